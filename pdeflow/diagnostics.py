"""What a trajectory says about the theory: energy identity, optimality gap, PL / KL rates, head structure.

All quantities follow MODEL.md ("Quantities every run can report"):

- energy identity residual ``r(t) = E(t) - E(t0) + int_{t0}^t I(u) du`` (trapezoid rule), zero for the exact
  flow; for a fixed-step solver it is ``O(dt^2)`` from the quadrature plus the solver's own error;
- optimality gap ``G(rho) = int Phi d rho - min_{omega in Omega} Phi(omega; rho)`` on a compact set Omega
  (a ball ``|omega| <= R``, a box ``[-R, R]^k``, or the box of a grid run). With ``beta = inf`` the energy is
  convex in rho, so ``E(nu) >= E(rho) + int Phi_rho d(nu - rho) >= E(rho) - G(rho)`` for every measure nu on
  Omega: ``E - G`` is a lower bound on the best energy over measures on Omega (for any rho, in Omega or not)
  - but only with the true min Phi. The search gives a min Phi attained in Omega, so a gap never above the
  true one; a lower bound needs a *certified* min Phi (k <= 3: :func:`certified_min_phi`), and then uses the
  certified upper bound on the gap. Otherwise the gap is an estimate, and E - G is no bound and never E*;
- PL ratio ``mu(t) = I / (2 (E - E*))``; Kurdyka-Lojasiewicz exponent theta from the regression
  ``log I = log C + 2 (1 - theta) log(E - E*)`` (theta = 1/2: PL, exponential decay), both only where
  ``E - E*`` is trustworthy (:func:`trusted_excess`: ten times the width of the interval holding E*), the KL
  exponent only when it lies in (0, 1], with a moving-block bootstrap interval (:func:`kl_fit`);
- particles with ``beta < inf`` store an energy without the entropy term (a particle measure has no
  density): their energy identity, E*, PL and KL are refused with a note (ENTROPY_MISSING);
- head structure: clusters of heads in omega (single linkage), their masses, and the attention map of a
  representative head of each heavy cluster on a probe sequence.

The minimum of Phi (:func:`optimality_gap`) is searched in three stages, all on the feasible set:

1. k <= 3: Phi on a regular grid of ``grid_points`` per axis over the bounding box of Omega (points outside
   a ball are skipped), evaluated in batches; the best grid-local minima become starts
   (``GapResult.exhaustive``). After the search, :func:`certified_min_phi` proves a lower bound on min Phi
   from the grid, Taylor bounds with derivative bounds over each cell, and refinement of the cells that
   could hold a lower value (``GapResult.certified``, ``min_phi_lower``).
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
   true gap, and is an estimate (possibly too small) when min Phi is not certified.
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
ENTROPY_MISSING = ("refused: beta < inf with particles, whose stored energy has no entropy term; the energy "
                   "identity, E*, PL and KL analyses would be those of another functional")


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


TRUST_FACTOR = 10.0       # E - E* is trusted where it exceeds this many widths of the interval holding E*
KL_MIN_POINTS = 8         # trusted samples a KL fit needs
KL_MIN_RANGE = math.log(2.0)   # ... and E - E* must fall by at least this (natural log) over them
BOOTSTRAP = 400           # replicates of the moving-block bootstrap of the KL slope
PROFILE_LEVEL = 3.841     # chi^2_1 0.95 quantile: the profile-likelihood interval of a fitted E*


@dataclass(frozen=True)
class KLFit:
    """``log I = log C + q log(E - E*)`` with ``q = 2 (1 - theta)``: theta, its 95% interval, C, points used.

    ``reason`` is empty when the window shows a KL regime; otherwise it says in one line why not, and theta,
    the interval and C are nan (``fitted`` keeps the regression's theta, if there was one, for the record).
    """
    theta: float
    ci_low: float
    ci_high: float
    constant: float
    n_points: int
    reason: str = ""
    fitted: float = math.nan

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


def trusted_excess(energy: np.ndarray, e_star_range: tuple[float, float]) -> np.ndarray:
    """Where ``E - E*`` is known to a tenth of itself: ``E - hi >= TRUST_FACTOR (hi - lo)`` (and above
    rounding) for E* known to lie in ``[lo, hi]``. [n] -> [n] bool.

    Then for every E* in the interval the relative error of ``E - E*`` is at most 1/TRUST_FACTOR, so
    ``log(E - E*)`` is known to within 0.1: a fitted slope is not an artefact of a misplaced E*.
    """
    energy = np.asarray(energy, dtype=float)
    lo, hi = e_star_range
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return np.zeros(energy.shape, dtype=bool)
    floor = 64 * np.finfo(float).eps * np.maximum(1.0, np.abs(energy))
    with np.errstate(invalid="ignore"):
        return np.isfinite(energy) & (energy - hi > floor) & (energy - hi >= TRUST_FACTOR * (hi - lo))


def _window(n: int, window: float) -> slice:
    if not 0 < window <= 1:
        raise ValueError(f"window must be in (0, 1], got {window}")
    return slice(n - max(1, int(math.ceil(window * n))), n)


def _block_length(n: int) -> int:
    """Block length of the moving-block bootstrap: about n^(1/3) (the usual rate for a variance)."""
    return max(1, int(round(2.0 * n ** (1.0 / 3.0))))


def _slope_interval(x: np.ndarray, y: np.ndarray, eps_x: np.ndarray, rng: np.random.Generator,
                    replicates: int) -> tuple[float, float, float, float]:
    """Least squares ``y = c + q x`` with a 95% interval of q: ``(q, q_low, q_high, c)``.

    The interval is the percentile interval of a moving-block residual bootstrap (blocks of
    :func:`_block_length` consecutive residuals, scaled by ``sqrt(n / (n - 2))`` for the two fitted
    parameters; blocks keep the serial correlation of the residuals of a smooth curve), widened to at least
    the rounding bound ``sum_i |x_i - xm| (eps_y + |q| eps_x_i) / sxx`` (``eps_x`` [n]: the relative rounding
    of ``E - E*``; ``eps_y`` that of log I), so an exact power law's interval contains its exponent.
    """
    n = x.size
    xc = x - x.mean()
    sxx = float(xc @ xc)
    q = float(xc @ (y - y.mean()) / sxx)
    c = float(y.mean() - q * x.mean())
    resid = (y - c - q * x) * math.sqrt(n / max(n - 2, 1))
    b = _block_length(n)
    starts = rng.integers(0, n - b + 1, size=(replicates, -(-n // b)))
    idx = (starts[:, :, None] + np.arange(b)).reshape(replicates, -1)[:, :n]
    slopes = q + (resid[idx] @ xc) / sxx
    from scipy import stats  # scipy submodules load lazily: `pdeflow run` imports this module

    half = float(stats.t.ppf(0.975, max(n // b - 2, 1))) * float(np.std(slopes, ddof=1))
    eps = np.finfo(float).eps
    rounding = float(np.sum(np.abs(xc) * (4 * eps + abs(q) * eps_x)) / sxx)
    half = max(half, rounding)
    return q, q - half, q + half, c


def kl_fit(energy: np.ndarray, dissipation: np.ndarray, e_star: float, window: float = 1.0, *,
           e_star_range: tuple[float, float] | None = None, replicates: int = BOOTSTRAP, seed: int = 0) -> KLFit:
    """The KL exponent over the last ``window`` fraction of the samples, where it means something.

    Regression ``log I = log C + q log(E - E*)``, ``theta = 1 - q / 2``, on the samples where ``E - E*`` is
    trustworthy (:func:`trusted_excess`; ``e_star_range = (lo, hi)`` is an interval known to hold E*,
    default the point ``e_star``) and ``I > 0``. The 95% interval is the moving-block bootstrap of
    :func:`_slope_interval`, repeated with E* at both ends of its interval and joined, so it carries the
    uncertainty of E*. A KL regime needs KL_MIN_POINTS trusted samples over which ``E - E*`` falls by a factor
    2 or more, and a fitted theta in (0, 1] (a Lojasiewicz exponent); otherwise ``reason`` says which failed.
    """
    energy, dissipation = np.asarray(energy, dtype=float), np.asarray(dissipation, dtype=float)
    sl = _window(energy.size, window) if energy.size else slice(0, 0)
    e, i = energy[sl], dissipation[sl]
    lo, hi = (e_star, e_star) if e_star_range is None else (float(e_star_range[0]), float(e_star_range[1]))
    nan = math.nan
    if not math.isfinite(e_star):
        return KLFit(nan, nan, nan, nan, 0, reason="E* unknown")
    ok = trusted_excess(e, (lo, hi)) & np.isfinite(i) & (i > 0)
    n = int(ok.sum())
    if n < KL_MIN_POINTS:
        detail = (f"E - E* above {TRUST_FACTOR:g} x the width of E*'s interval [{lo:.10g}, {hi:.10g}]" if hi > lo
                  else "E - E* > 0 and I > 0")
        return KLFit(nan, nan, nan, nan, n, reason=f"only {n} samples of the window have {detail} "
                                                   f"(a fit needs {KL_MIN_POINTS})")
    x_span = float(np.ptp(np.log(e[ok] - hi)))
    if x_span < KL_MIN_RANGE:
        return KLFit(nan, nan, nan, nan, n, reason=f"E - E* falls only by a factor {math.exp(x_span):.3g} over the "
                                                   "trusted samples (a fit needs 2)")
    y = np.log(i[ok])
    rng = np.random.default_rng(seed)
    eps = np.finfo(float).eps
    fits = {}
    for star in sorted({lo, e_star, hi}):
        excess = e[ok] - star
        eps_x = 4 * eps * (np.abs(e[ok]) + abs(star)) / excess
        fits[star] = _slope_interval(np.log(excess), y, eps_x, rng, replicates)
    q, _, _, c = fits[e_star]
    theta = 1.0 - q / 2.0
    q_low, q_high = min(f[1] for f in fits.values()), max(f[2] for f in fits.values())
    if not 0.0 < theta <= 1.0:
        return KLFit(nan, nan, nan, nan, n, fitted=theta,
                     reason=f"the fitted theta {theta:.3g} lies outside (0, 1]: I is not a KL power of E - E* here "
                            "(not yet asymptotic, the step lost accuracy, or E* is not this flow's limit)")
    return KLFit(theta=theta, ci_low=1.0 - q_high / 2.0, ci_high=1.0 - q_low / 2.0, constant=float(math.exp(c)),
                 n_points=n, fitted=theta)


def kl_exponent(energy: np.ndarray, dissipation: np.ndarray, e_star: float,
                window: float = 1.0) -> tuple[float, float, float]:
    """The KL exponent theta of ``I ~ C (E - E*)^(2 (1 - theta))`` and its interval: ``(theta, ci_low, ci_high)``,
    nan when the window shows no KL regime. See :func:`kl_fit` (``window``: the last fraction of the samples)."""
    fit = kl_fit(energy, dissipation, e_star, window)
    return fit.theta, fit.ci_low, fit.ci_high


def fit_e_star(energy: np.ndarray, dissipation: np.ndarray) -> float:
    """The limit energy ``E*`` < min E that makes ``log I`` most nearly affine in ``log(E - E*)``
    (:func:`fit_e_star_interval`; nan when the tail does not determine it)."""
    return fit_e_star_interval(energy, dissipation)[0]


def fit_e_star_interval(energy: np.ndarray, dissipation: np.ndarray) -> tuple[float, float, float]:
    """The fitted limit energy and a 95% interval ``(E*, lo, hi)``; nan when the tail does not determine it.

    Profile least squares over ``delta = min E - E*`` (log-spaced scan, then a bounded refinement): at the
    true limit of an exponential or power-law tail the regression is exact, a wrong ``E*`` bends it. The
    interval is the profile-likelihood one, ``n_eff log(RSS(delta) / RSS_min) <= 3.84`` with
    ``n_eff = n / block`` (the residuals of a smooth tail are serially correlated: one per bootstrap block
    counts), widened to 64 eps |E|. nan when the energy does not decrease, or when the best ``delta`` is the
    largest scanned (ten times the energy drop: a tail far from its limit does not determine it); ``lo`` is
    -inf when the interval reaches that largest ``delta``.
    """
    energy, dissipation = np.asarray(energy, dtype=float), np.asarray(dissipation, dtype=float)
    ok = np.isfinite(energy) & np.isfinite(dissipation) & (dissipation > 0)
    e, i = energy[ok], dissipation[ok]
    nan3 = (math.nan, math.nan, math.nan)
    if e.size < 4:
        return nan3
    e_min, span = float(e.min()), float(e.max() - e.min())
    if span <= 0:
        return nan3
    y = np.log(i)
    from scipy import optimize

    def rss(log_delta: float) -> float:
        x = np.log(e - e_min + math.exp(log_delta))
        A = np.stack([np.ones_like(x), x], axis=1)
        res = y - A @ np.linalg.lstsq(A, y, rcond=None)[0]
        return float(res @ res)

    floor = 64 * np.finfo(float).eps * max(1.0, abs(e_min))
    grid = np.linspace(math.log(max(floor, 1e-300)), math.log(10.0 * span), 160)
    values = np.array([rss(g) for g in grid])
    j = int(np.argmin(values))
    if j == grid.size - 1:
        return nan3               # the best E* recedes without bound: the tail does not determine it
    a, b = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    best = optimize.minimize_scalar(rss, bounds=(a, b), method="bounded", options={"xatol": 1e-10})
    log_delta, rss_min = (float(best.x), float(best.fun)) if best.fun <= values[j] else (float(grid[j]), float(values[j]))
    n_eff = e.size / _block_length(e.size)
    tiny = 1e-300

    def level(g: float) -> float:
        return n_eff * math.log(max(rss(g), tiny) / max(rss_min, tiny)) - PROFILE_LEVEL

    def edge(direction: int) -> float:
        """The log delta where the profile crosses the level, walking from the best along ``direction``."""
        inside = log_delta
        for g in (grid[grid > log_delta] if direction > 0 else grid[grid < log_delta][::-1]):
            if level(g) > 0:
                return optimize.brentq(level, min(inside, g), max(inside, g), xtol=1e-12)
            inside = g
        return math.inf if direction > 0 else -math.inf

    d_low, d_high = math.exp(edge(-1)), math.exp(edge(+1))
    e_star = e_min - math.exp(log_delta)
    return e_star, min(e_min - d_high, e_star - floor), max(e_min - d_low, e_star + floor)


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
# the certified minimum of Phi (k <= 3)
# ================================================================================================
CERTIFY_BUDGET = 1 << 15     # evaluations of Phi and grad Phi the refinement of a certificate may spend
CERTIFY_TOL = 1e-9           # refinement stops once the certified minimum is this close (relative) to the found one


@dataclass(frozen=True)
class _BoundTerms:
    """What :func:`grad_phi_bound` needs of the problem and of rho: ``X = max |x_bj|``, ``A = sum_{b,l} |G_bl|``,
    the score scale, the spectral norms of the basis blocks of (WQ, WK, WV, WO) and the weight decay."""
    X: float
    A: float
    scale: float
    basis_norm: np.ndarray   # [4]
    weight_decay: float

    @classmethod
    def of(cls, problem: Problem, G: np.ndarray) -> "_BoundTerms":
        a = problem.arrays()
        inputs = a["embedding"][a["tokens"]] + a["positions"][None, :, :]
        basis = a.get("basis")
        norms = np.ones(4) if basis is None else np.array(
            [np.linalg.norm(basis[blk], 2) if basis[blk].size else 0.0 for blk in _blocks_of(problem)])
        return cls(X=float(np.max(np.linalg.norm(inputs, axis=-1))),
                   A=float(np.sum(np.linalg.norm(np.asarray(G).real.astype(float), axis=-1))),
                   scale=abs(float(a["score_scale"])), basis_norm=norms, weight_decay=problem.weight_decay)


def _blocks_of(problem: Problem) -> list[slice]:
    s = problem.d * problem.head_dim
    return [slice(0, s), slice(s, 2 * s), slice(2 * s, 3 * s), slice(3 * s, 4 * s)]


def _head_norms(problem: Problem, centre: np.ndarray) -> np.ndarray:
    """Frobenius norms of (WQ, WK, WV, WO) at ``centre`` [C, k]: [C, 4]."""
    theta = problem.coords.theta(np.asarray(centre, dtype=float))
    return np.stack([np.linalg.norm(theta[:, blk], axis=1) for blk in _blocks_of(problem)], axis=1)


def grad_phi_bound(problem: Problem, centre: np.ndarray, radius: np.ndarray, G: np.ndarray) -> np.ndarray:
    """An upper bound on ``|grad_omega Phi(x; rho)|`` over each ball ``|x - centre_c| <= radius_c``: [C, k], [C] -> [C].

    With ``Phi_data(theta) = sum_{b,l} <G_bl, WO c_bl>``, ``c_bl = sum_{j<=l} a_lj WV x_bj`` (docs/model.md; G
    holds the loss weights and the unembedding), ``X = max |x_bj|``, ``A = sum_{b,l} |G_bl|`` and ``s`` the
    score scale, the derivative along a unit direction e of omega, which moves ``(WQ, WK, WV, WO)`` by
    ``(B_Q e, B_K e, B_V e, B_O e)``, is at most

        ``A [ X |WV| |B_O| + |WO| ( X |B_V| + 2 |s| X^3 |WV| (|WK| |B_Q| + |WQ| |B_K|) ) ] + lam |omega|``:

    ``|c| <= |WV| X`` (a convex combination); the softmax derivative gives
    ``sum_j da_j V_j = sum_j a_j ds_j (V_j - sum_i a_i V_i)``, at most ``max_j |ds_j| 2 |WV| X``, with
    ``|ds_j| <= |s| X^2 (|dWQ| |WK| + |WQ| |dWK|)``. Matrix norms are Frobenius (they bound the spectral
    ones), ``|B_W|`` the spectral norm of W's rows of the basis (1 in full coordinates), and over a ball
    ``|W(x)| <= |W(centre)| + |B_W| radius``. The bound holds for every rho (it uses only G).
    """
    return _derivative_bounds(_BoundTerms.of(problem, G), problem, np.atleast_2d(np.asarray(centre, dtype=float)),
                              np.asarray(radius, dtype=float))[0]


def _rounding(t: _BoundTerms, problem: Problem, centre: np.ndarray, phi: np.ndarray, n_terms: int) -> np.ndarray:
    """A bound on the float64 rounding error of Phi at ``centre`` [C, k]: ``(n + 16) eps`` times the sum of the
    magnitudes summed (each data term ``|<G_bl, WO c_bl>| <= |G_bl| |WO| |WV| X``; ``lam |omega|^2 / 2``)."""
    _, _, wv, wo = _head_norms(problem, centre).T
    magnitude = np.abs(phi) + t.A * t.X * wv * wo + 0.5 * t.weight_decay * np.einsum("ck,ck->c", centre, centre)
    return (n_terms + 16) * np.finfo(float).eps * magnitude


def hess_phi_bound(problem: Problem, centre: np.ndarray, radius: np.ndarray, G: np.ndarray) -> np.ndarray:
    """An upper bound on ``|e^T Hess_omega Phi(x; rho) e|`` over unit e and each ball ``|x - centre_c| <= radius_c``:
    [C, k], [C] -> [C].

    Along a line ``theta = theta(x) + tau B e`` (notation of :func:`grad_phi_bound`; ``d`` is ``d/dtau``):
    ``d^2 Phi_data = sum_{b,l} <G_bl, 2 dWO dc_bl + WO d^2 c_bl>`` with ``dc = sum_j da_j V_j + sum_j a_j dWV x_j``
    and ``d^2 c = sum_j d^2 a_j V_j + 2 sum_j da_j dWV x_j``. With ``S1 = |s| X^2 (|B_Q| |WK| + |WQ| |B_K|)``
    bounding ``|ds_j|`` and ``S2 = 2 |s| X^2 |B_Q| |B_K|`` bounding ``|d^2 s_j|``, the softmax derivatives
    ``da_j = a_j (ds_j - <ds>)``, ``d^2 a_j = a_j ((ds_j - <ds>)^2 - var(ds) + d^2 s_j - <d^2 s>)`` (means under
    a) give ``|dc| <= 2 S1 |WV| X + |B_V| X`` and ``|d^2 c| <= 2 |WV| X (2 S1^2 + 2 S2) + 4 S1 |B_V| X``, so

        ``|d^2 Phi| <= A (2 |B_O| |dc| + |WO| |d^2 c|) + lam``.
    """
    return _derivative_bounds(_BoundTerms.of(problem, G), problem, np.atleast_2d(np.asarray(centre, dtype=float)),
                              np.asarray(radius, dtype=float))[1]


def _derivative_bounds(t: _BoundTerms, problem: Problem, centre: np.ndarray,
                       radius: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bounds of :func:`grad_phi_bound` and :func:`hess_phi_bound` over balls: ([C], [C])."""
    wq, wk, wv, wo = (_head_norms(problem, centre) + t.basis_norm * radius[:, None]).T
    bq, bk, bv, bo = t.basis_norm
    X = t.X
    s1 = t.scale * X ** 2 * (bq * wk + wq * bk)        # |ds_j|
    s2 = 2.0 * t.scale * X ** 2 * bq * bk              # |d^2 s_j|
    dc = 2.0 * s1 * wv * X + bv * X
    d2c = 2.0 * wv * X * (2.0 * s1 ** 2 + 2.0 * s2) + 4.0 * s1 * bv * X
    grad = t.A * (X * wv * bo + wo * dc) + t.weight_decay * (np.linalg.norm(centre, axis=1) + radius)
    return grad, t.A * (2.0 * bo * dc + wo * d2c) + t.weight_decay


def _float64(problem: Problem) -> Problem:
    """The problem evaluated in float64 (a certificate needs float64 rounding)."""
    return problem if problem.dtype == np.float64 else Problem.from_arrays(problem.arrays(), "float64", problem.beta)


def certified_min_phi(problem: Problem, G: np.ndarray, dom: Domain, points: int, found: float,
                      budget: int = CERTIFY_BUDGET) -> tuple[float, int]:
    """A proven lower bound on ``min_Omega Phi(.; rho)``: ``(bound, evaluations of Phi and grad Phi spent)``.

    The boxes of half-widths ``h/2`` about the points of the regular grid of ``points`` per axis (h the
    spacing) cover the bounding box of Omega. On a box of half-widths ``w`` about c, Taylor's theorem gives
    ``Phi(x) >= Phi(c) - sum_i |dPhi/domega_i(c)| w_i - M |w|^2 / 2 - (rounding)`` with M from
    :func:`hess_phi_bound` over the ball of radius ``|w|`` and the float64 rounding of Phi and grad Phi
    (``(B T d + 16) eps`` times the magnitudes summed). Boxes whose bound lies below ``found`` (the least Phi
    found in Omega) by more than CERTIFY_TOL relative are split into 2^k children, worst first, while
    ``budget`` evaluations last (near a minimizer the slack falls fourfold per split, so the work per halving
    stays about constant); boxes that miss Omega are dropped. The least bound over the boxes is the
    certificate: it holds whatever the budget, which only decides how close it gets to ``found``.
    """
    problem = _float64(problem)
    G = np.asarray(G).astype(np.float64, copy=False)
    k = dom.k
    mesh, _ = dom.grid(points)
    half = (dom.upper - dom.lower) / max(points - 1, 1) / 2.0
    halves = np.tile(half, (mesh.shape[0], 1))
    keep = _meets(dom, mesh, halves)
    centre, halves = mesh[keep], halves[keep]
    terms, n_terms = _BoundTerms.of(problem, G), int(np.asarray(G).size)
    tol = CERTIFY_TOL * (1.0 + abs(found))

    def lower(c: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The lower bounds of Phi over the boxes, and Phi at their centres."""
        p, g = _grad_phi_batched(problem, G, c)
        r = np.linalg.norm(w, axis=1)
        slope, curvature = _derivative_bounds(terms, problem, c, r)
        rounding = _rounding(terms, problem, c, p, n_terms) + (n_terms + 16) * np.finfo(float).eps * slope * r
        return p - np.sum(np.abs(g) * w, axis=1) - 0.5 * curvature * r * r - rounding, p

    low, phi = lower(centre, halves)
    spent = centre.shape[0]
    inside = ~dom.outside(centre)
    target = min(found, float(np.min(phi[inside])) if inside.any() else math.inf) - tol
    children = np.array(np.meshgrid(*([[-0.5, 0.5]] * k), indexing="ij")).reshape(k, -1).T   # [2^k, k]
    while spent < budget:
        bad = np.flatnonzero(low < target)
        if bad.size == 0:
            break
        bad = bad[np.argsort(low[bad], kind="stable")][:max(1, (budget - spent) // children.shape[0])]
        c_new = (centre[bad, None, :] + children[None, :, :] * halves[bad, None, :]).reshape(-1, k)
        w_new = np.repeat(halves[bad] / 2.0, children.shape[0], axis=0)
        ok = _meets(dom, c_new, w_new)
        c_new, w_new = c_new[ok], w_new[ok]
        l_new, p_new = lower(c_new, w_new)
        spent += c_new.shape[0]
        inside = ~dom.outside(c_new)
        if inside.any():
            target = min(target, float(np.min(p_new[inside])) - tol)
        rest = np.ones(centre.shape[0], dtype=bool)
        rest[bad] = False
        centre, halves = np.concatenate([centre[rest], c_new]), np.concatenate([halves[rest], w_new])
        low = np.concatenate([low[rest], l_new])
    return float(np.min(low)) if low.size else math.inf, spent


def _meets(dom: Domain, centre: np.ndarray, half: np.ndarray) -> np.ndarray:
    """Boxes about ``centre`` [C, k] of half-widths ``half`` [C, k] that meet Omega: [C] bool."""
    if dom.kind == "box":
        mid, width = (dom.upper + dom.lower) / 2.0, (dom.upper - dom.lower) / 2.0
        return np.all(np.abs(centre - mid) <= width + half, axis=1)
    nearest = np.maximum(np.abs(centre) - half, 0.0)       # the box's point nearest the origin
    return np.linalg.norm(nearest, axis=1) <= dom.radius


def _phi_batched(problem: Problem, G: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], GRID_BATCH):
        out[start:start + GRID_BATCH] = problem.phi_field(x[start:start + GRID_BATCH], G)
    return out


def _grad_phi_batched(problem: Problem, G: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    phi, grad = np.empty(x.shape[0]), np.empty(x.shape)
    for start in range(0, x.shape[0], GRID_BATCH):
        phi[start:start + GRID_BATCH], grad[start:start + GRID_BATCH] = problem.grad_phi_field(x[start:start + GRID_BATCH], G)
    return phi, grad


# ================================================================================================
# the optimality gap
# ================================================================================================
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
    bound = problem.energy(omega, mass) - float(mass @ phi) - (logsumexp(-beta * phi) + math.log(grid.cell_volume)) / beta
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
    ``dissipation``, ``gap`` (from the least Phi found: never above the true gap), ``gap_certified`` (bool: min
    Phi certified, :class:`GapResult`), ``gap_bound`` (the certified upper bound on the gap), ``lower_bound``
    (``E - gap_bound``, a proven lower bound on E over measures on Omega; nan where the gap is not certified
    or an entropy term is missing), ``min_phi``, ``mean_phi``, ``outside_mass``, ``minimizer`` [F, k],
    ``pl_mu`` (only where E - E* is trustworthy: :func:`trusted_excess`), ``energy_identity_residual``,
    ``kl_predicted`` (E - E* predicted by the KL fit over its window). Scalars: ``e_star``, where it came from
    and the interval ``[e_star_low, e_star_high]`` known (given, certified) or estimated (fit) to hold it; the
    KL fit, or ``kl_status`` saying why the window shows no KL regime; ``pl_mu_min`` (the least trusted PL
    ratio at the frames of the KL window: the PL constant the tail supports), the stationary time, and the
    settings the gap search used."""
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
    gap_bound: np.ndarray
    gap_certified: np.ndarray
    e_star: float = math.nan
    e_star_source: str = "none"
    e_star_low: float = math.nan
    e_star_high: float = math.nan
    kl_status: str = ""
    kl_fitted: float = math.nan
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
                "minimizer", "gap_exhaustive", "pl_mu", "energy_identity_residual", "kl_predicted", "gap_bound",
                "gap_certified")
SCALARS = ("e_star", "e_star_source", "e_star_low", "e_star_high", "kl_status", "kl_fitted", "kl_theta", "kl_constant", "kl_points", "kl_window_start", "kl_decay_error",
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
                 pl_mu=nan.copy(), energy_identity_residual=nan.copy(), kl_predicted=nan.copy(),
                 gap_bound=nan.copy(), gap_certified=np.zeros(F, dtype=bool))
    if F == 0:
        a.notes.append("no frames")
        return a
    if settings.gap:
        _gaps(a, traj, problem, settings, previous)
    if "omega" in traj.frames and not math.isinf(problem.beta):
        # the stored energy and dissipation of noisy particles lack the entropy term (no density to take it
        # from): the identity and the rates would be those of another functional
        a.kl_status = ENTROPY_MISSING
        a.notes.append(ENTROPY_MISSING)
        _clusters(a, traj, problem, settings)
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

    _rates(a, settings, st_t, st_e, st_i)
    _clusters(a, traj, problem, settings)
    return a


def _clusters(a: Analysis, traj: Trajectory, problem: Problem, settings: DiagnosticsConfig) -> None:
    last = a.time.size - 1
    omega, mass = frame_measure(traj, last)
    grid = trajectory_grid(traj)
    cells = {} if grid is None else {"min_mass": GRID_CLUSTER_MASS * float(mass.max()),
                                     "min_distance": 1.01 * float(np.linalg.norm(grid.width))}
    a.clusters = head_clusters(problem, omega, mass, tol=settings.cluster_tol, attention_maps=settings.attention_maps,
                               seed=settings.seed, frame=last, **cells)


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
        a.gap_certified[f], a.gap_bound[f] = res.certified, res.gap_bound
        known.append(res.minimizer[None])
    computed = np.isfinite(a.gap)
    a.gap_computed = bool(computed.any())
    a.gap_is_estimate = bool(a.gap_computed and not a.gap_certified[computed].all())
    a.gap_domain = "grid, entropic" if entropic else settings.domain
    a.gap_radius = settings.radius if settings.domain in ("ball", "box") and not entropic else math.nan
    if entropic:
        a.notes.append("beta < inf on a grid: G = E_h - min E_h over grid densities (relative entropy to the Gibbs "
                       "density of Phi, divided by beta)")
    if math.isinf(problem.beta) or entropic:
        a.lower_bound = np.where(a.gap_certified, a.energy - a.gap_bound, np.nan)
    else:
        a.notes.append("beta < inf with particles: E - G is not a lower bound (the entropy is not in Phi); "
                       "lower_bound left nan")
    if a.gap_is_estimate:
        a.notes.append(f"the gap is an estimate: min Phi comes from a non-exhaustive search in k = {problem.k} "
                       "coordinates, so E - G bounds nothing and is not used as E*")
    if np.any(a.outside_mass[computed] > 0):
        a.notes.append("part of rho lies outside Omega: the gap may be negative there (a certified E - G bound "
                       "stays a bound)")


def _rates(a: Analysis, settings: DiagnosticsConfig, st_t: np.ndarray, st_e: np.ndarray, st_i: np.ndarray) -> None:
    """E*, the PL ratio at the frames and the KL fit over the window (on the /steps rows when present).

    E* comes with an interval that holds it: ``diagnostics.e_star`` if given (a point); else the narrower of
    the certified one, ``[best E - gap_bound, lowest E]`` (point: the bound), and the profile interval of the
    limit fitted from the window's tail (:func:`fit_e_star_interval`). An uncertified gap never gives E*.
    PL and KL use only samples where E - E* is trustworthy (:func:`trusted_excess`)."""
    t_end = float(a.time[-1])
    start = t_end - settings.kl_window * (t_end - float(a.time[0]))
    in_window = st_t >= start - 1e-12 * max(1.0, abs(start))
    e_min = float(np.nanmin(st_e))
    candidates = []
    if math.isfinite(settings.e_star):
        candidates.append(("given", float(settings.e_star), float(settings.e_star), float(settings.e_star)))
    else:
        bounds = np.isfinite(a.lower_bound)
        if bounds.any():
            best = float(np.max(a.lower_bound[bounds]))
            if best <= e_min:
                candidates.append(("lower_bound", best, best, e_min))
            else:
                a.notes.append(f"certified lower bound {best:.10g} exceeds the lowest energy {e_min:.10g}: the energies "
                               "are not those of this problem's flow (solver error?); the bound is not used as E*")
        fitted = fit_e_star_interval(st_e[in_window], st_i[in_window])
        if math.isfinite(fitted[0]):
            candidates.append(("fit",) + fitted)
    if not candidates:
        a.e_star_source = "none"
        a.kl_status = "no KL regime in this window: E* unknown (no certified gap, and the tail does not determine its limit)"
        a.notes.append("E* unknown (no certified gap, and the tail does not determine its limit): no PL/KL; "
                       "pass --e-star or run longer")
        return
    source, e_star, lo, hi = min(candidates, key=lambda c: c[3] - c[2])
    a.e_star, a.e_star_source, a.e_star_low, a.e_star_high = e_star, source, lo, hi
    trusted = trusted_excess(a.energy, (lo, hi))
    a.pl_mu = np.where(trusted, pl_constant(a.energy, a.dissipation, e_star), np.nan)
    fit = kl_fit(st_e[in_window], st_i[in_window], e_star, e_star_range=(lo, hi), seed=settings.seed)
    a.kl_theta, a.kl_theta_ci, a.kl_constant, a.kl_points = fit.theta, (fit.ci_low, fit.ci_high), fit.constant, fit.n_points
    a.kl_fitted, a.kl_window_start = fit.fitted, start
    if fit.reason:
        a.kl_status = f"no KL regime in this window: {fit.reason}"
        a.notes.append(a.kl_status)
    else:
        a.kl_status = "KL regime"
    frames = np.flatnonzero(a.time >= start - 1e-12 * max(1.0, abs(start)))
    window_mu = a.pl_mu[frames][np.isfinite(a.pl_mu[frames])]
    a.pl_mu_min = float(window_mu.min()) if window_mu.size else math.nan
    if math.isfinite(fit.theta) and frames.size and a.energy[frames[0]] > e_star:
        t0 = a.time[frames[0]]
        predicted = fit.predicted_excess(a.time[frames], t0, a.energy[frames[0]] - e_star)
        a.kl_predicted[frames] = predicted
        observed = a.energy[frames] - e_star
        ok = (observed > 0) & (predicted > 0) & trusted[frames]
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
    F = kwargs["time"].size      # files written before certificates: nothing certified
    kwargs.setdefault("gap_bound", np.full(F, np.nan))
    kwargs.setdefault("gap_certified", np.zeros(F, dtype=bool))
    kwargs.update({key: d[key] for key in SCALARS if key in d})
    kwargs["kl_status"] = str(kwargs.get("kl_status", ""))
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


__all__ = ["GapResult", "optimality_gap", "entropic_gap", "minimize_phi", "certified_min_phi", "grad_phi_bound",
           "hess_phi_bound", "trusted_excess", "fit_e_star_interval", "ENTROPY_MISSING", "Domain",
           "energy_identity_residual", "pl_constant",
           "kl_exponent", "kl_fit", "KLFit", "fit_e_star", "attention_pattern", "probe_sequence", "HeadClusters",
           "head_clusters", "frame_measure", "trajectory_grid", "Analysis", "analyse", "analyse_run", "write_analysis",
           "read_analysis", "check_editable", "gap_frame_indices"]
