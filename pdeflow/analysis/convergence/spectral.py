"""The spectral record of a run: the ends of the spectrum of ``S`` at analysed frames, and the phases they show.

At every ``diagnostics.spectrum_every``-th frame (and the last) of a particle run whose dissipation is at most
``diagnostics.spectrum_near * I(0)`` (farther from any stationary point the phase is descent whatever the
spectrum, so no product is spent there), :func:`pdeflow.analysis.hessian.spectrum.spectrum_ends` gives the converged
Ritz values
at both ends of the spectrum of the mass-weighted Hessian ``S = M^(1/2) (M^-1 Hess E) M^(-1/2)`` [N k, N k] with
the model's continuous symmetries projected out (Lanczos with reorthogonalisation on the exact JVP):
``lambda_min``, ``lambda_max`` with their residuals ``|S x - lambda x|``, ``lowest_ritz`` (the lowest Ritz value,
converged or not: an upper bound on the lowest eigenvalue) and ``morse_index_lower``, the number of negative Ritz
values, converged or not (:func:`pdeflow.analysis.hessian.spectrum.negative_ritz_count`: by Cauchy interlacing each is a
negative eigenvalue; a lower bound on the Morse index of the stationary points the flow passes).

Phases (:func:`phase_of`), from ``lambda_min``, its residual ``r``, ``lowest_ritz``, the index and ``I``:

- ``descent``: ``I > diagnostics.spectrum_near * I(0)`` (the flow is still far from any stationary point), or no
  Ritz value converged and none negative;
- ``near a saddle of index >= n``: ``I <= spectrum_near * I(0)`` and ``n = morse_index_lower >= 1`` negative Ritz
  values (a negative lowest Ritz value is index >= 1, converged or not, whatever a converged value says);
- ``near a minimum``: ``I <= spectrum_near * I(0)``, no negative Ritz value, the lowest Ritz value converged and
  ``lambda_min - r > 0``: no negative eigenvalue found by the run's Lanczos steps. Evidence, not a certificate (a
  certified minimum is ``pdeflow stationary``'s dense bound, :mod:`pdeflow.analysis.certificate.certificate`);
- ``near a degenerate point``: ``I <= spectrum_near * I(0)`` otherwise (the sign is not resolved, or the lowest Ritz
  value has not converged).

Cost: ``products`` exact JVPs per analysed frame, each about :data:`pdeflow.core.problem.JVP_COST` gradient
evaluations (docs/solvers.md); :func:`run_gradient_equivalents` counts the run's own from its ``/steps`` rows, so
the record states its cost as a fraction of the run's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.problem import JVP_COST, Problem, gradient_equivalents
from ...io import schema
from ...io.trajectory import Trajectory
from ...solvers.base import COST_COLUMN

DESCENT = "descent"
MINIMUM = "near a minimum"
DEGENERATE = "near a degenerate point"
SADDLE = "near a saddle of index >= {n}"

# /analysis datasets of the record, one row per analysed frame [A]
# the record's names in /analysis, declared with their types in the trajectory's table (pdeflow.io.schema); the
# Ritz columns are stored as "spectrum_<name>" [A] and are absent in older files
SPECTRAL_ARRAYS = tuple(schema.SPECTRAL_ARRAYS)
SPECTRAL_RITZ = schema.SPECTRAL_RITZ
SPECTRAL_SCALARS = tuple(schema.SPECTRAL_SCALARS)


@dataclass
class SpectralRecord:
    """The ends of the spectrum of ``S`` at the analysed frames (module docstring). Arrays over analysed frames
    [A]: ``spectrum_frame`` (frame index), ``spectrum_time``, ``lambda_min``, ``lambda_max`` (nan: none converged) and
    their ``*_residual``, ``morse_index_lower``, ``spectrum_products`` (JVPs spent), ``lowest_ritz`` and its
    ``lowest_ritz_residual`` (nan where not computed or not stored); ``dissipation`` [A] and ``i0``
    (the dissipation at frame 0) for the phases. Scalars: the settings, ``n_symmetry`` (symmetry directions
    projected out), ``jvp_cost`` (gradient evaluations per JVP), the record's and the run's gradient equivalents."""
    spectrum_frame: np.ndarray
    spectrum_time: np.ndarray
    lambda_min: np.ndarray
    lambda_min_residual: np.ndarray
    lambda_max: np.ndarray
    lambda_max_residual: np.ndarray
    morse_index_lower: np.ndarray
    spectrum_products: np.ndarray
    dissipation: np.ndarray
    i0: float
    spectrum_every: int = 0
    spectrum_near: float = math.nan
    n_symmetry: int = 0
    jvp_cost: float = JVP_COST
    run_grad_equivalents: float = math.nan
    notes: list[str] = field(default_factory=list)
    lowest_ritz: np.ndarray | None = None
    lowest_ritz_residual: np.ndarray | None = None

    def __post_init__(self) -> None:
        for key in SPECTRAL_RITZ:
            if getattr(self, key) is None:
                setattr(self, key, np.full(len(self.spectrum_frame), np.nan))

    @property
    def spectrum_grad_equivalents(self) -> float:
        """Gradient evaluations the record cost: :func:`pdeflow.core.problem.gradient_equivalents` of its exact
        JVPs."""
        return gradient_equivalents({"jvp_exact": float(np.sum(self.spectrum_products))})

    @property
    def cost_fraction(self) -> float:
        """The record's gradient equivalents over the run's (nan when the run's are not known)."""
        run = self.run_grad_equivalents
        return self.spectrum_grad_equivalents / run if math.isfinite(run) and run > 0 else math.nan

    @property
    def phases(self) -> list[str]:
        """The phase of each analysed frame (:func:`phase_of`)."""
        return [phase_of(lo, r, int(n), i, self.i0, self.spectrum_near, lowest_ritz=ritz) for lo, r, n, i, ritz in
                zip(self.lambda_min, self.lambda_min_residual, self.morse_index_lower, self.dissipation,
                    self.lowest_ritz)]


def phase_of(lambda_min: float, residual: float, morse_index_lower: int, dissipation: float, i0: float,
             near: float, *, lowest_ritz: float = math.nan) -> str:
    """The phase of one analysed frame (module docstring): ``descent``, ``near a saddle of index >= n``,
    ``near a minimum`` or ``near a degenerate point``. ``lowest_ritz``: the lowest Ritz value, converged or not
    (nan: not known, as in records stored before it was, where ``lambda_min`` stands for it); a negative one is
    index >= 1 even when ``morse_index_lower`` was stored from converged values only."""
    if not dissipation <= near * i0:
        return DESCENT
    index = max(int(morse_index_lower), 1 if lowest_ritz < 0 else 0)
    if index >= 1:
        return SADDLE.format(n=index)
    if not math.isfinite(lambda_min):
        return DESCENT
    resolved = not lowest_ritz < lambda_min  # the lowest Ritz value is the converged one (or not known)
    if resolved and lambda_min - residual > 0:
        return MINIMUM
    return DEGENERATE


def phase_spans(times: np.ndarray, phases: list[str]) -> list[tuple[float, float, str, int]]:
    """Consecutive analysed frames of one phase as ``(first time, last time, phase, frames)``."""
    spans: list[tuple[float, float, str, int]] = []
    for t, p in zip(np.asarray(times, dtype=float), phases):
        if spans and spans[-1][2] == p:
            first, _, _, n = spans[-1]
            spans[-1] = (first, float(t), p, n + 1)
        else:
            spans.append((float(t), float(t), p, 1))
    return spans


def spectrum_frame_indices(n_frames: int, every: int) -> np.ndarray:
    """Frames ``0, every, 2 every, ...`` and the last one (none when ``every`` is 0)."""
    if n_frames == 0 or every <= 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.append(np.arange(0, n_frames, every), n_frames - 1)).astype(np.int64)


