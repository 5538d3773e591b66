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
    with np.errstate(invalid="ignore", over="ignore"):  # a non-finite stored energy gives NaN residuals, no warning
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
THETA_TOL = 0.005         # a single theta only where the local exponent varies by at most this over the window
LOCAL_SECANTS = 16        # the window's span of ln(E - E*) is cut into about this many secants of the local exponent
MIN_SECANTS = 3           # ... and at least this many show whether the local exponent drifts
PROFILE_LEVEL = 3.841     # chi^2_1 0.95 quantile: the profile-likelihood interval of a fitted E*
PRE_ASYMPTOTIC = "pre-asymptotic: the local exponent drifts from {a:.4f} to {b:.4f} over t in [{t0:.6g}, {t1:.6g}]"


@dataclass(frozen=True)
class LocalExponent:
    """The local exponent ``theta(t) = 1 - (1/2) d ln I / d ln(E - E*)`` over a window, as secants.

    The trusted samples are cut at nodes ``j = 0..m`` where ``x = ln(E - E*)`` has fallen by a step ``h`` (about
    1/LOCAL_SECANTS of its span, never less than the rounding allows) since the previous node, and each secant
    ``theta_j = 1 - (y_{j+1} - y_j) / (2 (x_{j+1} - x_j))`` (``y = ln I``) is by the mean value theorem the local
    exponent at some time of ``[t_j, t_{j+1}]``. Arrays [m]: ``time`` (midpoints), ``theta`` (E* at its value).
    ``low``, ``high``: a range that holds ``theta(t)`` at every time of the window, for every E* of its interval:
    the least and largest secant over the three E* (the interval's ends and its value), widened by ``pad``, the
    largest change between neighbouring secants (what the local exponent can do within one secant, for a curve
    whose exponent varies smoothly on the scale of a secant) plus the rounding of the secants. ``theta`` of
    the whole window: the secant from the first node to the last (a mean of the local exponent).
    """
    time: np.ndarray
    theta: np.ndarray
    low: float
    high: float
    pad: float
    mean: float
    constant: float
    t_first: float
    t_last: float

    @property
    def drift(self) -> float:
        """The largest minus the least secant with E* at its value: how far the local exponent moves."""
        return float(np.ptp(self.theta)) if self.theta.size else math.nan

    @property
    def extended(self) -> tuple[float, float]:
        """``[low, high]`` extended by :attr:`drift` on the side the local exponent moves to (last secant against
        first): where it may still go if it goes on moving as much. When theta(t) moves monotonically towards a limit
        and its distance to it at least halves over the window (e.g. late in a mixture of modes whose faster part
        decays), the limit lies within it; a window at a turning point of theta(t) shows no drift and says nothing of
        the limit (at a known minimum, the PL ratio against lambda_min does: ``diagnose --stationary``)."""
        move = self.theta[-1] - self.theta[0]
        return (self.low - (self.drift if move < 0 else 0.0), self.high + (self.drift if move > 0 else 0.0))


def _nodes(x: np.ndarray, h: float) -> np.ndarray:
    """Indices where ``x`` (falling, up to rounding) has fallen by ``h`` since the previous node, the last included."""
    nodes, level = [0], x[0]
    for j in range(1, x.size):
        if x[j] <= level - h:
            nodes.append(j)
            level = x[j]
    if nodes[-1] != x.size - 1 and x[nodes[-1]] - x[-1] > 0.5 * h:
        nodes.append(x.size - 1)
    return np.asarray(nodes)


