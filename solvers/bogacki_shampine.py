"""The Bogacki-Shampine 3(2) pair (``solver.method = "bs23"``, scipy's ``RK23``): an embedded explicit Runge-Kutta
method of order 3 with an order-2 error estimate and first-same-as-last reuse, three new evaluations of ``grad Phi``
per step, for the particles' Wasserstein flow ``d omega_i/dt = -grad Phi(omega_i; rho_N)``.

Tableau data for :class:`pdeflow.solvers.explicit.EmbeddedRK` (Bogacki & Shampine 1989); error control by the PI
controller of :mod:`pdeflow.solvers.controller` with ``err ~ h^3``. Details: docs/solvers.md, "Particles".
"""
from __future__ import annotations

from .explicit import EmbeddedRK


class BogackiShampine(EmbeddedRK):
    """Adaptive Bogacki-Shampine 3(2) (see the module docstring)."""
    name = "bs23"
    summary = "Bogacki-Shampine 3(2) (scipy's RK23) with error control"
    use_when = "as `adaptive` at loose tolerances: order 3, three new evaluations a step against six"
    order = 3
    error_order = 2  # the embedded second-order solution's error: err ~ h^3
    fsal = True  # three new evaluations per attempt
    A = ((),
         (1 / 2,),
         (0.0, 3 / 4),
         (2 / 9, 1 / 3, 4 / 9))
    b = (2 / 9, 1 / 3, 4 / 9, 0.0)
    c = (0.0, 1 / 2, 3 / 4, 1.0)
    # b - b_hat, b_hat = (7/24, 1/4, 1/3, 1/8) the embedded second-order solution
    e = (-5 / 72, 1 / 12, 1 / 9, -1 / 8)