def run_gradient_equivalents(steps: dict[str, Any], stages: int | None = None) -> float:
    """Gradient evaluations of a run from its ``/steps`` rows: :func:`pdeflow.core.problem.gradient_equivalents` of
    the summed cost columns (:data:`pdeflow.solvers.base.COST_COLUMNS`, which every stepper writes). A file written
    before them: the same formula of ``sum gradient_evals`` and ``sum jvps`` (counted exact) when the stepper counted
    them, else ``stages`` per attempted step (the rows after the first, plus ``rejected``); nan when neither
    is known."""
    if all(column in steps for column in COST_COLUMN.values()):
        return gradient_equivalents({kind: float(np.nansum(np.asarray(steps[column], dtype=float)))
                                     for kind, column in COST_COLUMN.items()})
    if "gradient_evals" in steps:
        evals = np.nansum(np.asarray(steps["gradient_evals"], dtype=float))
        jvps = np.nansum(np.asarray(steps["jvps"], dtype=float)) if "jvps" in steps else 0.0
        return gradient_equivalents({"gradient": float(evals), "jvp_exact": float(jvps)})
    if stages is None or "time" not in steps:
        return math.nan
    rejected = np.nansum(np.asarray(steps["rejected"], dtype=float)) if "rejected" in steps else 0.0
    return float(stages * (max(len(steps["time"]) - 1, 0) + rejected))


