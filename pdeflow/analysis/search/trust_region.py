"""Trust-region Newton-Krylov on the live heads: a search that takes negative curvature instead of being cut by it.

Each iteration at ``v`` (mass-weighted coordinates, :mod:`pdeflow.analysis.stationary.stationary`) minimises the
quadratic model ``m(p) = g^T p + p^T H p / 2`` of E, ``H = Pi S Pi`` on the live heads (exact Hessian-vector
products, :func:`pdeflow.analysis.hessian.spectrum.hessian_operator`), over the trust region ``|p|_P <= Delta`` by
Steihaug-Toint conjugate gradients (:func:`steihaug_toint`; Conn, Gould & Toint, *Trust-Region Methods*, Algorithm
7.5.1): CG preconditioned by ``P``, the iterates' ``P``-norms carried by recurrences, ending inside the region at a
relative residual ``eta = min(ETA, sqrt(|g| / |g_0|))``, or on its boundary along the current direction when that
direction leaves it or has non-positive curvature: a direction of negative curvature is followed to the boundary,
not cut by a line search. ``P`` is the per-head block preconditioner
(:class:`pdeflow.analysis.stationary.block_preconditioner.BlockPreconditioner`, ``2 k`` forward passes a build), or
the identity; the region is then ellipsoidal, a stiff head's steps short and a slow head's long.

The step is kept when ``rho = (E - E(v + p)) / -m(p) > ACCEPT`` (or, once E's decrease has reached its rounding,
when it lowers I); ``Delta`` shrinks to ``SHRINK |p|_P`` when ``rho < BAD`` and doubles when ``rho > GOOD`` on the
boundary (Nocedal & Wright, Algorithm 4.1). Heads a step sends below
:data:`pdeflow.analysis.stationary.stationary.FREEZE` of the largest are set exactly to the origin and leave the
search; ``P`` is block-diagonal by head, so their blocks simply leave ``P`` (no build). ``P`` is built once, at the
first iteration (an aged ``P`` costs CG iterations, never accuracy: every product is exact).

Every choice is a function of the state and fixed constants: the search is deterministic for a given thread count.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ...core.hessian_assembly import head_blocks
from ..hessian.spectrum import hessian_operator, origin_is_stationary
from ..stationary.block_preconditioner import BlockPreconditioner
from ..stationary.stationary import Counter, Progress, _History, heads_at_origin, with_heads_at_origin

ETA = 0.1          # the loosest relative residual of a subproblem's CG solve inside the region
CG_MAXITER = 300   # CG iterations (products) of one subproblem at most
ACCEPT = 1e-4      # a step is kept when the actual decrease of E is more than this share of the model's
BAD, GOOD = 0.25, 0.75
SHRINK, GROW = 0.25, 2.0
MAX_ITER = 5000    # trust-region iterations (accepted or not) of one search at most


def steihaug_toint(matvec: Callable[[np.ndarray], np.ndarray], g: np.ndarray,
                   inverse: Callable[[np.ndarray], np.ndarray], project: Callable[[np.ndarray], np.ndarray],
                   radius: float, eta: float, maxiter: int) -> tuple[np.ndarray, np.ndarray, str, int, float]:
    """``p`` [n] approximately minimising ``g^T p + p^T A p / 2`` over ``|p|_P <= radius`` (``A`` symmetric, applied
    by ``matvec``; ``P^-1`` = ``inverse`` followed by ``project``, symmetric positive definite on A's range, which
    holds ``g``). From ``p = 0``, CG on ``A p = -g`` preconditioned by ``P``: with ``z = P^-1 r`` and ``d`` the
    search direction, ``|p|_P^2``, ``p^T P d`` and ``d^T P d`` follow from ``r^T z`` alone (``p_(j+1) = p_j +
    alpha d_j``, ``d_(j+1) = -z_(j+1) + beta d_j``), so ``P`` itself is never applied. Ends at ``|A p + g| <=
    eta |g|`` ("converged"), at the boundary ``|p + tau d|_P = radius`` (``tau >= 0``) when ``d^T A d <= 0``
    ("negative curvature") or the next iterate leaves the region ("boundary"), or after ``maxiter`` products.
    Returns (p, A p, why it ended, products, ``|p|_P``)."""
    p = np.zeros_like(g)
    Ap = np.zeros_like(g)
    r = g.copy()
    z = project(inverse(r))
    d = -z
    rz = float(r @ z)
    pp, pd, dd = 0.0, 0.0, rz
    norm_g = float(np.linalg.norm(g))

    def to_boundary() -> float:
        return (-pd + math.sqrt(max(pd * pd + dd * (radius * radius - pp), 0.0))) / dd

    for it in range(1, maxiter + 1):
        Ad = matvec(d)
        curvature = float(d @ Ad)
        if not curvature > 0.0:
            tau = to_boundary()
            return p + tau * d, Ap + tau * Ad, "negative curvature", it, radius
        alpha = rz / curvature
        pp_next = pp + 2.0 * alpha * pd + alpha * alpha * dd
        if pp_next >= radius * radius:
            tau = to_boundary()
            return p + tau * d, Ap + tau * Ad, "boundary", it, radius
        p += alpha * d
        Ap += alpha * Ad
        r += alpha * Ad
        pp = pp_next
        if float(np.linalg.norm(r)) <= eta * norm_g:
            return p, Ap, "converged", it, math.sqrt(pp)
        z = project(inverse(r))
        rz_next = float(r @ z)
        beta = rz_next / rz
        pd = beta * (pd + alpha * dd)
        dd = rz_next + beta * beta * dd
        d = -z + beta * d
        rz = rz_next
    return p, Ap, "maxiter", maxiter, math.sqrt(pp)


def trust_region_search(c: Counter, v: np.ndarray, target: float, hist: _History, say: Progress, *,
                        awake: np.ndarray | None = None, precondition: bool = True, max_iter: int = MAX_ITER,
                        ) -> tuple[np.ndarray, float, np.ndarray, float, int, str]:
    """The search of the module docstring from ``v`` [N k] until ``I <= target``, ``max_iter`` iterations, the limits
    of ``c`` (:attr:`pdeflow.analysis.stationary.stationary.Counter.exhausted`) or a region shrunk to nothing;
    ``awake`` [N] (bool): heads that take part however small (an escape direction moves them; the L-BFGS search's
    rule); ``precondition``: ``P`` the per-head blocks of S (else the identity). Products and the forward passes of
    a block build are counted by the Problem (read on ``c``). Returns the point, E, g, I, the iterations and why
    they stopped."""
    problem, (n_heads, k) = c.problem, c.shape
    hold = origin_is_stationary(problem, c.omega(v), c.mass)
    awake = np.zeros(n_heads, dtype=bool) if awake is None else awake

    def dead(x: np.ndarray) -> np.ndarray:
        return heads_at_origin(c.omega(x)) & ~awake if hold else np.zeros(n_heads, dtype=bool)

    E, g = c.energy_and_gradient(v)
    I = float(g @ g)
    g0 = math.sqrt(I)
    radius = math.nan
    built: tuple[np.ndarray, BlockPreconditioner] | None = None
    for it in range(max_iter + 1):
        if I <= target:
            return v, E, g, I, it, f"I = {I:.3g} <= {target:.3g} after {it} trust-region iterations"
        if it == max_iter:
            break
        if c.exhausted:
            return v, E, g, I, it, f"{c.stopped()} ({it} trust-region iterations) without reaching I <= {target:.3g}"
        live = ~dead(v)
        cols = np.repeat(live, k)
        omega_live, mass_live = c.omega(v)[live], c.mass[live]
        inverse: Callable[[np.ndarray], np.ndarray] = lambda x: x  # noqa: E731
        if precondition:
            if built is None or np.any(live & ~built[0]):
                built = (live, BlockPreconditioner.from_blocks(head_blocks(problem, omega_live, mass_live)))
            elif not np.array_equal(built[0], live):  # heads died (a dead head stays dead): their blocks leave P
                keep = live[built[0]]
                P = built[1]
                built = (live, BlockPreconditioner(P.vectors[keep], P.inverse_values[keep], P.negative))
            inverse = built[1]
        op = hessian_operator(problem, omega_live, mass_live)
        project = op.symmetry.project
        b = project(g[cols])
        if not math.isfinite(radius):  # the P-norm of the preconditioned gradient step: Newton's when P = S
            radius = math.sqrt(float(b @ project(inverse(b))))
        eta = min(ETA, math.sqrt(math.sqrt(I) / g0))
        step, Hstep, status, cg_steps, length = steihaug_toint(op.matvec, b, inverse, project, radius, eta, CG_MAXITER)
        predicted = -(float(b @ step) + 0.5 * float(step @ Hstep))
        p = np.zeros(n_heads * k)
        p[cols] = step
        E_new, g_new = c.energy_and_gradient(v + p)
        I_new = float(g_new @ g_new)
        rho = (E - E_new) / predicted if predicted > 0 else -math.inf
        # E's decrease below its rounding: I, known to relative precision, decides
        flat = abs(E_new - E) <= 8 * np.spacing(abs(E)) and I_new < I
        accepted = bool(np.isfinite(E_new) and (rho > ACCEPT or flat))
        on_boundary = status in ("boundary", "negative curvature")
        if rho < BAD and not flat:
            radius = SHRINK * length
        elif rho > GOOD and on_boundary:
            radius *= GROW
        if not accepted:
            if radius <= 1e-14 * max(1.0, float(np.linalg.norm(v))):
                return v, E, g, I, it, f"the trust region shrank to {radius:.3g} at I = {I:.3g}"
            continue
        v = with_heads_at_origin(v + p, c.shape, dead(v + p))
        E, g = c.energy_and_gradient(v)
        I = float(g @ g)
        hist.add(E, I)
        say(f"trust region {it + 1}: E = {E:.13g}, I = {I:.3e}, rho = {rho:.3g}, {status} after {cg_steps} CG steps, "
            f"radius {radius:.3g}, {int(live.sum())} live heads, {c.gradients} gradients, {c.products} products")
    return v, E, g, I, max_iter, f"{max_iter} trust-region iterations without reaching I <= {target:.3g}"


__all__ = ["steihaug_toint", "trust_region_search"]
