"""What a trajectory says about the theory: energy identity, optimality gap, PL / KL rates, head structure.

All quantities follow MODEL.md ("Quantities every run can report"):

- energy identity residual ``r(t) = E(t) - E(t0) + int_{t0}^t I(u) du`` (trapezoid rule), zero for the exact
  flow; for a fixed-step solver it is ``O(dt^2)`` from the quadrature plus the solver's own error;
- optimality gap ``G(rho) = int Phi d rho - min_{omega in Omega} Phi(omega; rho)`` on a compact set Omega
  (a ball ``|omega| <= R``, a box ``[-R, R]^k``, or the box of a grid run). With ``beta = inf`` the energy is
  convex in rho, so ``E(nu) >= E(rho) + int Phi_rho d(nu - rho) >= E(rho) - G(rho)`` for every measure nu on
  Omega: ``E - G`` is a lower bound on the best energy over measures on Omega (for any rho, in Omega or not);
- PL ratio ``mu(t) = I / (2 (E - E*))``; Kurdyka-Lojasiewicz exponent theta from the regression
  ``log I = log C + 2 (1 - theta) log(E - E*)`` (theta = 1/2: PL, exponential decay);
- head structure: clusters of heads in omega (single linkage), their masses, and the attention map of a
  representative head of each heavy cluster on a probe sequence.

The minimum of Phi (:func:`optimality_gap`) is searched in three stages, all on the feasible set:

1. k <= 3: Phi on a regular grid of ``grid_points`` per axis over the bounding box of Omega (points outside
   a ball are skipped), evaluated in batches; the best grid-local minima become starts. This search is
   called *exhaustive* (``GapResult.exhaustive``): it misses the global minimum only by the grid spacing.
2. starts (the grid minima, the particles - a mass-weighted subsample if there are many -, random points
   uniform in Omega, and ``extra_starts`` such as earlier minimizers) descend together by projected
   gradient with Barzilai-Borwein steps and Armijo backtracking; Phi and grad Phi of all active starts are
   one batched call per iteration (a single-point call costs almost as much as a batch). Without a grid
   (k > 3) the starts are cut by successive halving: every 10 iterations the moving starts above the
   median Phi stop, until no more than the polished few move.
3. the best few distinct results are polished with scipy: L-BFGS-B with the analytic gradient (box bounds).
   For a ball, L-BFGS-B runs in the bounding box from interior points; a point on the sphere, or one that
   L-BFGS-B carries outside the ball, is polished on the sphere through the smooth reparametrization
   ``omega = R u / |u|`` (L-BFGS-B without bounds in u), then, if Phi decreases inward there (negative
   multiplier), once more from just inside.
   Every candidate is projected onto Omega (clipped to the box, or scaled onto the ball) before Phi is
   evaluated, so the reported minimum is attained at a point of Omega: the reported gap never exceeds the
   true gap, and is an estimate (possibly too small) when the search is not exhaustive.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import Config, ConfigError, DiagnosticsConfig
from .model import split_theta
from .measure import Grid, entropy
from .problem import Problem
from .trajectory import (Trajectory, TrajectoryError, check_file, edit_trajectory, open_by_swmr_writer,
                         open_trajectory)

MAX_PARTICLE_STARTS = 32     # particles used as starts of the gap search (mass-weighted subsample beyond)
GRID_STARTS = 8              # best grid-local minima used as starts
POLISHED = 3                 # distinct results of the batched descent polished by scipy
DESCENT_ITERATIONS = 300
HALVING_ROUND = 10           # k > 3: iterations between two halvings of the moving starts
POLISH_ITERATIONS = 500
GRID_BATCH = 8192            # query points per Phi call on the exhaustive grid
ARMIJO = 1e-4
MAX_CLUSTER_POINTS = 2048    # heads entering the linkage (the rest join the nearest cluster)
GRID_CLUSTER_MASS = 1e-2     # grid cells lighter than this times the heaviest belong to no cluster
ANALYSIS_GROUP = "analysis"


# ================================================================================================
# rates: energy identity, PL, KL
# ================================================================================================
def energy_identity_residual(time: np.ndarray, energy: np.ndarray, dissipation: np.ndarray) -> np.ndarray:
    """``r_n = E(t_n) - E(t_0) + int_{t_0}^{t_n} I dt`` with the trapezoid rule: [n] -> [n] (``r_0 = 0``).

    Zero for the exact flow (the energy identity ``dE/dt = -I``); the trapezoid rule adds ``O(h^2)``.
    """
    time, energy, dissipation = (np.asarray(a, dtype=float) for a in (time, energy, dissipation))
    if time.size == 0:
        return np.zeros(0)
    steps = 0.5 * np.diff(time) * (dissipation[1:] + dissipation[:-1])
    return energy - energy[0] + np.concatenate([[0.0], np.cumsum(steps)])


def pl_constant(energy: np.ndarray, dissipation: np.ndarray, e_star: float) -> np.ndarray:
    """PL ratio ``mu = I / (2 (E - E*))`` elementwise: [n] -> [n], nan where ``E - E* <= 0``.

    For ``E - E* = A exp(-2 mu t)`` (PL with constant mu along the flow) it is mu at every time.
    """
    energy, dissipation = np.asarray(energy, dtype=float), np.asarray(dissipation, dtype=float)
    excess = energy - e_star
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(excess > 0, dissipation / (2.0 * excess), np.nan)


@dataclass(frozen=True)
class KLFit:
    """``log I = log C + q log(E - E*)`` with ``q = 2 (1 - theta)``: theta, its 95% interval, C, points used."""
    theta: float
    ci_low: float
    ci_high: float
    constant: float
    n_points: int

    def predicted_excess(self, time: np.ndarray, t0: float, excess0: float) -> np.ndarray:
        """``E - E*`` solving ``dE/dt = -C (E - E*)^q`` from ``excess0`` at ``t0``, at ``time`` >= t0.

        ``q = 1``: ``excess0 exp(-C (t - t0))``; else ``(excess0^(1-q) + (q - 1) C (t - t0))^(1/(1-q))``
        (a power law for q > 1, extinction in finite time for q < 1).
        """
        q, C = 2.0 * (1.0 - self.theta), self.constant
        dt = np.asarray(time, dtype=float) - t0
        if abs(q - 1.0) < 1e-12:
            return excess0 * np.exp(-C * dt)
        base = excess0 ** (1.0 - q) + (q - 1.0) * C * dt
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(base > 0, np.abs(base) ** (1.0 / (1.0 - q)), 0.0)


def _usable(energy: np.ndarray, dissipation: np.ndarray, e_star: float) -> np.ndarray:
    """Points where ``log(E - E*)`` and ``log I`` mean something: both positive and above rounding."""
    floor = 64 * np.finfo(float).eps * np.maximum(1.0, np.abs(energy))
    return np.isfinite(energy) & np.isfinite(dissipation) & (energy - e_star > floor) & (dissipation > 0)


def _window(n: int, window: float) -> slice:
    if not 0 < window <= 1:
        raise ValueError(f"window must be in (0, 1], got {window}")
    return slice(n - max(1, int(math.ceil(window * n))), n)


def kl_fit(energy: np.ndarray, dissipation: np.ndarray, e_star: float, window: float = 1.0) -> KLFit:
    """Least squares of ``log I`` on ``log(E - E*)`` over the last ``window`` fraction of the samples.

    theta = 1 - slope / 2; the interval is ``slope -/+ t_{0.975, n-2} se(slope)`` mapped to theta (the
    residuals of a smooth curve are not independent, so read it as a measure of fit, not a probability).
    Points with ``E - E*`` at rounding level or ``I = 0`` are dropped; fewer than 3 left gives nan.
    """
    energy, dissipation = np.asarray(energy, dtype=float), np.asarray(dissipation, dtype=float)
    sl = _window(energy.size, window) if energy.size else slice(0, 0)
    e, i = energy[sl], dissipation[sl]
    ok = _usable(e, i, e_star)
    n = int(ok.sum())
    if n < 3:
        return KLFit(math.nan, math.nan, math.nan, math.nan, n)
    x, y = np.log(e[ok] - e_star), np.log(i[ok])
    xm, ym = x.mean(), y.mean()
    sxx = float(np.sum((x - xm) ** 2))
    if sxx <= 0:
        return KLFit(math.nan, math.nan, math.nan, math.nan, n)
    slope = float(np.sum((x - xm) * (y - ym)) / sxx)
    intercept = ym - slope * xm
    rss = float(np.sum((y - intercept - slope * x) ** 2))
    from scipy import stats  # scipy submodules load lazily: `pdeflow run` imports this module

    se = math.sqrt(rss / (n - 2) / sxx) if n > 2 else math.inf
    half = float(stats.t.ppf(0.975, n - 2)) * se
    return KLFit(theta=1.0 - slope / 2.0, ci_low=1.0 - (slope + half) / 2.0, ci_high=1.0 - (slope - half) / 2.0,
                 constant=float(math.exp(intercept)), n_points=n)


def kl_exponent(energy: np.ndarray, dissipation: np.ndarray, e_star: float,
                window: float = 1.0) -> tuple[float, float, float]:
    """The KL exponent theta of ``I ~ C (E - E*)^(2 (1 - theta))`` and its interval: ``(theta, ci_low, ci_high)``.

    See :func:`kl_fit` (``window``: the last fraction of the samples used).
    """
    fit = kl_fit(energy, dissipation, e_star, window)
    return fit.theta, fit.ci_low, fit.ci_high


def fit_e_star(energy: np.ndarray, dissipation: np.ndarray) -> float:
    """The limit energy ``E*`` < min E that makes ``log I`` most nearly affine in ``log(E - E*)``.

    Profile least squares over ``delta = min E - E*`` (log-spaced scan, then a bounded refinement): at the
    true limit of an exponential or power-law tail the regression is exact, a wrong ``E*`` bends it.
    nan when the energy does not decrease, or when the best ``delta`` is the largest scanned (ten times the
    energy drop: a tail far from its limit does not determine it).
    """
    energy, dissipation = np.asarray(energy, dtype=float), np.asarray(dissipation, dtype=float)
    ok = np.isfinite(energy) & np.isfinite(dissipation) & (dissipation > 0)
    e, i = energy[ok], dissipation[ok]
    if e.size < 4:
        return math.nan
    e_min, span = float(e.min()), float(e.max() - e.min())
    if span <= 0:
        return math.nan
    y = np.log(i)
    from scipy import optimize

    def rss(log_delta: float) -> float:
        x = np.log(e - e_min + math.exp(log_delta))
        A = np.stack([np.ones_like(x), x], axis=1)
        res = y - A @ np.linalg.lstsq(A, y, rcond=None)[0]
        return float(res @ res)

    lo = math.log(max(64 * np.finfo(float).eps * max(1.0, abs(e_min)), 1e-300))
    hi = math.log(10.0 * span)
    grid = np.linspace(lo, hi, 80)
    values = [rss(g) for g in grid]
    j = int(np.argmin(values))
    if j == grid.size - 1:
        return math.nan           # the best E* recedes without bound: the tail does not determine it
    a, b = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    if b > a:
        best = optimize.minimize_scalar(rss, bounds=(a, b), method="bounded", options={"xatol": 1e-10})
        log_delta = float(best.x) if best.fun <= values[j] else float(grid[j])
    else:
        log_delta = float(grid[j])
    return e_min - math.exp(log_delta)


# ================================================================================================
# the parameter set Omega
# ================================================================================================
@dataclass(frozen=True)
class Domain:
    """Omega: the ball ``|omega| <= radius`` (kind "ball") or the box ``lower <= omega <= upper`` ("box")."""
    kind: str
    lower: np.ndarray     # [k], the bounding box (for a ball: -radius)
    upper: np.ndarray     # [k]
    radius: float = math.inf

    @classmethod
    def make(cls, domain: str, k: int, radius: float,
             bounds: tuple[np.ndarray, np.ndarray] | None = None) -> "Domain":
        """``ball``/``box`` of radius (half-width) ``radius`` about 0, or ``grid``: the box ``bounds``."""
        if domain == "ball":
            return cls("ball", np.full(k, -radius), np.full(k, radius), float(radius))
        if domain == "box":
            return cls("box", np.full(k, -radius), np.full(k, radius))
        if domain == "grid":
            if bounds is None:
                raise ConfigError("diagnostics.domain = 'grid' needs a grid run (the box of its grid)")
            lower, upper = (np.broadcast_to(np.asarray(b, dtype=float), (k,)).copy() for b in bounds)
            return cls("box", lower, upper)
        raise ConfigError(f"diagnostics.domain must be one of 'ball', 'box', 'grid', got {domain!r}")

    @property
    def k(self) -> int:
        return self.lower.size

    def project(self, x: np.ndarray) -> np.ndarray:
        """The nearest point of Omega: clip to the box, or scale onto the ball. [S, k] -> [S, k]."""
        if self.kind == "box":
            return np.clip(x, self.lower, self.upper)
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        return x * np.minimum(1.0, self.radius / np.maximum(norm, 1e-300))

    def outside(self, x: np.ndarray) -> np.ndarray:
        """Points of x [S, k] not in Omega (beyond a relative 1e-12): [S] bool."""
        if self.kind == "box":
            tol = 1e-12 * np.maximum(1.0, np.abs(self.upper - self.lower))
            return np.any((x < self.lower - tol) | (x > self.upper + tol), axis=1)
        return np.linalg.norm(x, axis=1) > self.radius * (1 + 1e-12)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n points uniform in Omega: [n, k]."""
        if self.kind == "box":
            return rng.uniform(self.lower, self.upper, size=(n, self.k))
        direction = rng.standard_normal((n, self.k))
        direction /= np.maximum(np.linalg.norm(direction, axis=1, keepdims=True), 1e-300)
        return direction * (self.radius * rng.random((n, 1)) ** (1.0 / self.k))

    def grid(self, points: int) -> tuple[np.ndarray, np.ndarray]:
        """A regular grid of ``points`` per axis over the bounding box: points [points^k, k] (row-major,
        axis 0 slowest) and which of them lie in Omega [points^k]."""
        axes = [np.linspace(lo, hi, points) for lo, hi in zip(self.lower, self.upper)]
        mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, self.k)
        return mesh, ~self.outside(mesh)


