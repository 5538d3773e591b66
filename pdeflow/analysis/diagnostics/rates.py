"""Rates of the energy decay: the energy identity residual, the PL ratio, the KL exponent, and fits of E*."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def energy_identity_residual(time: np.ndarray, energy: np.ndarray, dissipation: np.ndarray,
                             integral: np.ndarray | None = None) -> np.ndarray:
    """``r_n = E(t_n) - E(t_0) + int_{t_0}^{t_n} I dt``: [n] -> [n] (``r_0 = 0``).

    Zero for the exact flow (the energy identity ``dE/dt = -I``). ``integral`` [n]: the run's own quadrature
    of each step, ``integral[j] ~ int_{t_{j-1}}^{t_j} I dt`` (``/steps/dissipation_integral``, the stepper's
    stage quadrature, so the residual falls at the method's order; ``integral[0]`` is ignored). Without it,
    or where it is not finite, the trapezoid rule on ``dissipation`` (``O(h^2)`` whatever the method).
    """
    time, energy, dissipation = (np.asarray(a, dtype=float) for a in (time, energy, dissipation))
    if time.size == 0:
        return np.zeros(0)
    steps = 0.5 * np.diff(time) * (dissipation[1:] + dissipation[:-1])
    if integral is not None:
        own = np.asarray(integral, dtype=float)[1:]
        if own.shape == steps.shape and np.all(np.isfinite(own)):
            steps = own
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


def kl_interval_clipped(low: float, high: float) -> bool:
    """Whether a KL exponent interval ``[low, high]`` touches 0 or 1: cut to the range (0, 1] by :func:`kl_fit`."""
    return bool(low <= 0.0 or high >= 1.0)


@dataclass(frozen=True)
class KLFit:
    """``log I = log C + q log(E - E*)`` with ``q = 2 (1 - theta)``: theta, its 95% interval, C, points used.

    ``reason`` is empty when the window shows a KL regime; otherwise it says in one line why not, and theta,
    the interval and C are nan (``fitted`` keeps the regression's theta, if there was one, for the record).
    The interval lies in [0, 1], the closure of the exponent's range (0, 1]: :attr:`clipped` says it was cut there.
    """
    theta: float
    ci_low: float
    ci_high: float
    constant: float
    n_points: int
    reason: str = ""
    fitted: float = math.nan

    @property
    def clipped(self) -> bool:
        """Whether the bootstrap interval reached past the range (0, 1] and was cut to it."""
        return kl_interval_clipped(self.ci_low, self.ci_high)

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
    # the exponent of a Lojasiewicz inequality lies in (0, 1]: the bootstrap's interval is cut to that range
    ci_low, ci_high = max(1.0 - q_high / 2.0, 0.0), min(1.0 - q_low / 2.0, 1.0)
    return KLFit(theta=theta, ci_low=ci_low, ci_high=ci_high, constant=float(math.exp(c)), n_points=n, fitted=theta)


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
    if 10.0 * span <= floor:
        return nan3               # the energy moves at its rounding: nothing to fit
    grid = np.linspace(math.log(max(floor, 1e-300)), math.log(10.0 * span), 160)
    values = np.array([rss(g) for g in grid])
    j = int(np.argmin(values))
    if j == grid.size - 1:
        return nan3               # the best E* recedes without bound: the tail does not determine it
    a, b = grid[max(j - 1, 0)], grid[min(j + 1, grid.size - 1)]
    best = optimize.minimize_scalar(rss, bounds=(a, b), method="bounded", options={"xatol": 1e-10})
    log_delta, rss_min = ((float(best.x), float(best.fun)) if best.fun <= values[j]
                          else (float(grid[j]), float(values[j])))
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
