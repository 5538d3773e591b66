"""The analysis of a trajectory (what ``/analysis`` holds): rates, gaps and head clusters, from the
``[diagnostics]`` settings; the quantities are those of :mod:`pdeflow.analysis.diagnostics`."""
from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass, field

import numpy as np

from ...core.clock import time_tolerance
from ...core.config import ConfigError, DiagnosticsConfig
from ...core.problem import Problem
from ...io import schema
from ...io.trajectory import Trajectory
from ..convergence.predictions import PointPrediction, spectral_test
from ..convergence.rates import (
    THETA_TOL,
    KLFit,
    e_star_refusal,
    energy_identity_residual,
    fit_e_star_interval,
    kl_fit,
    pl_constant,
    trusted_excess,
)
from ..convergence.spectral import SADDLE, SpectralRecord, analysed_spectrum
from ..optimality.gap import entropic_gap, optimality_gap
from .clusters import HeadClusters, frame_measure, head_clusters, trajectory_grid

UNIT_MASS_TOL = 1e-9         # a total mass this close to 1 is a probability measure's
GRID_CLUSTER_MASS = 1e-2     # grid cells lighter than this times the heaviest belong to no cluster
SUPPORT_MARGIN = 1.25        # a ball or box Omega reaches at least this times past the farthest particle analysed
ENTROPY_MISSING = ("refused: beta < inf with particles, whose stored energy has no entropy term; the energy "
                   "identity, E*, PL and KL analyses would be those of another functional")


@dataclass
class Analysis:
    """Everything ``/analysis`` holds. Arrays over frames [F] (nan where not computed): ``time``, ``energy``,
    ``dissipation``, ``gap`` (from the least Phi found: never above the true gap), ``gap_certified`` (bool: min
    Phi certified, :class:`GapResult`), ``gap_bound`` (the certified upper bound on the gap), ``lower_bound``
    (``E - gap_bound``, a proven lower bound on E over measures on Omega; nan where the gap is not certified
    or an entropy term is missing), ``min_phi``, ``mean_phi``, ``outside_mass``, ``minimizer`` [F, k],
    ``pl_mu`` (only where E - E* is trustworthy: :func:`trusted_excess`), ``energy_identity_residual``,
    ``kl_predicted`` (E - E* predicted by the KL exponent over its window, where one is established). Scalars:
    ``e_star``, where it came from and the interval ``[e_star_low, e_star_high]`` known (given, certified) or
    estimated (fit) to hold it; ``kl_status``: "KL regime", "pre-asymptotic: ..." or why the window shows no KL
    regime, in one line; ``gap_inputs``: the digest of what the gap was computed from (:func:`gap_inputs`); the
    local exponent theta(t) over the window ``[kl_window_start, kl_window_end]``
    (:func:`pdeflow.analysis.convergence.rates.local_exponent`, on its trusted samples from ``kl_t_first`` to
    ``kl_t_last``): its first and last secants ``kl_theta_first``, ``kl_theta_last``, the interval
    ``kl_theta_range`` (:attr:`~pdeflow.analysis.convergence.rates.LocalExponent.extended`), ``kl_theta`` (only
    where theta(t) is constant within ``kl_tolerance``); the PL ratio over the same samples: first, last and least
    (``pl_mu_first``, ``pl_mu_last``, ``pl_mu_min``); the theory's ``predicted_theta`` and ``predicted_mu`` at a
    given stationary point and ``prediction`` (on what they rest, or why none is claimed); the stationary time,
    and the settings the gap search used."""
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
    kl_theta_range: tuple[float, float] = (math.nan, math.nan)
    kl_theta_first: float = math.nan
    kl_theta_last: float = math.nan
    kl_t_first: float = math.nan
    kl_t_last: float = math.nan
    kl_tolerance: float = THETA_TOL
    kl_constant: float = math.nan
    kl_points: int = 0
    kl_window_start: float = math.nan
    kl_window_end: float = math.nan
    kl_decay_error: float = math.nan
    pl_mu_min: float = math.nan
    pl_mu_first: float = math.nan
    pl_mu_last: float = math.nan
    predicted_theta: float = math.nan
    predicted_mu: float = math.nan
    prediction: str = ""
    stationary_time: float = math.nan
    stationary_tol: float = math.nan
    gap_computed: bool = False
    gap_is_estimate: bool = False
    gap_domain: str = ""
    gap_radius: float = math.nan
    gap_inputs: str = ""
    clusters: HeadClusters | None = None
    spectrum: SpectralRecord | None = None      # the ends of the spectrum of S at analysed frames (spectral.py)
    notes: list[str] = field(default_factory=list)

    @property
    def gap_frames(self) -> np.ndarray:
        """Indices of the frames where the gap was computed."""
        return np.flatnonzero(np.isfinite(self.gap))

    @property
    def e_star_text(self) -> str:
        """Where E* comes from, in words: given, the energy of a given stationary point (a proven nondegenerate
        minimum where the theory's rates are claimed there), the certified lower bound, a fit, or unknown."""
        if self.e_star_source == "stationary":
            return ("the energy of the certified local minimum" if math.isfinite(self.predicted_theta)
                    else "the energy of the given stationary point (no proven nondegenerate minimum)")
        return {"given": "given", "lower_bound": "certified lower bound", "fit": "fitted from the tail",
                "none": "unknown"}.get(self.e_star_source, self.e_star_source)