def _secants(x: np.ndarray, y: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    return 1.0 - np.diff(y[nodes]) / (2.0 * np.diff(x[nodes]))


def local_exponent(time: np.ndarray, energy: np.ndarray, dissipation: np.ndarray, e_star: float,
                   e_star_range: tuple[float, float]) -> LocalExponent | None:
    """The local exponent over samples [n] that are all trusted (:func:`trusted_excess`) with ``I > 0``, in time
    order (:class:`LocalExponent`); None when they give fewer than MIN_SECANTS secants."""
    time, energy, dissipation = (np.asarray(a, dtype=float) for a in (time, energy, dissipation))
    eps = np.finfo(float).eps
    eps_x = 4 * eps * (np.abs(energy) + abs(e_star)) / (energy - e_star)   # relative rounding of E - E*
    h = float(np.ptp(np.log(energy - e_star))) / LOCAL_SECANTS
    # a secant over h carries a rounding error ~ |q| eps_x / h: samples where that would exceed ~1e-3 are left out
    keep = eps_x <= 5e-4 * h
    time, energy, dissipation, eps_x = time[keep], energy[keep], dissipation[keep], eps_x[keep]
    if time.size < 2:
        return None
    y = np.log(dissipation)
    x = np.log(energy - e_star)
    nodes = _nodes(x, h)
    if nodes.size < MIN_SECANTS + 1:
        return None
    star_lo, star_hi = e_star_range
    every = [_secants(np.log(energy - s), y, nodes) for s in sorted({star_lo, e_star, star_hi})]
    theta = _secants(x, y, nodes)
    dx = np.abs(np.diff(x[nodes]))
    q = np.abs(2.0 * (1.0 - theta))
    rounding = float(np.max((2 * 16 * eps + q * (eps_x[nodes[1:]] + eps_x[nodes[:-1]])) / (2.0 * dx)))
    pad = float(np.max(np.abs(np.diff(theta)))) + rounding
    low = min(float(s.min()) for s in every) - pad
    high = max(float(s.max()) for s in every) + pad
    mean = 1.0 - (y[nodes[-1]] - y[nodes[0]]) / (2.0 * (x[nodes[-1]] - x[nodes[0]]))
    c = float(np.exp(np.mean(y - 2.0 * (1.0 - mean) * x)))
    mid = 0.5 * (time[nodes[1:]] + time[nodes[:-1]])
    return LocalExponent(time=mid, theta=theta, low=low, high=high, pad=pad, mean=float(mean), constant=c,
                         t_first=float(time[nodes[0]]), t_last=float(time[nodes[-1]]))


@dataclass(frozen=True)
class KLFit:
    """What a window says about ``I = C (E - E*)^q``, ``q = 2 (1 - theta)``: theta, the interval ``[low, high]``
    (:attr:`LocalExponent.extended`: the range of the local exponent theta(t) over t in the window and E* over its
    interval, extended by its drift on the side it moves; not a confidence interval), C, the trusted points used.

    ``theta`` is finite only when the local exponent is constant over the window within THETA_TOL (its secants
    with E* at its value span at most THETA_TOL) and lies in (0, 1]; otherwise ``reason`` says in one line why
    not (for a drifting exponent: ``pre-asymptotic: the local exponent drifts from a to b over t in [t0, t1]``),
    and ``fitted`` keeps the window's mean exponent for the record. ``local``: the secants, when there were enough.
    """
    theta: float
    low: float
    high: float
    constant: float
    n_points: int
    reason: str = ""
    fitted: float = math.nan
    local: LocalExponent | None = None

    @property
    def pre_asymptotic(self) -> bool:
        """Whether the window was refused because its local exponent drifts."""
        return self.reason.startswith("pre-asymptotic")

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


def e_star_refusal(e_star: float, lowest: float, what: str = "the lowest energy of the run") -> str:
    """Why ``e_star`` cannot be the limit of a flow whose least energy is ``lowest`` ("" when it can), in one
    line: the energy of a gradient flow never rises, so its limit lies at or below every energy it took (up to
    rounding, 64 eps |E|). ``what`` names ``lowest`` (e.g. the energy of a stationary point)."""
    if not (math.isfinite(e_star) and math.isfinite(lowest)):
        return ""
    floor = 64 * np.finfo(float).eps * max(1.0, abs(lowest))
    if e_star - lowest <= floor:
        return ""
    return f"E* = {e_star:.12g} lies above {what} ({lowest:.12g}), so it is no limit of this flow"


def _window(n: int, window: float) -> slice:
    if not 0 < window <= 1:
        raise ValueError(f"window must be in (0, 1], got {window}")
    return slice(n - max(1, int(math.ceil(window * n))), n)


def _block_length(n: int) -> int:
    """About 2 n^(1/3) consecutive residuals of a smooth tail count as one (the profile interval of E*)."""
    return max(1, int(round(2.0 * n ** (1.0 / 3.0))))


def kl_fit(energy: np.ndarray, dissipation: np.ndarray, e_star: float, window: float = 1.0, *,
           e_star_range: tuple[float, float] | None = None, time: np.ndarray | None = None) -> KLFit:
    """The KL exponent over the last ``window`` fraction of the samples, where the data establish it.

    On the samples where ``E - E*`` is trustworthy (:func:`trusted_excess`; ``e_star_range = (lo, hi)`` is an
    interval known to hold E*, default the point ``e_star``) and ``I > 0``, the local exponent
    ``theta(t) = 1 - (1/2) d ln I / d ln(E - E*)`` (:func:`local_exponent`; ``time`` [n], default the sample index).
    A single theta needs KL_MIN_POINTS trusted samples over which ``E - E*`` falls by a factor 2 or more, MIN_SECANTS
    secants, a local exponent constant within THETA_TOL, and a value in (0, 1] (a Lojasiewicz exponent); otherwise
    ``reason`` says which failed, in one line.
    """
    energy, dissipation = np.asarray(energy, dtype=float), np.asarray(dissipation, dtype=float)
    time = np.arange(energy.size, dtype=float) if time is None else np.asarray(time, dtype=float)
    sl = _window(energy.size, window) if energy.size else slice(0, 0)
    t, e, i = time[sl], energy[sl], dissipation[sl]
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
    local = local_exponent(t[ok], e[ok], i[ok], e_star, (lo, hi))
    if local is None:
        return KLFit(nan, nan, nan, nan, n, reason=f"the {n} trusted samples give fewer than {MIN_SECANTS} secants of "
                                                   "ln I against ln(E - E*): whether the local exponent drifts is "
                                                   "not seen")
    if local.drift > THETA_TOL:
        return KLFit(nan, local.low, local.high, nan, n, fitted=local.mean, local=local,
                     reason=PRE_ASYMPTOTIC.format(a=local.theta[0], b=local.theta[-1], t0=local.t_first,
                                                  t1=local.t_last))
    if not 0.0 < local.mean <= 1.0:
        return KLFit(nan, local.low, local.high, nan, n, fitted=local.mean, local=local,
                     reason=f"the local exponent {local.mean:.3g} lies outside (0, 1]: I is not a KL power of E - E* "
                            "here (the step lost accuracy, or E* is not this flow's limit)")
    low, high = local.extended
    return KLFit(theta=local.mean, low=max(low, 0.0), high=min(high, 1.0), constant=local.constant,
                 n_points=n, fitted=local.mean, local=local)


def kl_exponent(energy: np.ndarray, dissipation: np.ndarray, e_star: float,
                window: float = 1.0) -> tuple[float, float, float]:
    """The KL exponent theta of ``I ~ C (E - E*)^(2 (1 - theta))`` and the range of the local exponent over the
    window: ``(theta, low, high)``, theta nan when the window establishes none. See :func:`kl_fit`."""
    fit = kl_fit(energy, dissipation, e_star, window)
    return fit.theta, fit.low, fit.high


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
