"""``pdeflow validate``'s second half: every number a trajectory stores, checked against what determines it.

The schema check (:func:`pdeflow.io.reference.validate`) and the byte screen (:mod:`pdeflow.io.untrusted`: HDF5's
Fletcher-32 on /frames' fields, /model and /data) say a file is well formed; :func:`recheck` says its numbers are the
ones its run wrote. Three kinds of check, each naming the dataset and the frame or row that fails:

- **copies** (bit for bit): a number stored twice must be stored equal - /frames/time, energy, dissipation against
  the /steps row of the frame (/frames/step) and /analysis; the last frame against the active checkpoint slot;
  the root attributes a run sets at its end against the rows they summarise (``final_time``, ``steps``,
  ``max_identity_defect``, ``max_stability_ratio``, ``stability_products``);
- **relations** (bit for bit, the writer's own float operations repeated): ``/steps/dt[j] = time[j] - time[j-1]``,
  the energy-identity defect ``identity_defect[j]`` of ``energy[j-1], energy[j], dissipation_integral[j]``
  (:func:`pdeflow.solvers.accuracy.identity_defect`), each checkpoint slot's SHA-256, the config re-parsed and the
  problem and initial measure it builds;
- **recomputations** (to :func:`tolerance`): the energy, dissipation and risk of every frame from its checksummed
  fields by the run's own stepper (:meth:`pdeflow.solvers.base.Stepper.diagnostics`) on the stored problem.

What none of these reaches is listed (:class:`Unchecked`): rows between frames that only re-integrating the run
would reproduce, clock readings, texts. /analysis: :mod:`pdeflow.interface.recompute_analysis`. The rules, the
tolerance and its measurement: docs/schema.md, "Checking the stored numbers".
"""
from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np

from ..core.config import ConfigError
from ..core.measure import free_energy
from ..core.state import State
from ..io import schema
from ..io.file_access import TrajectoryError, error_reason, open_for_reading, writer_alive
from ..io.reference import Dynamics
from ..io.trajectory import open_trajectory
from .recompute_metadata import check_checkpoint, check_config, check_root
from .recompute_record import (
    RECOMPUTE_MAX_BYTES,
    RECOMPUTE_ULPS,
    Recheck,
    Stored,
    Unchecked,
    _digest_ok,
    _g,
    allowed,
    same,
    tolerance,
)

__all__ = ["recheck", "Recheck", "Unchecked", "tolerance", "RECOMPUTE_ULPS", "RECOMPUTE_MAX_BYTES"]


def read_stored(path: Path, out: Recheck) -> Stored | None:
    """The file as :class:`Stored`; None (with the problem in ``out``) if it cannot be read as a trajectory."""
    try:
        traj = open_trajectory(path)
    except TrajectoryError as exc:
        out.problems.append(" ".join(str(exc).split()))
        return None
    text = str(traj.attrs.get("config", ""))
    cfg = traj.config if text else None
    st = Stored(path, traj, cfg, traj.problem(), writer_alive=writer_alive(path))
    if cfg is not None:
        from pdeflow.solvers import make_stepper  # the run's own evaluation of its measure

        try:
            st.stepper = make_stepper(st.problem, cfg)
        except (ConfigError, ValueError, ImportError) as exc:
            st.no_stepper = f"its stepper cannot be rebuilt ({' '.join(str(exc).split())[:120]})"
    else:
        st.no_stepper = "the file holds no config (another code's file)"
    try:
        with open_for_reading(path) as f:
            if "checkpoint" in f:
                _read_slots(f, st)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        out.problems.append(f"/checkpoint cannot be read ({error_reason(exc)[:100]})")
    return st


def _read_slots(f: h5py.File, st: Stored) -> None:
    ck = f["checkpoint"]
    st.active = int(ck["active"][()])
    for name in schema.SLOTS:
        arrays: dict[str, np.ndarray] = {}
        try:
            ck[name].visititems(lambda key, obj: arrays.__setitem__(key, obj[()])
                                if isinstance(obj, h5py.Dataset) else None)
            st.slots[name] = arrays
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
            st.slots[name] = None
            st.slot_errors[name] = error_reason(exc)[:100]