# the names of /analysis, declared with their shapes and types in the trajectory's table (pdeflow.io.schema)
FRAME_ARRAYS = tuple(schema.ANALYSIS_FRAME_ARRAYS)
SCALARS = tuple(schema.ANALYSIS_SCALARS)
CLUSTER_ARRAYS = tuple(schema.ANALYSIS_CLUSTER_ARRAYS)


def gap_frame_indices(n_frames: int, gap_frames: int) -> np.ndarray:
    """``gap_frames`` frame indices spread evenly over [0, n_frames), the last frame included."""
    if n_frames == 0 or gap_frames <= 0:
        return np.zeros(0, dtype=np.int64)
    if gap_frames == 1:
        return np.array([n_frames - 1])
    return np.unique(np.round(np.linspace(0, n_frames - 1, gap_frames)).astype(np.int64))


def accurate_span(traj: Trajectory) -> tuple[Trajectory, str]:
    """The part of a trajectory its run computed accurately, and a one-line note ("" when that is all of it).

    A run that lost accuracy at ``t_lost`` (:func:`pdeflow.solvers.accuracy.file_lost_at`: the file's verdict)
    keeps its frames and /steps rows from before ``t_lost`` only: the step ending there broke the energy identity
    or the stability bound, so what follows is no longer the flow's. The result is a shallow copy of ``traj``
    with those frames and rows."""
    from ...solvers.accuracy import file_lost_at  # the accuracy record: steppers layer, below this one

    lost = file_lost_at(traj)
    if not math.isfinite(lost):
        return traj, ""
    tol = time_tolerance(lost)
    n_frames = int(np.count_nonzero(np.asarray(traj.time) < lost - tol))
    rows = np.asarray(traj.steps.get("time", np.zeros(0)))
    n_rows = int(np.count_nonzero(rows < lost - tol))
    span = copy.copy(traj)
    span.frames = {k: v[:n_frames] for k, v in traj.frames.items()}
    span.steps = {k: v[:n_rows] for k, v in traj.steps.items()}
    return span, (f"the run lost accuracy at t = {lost:.6g} (its accuracy verdict): only the {n_frames} of "
                  f"{len(traj.time)} frames and {n_rows} /steps rows before it are analysed")


def _padded(a: Analysis, traj: Trajectory) -> Analysis:
    """An analysis of the accurate span (:func:`accurate_span`) over all of ``traj``'s frames: the file's time,
    energy and dissipation, nan (False) for the frames after the span."""
    F, n = len(traj.time), a.time.size
    for name in FRAME_ARRAYS:
        value = np.asarray(getattr(a, name))
        if name in ("time", "energy", "dissipation"):
            full = np.asarray(traj.frames[name], dtype=float)
        else:
            full = np.full((F,) + value.shape[1:], False if value.dtype == bool else np.nan, dtype=value.dtype)
            full[:n] = value
        setattr(a, name, full)
    return a