# ================================================================================================
# the optimality gap
# ================================================================================================
@dataclass(frozen=True)
class GapResult:
    """``gap = mean_phi - min_phi`` with ``mean_phi = int Phi d rho`` and ``min_phi`` the least Phi found on
    Omega, at ``minimizer`` [k]; ``exhaustive``: the k <= 3 grid search ran (else the gap is an estimate,
    possibly too small); ``outside_mass``: mass of rho outside Omega (G >= 0 is only guaranteed without it)."""
    gap: float
    min_phi: float
    mean_phi: float
    minimizer: np.ndarray
    exhaustive: bool
    outside_mass: float = 0.0
    n_starts: int = 0


def optimality_gap(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, domain: str = "ball",
                   radius: float = 5.0, n_starts: int = 32, grid_points: int = 64, seed: int = 0,
                   extra_starts: np.ndarray | None = None,
                   bounds: tuple[np.ndarray, np.ndarray] | None = None) -> GapResult:
    """``G(rho) = int Phi d rho - min_{Omega} Phi(.; rho)`` for ``rho = sum_i m_i delta_{omega_i}``.

    omega [N, k], mass [N]; ``domain``: "ball" (``|omega| <= radius``), "box" (``[-radius, radius]^k``) or
    "grid" (the box ``bounds = (lower, upper)``); ``n_starts`` random starts uniform in Omega besides the
    particles (at most MAX_PARTICLE_STARTS of them) and ``extra_starts`` [S, k]; for k <= 3 an exhaustive
    grid of ``grid_points`` per axis first. The search is described in the module docstring.
    """
    omega = np.atleast_2d(np.asarray(omega, dtype=float))
    mass = np.asarray(mass, dtype=float)
    dom = Domain.make(domain, problem.k, radius, bounds)
    G = problem.residual_features(omega, mass)
    mean_phi = float(np.dot(mass, problem.phi_field(omega, G)))
    rng = np.random.default_rng(seed)
    starts = [_particle_starts(omega, mass, rng), dom.sample(n_starts, rng)]
    if extra_starts is not None and np.size(extra_starts):
        extra = np.atleast_2d(np.asarray(extra_starts, dtype=float))
        starts.append(extra[np.all(np.isfinite(extra), axis=1)])
    exhaustive = problem.k <= 3
    if exhaustive:
        starts.append(_grid_starts(problem, G, dom, grid_points))
    min_phi, minimizer, n = minimize_phi(problem, G, dom, np.concatenate(starts, axis=0), exhaustive)
    outside = float(np.sum(mass[dom.outside(omega)]))
    return GapResult(gap=mean_phi - min_phi, min_phi=min_phi, mean_phi=mean_phi, minimizer=minimizer,
                     exhaustive=exhaustive, outside_mass=outside, n_starts=n)