def recheck(path: str | Path) -> Recheck:
    """Every stored number of the trajectory ``path`` checked against what determines it (module docstring).

    The file should have passed :func:`pdeflow.io.reference.validate` (else the first problem reading it is
    reported). A live writer's file is checked on its committed rows."""
    from .recompute_analysis import check_analysis  # imports the analysis layer: only when a file is checked

    out = Recheck()
    with open_for_reading(path) as f:
        foreign = "config" not in f.attrs
    if foreign:
        check_foreign(Path(path), out)
        return out
    st = read_stored(Path(path), out)
    if st is None:
        return out
    check_frames(st, out)
    check_steps(st, out)
    check_root(st, out)
    check_config(st, out)
    check_checkpoint(st, out)
    check_analysis(st, out)
    return out


def check_foreign(path: Path, out: Recheck) -> None:
    """A file from another code (no /.config): the frames' stored energy and dissipation recomputed from the stored
    problem by the Wasserstein flow's formulas (:class:`pdeflow.io.reference.Dynamics`; a grid's dissipation is the
    discretisation's own and is not recomputed); the rest is that code's."""
    from ..io.reference import read_run

    run = read_run(path)
    tol = tolerance(run.problem.precision)
    F = len(run.time)
    recomputed = {"energy": [], "dissipation": []}
    for i in range(F):
        if run.grid is not None:
            recomputed["energy"].append(free_energy(run.problem, run.grid, run.frames["density"][i]))
        else:
            omega, mass = run.measure(i)
            recomputed["energy"].append(run.problem.energy(omega, mass))
            recomputed["dissipation"].append(run.dynamics.dissipation(run.problem, omega, mass))
    for name, values in recomputed.items():
        if name not in run.frames or not values:
            continue
        scale = max((abs(v) for v in values), default=0.0) if name == "dissipation" else 0.0
        for i, x in enumerate(values):
            s, limit = float(run.frames[name][i]), allowed(x, tol, scale)
            if not abs(s - x) <= limit:
                out.problems.append(f"frame {i} (t = {run.time[i]:.6g}): /frames/{name} = {_g(s)} but its "
                                    f"recomputation from the frame's fields and the stored problem gives {_g(x)} "
                                    f"(difference {abs(s - x):.3g}, tolerance {limit:.3g})")
        out.checked.append(f"/frames/{name}: recomputed from the frames' fields and the stored problem ({F} frames, "
                           f"relative tolerance {tol:.2g})")
        out.unseen(f"/frames/{name}", f"recomputed to a relative {tol:.2g} only (a single copy)", relative=tol,
                   scale=max((abs(v) for v in values), default=0.0) if name == "dissipation" else 0.0)
    out.unseen("/steps", "another code's file (no /.config): its rows are that code's")


# ---- frames and the /steps rows at frames --------------------------------------------------------------------------
def frame_rows(st: Stored, out: Recheck | None = None) -> np.ndarray:
    """The /steps row of every frame (/frames/step), -1 where there is none (a problem in ``out``)."""
    rows = np.asarray(st.traj.frames.get("step", np.full(st.n_frames, -1)), dtype=np.int64)
    if "step" not in st.traj.frames or not st.n_steps:
        return np.full(st.n_frames, -1)
    t_frames, t_steps = st.traj.time, st.traj.steps["time"]
    for i, j in enumerate(rows):
        if not 0 <= j < st.n_steps:
            if out is not None:
                out.problems.append(f"frame {i} (t = {t_frames[i]:.6g}): /frames/step = {j} is no row of /steps "
                                    f"({st.n_steps} rows)")
            rows[i] = -1
        elif out is not None and not same(t_frames[i], t_steps[j]):
            out.problems.append(f"frame {i}: /frames/time = {_g(t_frames[i])} but /steps/time[{j}] (its row, "
                                f"/frames/step) = {_g(t_steps[j])}")
    if out is not None and np.any(np.diff(rows[rows >= 0]) < 0):
        out.problems.append("/frames/step must be non-decreasing")
    return rows