def analyse(traj: Trajectory, settings: DiagnosticsConfig, *, previous: Analysis | None = None,
            run_stationary_tol: float = 0.0, point: PointPrediction | None = None) -> Analysis:
    """The analysis of a trajectory with the ``[diagnostics]`` settings (the :mod:`pdeflow.analysis.diagnostics`
    docstring), over the span its run computed accurately (:func:`accurate_span`; a note says when that is not all of
    it).

    ``previous``: an earlier analysis of the same file, whose minimizers seed the gap search (so a rerun
    only improves the minimum found), and whose gap (certified or not) is kept, with a note, when these settings do
    not recompute it (``gap = false``): a rerun never silently drops a certified gap. ``run_stationary_tol``: the
    run's ``run.stationary_tol``. ``point``: the theory's prediction at a stationary point
    (:func:`pdeflow.analysis.convergence.predictions.prediction_at`), printed beside the measured rates.
    """
    span, note = accurate_span(traj)
    if not note:
        return _analyse(traj, settings, previous, run_stationary_tol, point)
    a = _analyse(span, settings, previous, run_stationary_tol, point)
    a.notes.insert(0, note)
    return _padded(a, traj)


def lowest_energy(traj: Trajectory) -> float:
    """The least energy of the span a run computed accurately (:func:`accurate_span`), over its frames and
    /steps rows (nan when it has none): no limit of the flow lies above it."""
    span, _ = accurate_span(traj)
    values = [np.asarray(span.frames["energy"], dtype=float), np.asarray(span.steps.get("energy", ()), dtype=float)]
    finite = np.concatenate([v[np.isfinite(v)] for v in values])
    return float(finite.min()) if finite.size else math.nan


def _kept(a: Analysis, previous: Analysis | None, settings: DiagnosticsConfig) -> None:
    """The gap of ``previous`` (same frames) into ``a`` when ``settings`` do not recompute it, with a note."""
    if previous is None or previous.time.shape != a.time.shape or not np.array_equal(previous.time, a.time):
        return
    if not settings.gap and previous.gap_computed:
        _copy_gap(a, previous)
        certified = int(np.count_nonzero(a.gap_certified))
        a.notes.append(f"the gap stored by the earlier analysis is kept, not recomputed (diagnostics.gap = false): "
                       f"{a.gap_frames.size} frames, {certified} certified")


GAP_ARRAYS = ("gap", "lower_bound", "min_phi", "mean_phi", "outside_mass", "minimizer", "gap_exhaustive", "gap_bound",
              "gap_certified")
GAP_SCALARS = ("gap_computed", "gap_is_estimate", "gap_domain", "gap_radius", "gap_inputs")


def _copy_gap(a: Analysis, previous: Analysis) -> None:
    """The gap of ``previous`` (same frames) into ``a``: its arrays and its scalars."""
    for name in GAP_ARRAYS:
        setattr(a, name, np.array(getattr(previous, name), copy=True))
    for name in GAP_SCALARS:
        setattr(a, name, getattr(previous, name))


def gap_inputs(traj: Trajectory, frames: np.ndarray, settings: DiagnosticsConfig) -> str:
    """The SHA-256 (hex) of everything the gap at ``frames`` is computed from: the pdeflow version, the search's
    ``[diagnostics]`` settings (domain, radius, starts, grid points, seed, gap_frames), the stored problem (/model
    and /data arrays, beta), and at each frame its time and measure (particles and masses, or the density)."""
    from ... import __version__

    h = hashlib.sha256()
    keys = ("gap_frames", "domain", "radius", "n_starts", "grid_points", "seed")
    h.update(json.dumps({"version": __version__, **{k: getattr(settings, k) for k in keys},
                         "beta": repr(float(traj.model_attrs.get("beta", math.inf)))}, sort_keys=True).encode())
    for name in sorted(traj.arrays):
        value = np.ascontiguousarray(traj.arrays[name])
        h.update(f"{name}{value.dtype.str}{value.shape}".encode())
        h.update(value.tobytes())
    for f in frames:
        h.update(np.float64(traj.time[f]).tobytes())
        for name in ("omega", "mass", "density"):
            if name in traj.frames:
                h.update(name.encode())
                h.update(np.ascontiguousarray(traj.frames[name][int(f)], dtype=np.float64).tobytes())
    return h.hexdigest()


