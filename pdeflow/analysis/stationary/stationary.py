"""Stationary points of the particle flow: the one next to a state (Newton-Krylov) and a local minimum
(a descent search that leaves saddles along their negative curvature), certified by the spectrum of the
mass-weighted Hessian.

The particles ``omega`` [N, k] with fixed masses ``mass`` [N] are written in the mass-weighted coordinates
``v = M^(1/2) omega`` (flat [N k]). There the energy's gradient is ``g = M^(1/2) grad Phi`` (``grad Phi`` at the
particles), its squared norm is the dissipation ``I = sum_i m_i |grad Phi(omega_i)|^2``, and its Hessian is
``S = M^(1/2) (M^-1 Hess E) M^(-1/2)`` (:mod:`pdeflow.analysis.hessian.spectrum`), applied by the exact JVP. Each head's
symmetry directions (orbit tangents) are projected out of every Newton system: E is flat along them, so they carry
no information and make S singular.

- :func:`nearest`: Newton's method on ``g(v) = 0``: each step solves ``Pi S Pi p = -Pi g`` for the
  minimal-residual iterate (:func:`newton_step`; S is symmetric and indefinite at a saddle) to a relative residual
  ``eta = min(ETA_MAX, |g| / |g_0|)`` (quadratic convergence once full steps are taken), and is globalised by a
  backtracking line search on I (the step is a descent direction of I when the solve is accurate:
  ``d/da I(v + a p) = 2 g^T S p ~ -2 I``). It converges to the stationary point, saddle or minimum, whose basin of
  Newton's method holds the start.
- :func:`minimum`: a descent search on E, by default L-BFGS (:func:`pdeflow.analysis.search.lbfgs.lbfgs`,
  :data:`LBFGS_MEMORY` pairs; measured on longtime.toml it lowers E several times faster per gradient
  equivalent than the flow or the trust-region search, docs/experiments.md), or ``method="trust-region"``:
  ``trust-krylov`` with ``hessp = Pi S Pi`` (the Lanczos-based GLTR subproblem solver follows directions of
  negative curvature to the trust region's boundary). When the search stops at a point whose spectrum still has
  a converged negative eigenvalue, it is restarted from that point moved along the eigenvector (both signs tried,
  the lower energy kept): the negative curvature the spectrum finds is what leaves a saddle, whichever search.

This module's :func:`minimum` is the ``lbfgs`` route of :data:`ROUTES`; the ``structured`` route (L-BFGS, a
block-preconditioned Newton-PCG endgame, Cholesky certificate) is
:func:`pdeflow.analysis.search.structured_minimum.structured_minimum`, built on the same Counter, history, verdict and
result file.

Both stop when ``I <= ratio * I(0)`` (``I(0)``: the dissipation of the run's first frame) and report the two ends
of the spectrum there (:func:`pdeflow.analysis.hessian.spectrum.spectrum_ends`) and what they establish
(:func:`pdeflow.analysis.certificate.certificate.certify`, the one rule): every negative Ritz value of a block,
converged or
not, is a negative eigenvalue (interlacing: a saddle); a minimum is certified only by the dense eigenvalue bound
on S off the symmetry directions (up to ``dense_limit`` unknowns on the live heads); above that limit the verdict
is :data:`pdeflow.analysis.certificate.certificate.LANCZOS_VERDICT`, not a certificate.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.optimize
import scipy.sparse.linalg

from ...core.config import Config
from ...core.problem import JVP_COST, Problem, gradient_equivalents
from ...io.result_schema import STATIONARY
from ..certificate.certificate import (
    BY_DENSE,
    DENSE_LIMIT,
    LANCZOS_VERDICT,
    PROOFS,
    Certificate,
    certify,
    not_stationary,
    stored_lambda_min,
)
from ..hessian.spectrum import (
    KRYLOV_DIM,
    HessianOperator,
    SpectrumEnds,
    hessian_operator,
    origin_is_stationary,
    spectrum_ends,
)
from ..search.lbfgs import LbfgsResult, lbfgs

DISSIPATION_RATIO = 1e-12   # converged: I <= DISSIPATION_RATIO * I(0)
ETA_MAX = 1e-2               # the loosest relative residual of a Newton step's solve
MINRES_MAXITER = 500         # products per Newton step at most (the minimal-residual solve)
MAX_NEWTON = 100             # Newton steps of nearest at most
LINE_SEARCH = 30             # halvings of a Newton step at most
ARMIJO = 1e-4                # sufficient decrease of I along a Newton step
KINDS = ("nearest", "minimum")
METHODS = ("lbfgs", "trust-region")   # the descent searches of minimum
LBFGS_MEMORY = 100           # L-BFGS correction pairs: on longtime.toml 100 reach an energy in 2/3 of the
                             # gradients 30 need, for 2x the 6 ms an iteration costs with 30 (n = 32,768)
FREEZE = 1e-6                # a head with |omega_i| <= FREEZE max_j |omega_j| is held at the origin by L-BFGS
FREEZE_GAIN = 8              # this many more heads below FREEZE restart L-BFGS on the fewer live heads
AWAKE = 1e-3                 # heads carrying this share of an escape direction's largest entry take part again
KRYLOV_GROWTH = 3            # classify: the longest Lanczos run, in units of the first check
MAX_ITER = {"lbfgs": 100_000, "trust-region": 2000}   # iterations of one search at most (by default)
LOWEST_DIRECTIONS = 3        # the lowest converged Ritz vectors a result file keeps

Progress = Callable[[str], None]
# a preconditioner's factory: (omega [h, k], mass [h]) of the live heads -> P^-1 on flat [h k] vectors
Preconditioning = Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], np.ndarray]]


class Counter:
    """The energy and its mass-weighted gradient at ``v`` [N k] and the Hessian operators there (a repeated
    evaluation at the same ``v`` is served from memory, no call of the Problem's), the search's cost read from the
    Problem's counter since the Counter was made (:meth:`pdeflow.core.problem.Problem.mark`): :attr:`gradients` in
    all, the search's :attr:`products` apart from the certification's (:attr:`certification`, a
    :class:`pdeflow.core.problem.Share` that :func:`classify` enters, and its ``certify_wall`` seconds); and the
    search's limits: ``max_wall`` seconds (machine-dependent) and ``max_cost`` gradient equivalents (:attr:`cost`;
    the same count on every machine, so a search stopped by it stops at the same iterate)."""

    def __init__(self, problem: Problem, mass: np.ndarray, shape: tuple[int, int], *, max_wall: float = math.inf,
                 max_cost: float = math.inf) -> None:
        self.problem, self.mass, self.shape = problem, np.asarray(mass, dtype=float), shape
        self.max_wall, self.max_cost = max_wall, max_cost
        self.root = np.sqrt(self.mass)[:, None]
        self._mark = problem.mark()
        self.certification = problem.share()
        self.certify_wall = 0.0
        self._last: tuple[np.ndarray, float, np.ndarray] | None = None
        self.start = time.perf_counter()

    def _search_calls(self) -> dict[str, int]:
        """The Problem's calls since the Counter began, less the certification's products (its gradients stay:
        :attr:`gradients` is the search's in all)."""
        spent = self.problem.since(self._mark)
        return {kind: spent[kind] - (self.certification.calls[kind] if kind != "gradient" else 0) for kind in spent}

    @property
    def gradients(self) -> int:
        """The grad Phi evaluations since the Counter began, the certification's included."""
        return self._search_calls()["gradient"]

    def omega(self, v: np.ndarray) -> np.ndarray:
        """``omega = M^(-1/2) v``: [N k] -> [N, k]."""
        return np.asarray(v, dtype=float).reshape(self.shape) / self.root

    def coordinates(self, omega: np.ndarray) -> np.ndarray:
        """``v = M^(1/2) omega``: [N, k] -> [N k]."""
        return (self.root * np.asarray(omega, dtype=float)).ravel()

    def energy_and_gradient(self, v: np.ndarray) -> tuple[float, np.ndarray]:
        """``E`` and ``g = M^(1/2) grad Phi`` [N k] (one grad Phi evaluation)."""
        if self._last is not None and np.array_equal(self._last[0], v):
            return self._last[1], self._last[2].copy()
        ev = self.problem.evaluate(self.omega(v), self.mass)
        g = (self.root * ev.grad_phi).ravel()
        self._last = (np.array(v, dtype=float), ev.energy, g.copy())
        return ev.energy, g

    def use(self, problem: Problem) -> None:
        """Evaluate with ``problem`` from now on (the same data in another precision on the same counter,
        :meth:`pdeflow.core.problem.Problem.in_precision`: a float32 search before a float64 polish); the
        remembered evaluation, made with the other, is forgotten."""
        if problem.counts is not self.problem.counts:
            raise ValueError("Counter.use: the problem must count on the same counter (Problem.in_precision)")
        self.problem = problem
        self._last = None

    def hessian(self, v: np.ndarray) -> HessianOperator:
        """``Pi S Pi`` at ``v`` (:func:`pdeflow.analysis.hessian.spectrum.hessian_operator`)."""
        return hessian_operator(self.problem, self.omega(v), self.mass)

    @property
    def products(self) -> int:
        """The search's Jacobian-vector products (exact and difference), the certification's apart."""
        calls = self._search_calls()
        return calls["jvp_exact"] + calls["jvp_difference"]

    @property
    def wall(self) -> float:
        return time.perf_counter() - self.start

    @property
    def cost(self) -> float:
        """The search's cost so far in grad Phi evaluations (:func:`pdeflow.core.problem.gradient_equivalents` of
        its gradients and products)."""
        return gradient_equivalents(self._search_calls())

    @property
    def exhausted(self) -> bool:
        """Past ``max_wall`` seconds or ``max_cost`` gradient equivalents."""
        return self.wall > self.max_wall or self.cost > self.max_cost

    def stopped(self) -> str:
        """Which limit stopped the search, for its message."""
        if self.cost > self.max_cost:
            return f"stopped by the budget of {self.max_cost:g} gradient equivalents"
        return f"stopped after {self.max_wall:g} s"


@dataclass
class StationaryPoint:
    """What a search found: the point ``omega`` [N, k] (masses ``mass`` [N]), its energy and dissipation, the
    dissipation ``initial_dissipation`` I(0) the target is relative to (``target = ratio * I(0)``), whether it
    ``converged`` (I <= target) and, for a minimum, is ``certified``; the spectrum ends there and the
    ``certificate`` of its sign (:class:`pdeflow.analysis.certificate.certificate.Certificate`); the cost
    (``gradients`` in all, JVP ``products`` of the search and ``certify_products`` of the spectrum, ``wall``
    seconds in all of which ``certify_wall`` for the spectrum); the history per iteration
    (``energy``, ``dissipation``, cumulative ``products`` and ``gradients``) and a ``message``."""
    kind: str
    omega: np.ndarray
    mass: np.ndarray
    energy: float
    dissipation: float
    start_energy: float
    start_dissipation: float
    initial_dissipation: float
    target: float
    converged: bool
    spectrum: SpectrumEnds
    certificate: Certificate
    gradients: int
    products: int
    wall: float
    certify_products: int
    certify_wall: float
    iterations: int
    message: str
    history: dict[str, np.ndarray] = field(default_factory=dict)
    route: str = "lbfgs"

    @property
    def morse_index_lower(self) -> int:
        """Negative eigenvalues proven: by interlacing from any block's Ritz values, or by the dense bound."""
        return max(self.spectrum.morse_index_lower, self.certificate.index_lower)

    @property
    def lambda_min(self) -> float:
        """The lowest eigenvalue of S off the symmetry directions, as computed: the certificate's
        (:attr:`pdeflow.analysis.certificate.certificate.Certificate.estimate`, inside its bracket) when it computed
        one, else
        the lowest converged Ritz value (NaN when none converged). The spectrum's lowest converged value alone can
        be a higher eigenvalue: a short Lanczos run on the live heads beside the origin block's exact values."""
        estimate = self.certificate.estimate
        return estimate if math.isfinite(estimate) else self.spectrum.lambda_min

    @property
    def certified(self) -> bool:
        """A local minimum: converged, and every eigenvalue of S off the symmetry directions proven positive
        (:attr:`pdeflow.analysis.certificate.certificate.Certificate.proven_minimum`)."""
        return bool(self.converged and self.certificate.proven_minimum)

    @property
    def gradient_equivalents(self) -> float:
        """The whole cost (search and certification) in grad Phi evaluations
        (:func:`pdeflow.core.problem.gradient_equivalents`; every product exact)."""
        return gradient_equivalents({"gradient": self.gradients, "jvp_exact": self.products + self.certify_products})

    @property
    def verdict(self) -> str:
        """:func:`verdict_of` the point."""
        return verdict_of(self.converged, self.spectrum, self.certificate)


def verdict_of(converged: bool, spectrum: SpectrumEnds, certificate: Certificate) -> str:
    """``not converged``, ``local minimum`` (proven by the certificate), ``saddle of index >= n`` (proven, by
    interlacing or the dense bound), :data:`pdeflow.analysis.certificate.certificate.LANCZOS_VERDICT` (no dense proof,
    no Ritz
    value negative and every block's lowest converged positive), or why none is established."""
    if not converged:
        return "not converged"
    if certificate.proven_minimum:
        return "local minimum"
    index = max(spectrum.morse_index_lower, certificate.index_lower)
    if index > 0:
        return f"saddle of index >= {index}"
    if certificate.kind not in PROOFS and spectrum.no_negative_found:
        return LANCZOS_VERDICT.format(m=certificate.lanczos_steps)
    return "stationary, index not established (lowest eigenvalue not converged or not resolved from 0)"


class _History:
    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.rows: list[tuple[float, float, int, int, float]] = []

    def add(self, energy: float, dissipation: float) -> None:
        c = self.counter
        self.rows.append((energy, dissipation, c.products, c.gradients, c.wall))

    def arrays(self) -> dict[str, np.ndarray]:
        a = np.array(self.rows, dtype=float).reshape(-1, 5)
        return {"energy": a[:, 0], "dissipation": a[:, 1], "products": a[:, 2].astype(np.int64),
                "gradients": a[:, 3].astype(np.int64), "wall": a[:, 4]}


def newton_step(op: scipy.sparse.linalg.LinearOperator, g: np.ndarray, eta: float,
                maxiter: int = MINRES_MAXITER) -> np.ndarray:
    """``p`` [n] with ``|op p + g| <= eta |g|`` (or the smallest residual within ``maxiter`` products), the
    minimal-residual iterate of the Krylov space of ``op`` and ``g``: MINRES's iterate, computed by scipy's GMRES
    without restarts. For a symmetric ``op`` the two agree in exact arithmetic, but scipy's MINRES also stops when
    ``|r| <= rtol (|A| |p| + |g|)`` or on its least-squares test, which near a nearly singular ``op`` (large
    ``|p|``) end the solve far above the residual asked for (measured: 7 products, relative residual 0.41 where
    0.01 was asked); GMRES tests the residual itself and reorthogonalises fully. Memory: ``maxiter`` vectors."""
    p, _ = scipy.sparse.linalg.gmres(op, -g, rtol=eta, atol=0.0, restart=maxiter, maxiter=1)
    return p


def _newton(c: Counter, v: np.ndarray, E: float, g: np.ndarray, hist: _History, target: float, max_newton: int,
            say: Progress) -> tuple[np.ndarray, float, np.ndarray, float, int, str]:
    """Newton steps on ``g(v) = 0`` from ``v`` (energy ``E``, gradient ``g``) until ``I <= target``, ``max_newton``
    steps or the limits of ``c`` (:attr:`Counter.exhausted`): each step's solve by :func:`newton_step` to a relative
    residual ``min(ETA_MAX, |g| / |g_start|)``, globalised by backtracking on I. Returns the point, E, g, I, the
    steps and why they stopped."""
    I = float(g @ g)
    g0 = math.sqrt(I)
    it = 0
    while True:
        if I <= target:
            message = f"I = {I:.3g} <= {target:.3g} after {it} Newton steps"
            break
        if it == max_newton:
            message = f"{max_newton} Newton steps without reaching I <= {target:.3g}"
            break
        if c.exhausted:
            message = f"{c.stopped()} ({it} Newton steps) without reaching I <= {target:.3g}"
            break
        it += 1
        eta = min(ETA_MAX, math.sqrt(I) / g0)
        op = c.hessian(v)
        # g is orthogonal to the symmetry directions (E is constant along them) up to rounding; left in, that
        # rounding is an inconsistent part of a singular system that a minimal-residual solve amplifies
        p = newton_step(op, op.symmetry.project(g), eta)
        alpha, accepted = 1.0, False
        for _ in range(LINE_SEARCH):
            E_new, g_new = c.energy_and_gradient(v + alpha * p)
            I_new = float(g_new @ g_new)
            if np.isfinite(I_new) and I_new <= (1.0 - 2.0 * ARMIJO * alpha * (1.0 - eta)) * I:
                accepted = True
                break
            alpha *= 0.5
        if not accepted:
            message = f"the line search on I failed at I = {I:.3g} (Newton step {it})"
            break
        v, E, g, I = v + alpha * p, E_new, g_new, I_new
        hist.add(E, I)
        say(f"Newton {it}: E = {E:.12g}, I = {I:.3e}, step {alpha:g} x |p| = {np.linalg.norm(p):.3g}, "
            f"{c.products} products")
    return v, E, g, I, it, message


def nearest(problem: Problem, omega: np.ndarray, mass: np.ndarray, initial_dissipation: float, *,
            ratio: float = DISSIPATION_RATIO, max_newton: int = MAX_NEWTON, krylov_dim: int = KRYLOV_DIM,
            max_wall: float = math.inf, max_cost: float = math.inf, dense_limit: int = DENSE_LIMIT,
            progress: Progress | None = None) -> StationaryPoint:
    """The stationary point next to ``omega`` [N, k] by Newton-Krylov on the velocity field (module docstring),
    until ``I <= ratio * initial_dissipation`` (or ``max_newton`` steps, ``max_wall`` seconds or ``max_cost``
    gradient equivalents: then the point reached is reported, not converged), then the spectrum there
    (``krylov_dim`` Lanczos steps) and its certificate (:func:`pdeflow.analysis.certificate.certificate.certify` with
    ``dense_limit``)."""
    say = progress or (lambda msg: None)
    c = Counter(problem, mass, np.shape(omega), max_wall=max_wall, max_cost=max_cost)
    target = ratio * initial_dissipation
    v = c.coordinates(omega)
    E, g = c.energy_and_gradient(v)
    I0 = I = float(g @ g)
    hist = _History(c)
    hist.add(E, I)
    v, E, g, I, it, message = _newton(c, v, E, g, hist, target, max_newton, say)
    return _finish(problem, "nearest", c, v, E, I, I0, initial_dissipation, target, it, message, hist,
                   (krylov_dim, dense_limit), say)


def polish(problem: Problem, omega: np.ndarray, mass: np.ndarray, target: float, *, max_newton: int = MAX_NEWTON,
           progress: Progress | None = None) -> tuple[np.ndarray, float, float, int, int, str]:
    """``nearest``'s Newton-Krylov steps (:func:`_newton`) from a point near a stationary one (``omega`` [N, k],
    ``mass`` [N]) until ``I <= target`` absolutely, or until a step no longer lowers I (the rounding floor). Near a
    minimum with a slow end ``lambda_min`` the point is off by up to ``sqrt(I) / lambda_min`` (mass-weighted) along
    the slow directions, which a rate check with perturbations of size eps must see far below eps; Newton converges
    quadratically there, where a gradient search crawls. Returns (point [N, k], E, I, Newton steps, products, why
    they stopped)."""
    say = progress or (lambda msg: None)
    c = Counter(problem, mass, np.shape(omega))
    v = c.coordinates(omega)
    E, g = c.energy_and_gradient(v)
    hist = _History(c)
    hist.add(E, float(g @ g))
    v, E, g, I, it, message = _newton(c, v, E, g, hist, target, max_newton, say)
    return c.omega(v), E, I, it, c.products, message


def heads_at_origin(omega: np.ndarray) -> np.ndarray:
    """The heads [N] (bool) with ``|omega_i| <= FREEZE max_j |omega_j|``: dead heads, held at 0 by the search."""
    norms = np.linalg.norm(omega, axis=1)
    return norms <= FREEZE * float(norms.max())


def with_heads_at_origin(v: np.ndarray, shape: tuple[int, int], heads: np.ndarray) -> np.ndarray:
    """``v`` [N k] with the chosen heads (``heads`` [N], bool) set exactly to 0: heads a step sent below the threshold
    are dead, and a dead head sits at the origin (a new array)."""
    w = np.array(v, dtype=float).reshape(shape)
    w[heads] = 0.0
    return w.ravel()


def _lbfgs_live_heads(c: Counter, v: np.ndarray, target: float, max_iter: int, hist: _History,
                      on_iterate: Callable[[np.ndarray], None] | None, say: Progress,
                      awake: np.ndarray, precondition: Preconditioning | None = None,
                      refresh: int = 0) -> tuple[LbfgsResult, np.ndarray]:
    """L-BFGS on E over the live heads only, the others (:func:`heads_at_origin`, except ``awake`` [N]) set to 0
    and left out of the evaluations: a head at the origin stays there (:func:`origin_is_stationary`), its terms
    of E and Phi vanish, and an evaluation costs about a fixed part plus a share per live head (measured on
    longtime.toml, one thread: 33 ms for 128 heads, 20 ms for 55). Whenever :data:`FREEZE_GAIN` more heads have
    fallen below the threshold, the search starts again on the fewer live heads. Stops at ``I <= target``, after
    ``max_iter`` iterations in all, at the limits of ``c`` (:attr:`Counter.exhausted`), or when L-BFGS stalls.
    Whether the origin is a minimum for the dead heads is for the spectrum of the whole point to say (``classify``).
    ``precondition(omega_live, mass_live)``: ``P^-1`` for L-BFGS's ``H_0`` on the live heads
    (:func:`pdeflow.analysis.search.lbfgs.two_loop`), built at every start and, with ``refresh > 0``, again after that
    many
    iterations (the search then starts again). Returns the last L-BFGS result and the whole point ``v`` [N k]."""
    problem, (n_heads, k) = c.problem, c.shape
    hold = origin_is_stationary(problem, c.omega(v), c.mass)
    done, starts, entry = 0, 1, len(hist.rows)
    reason = [""]  # why the callback ended the search, for its message
    while True:
        frozen = heads_at_origin(c.omega(v)) & ~awake if hold else np.zeros(n_heads, dtype=bool)
        live = ~frozen
        cols = np.repeat(live, k)
        mass, root = c.mass[live], c.root[live]
        last: list = [None, 0.0, None]
        regrouped = [False]
        built = len(hist.rows)
        inverse = None if precondition is None else precondition(v[cols].reshape(-1, k) / root, mass)

        def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
            if last[0] is None or not np.array_equal(last[0], x):
                ev = problem.evaluate(x.reshape(-1, k) / root, mass)
                energy = float(ev.energy) if np.isfinite(ev.energy) else math.inf
                last[:] = [x.copy(), energy, (root * ev.grad_phi).ravel()]
            return last[1], last[2]

        def whole(x: np.ndarray) -> np.ndarray:
            out = np.zeros(n_heads * k)
            out[cols] = x
            return out

        def record(x: np.ndarray) -> None:
            e, grad = fun(x)  # evaluated by the line search already: from memory
            dissipation = float(grad @ grad)  # the frozen heads' gradients vanish
            hist.add(e, dissipation)
            if on_iterate is not None:
                on_iterate(c.omega(whole(x)))
            if dissipation <= target:
                reason[0] = f"I = {dissipation:.3g} <= {target:.3g} after {len(hist.rows) - entry} iterations"
                raise StopIteration
            if c.exhausted:
                reason[0] = c.stopped()
                raise StopIteration
            if len(hist.rows) % 100 == 0:
                say(f"iteration {len(hist.rows) - 1}: E = {e:.12g}, I = {dissipation:.3e}, {int(live.sum())} live "
                    f"heads, {c.gradients} gradients, {c.wall:.1f} s")
                if hold and np.sum(heads_at_origin(c.omega(whole(x)))[live]) >= FREEZE_GAIN:
                    regrouped[0] = True
                    raise StopIteration
                if inverse is not None and refresh > 0 and len(hist.rows) - built >= refresh:
                    regrouped[0] = True  # the blocks have aged: built again where the search is
                    raise StopIteration

        x0 = v[cols]
        found = lbfgs(fun, x0, memory=LBFGS_MEMORY, max_iter=max_iter - done, callback=record, precondition=inverse)
        done += found.nit
        v = whole(found.x)
        if not regrouped[0] or done >= max_iter:
            if reason[0]:
                found = replace(found, message=reason[0])
            elif done >= max_iter and starts > 1:  # the limit counts the iterations of every start
                found = replace(found, message=f"{done} iterations (the limit, over {starts} starts)")
            return found, v
        starts += 1
        say(f"{int(np.sum(heads_at_origin(c.omega(v))))} heads at the origin: L-BFGS again on the others")


def minimum(problem: Problem, omega: np.ndarray, mass: np.ndarray, initial_dissipation: float, *,
            ratio: float = DISSIPATION_RATIO, method: str = "lbfgs", max_iter: int = 0, max_restarts: int = 5,
            krylov_dim: int = KRYLOV_DIM, escape: float = 0.0, max_wall: float = math.inf,
            max_cost: float = math.inf, dense_limit: int = DENSE_LIMIT, progress: Progress | None = None,
            on_iterate: Callable[[np.ndarray], None] | None = None) -> StationaryPoint:
    """A local minimum of E from ``omega`` [N, k] (module docstring): a descent search (``method``: ``"lbfgs"``,
    :func:`pdeflow.analysis.search.lbfgs.lbfgs` with :data:`LBFGS_MEMORY` pairs, finished by Newton steps on I if it
    stalls, or ``"trust-region"``, trust-region Newton-Krylov with ``hessp`` the projected S) until ``I <= ratio
    * initial_dissipation``, then the spectrum and its certificate (``dense_limit``); while a negative
    eigenvalue is proven (at most ``max_restarts`` times) the search restarts from the point moved along a direction
    of negative curvature (the dense eigenvector, else the lowest Ritz vector) by ``escape`` (0: by
    ``sqrt(2 |lambda| / lambda_max) max(1, |v|) / 10``), whichever sign lowers E. ``max_iter`` bounds the
    iterations of each search (0: :data:`MAX_ITER` of the method). After ``max_wall`` seconds, or once the search
    has cost ``max_cost`` gradient equivalents (:attr:`Counter.cost`, checked after every iteration: the same
    iterate on every machine), the search stops at its latest iterate (reported, not converged; after the budget
    without its spectrum, :func:`no_spectrum`). ``on_iterate(omega)`` is called with every iterate [N, k] (to
    keep the latest, say)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    say = progress or (lambda msg: None)
    c = Counter(problem, mass, np.shape(omega), max_wall=max_wall, max_cost=max_cost)
    target = ratio * initial_dissipation
    v = c.coordinates(omega)
    E, g = c.energy_and_gradient(v)
    I0 = float(g @ g)
    hist = _History(c)
    hist.add(E, I0)
    cache: dict[str, object] = {}

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        e, grad = c.energy_and_gradient(x)
        if not np.isfinite(e):
            return math.inf, np.zeros_like(grad)
        return e, grad

    def hessp(x: np.ndarray, p: np.ndarray) -> np.ndarray:
        if cache.get("x") is None or not np.array_equal(cache["x"], x):
            cache["x"], cache["op"] = x.copy(), c.hessian(x)
        return cache["op"].matvec(p)

    def record(x: np.ndarray) -> None:
        e, grad = c.energy_and_gradient(x)  # evaluated by the minimiser already: from memory
        dissipation = float(grad @ grad)
        hist.add(e, dissipation)
        if on_iterate is not None:
            on_iterate(c.omega(x))
        if dissipation <= target or c.exhausted:
            raise StopIteration  # scipy ends the minimisation at this iterate
        if len(hist.rows) % (100 if method == "lbfgs" else 1) == 0:
            say(f"iteration {len(hist.rows) - 1}: E = {e:.12g}, I = {dissipation:.3e}, {c.products} products, "
                f"{c.gradients} gradients, {c.wall:.1f} s")

    kwargs = {"method": "trust-krylov", "hessp": hessp,
              "options": {"gtol": math.sqrt(target), "maxiter": max_iter or MAX_ITER[method]}}
    iterations, message = 0, ""
    awake = np.zeros(c.shape[0], dtype=bool)
    spectrum, certificate = None, None
    for attempt in range(max_restarts + 1):
        start = len(hist.rows)
        if (I0 > target or attempt > 0) and method == "lbfgs":
            found, v = _lbfgs_live_heads(c, v, target, max_iter or MAX_ITER[method], hist, on_iterate, say, awake)
            message = f"{method}: {found.message}"
            if found.stalled and not c.exhausted:
                # E's decrease along a step has fallen to E's rounding before I reached the target: Newton's
                # steps, globalised on I (known to a relative precision E - E* is not), finish the search
                E, g = fun(v)
                say(f"{method} stalled ({found.message}) at I = {float(g @ g):.3e}: Newton steps")
                v, E, g, _, taken, newton_message = _newton(c, v, E, g, hist, target, MAX_NEWTON, say)
                message += f"; {taken} Newton steps: {newton_message}"
        elif I0 > target or attempt > 0:
            res = scipy.optimize.minimize(fun, v, jac=True, callback=record, **kwargs)
            v = res.x
            message = f"{method}: {res.message}"
        iterations += len(hist.rows) - start
        E, g = fun(v)
        I = float(g @ g)
        say(f"{method}: E = {E:.12g}, I = {I:.3e} after {iterations} iterations, {c.gradients} gradients, "
            f"{c.products} products")
        if c.exhausted:
            message = f"{c.stopped()} ({iterations} iterations) at I = {I:.3g} > {target:.3g}"
        if I > target:
            break
        message = f"{method}: I = {I:.3g} <= {target:.3g}"
        spectrum, certificate = classify(problem, c, v, krylov_dim, say, dense_limit)
        if max(spectrum.morse_index_lower, certificate.index_lower) == 0 or attempt == max_restarts:
            break
        lam, x = descent_direction(spectrum, certificate)
        size = escape or math.sqrt(2.0 * abs(lam) / max(spectrum.lambda_max, 1e-300)) * max(1.0, float(
            np.linalg.norm(v))) / 10.0
        trials = [(fun(v + s * size * x)[0], s) for s in (1.0, -1.0)]
        best = min(trials)
        say(f"escaping along the eigenvector of {lam:.4g}: step {size:.3g}, E {E:.12g} -> {best[0]:.12g}")
        v = v + best[1] * size * x
        # the heads the escape moves take part in the next search, however small they still are
        awake = np.linalg.norm(x.reshape(c.shape), axis=1) > AWAKE * float(np.abs(x).max())
        spectrum, certificate = None, None
    found = None if spectrum is None or certificate is None else (spectrum, certificate)
    return _finish(problem, "minimum", c, v, E, I, I0, initial_dissipation, target, iterations, message, hist,
                   (krylov_dim, dense_limit), say, found=found)


def descent_direction(spectrum: SpectrumEnds, certificate: Certificate) -> tuple[float, np.ndarray]:
    """A proven negative curvature and its unit direction [N k] (v-coordinates): the lowest dense eigenpair when
    the certificate is dense, else the lowest Ritz pair (negative: its Rayleigh quotient is the curvature along
    it, converged or not)."""
    if certificate.kind == BY_DENSE:
        return float(certificate.values[0]), certificate.vectors[:, 0]
    return float(spectrum.lowest_ritz), np.asarray(spectrum.lowest_ritz_vector)


def classify(problem: Problem, c: Counter, v: np.ndarray, krylov_dim: int, say: Progress,
             dense_limit: int = DENSE_LIMIT) -> tuple[SpectrumEnds, Certificate]:
    """The spectrum ends at ``v`` (:func:`pdeflow.analysis.hessian.spectrum.spectrum_ends`, ``krylov_dim`` Lanczos
    steps), the
    run continued up to :data:`KRYLOV_GROWTH` times the steps until the lowest Ritz value has converged and is
    resolved from 0 (:data:`pdeflow.analysis.hessian.spectrum.RESOLVED`; certification rests on its sign): near a
    minimum
    the lowest eigenvalues sit at 1e-6 of lambda_max and converge last (measured on longtime.toml: none of them
    in 300 steps, 7.4e-5 with residual 1e-14 in 900); then its certificate
    (:func:`pdeflow.analysis.certificate.certificate.certify`, ``dense_limit``). Returns the spectrum and the
    certificate; their calls are ``c``'s certification (:attr:`Counter.certification`), their seconds its
    ``certify_wall``."""
    t0 = time.perf_counter()
    with c.certification:
        spectrum = spectrum_ends(problem, c.omega(v), c.mass, krylov_dim=krylov_dim,
                                 max_dim=KRYLOV_GROWTH * krylov_dim, split_origin=True)
        certificate = certify(problem, c.omega(v), c.mass, spectrum, dense_limit=dense_limit)
    say(f"spectrum: lowest {spectrum.lowest[:3]}, {spectrum.products} Lanczos steps; {certificate.describe()}")
    c.certify_wall += time.perf_counter() - t0
    return spectrum, certificate


def no_spectrum(n: int) -> SpectrumEnds:
    """The spectrum of a point where none was computed: no converged Ritz value (``lowest_vectors`` [n, 0])."""
    empty = np.empty(0)
    return SpectrumEnds(lowest=empty, lowest_residual=empty, highest=empty, highest_residual=empty,
                        morse_index_lower=0, n_symmetry=0, products=0, lowest_vectors=np.empty((n, 0)))


def _finish(problem: Problem, kind: str, c: Counter, v: np.ndarray, E: float, I: float, I_start: float,
            initial_dissipation: float, target: float, iterations: int, message: str, hist: _History,
            spectral: tuple[int, int], say: Progress,
            found: tuple[SpectrumEnds, Certificate] | None = None) -> StationaryPoint:
    """The point of a search with its spectrum and certificate (``found``, else computed with ``spectral`` =
    (Lanczos steps, dense limit))."""
    n = c.shape[0] * c.shape[1]
    if found is None and I > target and c.cost > c.max_cost:
        # the budget bounds the whole search: a point it stopped is "not converged" whatever its spectrum, so none
        # is computed (at k = 256 the 300 Lanczos products would cost 750 gradients more)
        spectrum = no_spectrum(n)
        certificate = not_stationary(None, n, spectral[1])
        message += "; spectrum not computed (the budget is spent)"
    elif found is None and I > target:
        # the Lanczos ends still say whether the search stopped near a saddle; a dense certificate would only
        # restate "not converged" (measured on longtime.toml's 58 live heads: minutes of eigh and 8 GB)
        spectrum, _ = classify(problem, c, v, spectral[0], say, dense_limit=0)
        certificate = not_stationary(spectrum, n, spectral[1])
    elif found is None:
        spectrum, certificate = classify(problem, c, v, spectral[0], say, spectral[1])
    else:
        spectrum, certificate = found
    point = StationaryPoint(kind=kind, omega=c.omega(v), mass=c.mass.copy(), energy=E, dissipation=I,
                            start_energy=hist.rows[0][0], start_dissipation=I_start,
                            initial_dissipation=initial_dissipation, target=target, converged=bool(I <= target),
                            spectrum=spectrum, certificate=certificate, gradients=c.gradients,
                            products=c.products, wall=c.wall, certify_products=c.certification.products,
                            certify_wall=c.certify_wall, iterations=iterations, message=message, history=hist.arrays())
    say(f"{kind}: {point.verdict}; E = {E:.12g}, I = {I:.3e}")
    return point


# ---- the result file ------------------------------------------------------------------------------
SCHEMA, SCHEMA_VERSION = STATIONARY.schema, STATIONARY.version  # the table: pdeflow.io.result_schema
SCALARS = ("kind", "source", "frame", "time", "energy", "dissipation", "start_energy", "start_dissipation",
           "initial_dissipation", "ratio", "target", "converged", "certified", "verdict", "morse_index_lower",
           "n_symmetry", "lambda_min", "lambda_max", "lowest_ritz", "lowest_ritz_residual", "certificate",
           "certificate_text", "lambda_min_lower", "lambda_min_upper", "certificate_size", "certificate_delta",
           "distance_to_minimum", "lambda_min_lower_at_minimum", "lambda_min_upper_at_minimum",
           "lanczos_steps", "dense_limit", "iterations",
           "gradients", "products", "certify_products", "gradient_equivalents", "jvp_gradients", "wall",
           "certify_wall", "message", "route", "start_rule")
ROUTES = ("structured", "lbfgs")  # minimum's routes: pdeflow.analysis.search.structured_minimum, or minimum() here


def write_stationary(path: str | Path, point: StationaryPoint, cfg: Config, problem: Problem, *, source: str,
                     frame: int, time_of_frame: float, ratio: float, start_rule: str = "") -> None:
    """Write the result of a search all or nothing (:func:`pdeflow.io.result_files.new_result_file`), root attribute
    ``schema = "pdeflow-stationary"``, the problem in ``/model`` and ``/data`` as in a trajectory, and
    ``/stationary``: ``omega`` [N, k] and ``mass`` [N] (the point), the converged spectrum ends ``lowest``,
    ``lowest_residual``, ``highest``, ``highest_residual``, the ``unstable_directions`` [m, N, k] (unit Ritz
    vectors of the converged negative eigenvalues, in the mass-weighted coordinates ``v = M^(1/2) omega``), the
    ``lowest_directions`` [a, N, k] (the unit Ritz vectors of the :data:`LOWEST_DIRECTIONS` lowest converged values:
    one product re-derives a value and its residual from the file),
    ``history/{energy, dissipation, products, gradients, wall}`` per iteration, and the attributes
    :data:`SCALARS` (``source``, ``frame``, ``time``: the trajectory and frame the search started from; costs in
    gradients, JVP products and wall seconds, the certification's separately; ``certificate``: its kind,
    :data:`pdeflow.analysis.certificate.certificate.PROOFS` the proofs, ``certificate_text`` what it establishes,
    ``lambda_min_lower`` / ``lambda_min_upper`` the bounds on lambda_min at the point, ``distance_to_minimum``
    (``sqrt(I) / lambda_min_lower``) and ``lambda_min_lower_at_minimum`` / ``lambda_min_upper_at_minimum`` the
    bracket widened to the minimum the point approximates (an estimate, NaN when not made:
    :mod:`pdeflow.analysis.certificate.about_minimum`), ``certificate_size`` the dense order,
    ``certificate_delta`` its eigenvalue bound, ``lanczos_steps``, ``dense_limit``; ``route``: the search taken,
    :data:`ROUTES` (a nearest point's: ``"newton"``); ``start_rule``: what fixed the start frame)."""
    from ...io.result_files import new_result_file

    s, cert = point.spectrum, point.certificate
    values = {"kind": point.kind, "source": source, "frame": int(frame), "time": float(time_of_frame),
              "energy": point.energy, "dissipation": point.dissipation, "start_energy": point.start_energy,
              "start_dissipation": point.start_dissipation, "initial_dissipation": point.initial_dissipation,
              "ratio": float(ratio), "target": point.target, "converged": point.converged,
              "certified": point.certified, "verdict": point.verdict, "morse_index_lower": point.morse_index_lower,
              "n_symmetry": s.n_symmetry, "lambda_min": point.lambda_min, "lambda_max": s.lambda_max,
              "lowest_ritz": s.lowest_ritz, "lowest_ritz_residual": s.lowest_ritz_residual,
              "certificate": cert.kind, "certificate_text": cert.describe(), "lambda_min_lower": cert.lower,
              "lambda_min_upper": cert.upper, "certificate_size": cert.size, "certificate_delta": cert.delta,
              "distance_to_minimum": cert.distance, "lambda_min_lower_at_minimum": cert.minimum_bracket[0],
              "lambda_min_upper_at_minimum": cert.minimum_bracket[1],
              "lanczos_steps": cert.lanczos_steps, "dense_limit": cert.dense_limit,
              "iterations": point.iterations, "gradients": point.gradients, "products": point.products,
              "certify_products": point.certify_products, "gradient_equivalents": point.gradient_equivalents,
              "jvp_gradients": JVP_COST, "wall": point.wall, "certify_wall": point.certify_wall,
              "message": point.message, "route": point.route if point.kind == "minimum" else "newton",
              "start_rule": start_rule}
    unstable = (s.lowest + s.lowest_residual) < 0
    with new_result_file(path, SCHEMA, SCHEMA_VERSION, cfg, problem=problem) as f:
        g = f.create_group("stationary")
        for key in SCALARS:
            g.attrs[key] = values[key]
        g["omega"], g["mass"] = point.omega, point.mass
        g["lowest"], g["lowest_residual"] = s.lowest, s.lowest_residual
        g["highest"], g["highest_residual"] = s.highest, s.highest_residual
        g["unstable_directions"] = s.lowest_vectors[:, unstable].T.reshape((-1,) + point.omega.shape)
        g.create_dataset("lowest_directions", data=s.lowest_vectors[:, :LOWEST_DIRECTIONS].T.reshape(
            (-1,) + point.omega.shape), compression="gzip")
        h = g.create_group("history")
        for key, column in point.history.items():
            h[key] = column


def is_stationary_file(path: str | Path) -> bool:
    """Whether ``path`` is an HDF5 file written by :func:`write_stationary` (False for anything else)."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            schema = f.attrs.get("schema")
    except OSError:
        return False
    return (schema.decode() if isinstance(schema, bytes) else schema) == SCHEMA


def read_stationary(path: str | Path) -> dict[str, Any]:
    """The attributes and arrays of a result file (:func:`write_stationary`), ``history`` as a dict of columns,
    ``config`` the run's configuration (TOML text);
    TrajectoryError (one line) if it is not one."""
    import h5py

    from ...io.file_access import TrajectoryError
    from ...io.file_access import plain as _plain

    try:
        with h5py.File(path, "r") as f:
            if _plain(f.attrs.get("schema")) != SCHEMA:
                raise TrajectoryError(f"{path}: not a pdeflow stationary-point result (schema "
                                      f"{_plain(f.attrs.get('schema'))!r})")
            g = f["stationary"]
            out: dict[str, Any] = {k: _plain(v) for k, v in g.attrs.items()}
            for key in ("omega", "mass", "lowest", "lowest_residual", "highest", "highest_residual",
                        "unstable_directions"):
                out[key] = g[key][()]
            if "lowest_directions" in g:  # absent in files written before it was stored
                out["lowest_directions"] = g["lowest_directions"][()]
            out["history"] = {k: g["history"][k][()] for k in g["history"].keys()}
            out["created"] = _plain(f.attrs.get("created"))
            out["config"] = str(_plain(f.attrs["config"]))
    except (OSError, KeyError) as exc:
        raise TrajectoryError(f"{path}: unreadable stationary-point result ({str(exc)[:80]})") from None
    return out


def index_text(r: dict[str, Any]) -> str:
    """The Morse index a result file ``r`` (:func:`read_stationary`) establishes: ``0`` when its certificate proves
    every eigenvalue off the symmetry directions positive (lower bound on lambda_min > 0), else ``>= m``, the
    negative eigenvalues proven (m > 0), or that it is not established; none at a point that is not stationary."""
    if bool(r.get("certified")) and float(r.get("lambda_min_lower", math.nan)) > 0:
        return f"0 (proven: lambda_min >= {float(r['lambda_min_lower']):.6g} > 0)"
    index = int(r["morse_index_lower"])
    if not bool(r.get("converged", True)):
        there = f"; S has >= {index} negative eigenvalues there (proven)" if index else ""
        return f"none: the point is not stationary{there}"
    if index == 0:
        return "not established (no negative eigenvalue proven, none excluded)"
    return f">= {index} (negative eigenvalues proven)"


def lambda_min_text(r: dict[str, Any]) -> str:
    """``lambda_min`` of a result file ``r`` with what it is: inside the certificate's bracket, or an upper bound
    (a converged Ritz value), or not computed."""
    lam, lower, upper = (float(r.get(key, math.nan)) for key in ("lambda_min", "lambda_min_lower", "lambda_min_upper"))
    if stored_lambda_min(r)[1]:  # a file written before the certificate's value was stored as lambda_min
        return (f"in [{lower:.10g}, {upper:.10g}] (the certificate's bracket; the file's lambda_min, {lam:.6g}, lies "
                "outside it: the lowest converged Ritz value, stored by files before 2026-12-05)")
    if not math.isfinite(lam):
        return "not computed (no Ritz value converged)"
    if math.isfinite(lower):
        low, high = (float(r.get(key, math.nan)) for key in ("lambda_min_lower_at_minimum",
                                                             "lambda_min_upper_at_minimum"))
        about = (f"; at the minimum the point approximates in [{low:.10g}, {high:.10g}] (estimate: the bracket "
                 f"widened over the distance sqrt(I) / lambda_min = {float(r['distance_to_minimum']):.2g})"
                 if math.isfinite(low) else "")
        return f"{lam:.10g}, in the certificate's bracket [{lower:.10g}, {upper:.10g}] at this point{about}"
    return f"{lam:.10g} (the lowest converged Ritz value: an upper bound)"


def format_stationary(path: str | Path, r: dict[str, Any]) -> str:
    """A short human summary of a result file (``pdeflow info``)."""
    def values(v: np.ndarray, res: np.ndarray) -> str:
        return ", ".join(f"{x:+.6g} (+- {e:.1e})" for x, e in zip(v, res)) or "none converged"

    N, k = np.shape(r["omega"])
    lines = [f"file        {path}",
             f"stationary  {r['kind']} from frame {r['frame']} (t = {r['time']:.6g}) of {r['source']}",
             f"point       N = {N}, k = {k}: {r['verdict']}",
             f"energy      {r['energy']:.12g} (start {r['start_energy']:.12g})",
             f"dissipation {r['dissipation']:.4g} = {r['dissipation'] / r['initial_dissipation']:.3g} I(0) "
             f"(target {r['ratio']:.3g} I(0), I(0) = {r['initial_dissipation']:.6g}; "
             f"start {r['start_dissipation']:.4g})",
             f"index       {index_text(r)}; {r['n_symmetry']} symmetry directions removed",
             f"certificate {r.get('certificate_text', 'none stored (a file from before certificates)')}",
             f"lambda_min  {lambda_min_text(r)}",
             f"low Ritz    {values(r['lowest'][:6], r['lowest_residual'][:6])}",
             f"highest     {values(r['highest'][-3:], r['highest_residual'][-3:])}",
             f"cost        {r['gradients']} gradients + {r['products']} JVP products (search) + "
             f"{r['certify_products']} (spectrum) = {r['gradient_equivalents']:.0f} gradient equivalents "
             f"(JVP = {r['jvp_gradients']:g} gradients); wall {r['wall']:.1f} s, spectrum {r['certify_wall']:.1f} s",
             f"status      {r['message']}"]
    if "route" in r:  # absent in files written before routes were recorded
        lines.insert(2, f"route       {r['route']}; start: {r.get('start_rule') or 'not recorded'}")
    return "\n".join(lines)


__all__ = ["DISSIPATION_RATIO", "KINDS", "LBFGS_MEMORY", "METHODS", "ROUTES", "SCHEMA",
           "StationaryPoint", "format_stationary", "index_text", "is_stationary_file", "lambda_min_text", "minimum",
           "nearest", "read_stationary", "verdict_of", "write_stationary"]
