"""Implicit (JKO) steps for the Wasserstein-Fisher-Rao metric on a grid (``solver.method = "wfr_jko"``).

A step of length ``tau`` from the cell masses ``a`` [M] is
``b = argmin { E_h(b) + D(a, b)^2 / (2 tau) : b >= 0, sum_c b_c = sum_c a_c }``, ``D`` the
Hellinger-Kantorovich distance in its static form with the cost ``C(x, y) = -log cos^2(|x - y| / (2 delta))``,
``delta = sqrt(alpha / gamma)``, and an entropic term ``eps KL(pi | a x 1)`` on the plan. ``E_h`` is
re-linearized to a fixed point; each linearized problem is a semi-relaxed entropic plan (POT's
``sinkhorn_unbalanced`` with ``reg_m = (1, 0)``, :func:`semi_relaxed_plan`), the mass multiplier found by Brent.
First order; at most :data:`MAX_CELLS` cells. Diagnostics as ``fv`` with the reaction.
Details: docs/solvers.md, "Implicit WFR steps on a grid: wfr_jko".
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
from scipy.optimize import brentq

from pdeflow.core.config import Config, ConfigError
from pdeflow.core.measure import Grid
from pdeflow.core.problem import Problem

from .base import DefectSource, SolverError, State
from .controller import DT_MIN
from .entropic_ot import blur_setting, blur_source
from .finite_volume import CFL, LIMITER, SCHEME, FiniteVolume
from .jko import OUTER_MAXITER, TAU
from .parameters import Param
from .wfr import ALPHA, GAMMA

MAX_CELLS = 4096
# the plan's shifted cost is capped at COST_CAP eps: exp(-500) ~ 7e-218 of a row's largest entry, far below rounding,
# and a kernel entry a_i exp(-500) stays a normal double for every a_i > 1e-90 (POT stops on a zero column)
COST_CAP = 500.0
# With the second marginal free, POT's scaling v = (1 / K^T u)^0 is 1 at every iteration, so u repeats itself from
# the second iteration (change exactly 0: tests/methods/test_wfr.py checks POT does so). The plan is asked for without
# POT's log, whose objective (three KL divergences over the plan) took a third of a step's time.
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
    import ot  # on first use, as everywhere in pdeflow: POT's import loads its backends

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # POT only warns on a zero column or an overflow: never let that pass
        try:
            return ot.unbalanced.sinkhorn_unbalanced(a * np.exp(-shift), ones, shifted, eps, (1.0, 0.0),
                                                     method="sinkhorn", reg_type="kl", c=np.outer(a, ones),
                                                     numItermax=PLAN_MAXITER, stopThr=PLAN_TOL)
        except (RuntimeWarning, UserWarning) as warning:
            raise SolverError(f"wfr_jko: POT's unbalanced Sinkhorn failed ({warning}); raise solver.epsilon") from None


def jko_masses(a: np.ndarray, cost: np.ndarray, xi: np.ndarray, c: float, eps: float,
               guess: tuple[float, float] | None = None) -> tuple[np.ndarray, float]:
    """The minimizer b of ``<xi, b> + (1 / (2 c)) [min_pi <cost, pi> + eps KL(pi | a x 1)
    + KL(pi 1 | a) + KL(pi^T 1 | b)]``
    over b >= 0 with ``sum b = sum a``: a [M], cost [M, M], xi [M] -> (b [M], the mass multiplier lambda) (module
    docstring). lambda is the root of ``sum b(lambda) = sum a`` (increasing in lambda below ``min xi + 1 / c``),
    found by Brent to 1e-15 in a bracket that starts at ``guess = (lambda, width)`` when given (the root of the
    previous linearization of the same step and how far it moved: :func:`bracket`), else ``1 / c`` below the pole;
    each plan is computed once."""
    occupied = a > 0
    a_occ, cost_occ, total = a[occupied], cost[occupied], float(np.sum(a))
    computed: dict[float, np.ndarray] = {}

    def masses(lam: float) -> np.ndarray:
        if lam not in computed:
            growth = 1.0 + c * (xi - lam)
            computed[lam] = semi_relaxed_plan(a_occ, cost_occ + np.log(growth)[None, :], eps).sum(axis=0) / growth
        return computed[lam]

    def excess(lam: float) -> float:
        return float(masses(lam).sum()) - total

    upper = float(np.min(xi)) + 1.0 / c  # 1 + c (xi - lam) > 0 on every cell
    upper -= 1e-12 * max(1.0, abs(upper))
    lo, hi = bracket(excess, upper, 1.0 / c, guess)
    lam = brentq(excess, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    b = masses(lam)
    return b * (total / float(np.sum(b))), lam


def bracket(excess, upper: float, scale: float, guess: tuple[float, float] | None) -> tuple[float, float]:
    """``(lo, hi)`` with ``excess(lo) <= 0 < excess(hi)`` for the increasing ``excess`` on ``(-inf, upper]``, ``hi
    <= upper`` (``excess(upper) > 0``: the pole). Without a guess: ``hi = upper`` and ``lo`` ``scale``, 2 ``scale``,
    4 ``scale`` ... below it. With ``guess = (lam, width)``: ``lam`` and a point ``width`` from it on the side where
    the root lies, the step doubled until the sign changes (at most up to ``upper``)."""
    if guess is not None and guess[0] < upper:
        lam, width = guess
        width = max(abs(width), 1e-12 * max(1.0, abs(lam)))
        if excess(lam) > 0.0:
            return _below(excess, lam, width), lam
        while lam + width < upper and excess(lam + width) <= 0.0:
            width *= 2.0
        return lam, min(lam + width, upper)
    return _below(excess, upper, scale), upper


def _below(excess, hi: float, width: float) -> float:
    """``hi - width``, ``hi - 2 width``, ... : the first point where ``excess <= 0``."""
    while excess(hi - width) > 0.0:
        width *= 2.0
        if width > 1e12:
            raise SolverError("wfr_jko: no multiplier keeps the mass; lower solver.tau")
    return hi - width


# what solver.epsilon and solver.inner_tol mean to wfr_jko
EPSILON = Param("epsilon", float, 0.0, "entropic regularization eps of the plan, kernel width "
                "sqrt(2 eps alpha / gamma) (0: h^2 gamma / (2 alpha), a kernel one cell wide)", ge=0)
INNER_TOL = Param("inner_tol", float, 1e-10, "tolerance of the linearization: L1 change of the masses between "
                  "linearizations, over the mass", gt=0)


class UnbalancedJKO(FiniteVolume):
    """JKO steps for the Wasserstein-Fisher-Rao metric on a grid (see the module docstring)."""
    name = "wfr_jko"
    summary = "implicit Wasserstein-Fisher-Rao (Hellinger-Kantorovich) steps on a grid, entropic, first order"
    use_when = "the Wasserstein-Fisher-Rao flow of a density at steps beyond the explicit limit"
    params = (ALPHA, GAMMA, TAU, EPSILON, INNER_TOL, OUTER_MAXITER, CFL, DT_MIN, SCHEME, LIMITER)
    step_columns = ("mass", "min_density", "outer_iterations")
    # a minimizing movement carries the right-point rule h I(b) (as jko): pdeflow.solvers.accuracy
    quadrature = "right"

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
        self.epsilon = float(epsilon)  # as set: 0 means the default below
        # 0: a kernel one cell wide, sqrt(2 eps) delta = h with delta = sqrt(alpha / gamma) (see the docstring)
        self.eps = epsilon if epsilon > 0 else float(np.min(self.grid.width)) ** 2 * gamma / (2.0 * alpha)
        self.cost = hk_cost(np.asarray(self.grid.centres).reshape(self.grid.n_cells, -1), math.sqrt(alpha / gamma))

    @classmethod
    def check_keys(cls, cfg: Config) -> None:
        s = cfg.solver
        if s.gamma == 0.0 or s.alpha == 0.0:
            raise ConfigError("solver.method = 'wfr_jko' needs solver.gamma > 0 and solver.alpha > 0 (for the "
                              "Wasserstein JKO use 'jko')")

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> UnbalancedJKO:
        s = cfg.solver
        return cls(problem, Grid.from_config(cfg.grid, problem.k), s.tau if s.tau > 0 else s.dt, alpha=s.alpha,
                   epsilon=s.epsilon, inner_tol=s.inner_tol, outer_maxiter=s.outer_maxiter,
                   **cls.parameters(cfg))

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        grid = self.grid
        h = min(self.tau, dt_limit)
        # the plan's blur (variance ~ eps) per step of h is a diffusion of rate ~ eps / h: eps scales with h so that
        # a step cut short by a frame time diffuses at the rate of the full steps (as the grid jko does)
        b, ev, iteration = self._minimizer(state, h, self.eps * h / self.tau)
        rho = grid.density(b)
        new = state.advanced({"density": rho}, h, dt=self.tau)
        new.evaluation = ev
        return new, {"mass": grid.total_mass(rho), "min_density": float(np.min(rho)),
                     "outer_iterations": float(iteration)}

    def _minimizer(self, state: State, h: float, eps: float) -> tuple[np.ndarray, Any, int]:
        """The step's masses b [M] from the state's, with the plan's entropic ``eps``, their evaluation and the
        linearizations it took (module docstring)."""
        grid = self.grid
        a = grid.masses(state.fields["density"])
        total = float(np.sum(a))
        b, ev = a, self.evaluate(state)
        guess = None  # the multiplier of the previous linearization, and its move: the next bracket's start
        for iteration in range(1, self.outer_maxiter + 1):
            new_b, lam = jko_masses(a, self.cost, ev.xi.ravel(), 0.5 * self.gamma * h, eps, guess)
            guess = (lam, 2.0 * (lam - guess[0]) if guess else 1e-6 * max(1.0, abs(lam)))
            change = float(np.sum(np.abs(new_b - b))) / total
            b = new_b
            ev = self.evaluate_density(grid.density(b))
            if change <= self.inner_tol:
                return b, ev, iteration
        raise SolverError(f"wfr_jko: the linearization did not settle in solver.outer_maxiter = "
                          f"{self.outer_maxiter} iterations (last change {change:.2e}); lower solver.tau or "
                          f"raise solver.outer_maxiter")

    def defect_sources(self, old: State, new: State, residual: float) -> list[DefectSource]:
        """The entropic blur's share of the step's identity residual and the trial steps of other taus
        (:func:`~pdeflow.solvers.entropic_ot.blur_source`; the blur's diffusion ``~ alpha eps / (gamma tau)``, its
        kernel's variance ``2 delta^2 eps`` per step)."""
        def trial(state: State, length: float, eps: float) -> tuple[float, float, float]:
            _, ev, _ = self._minimizer(state, length, eps)
            return self.evaluate(state).energy, ev.energy, ev.dissipation

        energies = (self.evaluate(old).energy, self.evaluate(new).energy)
        return [blur_source(trial, old, self.known_initial_state(), energies, residual, new.t - old.t, self.tau,
                            self.eps,
                            blur_setting(self.epsilon, self.grid.shape[0], len(self.grid.shape), MAX_CELLS))]

    def likely_cause(self, state: State) -> str:
        return (f"the wfr_jko step (solver.tau = {self.tau:g}, solver.epsilon = {self.eps:g}) failed on grid.n = "
                f"{self.grid.shape[0]}; lower solver.tau or raise solver.epsilon")