def entropic_gap(problem: Problem, grid: Grid, density: np.ndarray) -> GapResult:
    """The exact gap of a grid density when ``beta < inf``: ``E_h(rho) - min E_h`` over densities on the grid.

    With masses ``m_c = rho_c |C|`` and ``F`` the energy without entropy (convex in m), for every grid density
    ``E_h(rho') >= F(m) + sum_c Phi_c (m'_c - m_c) + (1/beta) sum_c m'_c log(m'_c / |C|)
    >= F(m) - sum_c Phi_c m_c - (1/beta) log sum_c |C| exp(-beta Phi_c)`` (the Gibbs variational principle),
    so ``gap = E_h(rho) - that bound = (1/beta) KL(m || g)``, ``g_c ~ |C| exp(-beta Phi_c)``: zero exactly when
    rho is the Gibbs density of its own potential. ``min_phi`` and ``minimizer`` are the least Phi over the
    cell centres; density [shape]."""
    from scipy.special import logsumexp

    omega, mass = grid.particles(density)
    phi = problem.phi_field(omega, problem.residual_features(omega, mass))
    beta = problem.beta
    free = problem.energy(omega, mass) + entropy(grid, density, beta)
    bound = problem.energy(omega, mass) - float(mass @ phi) - (logsumexp(-beta * phi) + math.log(grid.cell_volume)) / beta
    j = int(np.argmin(phi))
    return GapResult(gap=free - bound, min_phi=float(phi[j]), mean_phi=float(mass @ phi), minimizer=omega[j].copy(),
                     exhaustive=True)