def _stepper_stages(method: str) -> int | None:
    """Gradient evaluations per step of an explicit Runge-Kutta ``method`` (None for the others)."""
    from ...core.config import ConfigError
    from ...solvers import stepper_class

    try:
        return getattr(stepper_class(method), "stages", None)
    except ConfigError:
        return None


def spectral_record(traj: Trajectory, problem: Problem, every: int, near: float, **ends: Any) -> SpectralRecord:
    """The record of a particle trajectory at :func:`spectrum_frame_indices` (module docstring): the spectrum ends
    at those of its frames with ``I <= near I(0)``, nan (and no products) at the others, which are in descent;
    ``ends`` go to :func:`pdeflow.analysis.hessian.spectrum.spectrum_ends` (``krylov_dim``, ``n_ends``, ``tol``)."""
    from ..hessian.spectrum import spectrum_ends

    frames = spectrum_frame_indices(len(traj.time), every)
    A = frames.size
    time = np.asarray(traj.time, dtype=float)
    dissipation = np.asarray(traj.frames["dissipation"], dtype=float)
    rec = SpectralRecord(spectrum_frame=frames, spectrum_time=time[frames], lambda_min=np.full(A, np.nan),
                         lambda_min_residual=np.full(A, np.nan), lambda_max=np.full(A, np.nan),
                         lambda_max_residual=np.full(A, np.nan), morse_index_lower=np.zeros(A, dtype=np.int64),
                         spectrum_products=np.zeros(A, dtype=np.int64), dissipation=dissipation[frames],
                         i0=float(dissipation[0]) if dissipation.size else math.nan, spectrum_every=every,
                         spectrum_near=near,
                         run_grad_equivalents=run_gradient_equivalents(
                             traj.steps, stages=_stepper_stages(str(traj.attrs.get("method", "")))))
    for a, f in enumerate(frames):
        if not dissipation[f] <= near * rec.i0:
            continue  # descent whatever the spectrum (phase_of): no products where they would tell nothing
        omega = np.asarray(traj.frames["omega"][f], dtype=float)
        mass = np.asarray(traj.frames["mass"][f], dtype=float)
        s = spectrum_ends(problem, omega, mass, **ends)
        if len(s.lowest):
            rec.lambda_min[a], rec.lambda_min_residual[a] = s.lowest[0], s.lowest_residual[0]
        if len(s.highest):
            rec.lambda_max[a], rec.lambda_max_residual[a] = s.highest[-1], s.highest_residual[-1]
        rec.morse_index_lower[a], rec.spectrum_products[a] = s.morse_index_lower, s.products
        rec.lowest_ritz[a], rec.lowest_ritz_residual[a] = s.lowest_ritz, s.lowest_ritz_residual
        rec.n_symmetry = s.n_symmetry
    return rec


def write_spectral_record(group, rec: SpectralRecord | None) -> None:
    """The record's datasets and attributes into the /analysis group (nothing when there is none); the phases
    as ``spectrum_phase`` [A] (str)."""
    if rec is None:
        return
    import h5py

    for key in SPECTRAL_ARRAYS:
        group.create_dataset(key, data=np.asarray(getattr(rec, key)))
    for key in SPECTRAL_RITZ:
        group.create_dataset(f"spectrum_{key}", data=np.asarray(getattr(rec, key), dtype=float))
    group.create_dataset("spectrum_phase", data=np.array(rec.phases, dtype=h5py.string_dtype("utf-8")))
    group.attrs["spectrum_i0"] = rec.i0
    for key in SPECTRAL_SCALARS:
        group.attrs[key] = getattr(rec, key)
    group.attrs["spectrum_cost_fraction"] = rec.cost_fraction