def _reused(a: Analysis, previous: Analysis | None) -> bool:
    """Whether ``previous`` holds a gap computed from the same inputs (:func:`gap_inputs`, ``a.gap_inputs``) on the
    same frames; if so it is copied into ``a`` with a note, and the search is not run again."""
    if (previous is None or not previous.gap_computed or previous.gap_inputs != a.gap_inputs
            or previous.time.shape != a.time.shape or not np.array_equal(previous.time, a.time)):
        return False
    _copy_gap(a, previous)
    certified = int(np.count_nonzero(a.gap_certified[a.gap_frames]))
    a.notes.append(f"the gap stored by the earlier analysis is reused, not recomputed: its inputs (the frames, the "
                   f"problem, the [diagnostics] search settings, the pdeflow version) are unchanged; "
                   f"{a.gap_frames.size} frames, {certified} certified")
    return True


def _analyse(traj: Trajectory, settings: DiagnosticsConfig, previous: Analysis | None,
             run_stationary_tol: float, point: PointPrediction | None) -> Analysis:
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
        a.gap_inputs = gap_inputs(traj, gap_frame_indices(F, settings.gap_frames), settings)
        if not _reused(a, previous):
            _gap_search(a, traj, problem, settings, previous)
        _gap_summary(a, traj, problem, settings)
    _kept(a, previous, settings)
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
    integral = np.asarray(steps["dissipation_integral"], dtype=float) if dense and "dissipation_integral" in steps \
        else None
    a.energy_identity_residual = np.interp(time, st_t, energy_identity_residual(st_t, st_e, st_i, integral))

    tol = settings.stationary_tol or run_stationary_tol or 1e-8 * float(dissipation[0])
    a.stationary_tol = tol
    below = dissipation <= tol
    if below[-1]:
        first = F - int(np.argmin(below[::-1])) if not below.all() else 0
        a.stationary_time = float(time[first])

    a.spectrum = analysed_spectrum(traj, problem, settings)
    _rates(a, settings, st_t, st_e, st_i, point)
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


