"""The entropic proximal step on a grid: ``argmin_{pi 1 = p} <C, pi> + eps sum pi (log pi - 1) + 2 tau F(pi^T 1)``
over plans ``pi`` [M, M] between cell masses, by Newton on the semi-dual (CG on its Hessian), for a linear-plus-entropy
``F``; the default regularization ``eps = h^2``; the blur's share of a lost step's identity residual
(:func:`blur_source`). The stepper is :class:`pdeflow.solvers.jko.GridJKO`; docs/solvers.md,
"Grid JKO steps (entropic)".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg
from scipy.special import logsumexp

from .base import DefectSource


def entropic_epsilon(epsilon: float, cell_widths) -> float:
    """The entropic regularization of a grid JKO step: ``epsilon``, or when it is 0 the default ``h^2`` with h the
    smallest of ``cell_widths`` [k] (module docstring, "Default eps")."""
    return epsilon if epsilon > 0 else float(np.min(cell_widths)) ** 2



def blur_source(energies: tuple[float, float], residual: float, double: tuple[float, float], h: float, tau: float,
                finer: str) -> DefectSource:
    """The entropic blur's share of a lost step of h's signed energy-identity residual ``R = E1 - E0 + Q``
    (= ``residual``; ``energies`` = ``(E0, E1)``), from the step of ``2 h`` from the same state with the same eps
    (``double`` = its ``(E, I)``: what a run with twice the tau would take; right-point quadrature), with its advice.

    Per step, the plan's blur (a diffusion of variance ~ eps, and the transport error of a kernel about a cell
    wide) is fixed by eps, not by h, while a first-order step's own error is ``~ h^2``: ``R(h) = A h^2 + B``, so
    the step's share ``A h^2 = (R(2 h) - R(h)) / 3`` and the blur's ``B = R(h) - A h^2`` (an estimate: it assumes
    these two terms over [h, 2 h]). The relative defect ``|R / dE|`` is then ``~ A h + B / h`` while ``dE ~ h``:
    lowering tau grows the blur's part. Whether raising tau lowers it is not left to that model (``dE`` stops
    growing with h near a stationary state): the advice compares the measured defects of the two steps, and names
    tau (doubled) only when the longer step's is the smaller, else ``finer``, the setting that shrinks eps
    (grid.n, or an explicit solver.epsilon)."""
    change, change_double = energies[1] - energies[0], double[0] - energies[0]
    residual_double = change_double + 2.0 * h * double[1]
    step = (residual_double - residual) / 3.0
    defect, defect_double = (abs(r / c) if c != 0.0 else math.inf for r, c in ((residual, change),
                                                                              (residual_double, change_double)))
    measured = f"one step of {2 * tau:g} from here: defect {defect_double:.3g} against {defect:.3g}"
    if defect_double < defect:
        fix = f"raise solver.tau = {tau:g} to {2 * tau:g} ({measured}) or {finer}"
    else:
        fix = f"{finer} (raising solver.tau does not help here: {measured})"
    return DefectSource("entropic blur", residual - step, f"{fix}; lowering solver.tau adds blur")


def finer_blur(epsilon: float, grid_n: int) -> str:
    """The setting besides tau that shrinks the blur: an explicit ``solver.epsilon`` (> 0) lowered, else grid.n
    raised (the default eps ~ the cell width squared)."""
    return (f"lower solver.epsilon = {epsilon:g}" if epsilon > 0 else
            f"raise grid.n = {grid_n} (the default eps ~ cell width^2)")


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