def read_spectral_record(d: dict[str, Any]) -> SpectralRecord | None:
    """The record in a stored /analysis (its datasets and attributes as a dict), or None."""
    if "lambda_min" not in d:
        return None
    kwargs: dict[str, Any] = {key: np.asarray(d[key]) for key in SPECTRAL_ARRAYS}
    kwargs.update({key: np.asarray(d[f"spectrum_{key}"], dtype=float) for key in SPECTRAL_RITZ
                   if f"spectrum_{key}" in d})
    kwargs.update({key: d[key] for key in SPECTRAL_SCALARS if key in d and key != "spectrum_grad_equivalents"})
    time = np.asarray(d["time"], dtype=float)
    frames = kwargs["spectrum_frame"].astype(np.int64)
    dissipation = np.asarray(d["dissipation"], dtype=float)
    kwargs["dissipation"] = dissipation[frames] if dissipation.size == time.size else np.full(frames.size, np.nan)
    kwargs["i0"] = float(d.get("spectrum_i0", dissipation[0] if dissipation.size else math.nan))
    kwargs["spectrum_every"] = int(kwargs.get("spectrum_every", 0))
    kwargs["n_symmetry"] = int(kwargs.get("n_symmetry", 0))
    return SpectralRecord(**kwargs)


def format_spectral_record(rec: SpectralRecord | None) -> list[str]:
    """The record as report lines: the cost, the phases as spans, and a table over analysed frames (``lowest
    Ritz``: converged or not, an upper bound on the lowest eigenvalue)."""
    if rec is None or rec.spectrum_frame.size == 0:
        return []
    fraction = rec.cost_fraction
    computed = int(np.sum(rec.spectrum_products > 0))
    lines = [f"spectrum of S every {rec.spectrum_every} frame(s): {rec.spectrum_frame.size} analysed, {computed} "
             f"near a stationary point (I <= {rec.spectrum_near:g} I(0)) computed ({rec.n_symmetry} symmetry "
             f"directions projected out at the last): {int(np.sum(rec.spectrum_products))} JVPs ~ "
             f"{rec.spectrum_grad_equivalents:.0f} gradient equivalents (JVP ~ {rec.jvp_cost:g} grad Phi)"
             + (f", {100 * fraction:.1f} % of the run's {rec.run_grad_equivalents:.0f}" if math.isfinite(fraction)
                else "")]
    for first, last, phase, n in phase_spans(rec.spectrum_time, rec.phases):
        when = f"t = {first:.4g}" if n == 1 else f"t = {first:.4g} .. {last:.4g}"
        lines.append(f"phase         {when}: {phase} ({n} analysed frame{'s' if n > 1 else ''})")
    lines.append("")
    lines.append("lowest conv: the lowest converged Ritz value, lambda_min when no Ritz value lies below it; "
                 "lowest Ritz: converged or not, an upper bound on lambda_min")
    lines.append(f"{'t':>10} {'I / I(0)':>10} {'lowest conv':>12} {'residual':>9} {'lowest Ritz':>12} {'index >=':>8} "
                 f"{'lambda_max':>11} {'residual':>9}  phase")
    for a, phase in enumerate(rec.phases):
        lines.append(f"{rec.spectrum_time[a]:>10.4g} {rec.dissipation[a] / rec.i0:>10.3e} "
                     f"{rec.lambda_min[a]:>+12.4e} {rec.lambda_min_residual[a]:>9.1e} {rec.lowest_ritz[a]:>+12.4e} "
                     f"{rec.morse_index_lower[a]:>8d} "
                     f"{rec.lambda_max[a]:>11.4g} {rec.lambda_max_residual[a]:>9.1e}  {phase}")
    return lines


def analysed_spectrum(traj: Trajectory, problem: Problem, settings) -> SpectralRecord | None:
    """The record ``diagnose`` stores (``settings``: the ``[diagnostics]`` section): particle runs without noise
    only, none when ``spectrum_every`` is 0 (a grid's cells are no particle system whose Hessian this is)."""
    if settings.spectrum_every <= 0 or "omega" not in traj.frames or not math.isinf(problem.beta):
        return None
    return spectral_record(traj, problem, settings.spectrum_every, settings.spectrum_near)
