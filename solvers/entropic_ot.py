"""The entropic proximal step on a grid: ``argmin_{pi 1 = p} <C, pi> + eps sum pi (log pi - 1) + 2 tau F(pi^T 1)``
over plans ``pi`` [M, M] between cell masses, by Newton on the semi-dual (CG on its Hessian), for a linear-plus-entropy
``F``; the default regularization ``eps = h^2``; the blur's share of a lost step's identity residual
(:func:`blur_source`). The stepper is :class:`pdeflow.solvers.jko.GridJKO`; docs/solvers.md,
"Grid JKO steps (entropic)".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg
from scipy.special import logsumexp

from .base import DefectSource, Setting, SolverError, State


def entropic_epsilon(epsilon: float, cell_widths) -> float:
    """The entropic regularization of a grid JKO step: ``epsilon``, or when it is 0 the default ``h^2`` with h the
    smallest of ``cell_widths`` [k] (module docstring, "Default eps")."""
    return epsilon if epsilon > 0 else float(np.min(cell_widths)) ** 2



# the factors of solver.tau a lost step's trial steps try (one step each, from the lost step's start and from the
# initial state): what a run with tau times the factor would take (pdeflow.solvers.accuracy.advice weighs them)
TRIAL_FACTORS = (0.5, 2.0, 4.0, 8.0, 16.0)


def step_defect(energy0: float, energy1: float, dissipation1: float, h: float) -> float:
    """The relative energy-identity defect ``|E1 - E0 + h I1| / |E1 - E0|`` of a minimizing movement's step of h
    (right-point quadrature; inf for no energy change)."""
    change = energy1 - energy0
    return abs(change + h * dissipation1) / abs(change) if change != 0.0 else math.inf


def blur_source(trial: Callable[[State, float, float], tuple[float, float, float]], old: State, initial: State | None,
                energies: tuple[float, float], residual: float, h: float, tau: float, eps: float,
                finer: Setting) -> DefectSource:
    """The entropic blur's share of a lost step of h's signed energy-identity residual ``R = E1 - E0 + Q``
    (= ``residual``; ``energies`` = ``(E0, E1)``), and trial steps for the advice.

    ``trial(state, length, eps)`` gives ``(E, E', I')``: the energy at ``state`` and the energy and dissipation after
    one step of ``length`` from it with the plan's entropic eps. Per step, the plan's blur (a diffusion of variance
    ~ eps, and the transport error of a kernel about a cell wide) is fixed by eps, not by h, while a first-order
    step's own error is ``~ h^2``: ``R(h) = A h^2 + B``, so from the step of ``2 h`` (same eps, as a run with twice
    the tau takes it) the step's share is ``A h^2 = (R(2 h) - R(h)) / 3`` and the blur's ``B = R(h) - A h^2`` (an
    estimate: it assumes these two terms over [h, 2 h]). ``trials``: for each of :data:`TRIAL_FACTORS`, the defect
    of one step of factor x h from ``old`` (eps ``eps h / tau``, as the run takes a step of h) and of one step of
    factor x tau from ``initial`` (eps ``eps``: the first step of a run with that tau; nan when ``initial`` is None).
    ``finer``: the setting that shrinks eps (grid.n,
    or an explicit solver.epsilon)."""
    e0 = energies[0]
    trials = []
    for factor in TRIAL_FACTORS:
        found = []
        for state, length, width in ((old, factor * h, eps * h / tau), (initial, factor * tau, eps)):
            if state is None:
                found.append(math.nan)
                continue
            try:
                found.append(step_defect(*trial(state, length, width), length))
            except SolverError:      # the longer step's solve failed: no such step
                found.append(math.inf)
        trials.append((factor, found[0], found[1]))
    _, double_energy, double_dissipation = trial(old, 2.0 * h, eps * h / tau)
    residual_double = double_energy - e0 + 2.0 * h * double_dissipation
    step = (residual_double - residual) / 3.0
    return DefectSource("entropic blur", residual - step, f"{finer_text(finer)}; lowering solver.tau adds blur",
                        finer, tuple(trials))


def blur_setting(epsilon: float, grid_n: int, k: int, max_cells: int) -> Setting:
    """The setting besides tau that shrinks the blur: an explicit ``solver.epsilon`` (> 0; the blur ~ eps), else
    grid.n (the default eps ~ the cell width squared: the blur ~ ``grid.n ** -2``, up to ``max_cells`` cells)."""
    if epsilon > 0:
        return Setting("solver.epsilon", epsilon, 1.0)
    return Setting("grid.n", float(grid_n), -2.0, smallest=float(grid_n), largest=float(int(max_cells ** (1 / k))),
                   integer=True)


def finer_text(finer: Setting) -> str:
    """The advice to shrink the blur by ``finer``, in words."""
    if finer.key == "solver.epsilon":
        return f"lower solver.epsilon = {finer.value:g}"
    return f"raise grid.n = {finer.value:g} (the default eps ~ cell width^2)"


@dataclass
class ProxSolution:
    """One linearized entropic JKO problem, solved: ``masses`` [M] (``pi^T 1``), the semi-dual ``potential``
    g [M] (:func:`entropic_plan` rebuilds pi from it), Newton ``iterations`` and the Hessian-vector
    ``products`` of their CG solves, ``violation`` ``|pi^T 1 - q(g)|_1``, ``transport_cost`` ``<C, pi>``,
    ``entropic_cost`` ``<C, pi> + eps sum pi (log pi - 1)`` and ``converged`` (violation <= tol)."""
    masses: np.ndarray
    potential: np.ndarray
    iterations: int
    products: int
    violation: float
    transport_cost: float
    entropic_cost: float
    converged: bool



def _conditional_plan(cost: np.ndarray, g: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``P_ij = softmax_j((g_j - C_ij) / eps)`` [rows, M] and the row log-normalizers [rows]."""
    L = (g[None, :] - cost) / eps
    lse = logsumexp(L, axis=1)
    return np.exp(L - lse[:, None]), lse