def check_frames(st: Stored, out: Recheck) -> None:
    """/frames: energy and dissipation equal to their /steps rows and recomputed; /steps/risk at frames
    recomputed; frame 0 the config's initial measure; /frames/dt and wall_time as far as they are determined."""
    traj, F = st.traj, st.n_frames
    rows = frame_rows(st, out)
    steps = traj.steps
    for name in ("energy", "dissipation"):
        if name not in traj.frames or name not in steps:
            continue
        for i, j in enumerate(rows):
            if j >= 0 and not same(traj.frames[name][i], steps[name][j]):
                out.problems.append(f"frame {i} (t = {traj.time[i]:.6g}): /frames/{name} = {_g(traj.frames[name][i])}"
                                    f" but /steps/{name}[{j}], the same number, = {_g(steps[name][j])}")
    if F:
        out.checked.append(f"/frames/time, energy, dissipation: equal to their /steps rows ({F} frames)")
    _recompute_frames(st, out, rows)
    _frame_dt(st, out)
    _wall_times(st, out, rows)


def _recompute_frames(st: Stored, out: Recheck, rows: np.ndarray) -> None:
    traj, F = st.traj, st.n_frames
    tol = tolerance(st.problem.precision)
    if not F:
        return
    values: dict[str, list[float]] = {"energy": [], "dissipation": [], "risk": []}
    source = "the run's stepper"
    for i in range(F):
        fields = st.frame(i)
        if st.stepper is not None:
            state = State(t=float(traj.time[i]), step=0, dt=0.0, fields=dict(fields))
            diag = st.stepper.diagnostics(state)
            for key in values:
                values[key].append(float(diag[key]))
        elif "omega" in fields:     # another code's particle file: the Wasserstein(-Fisher-Rao) flow's formulas
            source = "the stored problem"
            ev = st.problem.evaluate(fields["omega"], fields["mass"])
            values["energy"].append(ev.energy)
            values["risk"].append(ev.risk)
            values["dissipation"].append(Dynamics(beta=st.problem.beta).dissipation(st.problem, fields["omega"],
                                                                                    fields["mass"]))
        else:
            out.unseen("/frames/energy", f"not recomputed: {st.no_stepper}")
            out.unseen("/frames/dissipation", f"not recomputed: {st.no_stepper}")
            return
    scale = max([abs(v) for v in values["dissipation"] if math.isfinite(v)], default=0.0)
    stored = {"energy": np.asarray(traj.frames.get("energy", np.full(F, np.nan)), dtype=float),
              "dissipation": np.asarray(traj.frames.get("dissipation", np.full(F, np.nan)), dtype=float)}
    if "risk" in traj.steps:
        stored["risk"] = np.array([traj.steps["risk"][j] if j >= 0 else np.nan for j in rows], dtype=float)
    where = {"energy": "/frames/energy", "dissipation": "/frames/dissipation", "risk": "/steps/risk"}
    for key, got in stored.items():
        for i in range(F):
            x, s = values[key][i], got[i]
            if not math.isfinite(x) and not math.isfinite(s):
                continue
            limit = allowed(x, tol, scale if key == "dissipation" else 0.0)
            if not abs(s - x) <= limit:
                at = where[key] + (f"[{rows[i]}]" if key == "risk" else "")
                out.problems.append(f"frame {i} (t = {traj.time[i]:.6g}): {at} = {_g(s)} but its recomputation from "
                                    f"the frame's fields by {source} gives {_g(x)} (difference {abs(s - x):.3g}, "
                                    f"tolerance {limit:.3g})")
    out.checked.append(f"/frames/energy, dissipation and /steps/risk at frames: recomputed from the frames' fields by "
                       f"{source} ({F} frames, relative tolerance {tol:.2g})")
    risk_rows = [int(j) for j in rows if j >= 0]
    out.unseen("/steps/risk", f"recomputed at frames to a relative {tol:.2g} only (a single copy)", risk_rows,
               relative=tol)
    between = sorted(set(range(st.n_steps)) - set(risk_rows))
    for name in ("risk", "dissipation"):
        if name in traj.steps:
            out.unseen(f"/steps/{name}", "rows between frames: only re-integrating the run would reproduce them",
                       between)


