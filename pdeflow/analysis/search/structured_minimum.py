"""The structured route to a certified local minimum: L-BFGS, a Newton-PCG endgame preconditioned by the per-head
blocks of S and a Cholesky certificate, the last two built on the structure of S (:mod:`pdeflow.core.hessian_assembly`).

On the mass-weighted coordinates ``v = M^(1/2) omega`` of :mod:`pdeflow.analysis.stationary.stationary` (the same
Counter,
history, verdict and result file), :func:`structured_minimum` runs, on the live heads (dead heads held exactly at
the origin, as the L-BFGS route does):

1. **search**: L-BFGS (:func:`pdeflow.analysis.stationary.stationary._lbfgs_live_heads`) until ``I <= SWITCH x I(0)``;
  with
   ``precondition_search`` (off by default, :data:`PRECONDITION_SEARCH`: it slowed the search where measured) its
   ``H_0 = gamma P^-1``, ``P`` the per-head block preconditioner
   (:class:`pdeflow.analysis.stationary.block_preconditioner.BlockPreconditioner` of
   :func:`pdeflow.core.hessian_assembly.head_blocks`, eigenvalues modified to be positive), built again every
   :data:`REFRESH` iterations and whenever heads die;
2. **endgame**: inexact Newton on the live heads: each step solves ``Pi S Pi p = -Pi g`` by conjugate gradients
   preconditioned by the same ``P`` (rebuilt at every step) with exact Hessian-vector products (counted products), to
   a relative residual ``eta = min(ETA, sqrt(|g| / |g_0|))`` (superlinear convergence); a direction of non-positive
   curvature met by CG ends the solve and is taken instead (a descent direction of E, the sign chosen so): the
   saddle escape inside the iteration (Steihaug's rule). Each step is globalised by backtracking on E (Armijo),
   or on I where E's decrease has reached E's rounding;
3. **certificate**: a short Lanczos run (:data:`CERTIFY_KRYLOV` steps: ``lambda_max`` and the index by
   interlacing) and :func:`pdeflow.analysis.certificate.certificate.certify` with ``method="cholesky"`` (C assembled
   from S's
   structure, Rump's test), up to :data:`DENSE_LIMIT` unknowns. A proven negative eigenvalue restarts from 1.
   along its direction (:func:`pdeflow.analysis.stationary.stationary.descent_direction`), at most ``max_restarts``
   times.

The search of step 1 is chosen by ``search`` (:data:`SEARCHES`, ``pdeflow stationary --search``): ``"lbfgs"``
(the default), ``"float32"`` (the same L-BFGS with its gradients evaluated in float32,
:func:`single_precision`, then float64 L-BFGS to the hand-over should it stall before, and step 2 in float64), or
``"trust-region"`` (:func:`pdeflow.analysis.search.trust_region.trust_region_search` from the start to the target
in place of steps 1 and 2). Which is faster where is measured in studies/minimum/NEW_SEARCHES.md.

Every choice is a function of the state and fixed constants (no clock, no random draw but fixed seeds), so the
route is deterministic for a given thread count (should Newton-PCG end above the target, L-BFGS goes on to it).
Costs, the Problem's count (:class:`pdeflow.analysis.stationary.stationary.Counter`): gradients, JVP products, and
the forward passes of the structured assemblies counted as one product each (``2 k`` per :func:`head_blocks`, k more
per further group of heads).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from ...core.hessian_assembly import head_blocks
from ...core.problem import Problem
from ..certificate.certificate import certify
from ..hessian.spectrum import hessian_operator, origin_is_stationary, spectrum_ends
from ..stationary.block_preconditioner import BlockPreconditioner
from ..stationary.stationary import (
    AWAKE,
    DISSIPATION_RATIO,
    MAX_ITER,
    Counter,
    Progress,
    StationaryPoint,
    _finish,
    _History,
    _lbfgs_live_heads,
    descent_direction,
    heads_at_origin,
    with_heads_at_origin,
)
from .trust_region import trust_region_search

ROUTE = "structured"
SEARCHES = ("lbfgs", "float32", "trust-region")  # the route's searches; the first is the default (studies/minimum/
                                                 # NEW_SEARCHES.md: the measured choice)
SWITCH = 1e-8          # the search hands over to the Newton endgame at I <= SWITCH I(0): measured on longtime.toml,
                       # from 8.5e-6 I(0) (99 live heads, still dying) CG meets negative curvature within 5-10
                       # steps and the steps are cut to 1/16-1/4; from the shipped minimum moved by 1e-4 four full
                       # steps reach 1e-14 I(0) (studies/minimum/FAST_MINIMUM.md)
PRECONDITION_SEARCH = False  # measured: block-Jacobi H_0 slows L-BFGS from t = 1 (E = 1.05 vs 0.62 at 200 its)
REFRESH = 500          # L-BFGS iterations between two builds of the block preconditioner
ETA = 0.1              # the loosest relative residual of a Newton step's CG solve
CG_MAXITER = 300       # CG iterations (products) of one Newton step at most
MAX_NEWTON = 60        # Newton steps of the endgame at most
LINE_SEARCH = 30       # halvings of a Newton step at most
ARMIJO = 1e-4          # sufficient decrease of E along a Newton step
CERTIFY_KRYLOV = 40    # Lanczos steps before the certificate: lambda_max, and a negative Ritz value if one shows
DENSE_LIMIT = 20_000   # the live heads' unknowns the Cholesky certificate assembles at most (~4 n^2 doubles)


def block_preconditioning(problem: Problem) -> Callable[[np.ndarray, np.ndarray], Callable]:
    """The factory ``(omega_live [h, k], mass_live [h]) -> P^-1`` of the block preconditioner (its assembly's
    forward passes, ``2 k`` and k more per further group of heads, are counted by the Problem)."""
    def build(omega: np.ndarray, mass: np.ndarray) -> BlockPreconditioner:
        return BlockPreconditioner.from_blocks(head_blocks(problem, omega, mass))
    return build


def pcg(matvec: Callable[[np.ndarray], np.ndarray], b: np.ndarray, inverse: Callable[[np.ndarray], np.ndarray],
        project: Callable[[np.ndarray], np.ndarray], eta: float, maxiter: int) -> tuple[np.ndarray, bool, int]:
    """Preconditioned conjugate gradients on ``A p = b`` (``A`` symmetric, applied by ``matvec``; ``inverse`` =
    ``P^-1`` symmetric positive definite, its output projected by ``project`` onto A's range: the symmetry
    directions stay out) to ``|A p - b| <= eta |b|``, at most ``maxiter`` products. Stops at the first direction
    ``d`` with ``d^T A d <= 0`` (Steihaug): returns ``d`` itself when no step was taken yet (a direction of
    non-positive curvature), else the iterate so far. Returns (p [n], whether it is a curvature direction,
    products)."""
    p = np.zeros_like(b)
    r = b.copy()
    z = project(inverse(r))
    d = z.copy()
    rz = float(r @ z)
    norm_b = float(np.linalg.norm(b))
    for it in range(1, maxiter + 1):
        Ad = matvec(d)
        curvature = float(d @ Ad)
        if not curvature > 0.0:
            return (d, True, it) if it == 1 else (p, False, it)
        alpha = rz / curvature
        p += alpha * d
        r -= alpha * Ad
        if float(np.linalg.norm(r)) <= eta * norm_b:
            return p, False, it
        z = project(inverse(r))
        rz_new = float(r @ z)
        d = z + (rz_new / rz) * d
        rz = rz_new
    return p, False, maxiter


def _newton_pcg(c: Counter, v: np.ndarray, target: float, hist: _History, say: Progress,
                max_newton: int, eta_max: float = ETA) -> tuple[np.ndarray, float, np.ndarray, float, int, str]:
    """The endgame (module docstring, step 2) from ``v`` until ``I <= target``, ``max_newton`` steps, the limits of
    ``c`` or a failed line search; the block preconditioner is built once per set of live heads (aged: CG's
    products are exact, so an aged P costs iterations, never accuracy; a build costs 2 k passes). Returns the
    point, E, g, I, the steps and why they stopped."""
    problem, (n_heads, k) = c.problem, c.shape
    hold = origin_is_stationary(problem, c.omega(v), c.mass)
    E, g = c.energy_and_gradient(v)
    I = float(g @ g)
    g0 = math.sqrt(I)
    it = 0
    built: tuple[np.ndarray, BlockPreconditioner] | None = None
    while True:
        if I <= target:
            return v, E, g, I, it, f"I = {I:.3g} <= {target:.3g} after {it} Newton-PCG steps"
        if it == max_newton:
            return v, E, g, I, it, f"{max_newton} Newton-PCG steps without reaching I <= {target:.3g}"
        if c.exhausted:
            return v, E, g, I, it, f"{c.stopped()} ({it} Newton-PCG steps) without reaching I <= {target:.3g}"
        it += 1
        live = ~heads_at_origin(c.omega(v)) if hold else np.ones(n_heads, dtype=bool)
        cols = np.repeat(live, k)
        omega_live, mass_live = c.omega(v)[live], c.mass[live]
        if built is None or not np.array_equal(built[0], live):
            built = (live, BlockPreconditioner.from_blocks(head_blocks(problem, omega_live, mass_live)))
        inverse = built[1]
        op = hessian_operator(problem, omega_live, mass_live)
        project = op.symmetry.project
        b = -project(g[cols])
        eta = min(eta_max, math.sqrt(math.sqrt(I) / g0))
        step, curved, cg_steps = pcg(op.matvec, b, inverse, project, eta, CG_MAXITER)
        p = np.zeros(n_heads * k)
        p[cols] = step
        slope = float(g @ p)
        if curved and slope > 0:
            p, slope = -p, -slope  # a curvature direction is followed downhill
        if not slope < 0:
            return v, E, g, I, it, f"no descent direction at I = {I:.3g} (Newton-PCG step {it})"
        alpha, accepted = 1.0, False
        for _ in range(LINE_SEARCH):
            E_new, g_new = c.energy_and_gradient(v + alpha * p)
            I_new = float(g_new @ g_new)
            if np.isfinite(E_new) and (E_new <= E + ARMIJO * alpha * slope or
                                       # E's decrease below its rounding: I, known to relative precision, decides
                                       (abs(E_new - E) <= 8 * np.spacing(abs(E)) and I_new < I)):
                accepted = True
                break
            alpha *= 0.5
        if not accepted:
            return v, E, g, I, it, f"the line search on E failed at I = {I:.3g} (Newton-PCG step {it})"
        v = v + alpha * p
        if hold:
            v = with_heads_at_origin(v, c.shape, heads_at_origin(c.omega(v)))
        E, g = c.energy_and_gradient(v)
        I = float(g @ g)
        hist.add(E, I)
        say(f"Newton-PCG {it}: E = {E:.13g}, I = {I:.3e}, step {alpha:g}{' (curvature)' if curved else ''}, "
            f"{cg_steps} CG steps, {int(live.sum())} live heads, {c.products} products")


def single_precision(problem: Problem) -> Problem:
    """The same problem evaluated in float32 (:attr:`pdeflow.core.problem.Problem.precision`): the float32 search's
    gradients."""
    return problem.in_precision("float32")


def structured_minimum(problem: Problem, omega: np.ndarray, mass: np.ndarray, initial_dissipation: float, *,
                       search: str = SEARCHES[0],
                       ratio: float = DISSIPATION_RATIO, switch: float = SWITCH, max_iter: int = 0,
                       precondition_search: bool = PRECONDITION_SEARCH, eta: float = ETA,
                       max_restarts: int = 5, max_wall: float = math.inf, max_cost: float = math.inf,
                       dense_limit: int = DENSE_LIMIT, krylov_dim: int = CERTIFY_KRYLOV,
                       progress: Progress | None = None,
                       on_iterate: Callable[[np.ndarray], None] | None = None) -> StationaryPoint:
    """A certified local minimum of E from ``omega`` [N, k] (``mass`` [N]) by the structured route (module
    docstring) until ``I <= ratio * initial_dissipation``; the search hands over to Newton-PCG at ``I <= switch *
    initial_dissipation``; ``search`` (:data:`SEARCHES`): ``"lbfgs"`` as above, ``"float32"`` its L-BFGS search
    evaluated in float32 (:func:`single_precision`; float64 L-BFGS goes on to the hand-over should it stall before),
    ``"trust-region"`` the trust-region Newton-Krylov search
    (:func:`pdeflow.analysis.search.trust_region.trust_region_search`) from the start to the target, in place of
    L-BFGS and Newton-PCG. ``max_iter``: L-BFGS iterations of each search (0: the L-BFGS route's); ``max_wall``,
    ``max_cost``: the limits of :class:`pdeflow.analysis.stationary.stationary.Counter`; ``dense_limit``: the live
    unknowns
    the certificate assembles at most; ``krylov_dim``: the Lanczos steps before it. The point's ``route`` is
    :data:`ROUTE`, with the search named when it is not the default."""
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}")
    say = progress or (lambda msg: None)
    c = Counter(problem, mass, np.shape(omega), max_wall=max_wall, max_cost=max_cost)
    single = single_precision(problem) if search == "float32" else None
    target = ratio * initial_dissipation
    handover = max(switch * initial_dissipation, target)
    v = c.coordinates(omega)
    E, g = c.energy_and_gradient(v)
    I0 = I = float(g @ g)
    hist = _History(c)
    hist.add(E, I0)
    precondition = block_preconditioning(problem) if precondition_search else None
    awake = np.zeros(c.shape[0], dtype=bool)
    iterations, message = 0, (f"I = {I0:.3g} <= {target:.3g} at the start" if I0 <= target else "")
    found = None
    for attempt in range(max_restarts + 1):
        parts = [message] if I <= target else []  # what each phase of this attempt did
        start = len(hist.rows)
        if search == "trust-region" and I > target:
            v, E, g, I, _, region_message = trust_region_search(c, v, target, hist, say, awake=awake)
            parts.append(f"trust region: {region_message}")
        if single is not None and I > handover:
            before = c.gradients
            c.use(single)
            result, v = _lbfgs_live_heads(c, v, handover, max_iter or MAX_ITER["lbfgs"], hist, on_iterate, say,
                                          awake)
            c.use(problem)
            parts.append(f"float32 L-BFGS ({c.gradients - before} gradients): {result.message}")
            E, g = c.energy_and_gradient(v)
            I = float(g @ g)
        if search != "trust-region" and I > handover:
            result, v = _lbfgs_live_heads(c, v, handover, max_iter or MAX_ITER["lbfgs"], hist, on_iterate, say,
                                          awake, precondition=precondition, refresh=REFRESH)
            parts.append(f"{'block-preconditioned ' if precondition_search else ''}L-BFGS: {result.message}")
        E, g = c.energy_and_gradient(v)
        I = float(g @ g)
        if I > target and not c.exhausted and search != "trust-region":
            say(f"search: I = {I:.3e} after {len(hist.rows) - start} iterations: Newton-PCG")
            v, E, g, I, taken, newton_message = _newton_pcg(c, v, target, hist, say, MAX_NEWTON, eta)
            parts.append(f"{taken} Newton-PCG steps: {newton_message}")
            if I > target and not c.exhausted:
                # outside Newton's basin after all: the search goes on to the target (the L-BFGS route's way)
                say(f"Newton-PCG ended at I = {I:.3e} ({newton_message}): L-BFGS to the target")
                result, v = _lbfgs_live_heads(c, v, target, max_iter or MAX_ITER["lbfgs"], hist, on_iterate, say,
                                              awake)
                parts.append(f"L-BFGS: {result.message}")
                E, g = c.energy_and_gradient(v)
                I = float(g @ g)
        iterations += len(hist.rows) - start
        message = "; ".join(parts)
        if I > target and c.exhausted:
            message = f"{c.stopped()} ({iterations} iterations) at I = {I:.3g} > {target:.3g}"
        if I > target:
            break
        t0 = time.perf_counter()
        with c.certification:
            spectrum = spectrum_ends(problem, c.omega(v), c.mass, krylov_dim=krylov_dim, split_origin=True)
            certificate = certify(problem, c.omega(v), c.mass, spectrum, dense_limit=dense_limit, method="cholesky")
        c.certify_wall += time.perf_counter() - t0
        say(f"certificate: {certificate.describe()}")
        found = (spectrum, certificate)
        if max(spectrum.morse_index_lower, certificate.index_lower) == 0 or attempt == max_restarts:
            break
        lam, x = descent_direction(spectrum, certificate)
        size = math.sqrt(2.0 * abs(lam) / max(spectrum.lambda_max, 1e-300)) * max(1.0, float(np.linalg.norm(v))) / 10
        trials = [(c.energy_and_gradient(v + s * size * x)[0], s) for s in (1.0, -1.0)]
        best = min(trials)
        say(f"escaping along the eigenvector of {lam:.4g}: step {size:.3g}, E {E:.12g} -> {best[0]:.12g}")
        v = v + best[1] * size * x
        awake = np.linalg.norm(x.reshape(c.shape), axis=1) > AWAKE * float(np.abs(x).max())
        E, g = c.energy_and_gradient(v)
        I = float(g @ g)
        found = None
    point = _finish(problem, "minimum", c, v, E, I, I0, initial_dissipation, target, iterations, message, hist,
                    (krylov_dim, dense_limit), say, found=found)
    point.route = ROUTE if search == SEARCHES[0] else f"{ROUTE} ({search} search)"
    return point


__all__ = ["CERTIFY_KRYLOV", "DENSE_LIMIT", "ROUTE", "SEARCHES", "SWITCH", "block_preconditioning", "pcg",
           "single_precision", "structured_minimum"]
