"""``pdeflow validate``'s recheck of ``/analysis``: each stored value against its definition (docs/design.md,
"Diagnostics"), evaluated on the file's own frames, /steps rows and problem, with the analysis's own functions.

Checked: the per-frame copies of time, energy and dissipation; at the gap frames ``mean_phi = int Phi d rho`` and
``min_phi = Phi(minimizer)`` recomputed (to :func:`pdeflow.interface.recompute.tolerance` of the largest ``|Phi|``
stored), ``gap = mean_phi - min_phi``, ``outside_mass``, ``lower_bound = E - gap_bound``, the flags; the
energy-identity residual, the stationary time, the PL ratio and its window figures, E* where a certified bound gave
it; the head clusters rebuilt from the last frame (:func:`pdeflow.analysis.diagnostics.head_clusters`); the spectral
record's frames, times, phases and costs. Not checked (listed): what a search, a fit or an eigen-solve found - the
certified lower bound on min Phi, the KL fit, a fitted E*, the spectrum's values at frames near a stationary point -
which only repeating them (``pdeflow diagnose``) reproduces, and the settings /analysis records.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..analysis.convergence.rates import THETA_TOL
from ..analysis.convergence.spectral import (
    SPECTRAL_ARRAYS,
    SPECTRAL_RITZ,
    SPECTRAL_SCALARS,
    read_spectral_record,
    run_gradient_equivalents,
    spectrum_frame_indices,
)
from ..analysis.diagnostics import (
    ENTROPY_MISSING,
    SUPPORT_MARGIN,
    Domain,
    energy_identity_residual,
    entropic_gap,
    frame_measure,
    head_clusters,
    pl_constant,
    support_reach,
    trajectory_grid,
    trusted_excess,
)
from ..analysis.diagnostics.analysis import GRID_CLUSTER_MASS, accurate_span, bound_refusal
from ..core.clock import time_tolerance
from ..core.problem import JVP_COST
from ..io import schema
from .recompute_record import Recheck, Stored, _g, same, tolerance

GAP_ARRAYS = ("gap", "min_phi", "mean_phi", "outside_mass", "gap_bound", "lower_bound")


class _Watched(dict):
    """/analysis as a dict that remembers which entries a check read."""

    def __init__(self, values: dict[str, Any]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)


def check_analysis(st: Stored, out: Recheck) -> None:
    """/analysis of ``st`` (module docstring); nothing when the file has none. An entry no check read is listed as
    unchecked."""
    d = _Watched(st.traj.analysis)
    if not d or "time" not in d:
        return
    _check(st, out, d)
    listed = {u.path for u in out.unchecked}
    attributes = set(schema.ANALYSIS_SCALARS) | set(SPECTRAL_SCALARS) | {
        "kl_theta_range", "notes", "cluster_threshold", "cluster_frame", "spectrum_i0", "spectrum_cost_fraction"}
    for name in sorted(set(d) - d.read):
        path = f"/analysis.{name}" if name in attributes else f"/analysis/{name}"
        if path not in listed:
            out.unseen(path, "no check of validate's reads it (a setting, a digest or words)")


def _check(st: Stored, out: Recheck, d: _Watched) -> None:
    F = st.n_frames
    for name in ("time", "energy", "dissipation"):
        stored = np.asarray(d.get(name, np.full(F, np.nan)), dtype=float)
        if stored.shape != (F,):
            out.problems.append(f"/analysis/{name} has {stored.size} rows, the file {F} frames")
            return
        frames = np.asarray(st.traj.frames.get(name, np.full(F, np.nan)), dtype=float)
        for i in np.flatnonzero(~((stored == frames) | (np.isnan(stored) & np.isnan(frames))))[:10]:
            out.problems.append(f"frame {i} (t = {st.traj.time[i]:.6g}): /analysis/{name} = {_g(stored[i])} but "
                                f"/frames/{name}, the same number, = {_g(frames[i])}")
    span, _ = accurate_span(st.traj)
    n = len(span.time)
    _beyond_span(st, out, d, n)
    _gaps(st, span, out, d)
    if "omega" in st.traj.frames and not math.isinf(st.problem.beta):
        if d.get("kl_status") != ENTROPY_MISSING:
            out.problems.append("/analysis.kl_status: a particle run with beta < inf has no identity or rates "
                                f"analysis, so it reads {ENTROPY_MISSING!r}")
    else:
        _identity_residual(span, out, d)
        _stationary(span, out, d)
        _rates(span, out, d)
    _clusters(st, span, out, d)
    _spectrum(st, span, out, d)
    for name in ("kl_predicted",):
        out.unseen(f"/analysis/{name}", "the KL fit's prediction: pdeflow diagnose repeats the fit")
    for name in ("kl_status", "kl_fitted", "kl_theta", "kl_constant", "kl_points", "kl_decay_error", "kl_t_first",
                 "kl_t_last", "kl_theta_first", "kl_theta_last", "kl_theta_range", "predicted_theta", "predicted_mu",
                 "prediction", "notes"):
        if name in d:
            out.unseen(f"/analysis.{name}", "a fit's result, a prediction or words: pdeflow diagnose repeats them")
    out.checked.append("/analysis: copies of the frames, Phi at the gap frames recomputed, the gap, bound, identity "
                       "residual, stationary time, PL ratio, clusters and the spectral record's frames and costs")


def _beyond_span(st: Stored, out: Recheck, d: dict[str, Any], n: int) -> None:
    """The frames after the accurate span (a run that lost accuracy) carry no analysis: nan, or False."""
    for name, (shape, _) in schema.ANALYSIS_FRAME_ARRAYS.items():
        if name in ("time", "energy", "dissipation") or name not in d:
            continue
        values = np.asarray(d[name])
        if values.shape[:1] != (st.n_frames,):
            out.problems.append(f"/analysis/{name} has {values.shape[:1]} rows, the file {st.n_frames} frames")
            continue
        tail = values[n:]
        empty = ~tail.astype(bool) if tail.dtype == bool else np.isnan(np.asarray(tail, dtype=float))
        if tail.size and not np.all(empty):
            out.problems.append(f"/analysis/{name}: frames {n} to {st.n_frames - 1} lie after the run lost accuracy "
                                f"and are not analysed, but hold values")


# ---- the optimality gap -------------------------------------------------------------------------------------------
def _gaps(st: Stored, span: Any, out: Recheck, d: dict[str, Any]) -> None:
    n = len(span.time)
    if "gap" not in d:
        return
    arr = {name: np.asarray(d[name], dtype=float)[:n] for name in GAP_ARRAYS if name in d}
    minimizer = np.asarray(d.get("minimizer", np.full((st.n_frames, st.problem.k), np.nan)), dtype=float)[:n]
    certified = np.asarray(d.get("gap_certified", np.zeros(st.n_frames, bool)), dtype=bool)[:n]
    exhaustive = np.asarray(d.get("gap_exhaustive", np.zeros(st.n_frames, bool)), dtype=bool)[:n]
    energy = np.asarray(span.frames["energy"], dtype=float)
    gap = arr["gap"]
    computed = np.isfinite(gap)
    grid = trajectory_grid(span)
    entropic = grid is not None and not math.isinf(st.problem.beta)
    domain = str(d.get("gap_domain", ""))
    radius = float(d.get("gap_radius", math.nan))
    frames = np.flatnonzero(computed)
    if bool(d.get("gap_computed", False)) != bool(computed.any()):
        out.problems.append(f"/analysis.gap_computed = {d.get('gap_computed')}, but /analysis/gap has "
                            f"{int(computed.sum())} finite values")
    estimate = bool(computed.any() and not certified[computed].all())
    if "gap_is_estimate" in d and bool(d["gap_is_estimate"]) != estimate:
        out.problems.append(f"/analysis.gap_is_estimate = {d['gap_is_estimate']}, but the certified flags give "
                            f"{estimate}")
    if not computed.any():
        return
    expected_domain = "grid, entropic" if entropic else domain
    if domain != expected_domain or domain not in ("ball", "box", "grid", "grid, entropic"):
        out.problems.append(f"/analysis.gap_domain = {domain!r}: it is ball, box, grid or (a grid with beta < inf) "
                            f"'grid, entropic'")
        return
    if domain in ("ball", "box"):
        reach = SUPPORT_MARGIN * support_reach(span, frames, domain)
        if radius < reach and not same(radius, reach):
            out.problems.append(f"/analysis.gap_radius = {_g(radius)}, but Omega holds the support: at least "
                                f"{SUPPORT_MARGIN:g} x the farthest particle analysed = {_g(reach)}")
        out.unseen("/analysis.gap_radius", "a setting (diagnostics.radius, enlarged to hold the support): checked "
                   "to hold it")
    tol = tolerance(st.problem.precision)
    scale = float(np.nanmax(np.abs(np.concatenate([arr["mean_phi"][frames], arr["min_phi"][frames]]))))
    for f in range(n):
        row = {name: arr[name][f] for name in arr}
        if not computed[f]:
            filled = [name for name in ("min_phi", "mean_phi", "outside_mass", "gap_bound", "lower_bound")
                      if name in row and not math.isnan(row[name])]
            if filled or np.any(np.isfinite(minimizer[f])) or certified[f] or exhaustive[f]:
                out.problems.append(f"frame {f}: /analysis/gap is nan (not computed there), but "
                                    f"{', '.join(filled) or 'the minimizer or a flag'} holds a value")
            continue
        _gap_frame(st, span, out, f, row, minimizer[f], bool(certified[f]), bool(exhaustive[f]), energy[f],
                   entropic, grid, domain, radius, tol, scale)
    refused = bound_refusal(span, frames) or (not entropic and not math.isinf(st.problem.beta))
    if refused and np.any(np.isfinite(arr.get("lower_bound", np.zeros(0)))):
        out.problems.append("/analysis/lower_bound holds values, but E - G bounds nothing for this run (its total "
                            "mass is free or not 1, or an entropy term is missing)")
    out.unseen("/analysis/gap_bound", "the certified bound on min Phi (a certificate's search): checked to be >= "
               "the gap where certified, nan elsewhere")
    out.unseen("/analysis/minimizer", "where Phi is least: min_phi = Phi there is recomputed, which fixes the point "
               "only as far as Phi is not flat there (near a minimum a change moves Phi to second order)", frames)
    for name in ("mean_phi", "min_phi") + (("gap",) if entropic else ()):
        out.unseen(f"/analysis/{name}", f"recomputed to {tol:.2g} of the largest |Phi| only (a single copy)", frames,
                   relative=tol, scale=scale)


def _gap_frame(st: Stored, span: Any, out: Recheck, f: int, row: dict[str, float], minimizer: np.ndarray,
               certified: bool, exhaustive: bool, energy: float, entropic: bool, grid: Any, domain: str,
               radius: float, tol: float, scale: float) -> None:
    """One gap frame: Phi recomputed at the measure and at the minimizer, the gap, outside mass, flags, bound."""
    at = f"frame {f} (t = {span.time[f]:.6g})"
    problem = st.problem
    omega, mass = frame_measure(span, f)
    if entropic:
        res = entropic_gap(problem, grid, span.frames["density"][f])
        recomputed = {"mean_phi": res.mean_phi, "min_phi": res.min_phi, "gap": res.gap}
    else:
        G = problem.residual_features(omega, mass)
        recomputed = {"mean_phi": float(np.dot(mass, problem.phi_field(omega, G))),
                      "min_phi": float(problem.phi_field(minimizer[None], G)[0]) if np.all(np.isfinite(minimizer))
                      else math.nan}
        if not same(row["gap"], row["mean_phi"] - row["min_phi"]):
            out.problems.append(f"{at}: /analysis/gap = {_g(row['gap'])}, but mean_phi - min_phi = "
                                f"{_g(row['mean_phi'] - row['min_phi'])}")
        dom = Domain.make(domain, problem.k, radius, (np.array(grid.lower), np.array(grid.upper))
                          if grid is not None else None)
        outside = float(np.sum(mass[dom.outside(omega)]))
        if not same(row["outside_mass"], outside):
            out.problems.append(f"{at}: /analysis/outside_mass = {_g(row['outside_mass'])}, but the frame's mass "
                                f"outside Omega ({domain}) is {_g(outside)}")
        if exhaustive != (problem.k <= 3):
            out.problems.append(f"{at}: /analysis/gap_exhaustive = {exhaustive}, but the grid search runs exactly "
                                f"when k <= 3 (k = {problem.k})")
    for name, x in recomputed.items():
        if not abs(row[name] - x) <= tol * max(abs(x), scale):
            what = "int Phi d rho" if name == "mean_phi" else "Phi at /analysis/minimizer" if name == "min_phi" \
                else "the entropic gap"
            out.problems.append(f"{at}: /analysis/{name} = {_g(row[name])}, but {what} recomputed from the frame is "
                                f"{_g(x)} (tolerance {tol * max(abs(x), scale):.3g})")
    bound, lower = row.get("gap_bound", math.nan), row.get("lower_bound", math.nan)
    if certified and not bound >= row["gap"]:
        out.problems.append(f"{at}: /analysis/gap_bound = {_g(bound)} is certified, yet below the gap found "
                            f"{_g(row['gap'])}")
    if not certified and not math.isnan(bound):
        out.problems.append(f"{at}: /analysis/gap_bound = {_g(bound)}, but the gap is not certified there (nan)")
    if not math.isnan(lower) and not same(lower, energy - bound):
        out.problems.append(f"{at}: /analysis/lower_bound = {_g(lower)}, but E - gap_bound = {_g(energy - bound)}")
    if certified and math.isnan(lower) and math.isinf(problem.beta) or (entropic and certified and math.isnan(lower)):
        if not bound_refusal(span, np.array([f])):
            out.problems.append(f"{at}: /analysis/lower_bound is nan where the gap is certified (E - gap_bound)")


# ---- the energy identity, stationarity, E* and PL ---------------------------------------------------------------
def _dense_steps(span: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """The rows the analysis used: /steps when it has two rows or more, else the frames."""
    steps = span.steps
    if len(steps.get("time", ())) >= 2:
        integral = np.asarray(steps["dissipation_integral"], dtype=float) if "dissipation_integral" in steps else None
        return tuple(np.asarray(steps[c], dtype=float) for c in ("time", "energy", "dissipation")) + (integral,)
    return (np.asarray(span.time, dtype=float), np.asarray(span.frames["energy"], dtype=float),
            np.asarray(span.frames["dissipation"], dtype=float), None)


def _identity_residual(span: Any, out: Recheck, d: dict[str, Any]) -> None:
    if "energy_identity_residual" not in d or not len(span.time):
        return
    st_t, st_e, st_i, integral = _dense_steps(span)
    expected = np.interp(np.asarray(span.time, dtype=float), st_t, energy_identity_residual(st_t, st_e, st_i, integral))
    stored = np.asarray(d["energy_identity_residual"], dtype=float)[:len(span.time)]
    for f in np.flatnonzero(~((stored == expected) | (np.isnan(stored) & np.isnan(expected))))[:10]:
        out.problems.append(f"frame {f} (t = {span.time[f]:.6g}): /analysis/energy_identity_residual = "
                            f"{_g(stored[f])}, but E(t) - E(0) + int I dt of the /steps rows = {_g(expected[f])}")


def _stationary(span: Any, out: Recheck, d: dict[str, Any]) -> None:
    """``stationary_time``: the first frame of the last run of frames with ``I <= stationary_tol``."""
    if "stationary_tol" not in d or not len(span.time):
        return
    tol = float(d["stationary_tol"])
    dissipation, time = np.asarray(span.frames["dissipation"], dtype=float), np.asarray(span.time, dtype=float)
    below = dissipation <= tol
    expected = math.nan
    if below[-1]:
        first = len(time) - int(np.argmin(below[::-1])) if not below.all() else 0
        expected = float(time[first])
    if not same(float(d.get("stationary_time", math.nan)), expected):
        out.problems.append(f"/analysis.stationary_time = {_g(d.get('stationary_time', math.nan))}, but the frames' "
                            f"dissipation falls to /analysis.stationary_tol = {tol:g} for good at {_g(expected)}")
    out.unseen("/analysis.stationary_tol", "a setting (diagnostics.stationary_tol, the run's, or 1e-8 I(0)): "
               "checked through the stationary time it gives")


def _rates(span: Any, out: Recheck, d: dict[str, Any]) -> None:
    """The KL window's ends, E* where it is a given point or the certified bound, the PL ratio at the frames and
    its first, last and least value over the window."""
    time = np.asarray(span.time, dtype=float)
    if not len(time) or "kl_window_end" not in d:
        return
    energy, dissipation = (np.asarray(span.frames[c], dtype=float) for c in ("energy", "dissipation"))
    start, t_end = float(d.get("kl_window_start", math.nan)), float(d["kl_window_end"])
    if not same(t_end, time[-1]):
        out.problems.append(f"/analysis.kl_window_end = {_g(t_end)}, but the analysed frames end at {_g(time[-1])}")
    if not time[0] <= start <= time[-1]:
        out.problems.append(f"/analysis.kl_window_start = {_g(start)} lies outside the analysed frames "
                            f"[{_g(time[0])}, {_g(time[-1])}]")
    out.unseen("/analysis.kl_window_start", "a setting (diagnostics.kl_window): checked to lie in the frames' span "
               "and through the PL figures over the window")
    if not same(float(d.get("kl_tolerance", THETA_TOL)), THETA_TOL):
        out.problems.append(f"/analysis.kl_tolerance = {_g(d['kl_tolerance'])}, but pdeflow's tolerance on the local "
                            f"exponent is {THETA_TOL:g}")
    st_t, st_e, st_i, _ = _dense_steps(span)
    source = str(d.get("e_star_source", "none"))
    e_star, lo, hi = (float(d.get(k, math.nan)) for k in ("e_star", "e_star_low", "e_star_high"))
    lower = np.asarray(d.get("lower_bound", np.full(len(time), np.nan)), dtype=float)[:len(time)]
    if source == "lower_bound":
        best, e_min = float(np.nanmax(lower)) if np.isfinite(lower).any() else math.nan, float(np.nanmin(st_e))
        for name, value, expected in (("e_star", e_star, best), ("e_star_low", lo, best), ("e_star_high", hi, e_min)):
            if not same(value, expected):
                out.problems.append(f"/analysis.{name} = {_g(value)}, but from the certified bound it is "
                                    f"{_g(expected)} (the largest lower_bound; e_star_high: the lowest energy)")
    elif source == "given":
        if not (same(e_star, lo) and same(e_star, hi)):
            out.problems.append(f"/analysis.e_star = {_g(e_star)} is given (a point), but its interval is "
                                f"[{_g(lo)}, {_g(hi)}]")
        out.unseen("/analysis.e_star", "given by the user (diagnostics.e_star)")
    elif source == "fit":
        if not lo <= e_star <= hi:
            out.problems.append(f"/analysis.e_star = {_g(e_star)} lies outside its fitted interval "
                                f"[{_g(lo)}, {_g(hi)}]")
        for name in ("e_star", "e_star_low", "e_star_high"):
            out.unseen(f"/analysis.{name}", "fitted from the tail (pdeflow diagnose repeats the fit)")
    elif source == "none":
        if not all(math.isnan(v) for v in (e_star, lo, hi)):
            out.problems.append("/analysis.e_star_source = 'none', but E* or its interval holds a value")
    else:
        out.problems.append(f"/analysis.e_star_source = {source!r}: it is given, lower_bound, fit or none")
    expected_mu = np.where(trusted_excess(energy, (lo, hi)), pl_constant(energy, dissipation, e_star), np.nan) \
        if source != "none" else np.full(len(time), np.nan)
    stored_mu = np.asarray(d.get("pl_mu", np.full(len(time), np.nan)), dtype=float)[:len(time)]
    for f in np.flatnonzero(~((stored_mu == expected_mu) | (np.isnan(stored_mu) & np.isnan(expected_mu))))[:10]:
        out.problems.append(f"frame {f} (t = {time[f]:.6g}): /analysis/pl_mu = {_g(stored_mu[f])}, but "
                            f"I / (2 (E - E*)) where E - E* is trusted gives {_g(expected_mu[f])}")
    in_window = st_t >= start - time_tolerance(start)
    w_e, w_i = st_e[in_window], st_i[in_window]
    ok = trusted_excess(w_e, (lo, hi)) & np.isfinite(w_i) & (w_i > 0) if source != "none" else np.zeros(0, bool)
    mu = pl_constant(w_e[ok], w_i[ok], e_star) if ok.any() else np.zeros(0)
    expected = dict(zip(("pl_mu_first", "pl_mu_last", "pl_mu_min"),
                        (float(mu[0]), float(mu[-1]), float(mu.min())) if mu.size else (math.nan,) * 3))
    for name, value in expected.items():
        if name in d and not same(float(d[name]), value):
            out.problems.append(f"/analysis.{name} = {_g(d[name])}, but the PL ratio over the window's trusted /steps "
                                f"rows gives {_g(value)}")


# ---- head clusters ------------------------------------------------------------------------------------------------
def _clusters(st: Stored, span: Any, out: Recheck, d: dict[str, Any]) -> None:
    """The clusters rebuilt from the last analysed frame at the stored linkage distance."""
    if "cluster_labels" not in d or not len(span.time):
        return
    last = len(span.time) - 1
    if int(d.get("cluster_frame", -1)) != last:
        out.problems.append(f"/analysis.cluster_frame = {d.get('cluster_frame')}, but the clusters are those of the "
                            f"last analysed frame, {last}")
        return
    omega, mass = frame_measure(span, last)
    grid = trajectory_grid(span)
    cells = {} if grid is None else {"min_mass": GRID_CLUSTER_MASS * float(mass.max()),
                                     "min_distance": 1.01 * float(np.linalg.norm(grid.width))}
    threshold = float(d.get("cluster_threshold", math.nan))
    rms = math.sqrt(float(np.dot(mass, np.einsum("ik,ik->i", omega, omega))) / max(float(mass.sum()), 1e-300))
    maps = int(np.asarray(d["cluster_attention"]).shape[0])
    seed = st.cfg.diagnostics.seed if st.cfg is not None else 0
    c = head_clusters(st.problem, omega, mass, tol=threshold / max(rms, 1e-12), attention_maps=maps, seed=seed,
                      frame=last, **cells)
    tol = tolerance(st.problem.precision)
    if not abs(c.threshold - threshold) <= tol * abs(threshold):
        out.problems.append(f"/analysis.cluster_threshold = {_g(threshold)} is no linkage distance of this frame "
                            f"(rebuilt: {_g(c.threshold)})")
    for name in ("labels", "size", "representative", "probe", "mass", "centre", "attention"):
        stored, rebuilt = np.asarray(d[f"cluster_{name}"]), np.asarray(getattr(c, name))
        if stored.shape != rebuilt.shape:
            out.problems.append(f"/analysis/cluster_{name} has shape {list(stored.shape)}, the clusters rebuilt from "
                                f"frame {last} {list(rebuilt.shape)}")
            continue
        exact = name in ("labels", "size", "representative", "probe")
        close = np.array_equal(stored, rebuilt) if exact else \
            np.all(np.abs(stored - rebuilt) <= tol * np.maximum(np.abs(rebuilt), np.max(np.abs(rebuilt), initial=0)))
        if not close:
            where = np.flatnonzero((stored != rebuilt).ravel())[:1]
            first = int(where[0]) if where.size else 0
            out.problems.append(f"/analysis/cluster_{name} differs from the clusters rebuilt from frame {last} at "
                                f"linkage distance {threshold:.6g} (first at element {first})")
    out.unseen("/analysis.cluster_threshold", "a setting (diagnostics.cluster_tol times the frame's rms radius): the "
               "clusters are rebuilt at it")
    for name in ("mass", "centre", "attention"):
        values = np.asarray(d[f"cluster_{name}"], dtype=float)
        out.unseen(f"/analysis/cluster_{name}", f"rebuilt to {tol:.2g} of its largest value only (a single copy)",
                   relative=tol, scale=float(np.max(np.abs(values), initial=0.0)))


# ---- the spectral record ----------------------------------------------------------------------------------------
def _spectrum(st: Stored, span: Any, out: Recheck, d: dict[str, Any]) -> None:
    """Its frames and times, the descent frames' empty rows, the phases from the stored values, the costs."""
    if "lambda_min" not in d:
        return
    n = len(span.time)
    names = {*SPECTRAL_ARRAYS, *(f"spectrum_{r}" for r in SPECTRAL_RITZ), *SPECTRAL_SCALARS, "spectrum_i0"}
    rec = read_spectral_record({**{k: d[k] for k in names if k in d}, "time": d["time"][:n],
                                "dissipation": d["dissipation"][:n]})
    every = int(rec.spectrum_every)
    frames = spectrum_frame_indices(len(span.time), every)
    if not np.array_equal(np.asarray(rec.spectrum_frame), frames):
        out.problems.append(f"/analysis/spectrum_frame = {np.asarray(rec.spectrum_frame).tolist()[:8]}, but every "
                            f"{every}-th analysed frame and the last are {frames.tolist()[:8]}")
        return
    time = np.asarray(span.time, dtype=float)
    dissipation = np.asarray(span.frames["dissipation"], dtype=float)
    if not np.array_equal(np.asarray(rec.spectrum_time, dtype=float), time[frames]):
        out.problems.append("/analysis/spectrum_time is not /frames/time at /analysis/spectrum_frame")
    if not same(float(rec.i0), float(dissipation[0])):
        out.problems.append(f"/analysis.spectrum_i0 = {_g(rec.i0)}, but I(0) = {_g(dissipation[0])}")
    descent = ~(dissipation[frames] <= rec.spectrum_near * dissipation[0])
    counts = ("spectrum_frame", "spectrum_time", "morse_index_lower", "spectrum_products")
    values = {name: np.asarray(d[name], dtype=float) for name in SPECTRAL_ARRAYS + tuple(f"spectrum_{r}" for r in
                                                                                       SPECTRAL_RITZ)
              if name in d and name not in counts}
    for a in np.flatnonzero(descent):
        held = [name for name, v in values.items() if np.isfinite(v[a])]
        if held or int(rec.spectrum_products[a]) or int(rec.morse_index_lower[a]):
            out.problems.append(f"frame {frames[a]}: the spectral record holds {', '.join(held) or 'products'} where "
                                f"I > spectrum_near I(0) (descent: no products are spent there)")
    phases = [p.decode() if isinstance(p, bytes) else str(p) for p in np.asarray(d.get("spectrum_phase", []))]
    if phases and phases != rec.phases:
        pairs = zip(phases, rec.phases)
        first = next(i for i, (p, q) in enumerate(pairs) if p != q) if len(phases) == len(rec.phases) else 0
        out.problems.append(f"/analysis/spectrum_phase[{first}] = {phases[first]!r}, but the stored spectrum gives "
                            f"{rec.phases[first] if first < len(rec.phases) else None!r}")
    run = run_gradient_equivalents(span.steps, stages=getattr(st.stepper, "stages", None))
    expected = {"jvp_cost": JVP_COST, "spectrum_grad_equivalents": rec.spectrum_grad_equivalents,
                "run_grad_equivalents": run,
                "spectrum_cost_fraction": rec.spectrum_grad_equivalents / run if math.isfinite(run) and run > 0
                else math.nan}
    for name, value in expected.items():
        if name in d and not same(float(d[name]), float(value)):
            out.problems.append(f"/analysis.{name} = {_g(d[name])}, but the record's products and the /steps cost "
                                f"columns give {_g(value)}")
    near = np.flatnonzero(~descent)
    for name in ("lambda_min", "lambda_min_residual", "lambda_max", "lambda_max_residual", "morse_index_lower",
                 "spectrum_products", "spectrum_lowest_ritz", "spectrum_lowest_ritz_residual"):
        out.unseen(f"/analysis/{name}", "a Lanczos solve at a frame near a stationary point: pdeflow diagnose repeats "
                   "it", near.tolist())
    for name in ("n_symmetry",) + tuple(k for k in SPECTRAL_SCALARS if k in ("spectrum_every", "spectrum_near")):
        out.unseen(f"/analysis.{name}", "a setting or a count of the spectral record")
