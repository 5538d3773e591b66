"""The Heun-Euler 2(1) pair (``solver.method = "heun-euler"``): Heun's second-order method with explicit Euler as
its embedded first-order solution, for the particles' Wasserstein flow ``d omega_i/dt = -grad Phi(omega_i; rho_N)``.

One step from ``y`` with ``f = -grad Phi``: ``k1 = f(y)``, ``k2 = f(y + h k1)``, ``y_new = y + h (k1 + k2) / 2``;
the estimate is the difference to Euler's ``y + h k1``, ``h (k2 - k1) / 2 = O(h^2)`` (error order 1), which the PI
controller of :mod:`pdeflow.solvers.controller` holds at ``solver.rtol``/``solver.atol``. The rate at ``y_new`` is
the next step's ``k1`` (first-same-as-last): two new evaluations per attempt. Tableau data for
:class:`pdeflow.solvers.explicit.EmbeddedRK`; the cheapest error-controlled method, for loose tolerances.
"""
from __future__ import annotations

from .explicit import EmbeddedRK


class HeunEuler(EmbeddedRK):
    """Adaptive Heun-Euler 2(1) (see the module docstring)."""
    name = "heun-euler"
    summary = "Heun-Euler 2(1): Heun's method with an Euler error estimate"
    use_when = "error control at loose tolerances for two evaluations a step (order 2)"
    order = 2
    error_estimator_order = 1  # Euler's error: err ~ h^2
    stages = 2  # new evaluations per accepted attempt (first-same-as-last)
    A = ((),
         (1.0,),
         (1 / 2, 1 / 2))
    b = (1 / 2, 1 / 2, 0.0)
    # b - b_hat, b_hat = (1, 0, 0) explicit Euler
    e = (-1 / 2, 1 / 2, 0.0)
