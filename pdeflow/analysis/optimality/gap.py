"""The optimality gap ``G(rho) = int Phi d rho - min_{omega in Omega} Phi(omega; rho)`` (see
pdeflow.analysis.diagnostics).

min Phi (:func:`optimality_gap`) is searched on Omega in three stages: a grid for k <= 3 (then certified by
:func:`certified_min_phi`), batched projected-gradient descent from many starts, and a scipy L-BFGS-B polish. Every
candidate is projected onto Omega, so the reported gap never exceeds the true one. The stages in detail:
docs/design.md, "The search for min Phi".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.measure import Grid, entropy
from ...core.problem import Problem
from .certify import _phi_batched, certified_min_phi
from .domain import Domain

MAX_PARTICLE_STARTS = 32     # particles used as starts of the gap search (mass-weighted subsample beyond)
GRID_STARTS = 8              # best grid-local minima used as starts
POLISHED = 3                 # distinct results of the batched descent polished by scipy
DESCENT_ITERATIONS = 300
HALVING_ROUND = 10           # k > 3: iterations between two halvings of the moving starts
POLISH_ITERATIONS = 500
ARMIJO = 1e-4


@dataclass(frozen=True)
class GapResult:
    """``gap = mean_phi - min_phi`` with ``mean_phi = int Phi d rho`` and ``min_phi`` the least Phi found on
    Omega, at ``minimizer`` [k]; ``exhaustive``: the k <= 3 grid search ran; ``outside_mass``: mass of rho
    outside Omega (G >= 0 is only guaranteed without it).

    ``min_phi`` is attained in Omega, so ``gap`` never exceeds the true gap. ``certified``: a proven lower
    bound ``min_phi_lower <= min_Omega Phi`` exists (:func:`certified_min_phi`), so the true gap lies in
    ``[gap, gap_bound]`` with ``gap_bound = mean_phi - min_phi_lower`` and ``E - gap_bound`` is a lower bound
    on E over measures on Omega (beta = inf). Uncertified, ``gap`` is an estimate: it bounds nothing from above
    and ``E - gap`` is no lower bound (``min_phi_lower``, ``gap_bound`` nan)."""
    gap: float
    min_phi: float
    mean_phi: float
    minimizer: np.ndarray
    exhaustive: bool
    outside_mass: float = 0.0
    n_starts: int = 0
    certified: bool = False
    min_phi_lower: float = math.nan
    evaluations: int = 0

    @property
    def gap_bound(self) -> float:
        """The certified upper bound ``mean_phi - min_phi_lower`` on the gap (nan when not certified)."""
        return self.mean_phi - self.min_phi_lower if self.certified else math.nan


def optimality_gap(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, domain: str = "ball",
                   radius: float = 5.0, n_starts: int = 32, grid_points: int = 64, seed: int = 0,
                   extra_starts: np.ndarray | None = None,
                   bounds: tuple[np.ndarray, np.ndarray] | None = None) -> GapResult:
    """``G(rho) = int Phi d rho - min_{Omega} Phi(.; rho)`` for ``rho = sum_i m_i delta_{omega_i}``.

    omega [N, k], mass [N]; ``domain``: "ball" (``|omega| <= radius``), "box" (``[-radius, radius]^k``) or
    "grid" (the box ``bounds = (lower, upper)``); ``n_starts`` random starts uniform in Omega besides the
    particles (at most MAX_PARTICLE_STARTS of them) and ``extra_starts`` [S, k]; for k <= 3 an exhaustive
    grid of ``grid_points`` per axis first. The search: docs/design.md, "The search for min Phi".
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
        mesh, values = _grid_values(problem, G, dom, grid_points)
        starts.append(_grid_starts(mesh, values, dom, grid_points))
    min_phi, minimizer, n = minimize_phi(problem, G, dom, np.concatenate(starts, axis=0), exhaustive)
    outside = float(np.sum(mass[dom.outside(omega)]))
    lower, spent = certified_min_phi(problem, G, dom, grid_points, min_phi) if exhaustive else (math.nan, 0)
    certified = bool(exhaustive and math.isfinite(lower))
    return GapResult(gap=mean_phi - min_phi, min_phi=min_phi, mean_phi=mean_phi, minimizer=minimizer,
                     exhaustive=exhaustive, outside_mass=outside, n_starts=n, certified=certified,
                     min_phi_lower=min(lower, min_phi) if certified else math.nan,
                     evaluations=spent + (grid_points ** problem.k if exhaustive else 0))


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
    bound = (problem.energy(omega, mass) - float(mass @ phi)
             - (logsumexp(-beta * phi) + math.log(grid.cell_volume)) / beta)
    j = int(np.argmin(phi))
    gap, mean_phi = free - bound, float(mass @ phi)
    return GapResult(gap=gap, min_phi=float(phi[j]), mean_phi=mean_phi, minimizer=omega[j].copy(), exhaustive=True,
                     certified=True, min_phi_lower=mean_phi - gap)


def _particle_starts(omega: np.ndarray, mass: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if omega.shape[0] <= MAX_PARTICLE_STARTS:
        return omega
    p = np.clip(mass, 0, None)
    p = p / p.sum() if p.sum() > 0 else None
    return omega[rng.choice(omega.shape[0], MAX_PARTICLE_STARTS, replace=False, p=p)]


def _grid_values(problem: Problem, G: np.ndarray, dom: Domain, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Phi on the regular grid of ``points`` per axis over the bounding box: points [points^k, k] and values
    [points^k], nan outside Omega."""
    mesh, inside = dom.grid(points)
    values = np.full(mesh.shape[0], np.nan)
    values[inside] = _phi_batched(problem, G, mesh[inside])
    return mesh, values


def _grid_starts(mesh: np.ndarray, values: np.ndarray, dom: Domain, points: int) -> np.ndarray:
    """The GRID_STARTS lowest grid points in Omega that are no higher than their axis neighbours in Omega."""
    values = np.where(dom.outside(mesh) | ~np.isfinite(values), np.inf, values)
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
    scipy polishing of the best few (docs/design.md). ``exhaustive``: the starts include the minima of
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
        f_moved, g_moved = (problem.grad_phi_field(x_new[still], G) if still.any()
                            else (np.zeros(0), np.zeros((0, dom.k))))
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