def _particle_starts(omega: np.ndarray, mass: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if omega.shape[0] <= MAX_PARTICLE_STARTS:
        return omega
    p = np.clip(mass, 0, None)
    p = p / p.sum() if p.sum() > 0 else None
    return omega[rng.choice(omega.shape[0], MAX_PARTICLE_STARTS, replace=False, p=p)]


def _grid_starts(problem: Problem, G: np.ndarray, dom: Domain, points: int) -> np.ndarray:
    """The GRID_STARTS lowest grid points that are no higher than their axis neighbours in Omega."""
    mesh, inside = dom.grid(points)
    values = np.full(mesh.shape[0], np.inf)
    idx = np.flatnonzero(inside)
    for start in range(0, idx.size, GRID_BATCH):
        part = idx[start:start + GRID_BATCH]
        values[part] = problem.phi_field(mesh[part], G)
    cube = values.reshape((points,) * dom.k)
    local = np.isfinite(cube)
    padded = np.pad(cube, 1, constant_values=np.inf)
    for axis in range(dom.k):
        for shift in (-1, 1):
            neighbour = np.roll(padded, shift, axis=axis)[(slice(1, -1),) * dom.k]
            local &= cube <= neighbour
    candidates = np.flatnonzero(local.ravel())
    best = candidates[np.argsort(values[candidates], kind="stable")[:GRID_STARTS]]
    return mesh[best]


def minimize_phi(problem: Problem, G: np.ndarray, dom: Domain, starts: np.ndarray,
                 exhaustive: bool = False) -> tuple[float, np.ndarray, int]:
    """The least ``Phi(.; rho)`` found on Omega from ``starts`` [S, k] (the measure given by its residual
    features G): ``(min_phi, minimizer [k], number of distinct starts)``. Batched projected descent, then
    scipy polishing of the best few (module docstring). ``exhaustive``: the starts include the minima of
    an exhaustive grid; every start then descends to convergence (no successive halving)."""
    x0 = dom.project(np.asarray(starts, dtype=float))
    scale = max(1.0, float(np.max(np.abs(x0)))) if x0.size else 1.0
    _, first = np.unique(np.round(x0 / scale, 10), axis=0, return_index=True)
    x0 = x0[np.sort(first)]
    x, f = _projected_descent(problem, G, dom, x0, halving=not exhaustive)
    order = np.argsort(f, kind="stable")
    chosen: list[int] = []
    for j in order:
        if all(np.linalg.norm(x[j] - x[c]) > 1e-6 * scale for c in chosen):
            chosen.append(int(j))
        if len(chosen) == POLISHED:
            break
    polished = dom.project(np.concatenate([_polish(problem, G, dom, x[j]) for j in chosen] or [np.zeros((0, dom.k))]))
    if polished.size:
        x = np.concatenate([x, polished])
        f = np.concatenate([f, problem.phi_field(polished, G)])
    best = int(np.argmin(f))
    return float(f[best]), x[best].copy(), int(x0.shape[0])


def _projected_descent(problem: Problem, G: np.ndarray, dom: Domain, x: np.ndarray,
                       iterations: int = DESCENT_ITERATIONS, halving: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Projected gradient with Barzilai-Borwein steps and Armijo backtracking along the projection arc,
    for all starts x [S, k] at once: ``x+ = P(x - a g)`` accepted when ``Phi(x+) <= Phi(x) + c <g, x+ - x>``.
    A start stops when neither x nor Phi moves (relative 1e-12 / 1e-15). With ``halving``, every
    HALVING_ROUND iterations the moving starts above their median Phi stop, and the descent ends once no
    more than POLISHED move (successive halving: the cost is about two rounds of all starts). Returns
    points and Phi values."""
    x = x.copy()
    if x.shape[0] == 0:
        return x, np.zeros(0)
    f, g = problem.grad_phi_field(x, G)
    step = 1.0 / np.maximum(np.linalg.norm(g, axis=1), 1.0)
    active = np.ones(x.shape[0], dtype=bool)
    for it in range(iterations):
        if halving and it and it % HALVING_ROUND == 0:
            idx = np.flatnonzero(active)
            if idx.size <= POLISHED:
                break                     # the scipy polish takes the survivors from here
            active[idx[f[idx] > np.median(f[idx])]] = False
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        xi, fi, gi, ai = x[idx], f[idx], g[idx], step[idx].copy()
        x_new, f_new = xi.copy(), fi.copy()
        pending = np.arange(idx.size)
        for _ in range(60):
            trial = dom.project(xi[pending] - ai[pending, None] * gi[pending])
            ft = problem.phi_field(trial, G)
            decrease = np.einsum("sk,sk->s", gi[pending], trial - xi[pending])
            ok = ft <= fi[pending] + ARMIJO * decrease
            x_new[pending[ok]], f_new[pending[ok]] = trial[ok], ft[ok]
            pending = pending[~ok]
            if pending.size == 0:
                break
            ai[pending] *= 0.25
        moved_size = np.linalg.norm(x_new - xi, axis=1)
        still = (moved_size > 1e-12 * (1.0 + np.linalg.norm(xi, axis=1))) & \
                (fi - f_new > 1e-15 * (1.0 + np.abs(fi)))
        still[pending] = False
        f_moved, g_moved = problem.grad_phi_field(x_new[still], G) if still.any() else (np.zeros(0), np.zeros((0, dom.k)))
        s = x_new[still] - xi[still]
        y = g_moved - gi[still]
        sy, ss = np.einsum("sk,sk->s", s, y), np.einsum("sk,sk->s", s, s)
        new_step = np.where(sy > 0, ss / np.where(sy > 0, sy, 1.0), 4.0 * ai[still])
        moved = idx[still]
        x[moved], f[moved], g[moved] = x_new[still], f_moved, g_moved
        step[moved] = np.clip(new_step, 1e-12, 1e12)
        active[idx[~still]] = False
    return x, f


def _polish(problem: Problem, G: np.ndarray, dom: Domain, x0: np.ndarray) -> np.ndarray:
    """Local minimizers of Phi on Omega near x0 by scipy L-BFGS-B, as candidate points [c, k].

    Box: L-BFGS-B with the box bounds. Ball: L-BFGS-B from an interior x0; a point on the sphere (x0, or
    where the interior search left the ball) is polished on the sphere through the smooth map
    ``u -> R u / |u|`` (unconstrained in u), and if there the multiplier ``nu = -<grad Phi, w> / R^2`` is
    negative (Phi decreases inward, so the point is no KKT point of the ball) once more inward from it.
    """
    from scipy import optimize

    def fun(w: np.ndarray) -> tuple[float, np.ndarray]:
        f, g = problem.grad_phi_field(w[None, :], G)
        return float(f[0]), g[0]

    def minimize(f, x, bounds=None) -> np.ndarray:
        return optimize.minimize(f, x, jac=True, method="L-BFGS-B", bounds=bounds,
                                 options={"maxiter": POLISH_ITERATIONS, "ftol": 1e-15, "gtol": 1e-11}).x

    box = list(zip(dom.lower, dom.upper))
    if dom.kind == "box":
        return minimize(fun, x0, box)[None]
    R = dom.radius
    if np.linalg.norm(x0) < R * (1 - 1e-9):
        x = minimize(fun, x0, box)
        if not dom.outside(x[None])[0]:
            return x[None]
        x0 = dom.project(x[None])[0]

    def on_sphere(u: np.ndarray) -> tuple[float, np.ndarray]:
        norm = max(float(np.linalg.norm(u)), 1e-300)
        f, g = fun(R * u / norm)
        return f, (R / norm) * (g - (g @ u) * u / (norm * norm))    # d/du of Phi(R u/|u|)

    u = minimize(on_sphere, x0)
    w = R * u / max(float(np.linalg.norm(u)), 1e-300)
    if -(fun(w)[1] @ w) >= 0:
        return w[None]
    inner = minimize(fun, w * (1 - 1e-6), box)
    return np.stack([w, inner])


# ================================================================================================
# measures of a trajectory, attention maps and head clusters
# ================================================================================================
def trajectory_grid(traj: Trajectory) -> Grid | None:
    """The :class:`pdeflow.measure.Grid` of a grid run (from the /frames attributes), None for particles."""
    return Grid.from_frame_attrs(traj.frame_attrs) if "density" in traj.frames else None


def frame_measure(traj: Trajectory, index: int) -> tuple[np.ndarray, np.ndarray]:
    """The measure of frame ``index`` as weighted particles ``(omega [N, k], mass [N])``: the particles, or
    for a grid the cell centres with masses ``density * cell volume`` (:meth:`Grid.particles`)."""
    if "omega" in traj.frames:
        return np.asarray(traj.frames["omega"][index], dtype=float), np.asarray(traj.frames["mass"][index], dtype=float)
    grid = trajectory_grid(traj)
    if grid is None:
        raise TrajectoryError(f"{traj.path}: frames hold neither particles (omega, mass) nor a grid density")
    return grid.particles(traj.frames["density"][index])


def attention_pattern(problem: Problem, theta: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Causal attention of heads theta [H, p] on one sequence of tokens [T]: [H, T, T], rows summing to one,
    ``a[h, l, j] = softmax_{j <= l}(scale <WQ_h x_l, WK_h x_j>)``, zero above the diagonal (MODEL.md)."""
    a = problem.arrays()
    tokens = np.asarray(tokens, dtype=np.int64)
    x = a["embedding"][tokens] + a["positions"][:tokens.size]
    wq, wk, _, _ = split_theta(np.atleast_2d(np.asarray(theta, dtype=float)), problem.d, problem.head_dim)
    q, k = np.einsum("hcd,td->htc", wq, x), np.einsum("hcd,td->htc", wk, x)
    s = float(a["score_scale"]) * np.einsum("htc,hsc->hts", q, k)
    s = np.where(np.tril(np.ones((tokens.size, tokens.size), dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def probe_sequence(problem: Problem) -> np.ndarray:
    """The data set's heaviest sequence (first among equals): tokens [T], the probe of attention maps."""
    a = problem.arrays()
    return np.asarray(a["tokens"][int(np.argmax(a["weights"]))])


@dataclass(frozen=True)
class HeadClusters:
    """Heads grouped by single linkage in omega at distance ``threshold``, heaviest cluster first.

    ``labels`` [N]; per cluster ``mass``, ``size``, ``centre`` (mass-weighted mean, [C, k]) and
    ``representative`` (the member nearest the centre, an index into the frame's heads); ``attention``
    [A, T, T] of the representatives of the A heaviest clusters on the ``probe`` tokens [T].
    """
    labels: np.ndarray
    mass: np.ndarray
    size: np.ndarray
    centre: np.ndarray
    representative: np.ndarray
    attention: np.ndarray
    probe: np.ndarray
    threshold: float
    frame: int = -1


def head_clusters(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, tol: float = 0.1,
                  attention_maps: int = 4, seed: int = 0, frame: int = -1, min_mass: float = 0.0,
                  min_distance: float = 0.0) -> HeadClusters:
    """Cluster heads omega [N, k] (masses [N]): single linkage cut at
    ``max(tol * sqrt(sum_i m_i |omega_i|^2 / sum_i m_i), min_distance)``.

    Heads of mass <= ``min_mass`` are left out (label -1): for a grid, cells below a fraction of the
    largest cell mass, with ``min_distance`` just above the cell diagonal so that neighbouring cells
    join (clusters are then the connected blobs of the density). With more than MAX_CLUSTER_POINTS heads
    a mass-weighted subsample is linked and every head joins its nearest cluster centre.
    """
    from scipy.cluster import hierarchy, vq

    omega, mass = np.atleast_2d(np.asarray(omega, dtype=float)), np.asarray(mass, dtype=float)
    live = np.flatnonzero(mass > max(min_mass, 0.0))
    labels = np.full(omega.shape[0], -1)
    rms = math.sqrt(float(np.dot(mass, np.einsum("ik,ik->i", omega, omega))) / max(float(mass.sum()), 1e-300))
    threshold = max(tol * max(rms, 1e-12), min_distance)
    if live.size == 1:
        labels[live] = 0
    elif live.size > 1:
        pts = omega[live]
        sub = np.arange(live.size)
        if live.size > MAX_CLUSTER_POINTS:
            rng = np.random.default_rng(seed)
            sub = np.sort(rng.choice(live.size, MAX_CLUSTER_POINTS, replace=False, p=mass[live] / mass[live].sum()))
        lab = hierarchy.fcluster(hierarchy.linkage(pts[sub], method="single"), t=threshold, criterion="distance") - 1
        if sub.size < live.size:
            centres = np.stack([pts[sub][lab == c].mean(axis=0) for c in range(lab.max() + 1)])
            lab = vq.vq(pts, centres)[0]
        labels[live] = lab
    n = int(labels.max()) + 1
    cmass = np.array([mass[labels == c].sum() for c in range(n)])
    order = np.argsort(-cmass, kind="stable")
    relabel = np.full(n + 1, -1)
    relabel[order] = np.arange(n)
    labels = relabel[labels]                         # -1 stays -1 (last entry)
    cmass = cmass[order]
    size = np.array([int(np.sum(labels == c)) for c in range(n)], dtype=np.int64)
    centre = np.array([np.average(omega[labels == c], axis=0, weights=mass[labels == c]) for c in range(n)]).reshape(n, -1)
    rep = np.array([np.flatnonzero(labels == c)[np.argmin(np.linalg.norm(omega[labels == c] - centre[c], axis=1))]
                    for c in range(n)], dtype=np.int64)
    probe = probe_sequence(problem)
    shown = rep[:min(attention_maps, n)]
    att = attention_pattern(problem, problem.theta(omega[shown]), probe) if shown.size else np.zeros((0,) + (probe.size,) * 2)
    return HeadClusters(labels=labels, mass=cmass, size=size, centre=centre, representative=rep, attention=att,
                        probe=probe, threshold=threshold, frame=frame)


# ================================================================================================
# the analysis of a trajectory
# ================================================================================================
@dataclass
class Analysis:
    """Everything ``/analysis`` holds. Arrays over frames [F] (nan where not computed): ``time``, ``energy``,
    ``dissipation``, ``gap``, ``lower_bound`` (E - G; nan with an entropy term), ``min_phi``, ``mean_phi``,
    ``outside_mass``, ``minimizer`` [F, k], ``pl_mu``, ``energy_identity_residual``, ``kl_predicted`` (E - E*
    predicted by the KL fit over its window). Scalars: ``e_star`` and where it came from, the KL fit,
    ``pl_mu_min`` (the least PL ratio at the frames of the KL window: the PL constant the tail supports),
    the stationary time, and the settings the gap search used."""
    time: np.ndarray
    energy: np.ndarray
    dissipation: np.ndarray
    gap: np.ndarray
    lower_bound: np.ndarray
    min_phi: np.ndarray
    mean_phi: np.ndarray
    outside_mass: np.ndarray
    minimizer: np.ndarray
    gap_exhaustive: np.ndarray
    pl_mu: np.ndarray
    energy_identity_residual: np.ndarray
    kl_predicted: np.ndarray
    e_star: float = math.nan
    e_star_source: str = "none"
    kl_theta: float = math.nan
    kl_theta_ci: tuple[float, float] = (math.nan, math.nan)
    kl_constant: float = math.nan
    kl_points: int = 0
    kl_window_start: float = math.nan
    kl_decay_error: float = math.nan
    pl_mu_min: float = math.nan
    stationary_time: float = math.nan
    stationary_tol: float = math.nan
    gap_computed: bool = False
    gap_is_estimate: bool = False
    gap_domain: str = ""
    gap_radius: float = math.nan
    clusters: HeadClusters | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gap_frames(self) -> np.ndarray:
        """Indices of the frames where the gap was computed."""
        return np.flatnonzero(np.isfinite(self.gap))


FRAME_ARRAYS = ("time", "energy", "dissipation", "gap", "lower_bound", "min_phi", "mean_phi", "outside_mass",
                "minimizer", "gap_exhaustive", "pl_mu", "energy_identity_residual", "kl_predicted")
SCALARS = ("e_star", "e_star_source", "kl_theta", "kl_constant", "kl_points", "kl_window_start", "kl_decay_error",
           "pl_mu_min",
           "stationary_time", "stationary_tol", "gap_computed", "gap_is_estimate", "gap_domain", "gap_radius")
CLUSTER_ARRAYS = ("labels", "mass", "size", "centre", "representative", "attention", "probe")


def gap_frame_indices(n_frames: int, gap_frames: int) -> np.ndarray:
    """``gap_frames`` frame indices spread evenly over [0, n_frames), the last frame included."""
    if n_frames == 0 or gap_frames <= 0:
        return np.zeros(0, dtype=np.int64)
    if gap_frames == 1:
        return np.array([n_frames - 1])
    return np.unique(np.round(np.linspace(0, n_frames - 1, gap_frames)).astype(np.int64))


def analyse(traj: Trajectory, settings: DiagnosticsConfig, *, previous: Analysis | None = None,
            run_stationary_tol: float = 0.0) -> Analysis:
    """The analysis of a trajectory with the ``[diagnostics]`` settings (module docstring).

    ``previous``: an earlier analysis of the same file, whose minimizers seed the gap search (so a rerun
    only improves the minimum found). ``run_stationary_tol``: the run's ``run.stationary_tol``.
    """
    problem = traj.problem()
    time = np.asarray(traj.time, dtype=float)
    F = time.size
    energy = np.asarray(traj.frames["energy"], dtype=float)
    dissipation = np.asarray(traj.frames["dissipation"], dtype=float)
    nan = np.full(F, np.nan)
    a = Analysis(time=time, energy=energy, dissipation=dissipation, gap=nan.copy(), lower_bound=nan.copy(),
                 min_phi=nan.copy(), mean_phi=nan.copy(), outside_mass=nan.copy(),
                 minimizer=np.full((F, problem.k), np.nan), gap_exhaustive=np.zeros(F, dtype=bool),
                 pl_mu=nan.copy(), energy_identity_residual=nan.copy(), kl_predicted=nan.copy())
    if F == 0:
        a.notes.append("no frames")
        return a
    steps = traj.steps
    dense = len(steps.get("time", ())) >= 2
    st_t, st_e, st_i = ((np.asarray(steps[c], dtype=float) for c in ("time", "energy", "dissipation")) if dense
                        else (time, energy, dissipation))
    a.energy_identity_residual = np.interp(time, st_t, energy_identity_residual(st_t, st_e, st_i))

    tol = settings.stationary_tol or run_stationary_tol or 1e-8 * float(dissipation[0])
    a.stationary_tol = tol
    below = dissipation <= tol
    if below[-1]:
        first = F - int(np.argmin(below[::-1])) if not below.all() else 0
        a.stationary_time = float(time[first])

    if settings.gap:
        _gaps(a, traj, problem, settings, previous)

    _rates(a, settings, st_t, st_e, st_i)
    last = F - 1
    omega, mass = frame_measure(traj, last)
    grid = trajectory_grid(traj)
    cells = {} if grid is None else {"min_mass": GRID_CLUSTER_MASS * float(mass.max()),
                                     "min_distance": 1.01 * float(np.linalg.norm(grid.width))}
    a.clusters = head_clusters(problem, omega, mass, tol=settings.cluster_tol, attention_maps=settings.attention_maps,
                               seed=settings.seed, frame=last, **cells)
    return a


def _gaps(a: Analysis, traj: Trajectory, problem: Problem, settings: DiagnosticsConfig,
          previous: Analysis | None) -> None:
    grid = trajectory_grid(traj)
    bounds = None if grid is None else (np.array(grid.lower), np.array(grid.upper))
    if settings.domain == "grid" and grid is None:
        raise ConfigError("diagnostics.domain = 'grid' needs a grid run; this file holds particles")
    known = [] if previous is None else [previous.minimizer[np.all(np.isfinite(previous.minimizer), axis=1)]]
    known = [m for m in known if m.shape[-1] == problem.k]
    entropic = grid is not None and not math.isinf(problem.beta)
    for f in gap_frame_indices(a.time.size, settings.gap_frames):
        if entropic:
            res = entropic_gap(problem, grid, traj.frames["density"][f])
        else:
            omega, mass = frame_measure(traj, int(f))
            res = optimality_gap(problem, omega, mass, domain=settings.domain, radius=settings.radius,
                                 n_starts=settings.n_starts, grid_points=settings.grid_points,
                                 seed=settings.seed + int(f), extra_starts=np.concatenate(known) if known else None,
                                 bounds=bounds)
        a.gap[f], a.min_phi[f], a.mean_phi[f] = res.gap, res.min_phi, res.mean_phi
        a.minimizer[f], a.outside_mass[f], a.gap_exhaustive[f] = res.minimizer, res.outside_mass, res.exhaustive
        known.append(res.minimizer[None])
    computed = np.isfinite(a.gap)
    a.gap_computed = bool(computed.any())
    a.gap_is_estimate = bool(a.gap_computed and not a.gap_exhaustive[computed].all())
    a.gap_domain = "grid, entropic" if entropic else settings.domain
    a.gap_radius = settings.radius if settings.domain in ("ball", "box") and not entropic else math.nan
    if entropic:
        a.notes.append("beta < inf on a grid: G = E_h - min E_h over grid densities (relative entropy to the Gibbs "
                       "density of Phi, divided by beta)")
    if math.isinf(problem.beta) or entropic:
        a.lower_bound = a.energy - a.gap
    else:
        a.notes.append("beta < inf with particles: E - G is not a lower bound (the entropy is not in Phi); "
                       "lower_bound left nan")
    if np.any(a.outside_mass[computed] > 0):
        a.notes.append("part of rho lies outside Omega: the gap may be negative there (E - G stays a bound)")


def _rates(a: Analysis, settings: DiagnosticsConfig, st_t: np.ndarray, st_e: np.ndarray, st_i: np.ndarray) -> None:
    """E*, the PL ratio at the frames and the KL fit over the window (on the /steps rows when present).

    E* is ``diagnostics.e_star`` if given; else the best lower bound E - G when it is tight (the last gap
    no larger than the energy drop over the window, so that E - E* measures the decay being fitted);
    else the limit fitted from the tail (:func:`fit_e_star`); else the lower bound anyway."""
    t_end = float(a.time[-1])
    start = t_end - settings.kl_window * (t_end - float(a.time[0]))
    in_window = st_t >= start - 1e-12 * max(1.0, abs(start))
    e_min = float(np.nanmin(st_e))
    bounds = np.isfinite(a.lower_bound)
    best_bound = float(np.max(a.lower_bound[bounds])) if bounds.any() else math.nan
    drop = float(np.max(st_e[in_window]) - np.min(st_e[in_window])) if in_window.any() else 0.0
    tight = bounds.any() and float(a.gap[np.flatnonzero(bounds)[-1]]) <= drop
    if math.isfinite(settings.e_star):
        a.e_star, a.e_star_source = float(settings.e_star), "given"
    elif tight:
        a.e_star, a.e_star_source = best_bound, "lower_bound"
    else:
        a.e_star, a.e_star_source = fit_e_star(st_e[in_window], st_i[in_window]), "fit"
        if bounds.any():
            if math.isfinite(a.e_star):
                a.notes.append("the lower bound is not tight (last gap above the energy drop over the KL window): "
                               "E* is the limit fitted from the tail")
            else:
                a.e_star, a.e_star_source = best_bound, "lower_bound"
                a.notes.append("the lower bound is not tight and the tail does not determine its limit: PL/KL are "
                               "relative to a distant E*; pass --e-star or run longer")
    if a.e_star_source == "lower_bound" and a.e_star > e_min:
        a.notes.append(f"best lower bound {a.e_star:.10g} exceeds the lowest energy {e_min:.10g}: "
                       "the gap search missed the minimum of Phi somewhere")
    if not math.isfinite(a.e_star):
        a.e_star_source = "none"
        a.notes.append("E* unknown (no gap, and the tail does not determine its limit): no PL/KL; pass --e-star")
        return
    a.pl_mu = pl_constant(a.energy, a.dissipation, a.e_star)
    fit = kl_fit(st_e[in_window], st_i[in_window], a.e_star)
    a.kl_theta, a.kl_theta_ci, a.kl_constant, a.kl_points = fit.theta, (fit.ci_low, fit.ci_high), fit.constant, fit.n_points
    a.kl_window_start = start
    if math.isfinite(fit.theta) and not 0.0 <= fit.theta < 1.0:
        a.notes.append(f"KL exponent {fit.theta:.3g} outside [0, 1): over this window I is not a power of E - E* "
                       "(not yet in the asymptotic regime, or E* is not the limit of this flow)")
    frames = np.flatnonzero(a.time >= start - 1e-12 * max(1.0, abs(start)))
    window_mu = a.pl_mu[frames][np.isfinite(a.pl_mu[frames])]
    a.pl_mu_min = float(window_mu.min()) if window_mu.size else math.nan
    if math.isfinite(fit.theta) and frames.size and a.energy[frames[0]] > a.e_star:
        t0 = a.time[frames[0]]
        predicted = fit.predicted_excess(a.time[frames], t0, a.energy[frames[0]] - a.e_star)
        a.kl_predicted[frames] = predicted
        observed = a.energy[frames] - a.e_star
        ok = (observed > 0) & (predicted > 0)
        if ok.any():
            a.kl_decay_error = float(np.max(np.abs(np.log(predicted[ok] / observed[ok]))))


# ================================================================================================
# /analysis in the file
# ================================================================================================
def check_editable(path: str | Path) -> None:
    """TrajectoryError unless ``path`` is a trajectory no run is writing (one that can take /analysis)."""
    check_file(path)
    if open_by_swmr_writer(Path(path)):
        raise TrajectoryError(f"{path}: a run is writing this file (or died while writing it; resume it first), "
                              "so the analysis cannot be stored; use --no-write to print it only")


def write_analysis(path: str | Path, analysis: Analysis) -> None:
    """Store ``analysis`` as the group /analysis of a finished trajectory, replacing only that group.

    The edit goes through :func:`pdeflow.trajectory.edit_trajectory` (on a copy renamed over the file when
    complete), so a kill leaves the previous file - frames, steps and any earlier /analysis - intact.
    TrajectoryError if a run is still writing the file (or died writing it: resume it first).
    """
    path = Path(path)
    check_editable(path)
    with edit_trajectory(path) as f:
        if ANALYSIS_GROUP in f:
            del f[ANALYSIS_GROUP]
        g = f.create_group(ANALYSIS_GROUP)
        for key in FRAME_ARRAYS:
            g.create_dataset(key, data=np.asarray(getattr(analysis, key)))
        for key in SCALARS:
            g.attrs[key] = getattr(analysis, key)
        g.attrs["kl_theta_ci"] = np.asarray(analysis.kl_theta_ci, dtype=float)
        g.attrs["notes"] = "\n".join(analysis.notes)
        c = analysis.clusters
        if c is not None:
            for key in CLUSTER_ARRAYS:
                g.create_dataset(f"cluster_{key}", data=np.asarray(getattr(c, key)))
            g.attrs["cluster_threshold"] = c.threshold
            g.attrs["cluster_frame"] = c.frame


def read_analysis(traj: Trajectory) -> Analysis | None:
    """The analysis stored in a trajectory (``traj.analysis``), or None if it has none."""
    d = traj.analysis
    if not d or "time" not in d:
        return None
    kwargs: dict[str, Any] = {key: np.asarray(d[key]) for key in FRAME_ARRAYS if key in d}
    kwargs.update({key: d[key] for key in SCALARS if key in d})
    for key in ("gap_computed", "gap_is_estimate"):
        kwargs[key] = bool(kwargs.get(key, False))
    ci = np.asarray(d.get("kl_theta_ci", (math.nan, math.nan)), dtype=float)
    kwargs["kl_theta_ci"] = (float(ci[0]), float(ci[1]))
    kwargs["notes"] = [n for n in str(d.get("notes", "")).split("\n") if n]
    if "cluster_labels" in d:
        kwargs["clusters"] = HeadClusters(**{key: np.asarray(d[f"cluster_{key}"]) for key in CLUSTER_ARRAYS},
                                          threshold=float(d["cluster_threshold"]), frame=int(d["cluster_frame"]))
    return Analysis(**kwargs)


def analyse_run(path: str | Path, cfg: Config) -> None:
    """Write the analysis of a finished run into its trajectory (the driver's ``on_finish``).

    Does nothing when ``diagnostics.enabled`` is false; the gap search follows ``diagnostics.gap``.
    """
    if not cfg.diagnostics.enabled:
        return
    traj = open_trajectory(path)
    write_analysis(path, analyse(traj, cfg.diagnostics, run_stationary_tol=cfg.run.stationary_tol))


__all__ = ["GapResult", "optimality_gap", "entropic_gap", "minimize_phi", "Domain", "energy_identity_residual", "pl_constant",
           "kl_exponent", "kl_fit", "KLFit", "fit_e_star", "attention_pattern", "probe_sequence", "HeadClusters",
           "head_clusters", "frame_measure", "trajectory_grid", "Analysis", "analyse", "analyse_run", "write_analysis",
           "read_analysis", "check_editable", "gap_frame_indices"]