def entropic_plan(cost: np.ndarray, p: np.ndarray, potential: np.ndarray, eps: float) -> np.ndarray:
    """The plan ``pi_ij = p_i softmax_j((g_j - C_ij) / eps)`` [M, M] of a semi-dual potential g [M]."""
    p = np.asarray(p, dtype=float)
    return p[:, None] * _conditional_plan(cost, np.asarray(potential, dtype=float), eps)[0]



def entropic_prox(cost: np.ndarray, p: np.ndarray, potential: np.ndarray, eps: float, tau: float, beta: float,
                  volume: float, tol: float, maxiter: int, start: np.ndarray | None = None) -> ProxSolution:
    """``argmin_{pi 1 = p} <C, pi> + eps sum pi (log pi - 1) + 2 tau F(pi^T 1)`` with the linear-plus-entropy
    ``F(q) = <V, q> + (1/beta) sum_j q_j log(q_j / volume)`` (module docstring: Newton on the semi-dual).

    ``cost`` C [M, M], ``p`` [M] (>= 0), ``potential`` V [M], ``volume`` the cell volume; ``start`` a semi-dual
    potential to start from (default: the one giving ``q = p``). Stops at ``|pi^T 1 - q|_1 <= tol`` or after
    ``maxiter`` Newton steps. Newton starts from the better (lower -J) of ``start`` and the potential with
    ``q(g) = p`` (``q(g) = min p`` in empty cells).
    """
    p = np.asarray(p, dtype=float)
    V = np.asarray(potential, dtype=float)
    rows = p > 0
    pa, Ca = p[rows], cost[rows]

    def plan_of(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _conditional_plan(Ca, g, eps)

    def solution(g: np.ndarray, P: np.ndarray, lse: np.ndarray, iterations: int, violation: float,
                 products: int = 0) -> ProxSolution:
        masses = pa @ P
        transport = float(pa @ np.einsum("ij,ij->i", P, Ca))
        # log pi_ij = log p_i + (g_j - C_ij) / eps - lse_i, so eps sum pi (log pi - 1) needs no [M, M] pass
        entropic = float(masses @ g) - eps * float(pa @ lse) + eps * float(pa @ (np.log(pa) - 1.0))
        masses *= p.sum() / masses.sum()
        return ProxSolution(masses=masses, potential=g, iterations=iterations, products=products,
                            violation=violation, transport_cost=transport, entropic_cost=entropic,
                            converged=violation <= tol)

    if not np.isfinite(beta):
        # F linear: the plan is explicit and the marginal condition has no second side
        g = -2.0 * tau * V
        return solution(g, *plan_of(g), 0, 0.0)
    s = 2.0 * tau / beta
    log_volume = np.log(volume)

    def q_of(g: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):
            return np.exp((-g - 2.0 * tau * V) / s - 1.0 + log_volume)

    def state(g: np.ndarray):
        P, lse = plan_of(g)
        q = q_of(g)
        m2 = pa @ P
        return eps * float(pa @ lse) + s * float(q.sum()), m2 - q, P, m2, q, lse

    # q(g) = p; empty cells start like the lightest occupied one (log 0 would make them absorb everything)
    g = -s * (np.log(np.maximum(p, pa.min()) / volume) + 1.0) - 2.0 * tau * V
    obj, grad, P, m2, q, lse = state(g)
    if start is not None:
        # a previous solution: a change of V between linearizations can make q(start) explode in
        # cells where pi^T 1 cannot follow, so it has to be better than q(g) = p to be used
        other = state(np.asarray(start, dtype=float))
        if other[0] < obj:
            g = np.asarray(start, dtype=float)
            obj, grad, P, m2, q, lse = other
    iterations, counter = 0, [0]
    while iterations < maxiter:
        norm = float(np.sum(np.abs(grad)))
        if norm <= tol:
            break
        # Newton-CG: the Hessian of -J, (diag(pi^T 1) - pi^T diag(1/p) pi) / eps + diag(q) / s, is positive
        # definite and diagonally dominant; with its diagonal as preconditioner CG needs few products
        # (each O(M^2)) when eps / s is not small, and cells of tiny mass do not spoil the conditioning
        diagonal = m2 / eps + q / s

        def hvp(v: np.ndarray, P=P, m2=m2, q=q) -> np.ndarray:
            return (m2 * v - (pa * (P @ v)) @ P) / eps + (q / s) * v

        op = LinearOperator((g.size, g.size), matvec=hvp, dtype=float)
        jacobi = LinearOperator((g.size, g.size), matvec=lambda r: r / diagonal, dtype=float)
        step, _ = cg(op, -grad, rtol=max(min(0.1, norm), 1e-12), maxiter=10 * g.size, M=jacobi,
                     callback=lambda _: counter.__setitem__(0, counter[0] + 1))
        iterations += 1
        slope = float(grad @ step)
        t = 1.0
        while True:
            trial = state(g + t * step)
            # Armijo on -J, or (where -J no longer resolves progress) a smaller marginal violation
            if trial[0] <= obj + 1e-4 * t * slope or float(np.sum(np.abs(trial[1]))) < norm:
                break
            t *= 0.5
            if t < 1e-12:
                return solution(g, P, lse, iterations, norm, counter[0])
        g = g + t * step
        obj, grad, P, m2, q, lse = trial
    return solution(g, P, lse, iterations, float(np.sum(np.abs(grad))), counter[0])
