"""The Heun-Euler 2(1) pair (``solver.method = "heun_euler"``): Heun's method (the explicit trapezoid, order 2) with
error control by the embedded explicit Euler step, for the particles' Wasserstein flow
``d omega_i/dt = -grad Phi(omega_i; rho_N)``.

With ``k1 = f(y_n)`` and ``k2 = f(y_n + h k1)``, the step is ``y_{n+1} = y_n + h (k1 + k2) / 2`` and the estimate of
the local error of the Euler solution ``y_n + h k1`` is ``e = h (k2 - k1) / 2 = O(h^2)``: ``error_order`` 1, so the
step-size exponent is 1/2. Two new evaluations of ``grad Phi`` per attempt (``k2``, and ``f(y_{n+1})``, the next
step's ``k1`` and the new state's diagnostics). Tableau data for :class:`pdeflow.solvers.explicit.EmbeddedRK` (the
last row of ``A`` is ``b``: the stage at the new state), error control by its PI controller.
"""
from __future__ import annotations

from .explicit import EmbeddedRK


class HeunEuler(EmbeddedRK):
    """Adaptive Heun-Euler 2(1) (see the module docstring)."""
    name = "heun_euler"
    summary = "Heun-Euler 2(1): Heun's method, order 2, with error control by the embedded Euler step"
    use_when = "loose tolerances at the least cost per step: two evaluations, order 2"
    order = 2
    error_order = 1  # the embedded Euler solution's error: err ~ h^2
    fsal = True  # two new evaluations per attempt
    A = ((),
         (1.0,),
         (0.5, 0.5))
    b = (0.5, 0.5, 0.0)
    c = (0.0, 1.0, 1.0)
    # b - b_hat, b_hat = (1, 0, 0) the embedded Euler solution
    e = (-0.5, 0.5, 0.0)