def _frame_dt(st: Stored, out: Recheck) -> None:
    """/frames/dt, the step size in force at a frame: equal to a checkpoint slot's taken at that frame."""
    if "dt" not in st.traj.frames:
        return
    seen = set()
    for name, arrays in st.slots.items():
        if not arrays or not _digest_ok(arrays):
            continue
        n = int(arrays["n_frames"])
        if 0 < n <= st.n_frames and same(float(arrays["t"]), st.traj.time[n - 1]):
            seen.add(n - 1)
            if not same(float(arrays["dt"]), st.traj.frames["dt"][n - 1]):
                out.problems.append(f"frame {n - 1} (t = {st.traj.time[n - 1]:.6g}): /frames/dt = "
                                    f"{_g(st.traj.frames['dt'][n - 1])} but checkpoint {name}, taken there, holds dt = "
                                    f"{_g(arrays['dt'])}")
    out.unseen("/frames/dt", "the step size a controller proposed: stored once (checked at the frames a checkpoint "
               "slot was taken at)", sorted(set(range(st.n_frames)) - seen))


def _wall_times(st: Stored, out: Recheck, rows: np.ndarray) -> None:
    """Wall times: non-negative and non-decreasing; a frame's no earlier than its /steps row's (a frame is written
    after its row; a resumed run's clock restarts from its last committed row, so nothing bounds it from above)."""
    steps, frames = st.traj.steps, st.traj.frames
    for where, values in (("/steps/wall_time", steps.get("wall_time")), ("/frames/wall_time", frames.get("wall_time"))):
        if values is None:
            continue
        w = np.asarray(values, dtype=float)
        bad = np.flatnonzero(~(w >= 0) | np.concatenate([[False], ~(np.diff(w) >= 0)]))
        for j in bad[:5]:
            out.problems.append(f"{where}[{j}] = {_g(w[j])}: wall times are >= 0 and non-decreasing")
    if "wall_time" in steps and "wall_time" in frames:
        w, fw = np.asarray(steps["wall_time"], dtype=float), np.asarray(frames["wall_time"], dtype=float)
        for i, j in enumerate(rows):
            if j >= 0 and not fw[i] >= w[j]:
                out.problems.append(f"frame {i} (t = {st.traj.time[i]:.6g}): /frames/wall_time = {_g(fw[i])} is "
                                    f"earlier than its /steps row's, {_g(w[j])} (the frame is written after it)")
    for group, where in ((steps, "/steps/wall_time"), (frames, "/frames/wall_time")):
        if "wall_time" in group:
            out.unseen(where, "clock readings: checked to be >= 0, non-decreasing and a frame's no earlier than its "
                       "row's only")


