"""Implicit (JKO) steps for the Wasserstein-Fisher-Rao metric on a grid (``solver.method = "wfr_jko"``).

A step of length ``tau`` (``solver.tau``, 0: ``solver.dt``) from the cell masses ``a`` (``m_c = rho_c |C|``) is

    b = argmin { E_h(b) + D(a, b)^2 / (2 tau) : b >= 0, sum_c b_c = sum_c a_c },

with ``D`` the Wasserstein-Fisher-Rao (Hellinger-Kantorovich) distance of the metric with action
``int (|v|^2 / alpha + g^2 / gamma) d rho`` - the metric whose gradient flow is :mod:`pdeflow.solvers.wfr` and ``fv``
with ``solver.gamma`` - in its static (Kantorovich) form (Liero-Mielke-Savare 2018; Chizat-Peyre-Schmitzer-Vialard
2018): ``D^2 = (4 / gamma) min_pi [<C, pi> + KL(pi 1 | a) + KL(pi^T 1 | b)]`` with the cost
``C(x, y) = -log cos^2(|x - y| / (2 delta))`` for ``|x - y| < pi delta`` (else +inf), ``delta = sqrt(alpha / gamma)``.
The KL weights of both marginals are 1: that relaxation is what makes it this metric (no free parameter).
The plan gets an entropic term ``eps KL(pi | a x 1)`` (``eps = solver.epsilon``): its kernel spreads mass over a
width ``~ sqrt(2 eps) delta`` per step, which must reach about a cell (else transport below a cell per step is
blocked and the reaction takes over), and adds the blur of entropic JKO schemes.

Solution. E_h is linearized at the current guess, ``E_h(b) ~ <xi, b>`` (``xi`` the potential of
:mod:`pdeflow.solvers.finite_volume`: ``Phi + (1/beta) log rho``), and re-linearized until the masses stop changing
(``solver.outer_maxiter`` times at most, tolerance ``solver.inner_tol`` on the L1 change over the mass). For a fixed
``xi`` the minimization over b is explicit: with ``c = gamma tau / 2`` and the multiplier ``lam`` of the mass,
``b_j = q_j / (1 + c (xi_j - lam))`` (``q = pi^T 1``), and eliminating b leaves a plan problem whose second marginal
is free and whose cost gains ``log(1 + c (xi_j - lam))`` - POT's ``ot.unbalanced.sinkhorn_unbalanced`` with
``reg_m = (1, 0)``, ``reg_type = "kl"`` and ``c = a x 1`` (:func:`semi_relaxed_plan`). With the second marginal's
weight 0 its scaling ``v`` is 1 from the first iteration, so the plain method (``method = "sinkhorn"``) converges in
two iterations (the second repeats the first: change 0, checked). Its kernel ``exp(-C' / eps)`` over- and underflows
for small eps (``log Z_i`` from -180 to 1.1e5 measured at n = 128, eps = 2.5e-4), so POT gets the same problem
rescaled per row: the cost minus its row minimum ``f_i`` and the first marginal ``a_i exp(-f_i)`` (an exact
reformulation: the marginal KL absorbs the shift), and the shifted cost capped at ``COST_CAP eps`` (+inf included):
entries below ``exp(-COST_CAP)`` of their row's largest are moved to that level, far below rounding, and no kernel
column is zero (POT stops on one). ``method = "sinkhorn_stabilized"`` is not used: it adds 1e-16 to ``K v``, which
biases rows of tail cells (``a_i`` down to 5e-15 there: most plans off by more than 1e-9);
``"sinkhorn_translation_invariant"`` divides by the weight 0. The solution is also closed-form,
``pi_ij = a_i r_i exp(-C'_ij / eps) / Z_i`` with ``Z_i = sum_j exp(-C'_ij / eps)`` and
``r_i = Z_i^(eps / (1 + eps))``: the test suite checks POT's plan in the step against it (to ``1e-14 / eps``, the
conditioning of ``exp(-C / eps)``; eps down to 2.5e-4, +inf costs). ``lam`` is the root (Brent) of
``sum_j b_j(lam) = sum_i a_i``. Mass is kept to rounding and positivity by construction. First order in tau; at most
:data:`MAX_CELLS` cells (dense costs).

Diagnostics as ``fv`` with the reaction (the same ``E_h`` and ``I_h``); ``/steps/outer_iterations``.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import ot
from scipy.optimize import brentq

from pdeflow.config import Config, ConfigError
from pdeflow.measure import Grid
from pdeflow.problem import Problem

from . import register
from .base import SolverError, State
from .finite_volume import FiniteVolume

MAX_CELLS = 4096
# the plan's shifted cost is capped at COST_CAP eps: exp(-500) ~ 7e-218 of a row's largest entry, far below rounding,
# and a kernel entry a_i exp(-500) stays a normal double for every a_i > 1e-90 (POT stops on a zero column)
COST_CAP = 500.0
# with the second marginal free the scaling repeats itself from its second iteration (change exactly 0)
PLAN_MAXITER, PLAN_TOL = 10, 1e-14


def hk_cost(points: np.ndarray, delta: float) -> np.ndarray:
    """``C_ij = -log cos^2(|x_i - x_j| / (2 delta))``, +inf from ``|x_i - x_j| >= pi delta``: [M, k] -> [M, M]."""
    d = np.sqrt(np.sum((points[:, None, :] - points[None, :, :]) ** 2, axis=-1))
    near = d < math.pi * delta
    out = np.full(d.shape, np.inf)
    out[near] = -np.log(np.cos(d[near] / (2.0 * delta)) ** 2)
    return out


def semi_relaxed_plan(a: np.ndarray, cost: np.ndarray, eps: float) -> np.ndarray:
    """The plan minimizing ``<cost, pi> + eps KL(pi | a x 1) + KL(pi 1 | a)`` (second marginal free) by POT's
    ``sinkhorn_unbalanced`` on the row-shifted, capped cost (module docstring): a [M] (positive), cost [M, M'] (every
    row with a finite entry, +inf allowed) -> pi [M, M']."""
    shift = np.min(cost, axis=1)
    if not np.all(np.isfinite(shift)):
        raise ValueError("semi_relaxed_plan: a row of the cost has no finite entry")
    shifted = np.minimum(cost - shift[:, None], COST_CAP * eps)
    ones = np.ones(cost.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # POT only warns on a zero column or an overflow: never let that pass
        try:
            plan, log = ot.unbalanced.sinkhorn_unbalanced(a * np.exp(-shift), ones, shifted, eps, (1.0, 0.0),
                                                          method="sinkhorn", reg_type="kl", c=np.outer(a, ones),
                                                          numItermax=PLAN_MAXITER, stopThr=PLAN_TOL, log=True)
        except (RuntimeWarning, UserWarning) as warning:
            raise SolverError(f"wfr_jko: POT's unbalanced Sinkhorn failed ({warning}); raise solver.epsilon") from None
    if not log["err"] or log["err"][-1] > PLAN_TOL:
        raise SolverError(f"wfr_jko: POT's unbalanced Sinkhorn did not converge in {PLAN_MAXITER} iterations")
    return plan


def jko_masses(a: np.ndarray, cost: np.ndarray, xi: np.ndarray, c: float, eps: float) -> np.ndarray:
    """The minimizer b of ``<xi, b> + (1 / (2 c)) [min_pi <cost, pi> + eps KL(pi | a x 1)
    + KL(pi 1 | a) + KL(pi^T 1 | b)]``
    over b >= 0 with ``sum b = sum a``: a [M], cost [M, M], xi [M] -> b [M] (module docstring)."""
    occupied = a > 0
    a_occ, cost_occ, total = a[occupied], cost[occupied], float(np.sum(a))

    def masses(lam: float) -> np.ndarray:
        growth = 1.0 + c * (xi - lam)
        return semi_relaxed_plan(a_occ, cost_occ + np.log(growth)[None, :], eps).sum(axis=0) / growth

    upper = float(np.min(xi)) + 1.0 / c  # 1 + c (xi - lam) > 0 on every cell
    upper -= 1e-12 * max(1.0, abs(upper))
    width = 1.0 / c
    while masses(upper - width).sum() > total:
        width *= 2.0
        if width > 1e12:
            raise SolverError("wfr_jko: no multiplier keeps the mass; lower solver.tau")
    lam = brentq(lambda x: masses(x).sum() - total, upper - width, upper, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    b = masses(lam)
    return b * (total / float(np.sum(b)))


@register
class UnbalancedJKO(FiniteVolume):
    """JKO steps for the Wasserstein-Fisher-Rao metric on a grid (see the module docstring)."""
    name = "wfr_jko"
    step_columns = ("mass", "min_density", "outer_iterations")

    def __init__(self, problem: Problem, grid: Grid, tau: float, *, alpha: float, gamma: float, epsilon: float = 0.0,
                 inner_tol: float = 1e-10, outer_maxiter: int = 50, **fv: Any) -> None:
        """Steps of ``tau`` on ``grid`` for the metric of ``alpha`` and ``gamma``; the plan's entropic ``epsilon``
        (0: one cell wide, module docstring); the linearization stops at ``inner_tol`` or after ``outer_maxiter``
        (``solver.*``); ``fv``: the :class:`FiniteVolume` parameters (its evaluation and first ``dt``)."""
        super().__init__(problem, grid, gamma=gamma, **fv)
        if self.grid.n_cells > MAX_CELLS:
            raise ConfigError(f"solver.method = 'wfr_jko' stores dense costs: at most {MAX_CELLS} cells, got "
                              f"{self.grid.n_cells}; lower grid.n")
        self.tau, self.inner_tol, self.outer_maxiter = float(tau), inner_tol, outer_maxiter
        # 0: a kernel one cell wide, sqrt(2 eps) delta = h with delta = sqrt(alpha / gamma) (see the docstring)
        self.eps = epsilon if epsilon > 0 else float(np.min(self.grid.width)) ** 2 * gamma / (2.0 * alpha)
        self.cost = hk_cost(np.asarray(self.grid.centres).reshape(self.grid.n_cells, -1), math.sqrt(alpha / gamma))

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> UnbalancedJKO:
        s = cfg.solver
        return cls(problem, Grid.from_config(cfg.grid, problem.k), s.tau if s.tau > 0 else s.dt, alpha=s.alpha,
                   epsilon=s.epsilon, inner_tol=s.inner_tol, outer_maxiter=s.outer_maxiter,
                   **cls.parameters(cfg))

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        grid = self.grid
        h = min(self.tau, dt_limit)
        a = grid.masses(state.fields["density"])
        total = float(np.sum(a))
        b, ev = a, self.evaluate(state)
        for iteration in range(1, self.outer_maxiter + 1):
            new_b = jko_masses(a, self.cost, ev.xi.ravel(), 0.5 * self.gamma * h, self.eps)
            change = float(np.sum(np.abs(new_b - b))) / total
            b = new_b
            ev = self.evaluate_density(grid.density(b))
            if change <= self.inner_tol:
                break
        else:
            raise SolverError(f"wfr_jko: the linearization did not settle in solver.outer_maxiter = "
                              f"{self.outer_maxiter} iterations (last change {change:.2e}); lower solver.tau or "
                              f"raise solver.outer_maxiter")
        rho = grid.density(b)
        new = state.advanced({"density": rho}, h, dt=self.tau)
        new.evaluation = ev
        return new, {"mass": grid.total_mass(rho), "min_density": float(np.min(rho)),
                     "outer_iterations": float(iteration)}

    def likely_cause(self, state: State) -> str:
        return (f"the wfr_jko step (solver.tau = {self.tau:g}, solver.epsilon = {self.eps:g}) failed on grid.n = "
                f"{self.grid.shape[0]}; lower solver.tau or raise solver.epsilon")