def _gap_search(a: Analysis, traj: Trajectory, problem: Problem, settings: DiagnosticsConfig,
                previous: Analysis | None) -> None:
    """The search for min Phi at the gap frames (:func:`gap_frame_indices`), seeded by ``previous``'s minimizers:
    the gap arrays of ``a``, its domain and radius (Omega enlarged to hold the support)."""
    grid = trajectory_grid(traj)
    bounds = None if grid is None else (np.array(grid.lower), np.array(grid.upper))
    if settings.domain == "grid" and grid is None:
        raise ConfigError("diagnostics.domain = 'grid' needs a grid run; this file holds particles")
    known = [] if previous is None else [previous.minimizer[np.all(np.isfinite(previous.minimizer), axis=1)]]
    known = [m for m in known if m.shape[-1] == problem.k]
    entropic = grid is not None and not math.isinf(problem.beta)
    frames = gap_frame_indices(a.time.size, settings.gap_frames)
    radius = settings.radius
    if not entropic and settings.domain in ("ball", "box"):
        reach = support_reach(traj, frames, settings.domain)
        radius = max(radius, SUPPORT_MARGIN * reach)
    for f in frames:
        if entropic:
            res = entropic_gap(problem, grid, traj.frames["density"][f])
        else:
            omega, mass = frame_measure(traj, int(f))
            res = optimality_gap(problem, omega, mass, domain=settings.domain, radius=radius,
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
    a.gap_radius = radius if settings.domain in ("ball", "box") and not entropic else math.nan


def _gap_summary(a: Analysis, traj: Trajectory, problem: Problem, settings: DiagnosticsConfig) -> None:
    """What the gap found or reused in ``a`` means: the lower bound ``E - gap_bound`` where it is one, and the
    notes (Omega enlarged, entropic, no bound, an estimate, mass outside Omega)."""
    entropic = a.gap_domain == "grid, entropic"
    computed = np.isfinite(a.gap)
    if math.isfinite(a.gap_radius) and a.gap_radius > settings.radius:
        a.notes.append(f"Omega enlarged from the {settings.domain} {settings.radius:g} (diagnostics.radius) to "
                       f"{a.gap_radius:.4g}, {SUPPORT_MARGIN:g} x the farthest particle analysed "
                       f"({a.gap_radius / SUPPORT_MARGIN:.4g}): the support condition compares Phi off the support "
                       "with its mean on it, so Omega holds the support")
    if entropic:
        a.notes.append("beta < inf on a grid: G = E_h - min E_h over grid densities (relative entropy to the Gibbs "
                       "density of Phi, divided by beta)")
    refused = bound_refusal(traj, a.gap_frames)
    if refused:
        a.notes.append(refused)
    elif math.isinf(problem.beta) or entropic:
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


def support_reach(traj: Trajectory, frames: np.ndarray, domain: str) -> float:
    """How far from 0 the particles of positive mass reach over ``frames``: the largest norm (``domain`` "ball")
    or the largest absolute coordinate ("box")."""
    reach = 0.0
    for f in frames:
        omega, mass = frame_measure(traj, int(f))
        held = np.asarray(omega)[np.asarray(mass) > 0]
        if held.size:
            size = np.linalg.norm(held, axis=1) if domain == "ball" else np.max(np.abs(held), axis=1)
            reach = max(reach, float(np.max(size)))
    return reach


def bound_refusal(traj: Trajectory, frames: np.ndarray) -> str:
    """Why ``E - gap_bound`` is no lower bound on E* for this file ("" when it is), in one line.

    The bound ``E(mu) >= E(rho) + int Phi d(mu - rho) >= E(rho) - G`` (convexity of E) holds for every
    probability measure mu on Omega when rho is one too. It says nothing about the limit of a flow whose total
    mass is free (WFR with ``solver.total_mass = "free"``: E is minimized over all masses) or of a measure of
    another total mass (checked at the gap ``frames``, to :data:`UNIT_MASS_TOL`)."""
    from ...solvers.methods import METHODS  # the method table: which methods read solver.total_mass

    s = traj.config.solver
    if "total_mass" in METHODS[s.method].reads and s.total_mass == "free":
        return ("solver.total_mass = 'free': the flow minimizes E over measures of any mass, so E - G (a bound over "
                "probability measures) bounds nothing here; lower_bound left nan")
    for f in frames:
        total = float(np.sum(frame_measure(traj, int(f))[1]))
        if abs(total - 1.0) > UNIT_MASS_TOL:
            return (f"the total mass is {total:.10g} at t = {traj.time[f]:.6g}, not 1: E - G bounds E over "
                    "probability measures only; lower_bound left nan")
    return ""


def _fit_moves_with_the_window(fitted: tuple[float, float, float], st_t: np.ndarray, st_e: np.ndarray,
                               st_i: np.ndarray, start: float, t_end: float) -> str:
    """Why the tail fit of E* is not used ("" when it is): its interval assumes the window is in the asymptotic
    regime (``log I`` affine in ``log(E - E*)``); a tail still on its way there gives an interval that the
    fit on one half of the window does not overlap. Such a fit moves with the window, so it is no E*."""
    if not math.isfinite(fitted[0]):
        return ""
    middle = 0.5 * (start + t_end)
    for name, half in (("first", (st_t >= start - time_tolerance(start)) & (st_t <= middle)),
                       ("second", st_t >= middle)):
        part = fit_e_star_interval(st_e[half], st_i[half])
        if math.isfinite(part[0]) and not (part[1] <= fitted[2] and fitted[1] <= part[2]):
            return (f"E* fitted from the tail moves with the window ({part[0]:.10g} in [{part[1]:.10g}, "
                    f"{part[2]:.10g}] on its {name} half, {fitted[0]:.10g} in [{fitted[1]:.10g}, {fitted[2]:.10g}] on "
                    "all of it): the tail is not yet asymptotic, so the fit is no E*")
    return ""


def saddle_refusal(rec: SpectralRecord | None, start: float) -> str:
    """Why the window ``t >= start`` has no KL exponent of the flow's limit because the spectral record calls some
    of its frames "near a saddle" ("" when none is), in one line: the rate of a saddle passage is no rate at the
    limit."""
    if rec is None:
        return ""
    prefix = SADDLE.split("{")[0]
    tol = time_tolerance(start)
    hits = [(float(t), p) for t, p in zip(rec.spectrum_time, rec.phases) if t >= start - tol and p.startswith(prefix)]
    if not hits:
        return ""
    times = sorted(t for t, _ in hits)
    return (f"refused: the fit window t >= {start:.6g} overlaps {len(hits)} analysed frame(s) whose recorded phase is "
            f"near a saddle (t = {times[0]:.6g} .. {times[-1]:.6g}; {hits[0][1]} at t = {hits[0][0]:.6g}): the decay "
            "there passes a saddle, it is no KL rate of the limit")


def theory_exponent_status(a: Analysis, fit: KLFit) -> str:
    """The KL line at a proven nondegenerate minimum (``a.predicted_theta`` = 1/2, ``a.predicted_mu`` = lambda_min):
    the theory's exponent, the range of the measured local exponent over the window, and what the spectral test
    (:func:`pdeflow.analysis.convergence.predictions.spectral_test`) calls it: approaching 1/2, pre-asymptotic, or
    not in the linear regime of the point. One line."""
    theory = f"theta = {a.predicted_theta:g}, the theory's at this nondegenerate minimum"
    test = spectral_test(a.pl_mu_last, a.pl_mu_min, a.predicted_mu)
    if fit.local is None or not test.state:
        return f"{theory}; the window measures no local exponent ({fit.reason or 'no trusted sample'})"
    lo, hi = a.kl_theta_range
    return (f"{theory}; the measured local exponent theta(t) = 1 - (1/2) d ln I / d ln(E - E*) lies in "
            f"[{lo:.4f}, {hi:.4f}] over t in [{fit.local.t_first:.6g}, {fit.local.t_last:.6g}]: {test.text}")


def _rates(a: Analysis, settings: DiagnosticsConfig, st_t: np.ndarray, st_e: np.ndarray, st_i: np.ndarray,
           point: PointPrediction | None = None) -> None:
    """E*, the PL ratio at the frames and over the window, and the local exponent over the window (on the /steps rows
    when present).

    E* comes with an interval that holds it: ``diagnostics.e_star`` if given (a point; refused with a note when
    it lies above the lowest energy of the run); else the narrower of
    the certified one, ``[best E - gap_bound, lowest E]`` (point: the bound), and the profile interval of the
    limit fitted from the window's tail (:func:`fit_e_star_interval`) if the fit on the window's first half
    agrees with it (:func:`_fit_moves_with_the_window`). An uncertified gap never gives E*.
    PL and KL use only samples where E - E* is trustworthy (:func:`trusted_excess`); a window that overlaps frames
    near a saddle (:func:`saddle_refusal`) gets no exponent."""
    t_end = float(a.time[-1])
    start = t_end - settings.kl_window * (t_end - float(a.time[0]))
    a.kl_window_start, a.kl_window_end = start, t_end
    if point is not None:
        a.predicted_theta, a.predicted_mu, a.prediction = point.theta, point.mu, point.basis
    in_window = st_t >= start - time_tolerance(start)
    e_min = float(np.nanmin(st_e))
    saddle = saddle_refusal(a.spectrum, start)
    candidates = []
    if math.isfinite(settings.e_star):
        refused = e_star_refusal(float(settings.e_star), e_min)
        if refused:
            a.kl_status = saddle or f"no KL regime in this window: {refused}"
            a.notes.append(f"{refused}: not used (no PL/KL)")
            return
        # E* given as the energy of the stationary point of --stationary is that point's, not the user's number
        given = "stationary" if point is not None and point.energy == float(settings.e_star) else "given"
        candidates.append((given, float(settings.e_star), float(settings.e_star), float(settings.e_star)))
    else:
        bounds = np.isfinite(a.lower_bound)
        if bounds.any():
            best = float(np.max(a.lower_bound[bounds]))
            if best <= e_min:
                candidates.append(("lower_bound", best, best, e_min))
            else:
                a.notes.append(f"certified lower bound {best:.10g} exceeds the lowest energy {e_min:.10g}: the "
                               "energies are not those of this problem's flow (solver error?); the bound is not used "
                               "as E*")
        fitted = fit_e_star_interval(st_e[in_window], st_i[in_window])
        moved = _fit_moves_with_the_window(fitted, st_t, st_e, st_i, start, t_end)
        if moved:
            a.notes.append(moved)
        elif math.isfinite(fitted[0]) and not math.isfinite(fitted[1]):
            # a power-law tail far from its limit: the profile bounds E* from above only, so a point estimate
            # inside [-inf, hi] would be a guess
            a.notes.append(f"the tail fit bounds E* from above only: E* <= {fitted[2]:.10g} (95%), no point "
                           "estimate (the energy is still far from its limit)")
        elif math.isfinite(fitted[0]):
            candidates.append(("fit",) + fitted)
    if not candidates:
        a.e_star_source = "none"
        a.kl_status = saddle or ("no KL regime in this window: E* unknown (no certified gap, and the tail does not "
                                 "determine its limit)")
        a.notes.append("E* unknown (no certified gap, and the tail does not determine its limit): no PL/KL; "
                       "pass --e-star or run longer")
        return
    source, e_star, lo, hi = min(candidates, key=lambda c: c[3] - c[2])
    a.e_star, a.e_star_source, a.e_star_low, a.e_star_high = e_star, source, lo, hi
    trusted = trusted_excess(a.energy, (lo, hi))
    a.pl_mu = np.where(trusted, pl_constant(a.energy, a.dissipation, e_star), np.nan)
    w_e, w_i = st_e[in_window], st_i[in_window]
    w_ok = trusted_excess(w_e, (lo, hi)) & np.isfinite(w_i) & (w_i > 0)
    if w_ok.any():
        mu = pl_constant(w_e[w_ok], w_i[w_ok], e_star)
        a.pl_mu_first, a.pl_mu_last, a.pl_mu_min = float(mu[0]), float(mu[-1]), float(mu.min())
    if saddle:
        a.kl_status = saddle
        return
    fit = kl_fit(w_e, w_i, e_star, e_star_range=(lo, hi), time=st_t[in_window])
    a.kl_theta, a.kl_theta_range = fit.theta, (fit.low, fit.high)
    a.kl_constant, a.kl_points, a.kl_fitted = fit.constant, fit.n_points, fit.fitted
    if fit.local is not None:
        a.kl_theta_first, a.kl_theta_last = float(fit.local.theta[0]), float(fit.local.theta[-1])
        a.kl_t_first, a.kl_t_last = fit.local.t_first, fit.local.t_last
    if point is not None and point.claimed:
        # at a proven nondegenerate minimum the exponent is the theory's 1/2; the window's local exponent is
        # measured against it by the theory's own test (mu against lambda_min), never named by a drift tolerance
        a.kl_theta, a.kl_constant = math.nan, math.nan
        a.kl_status = theory_exponent_status(a, fit)
        return
    if fit.pre_asymptotic:
        a.kl_status = fit.reason
    elif fit.reason:
        a.kl_status = f"no KL regime in this window: {fit.reason}"
        a.notes.append(a.kl_status)
    else:
        a.kl_status = "KL regime"
    frames = np.flatnonzero(a.time >= start - time_tolerance(start))
    if math.isfinite(fit.theta) and frames.size and a.energy[frames[0]] > e_star:
        t0 = a.time[frames[0]]
        predicted = fit.predicted_excess(a.time[frames], t0, a.energy[frames[0]] - e_star)
        a.kl_predicted[frames] = predicted
        observed = a.energy[frames] - e_star
        ok = (observed > 0) & (predicted > 0) & trusted[frames]
        if ok.any():
            a.kl_decay_error = float(np.max(np.abs(np.log(predicted[ok] / observed[ok]))))