# ---- /steps -----------------------------------------------------------------------------------------------------
def check_steps(st: Stored, out: Recheck) -> None:
    """/steps: ``dt[j] = time[j] - time[j-1]`` (the writer's subtraction), the energy-identity defect of each step
    from the stored energies and quadrature, the cost columns' counts integers >= 0."""
    steps, S = st.traj.steps, st.n_steps
    if not S or "time" not in steps:
        return
    t = np.asarray(steps["time"], dtype=float)
    if "dt" in steps:
        dt = np.asarray(steps["dt"], dtype=float)
        expected = np.concatenate([[0.0], t[1:] - t[:-1]])
        for j in np.flatnonzero(~((dt == expected) | (np.isnan(dt) & np.isnan(expected))))[:10]:
            what = "the initial state's row has dt = 0" if j == 0 else \
                f"it is /steps/time[{j}] - /steps/time[{j - 1}] = {_g(expected[j])}"
            out.problems.append(f"/steps row {j} (t = {t[j]:.6g}): /steps/dt = {_g(dt[j])}, but {what}")
        out.checked.append(f"/steps/time and dt: dt[j] = time[j] - time[j-1] ({S} rows)")
    _identity(st, out, t)
    from pdeflow.solvers.base import COST_COLUMNS

    for name in COST_COLUMNS:
        if name not in steps:
            continue
        v = np.asarray(steps[name], dtype=float)
        bad = np.flatnonzero(np.isfinite(v) & ~((v >= 0) & (v == np.round(v))))
        for j in bad[:5]:
            out.problems.append(f"/steps row {j} (t = {t[j]:.6g}): /steps/{name} = {_g(v[j])} is no count "
                                f"(an integer >= 0)")
    named = {it.name for it in schema.items_in("/steps")}
    for name in sorted(steps):
        if name in COST_COLUMNS:
            out.unseen(f"/steps/{name}", "the step's cost: counted as it ran (checked to be an integer >= 0, and "
                       "their sum against /analysis.run_grad_equivalents)")
        elif name not in named:
            out.unseen(f"/steps/{name}", "the stepper's own column")
    if "lambda_max_dt" in steps:
        out.unseen("/steps/lambda_max_dt", "a Lanczos estimate at states between frames (its largest is checked "
                   "against /.max_stability_ratio)")


def _identity(st: Stored, out: Recheck, t: np.ndarray) -> None:
    """``identity_defect[j] = identity_defect(energy[j-1], energy[j], dissipation_integral[j])`` where the run
    recorded it; nan in both columns where it did not."""
    from pdeflow.solvers.accuracy import identity_defect

    steps = st.traj.steps
    if "identity_defect" not in steps or "dissipation_integral" not in steps or "energy" not in steps:
        return
    e = np.asarray(steps["energy"], dtype=float)
    q = np.asarray(steps["dissipation_integral"], dtype=float)
    d = np.asarray(steps["identity_defect"], dtype=float)
    eps = float(np.finfo(np.float32 if st.problem.precision == "float32" else np.float64).eps)
    recorded = bool(st.stepper.energy_identity) if st.stepper is not None else bool(np.isfinite(d).any())
    bad = []
    for j in range(len(d)):
        if j == 0 or not recorded:
            if not (math.isnan(d[j]) and math.isnan(q[j])):
                bad.append((j, "no defect is recorded " + ("for the initial state" if j == 0 else
                                                           "by this method") + ": both columns are nan"))
            continue
        expected_d = identity_defect(float(e[j - 1]), float(e[j]), float(q[j]), eps)
        if not same(d[j], expected_d):
            bad.append((j, f"identity_defect = {_g(d[j])}, but |E[j] - E[j-1] + Q| / max(|E[j] - E[j-1]|, floor) of "
                           f"the stored /steps/energy[{j - 1}], [{j}] and dissipation_integral[{j}] is "
                           f"{_g(expected_d)}"))
    for j, why in bad[:10]:
        out.problems.append(f"/steps row {j} (t = {t[j]:.6g}): {why}")
    if len(bad) > 10:
        out.problems.append(f"... and {len(bad) - 10} more /steps rows whose identity defect disagrees")
    if recorded:
        out.checked.append(f"/steps/energy, dissipation_integral, identity_defect: the defect recomputed from the "
                           f"other two in every row ({len(d) - 1} steps)")
    else:
        out.unseen("/steps/energy", "rows between frames: this method records no energy-identity defect that ties "
                   "them together", sorted(set(range(len(e))) - set(frame_rows(st).tolist())))
