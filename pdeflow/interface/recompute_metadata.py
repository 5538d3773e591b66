"""``pdeflow validate``'s recheck of what a run's end, its config and its checkpoints store: the root attributes
against the /steps rows they summarise, the config text re-parsed and what it builds, both checkpoint slots
(:mod:`pdeflow.interface.recompute`)."""
from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Any

import numpy as np

from ..core.config import ConfigError
from ..core.parallel import SERIAL
from ..core.problem import Problem
from ..io.checkpoint import CHECKSUM, RUNNING
from ..io.resume import array_difference
from .recompute_record import ENDED, Recheck, Stored, _digest_ok, _g, same


# ---- root attributes ------------------------------------------------------------------------------------------------
def check_root(st: Stored, out: Recheck) -> None:
    """The root attributes: what a run's end records, against the rows it summarises; the texts as far as they are
    determined."""
    a, steps = st.traj.attrs, st.traj.steps
    status = st.status
    if status and status != RUNNING and status not in ENDED:
        out.problems.append(f"root attribute status = {status!r} is none of running, {', '.join(ENDED)}")
    _created(a, out)
    out.unseen("/.pdeflow_version", "the version that wrote the file: any text")
    if "measure" in a:
        measure = "grid" if "density" in st.traj.frames else "particles"
        if a["measure"] != measure:
            out.problems.append(f"root attribute measure = {a['measure']!r}, but the frames hold {measure}")
    if not st.ended or not st.n_steps:
        # a run that goes on (or died) holds its "not yet" values, or a resumed file's previous end's
        for key in ("final_time", "steps", "max_identity_defect", "max_stability_ratio", "accuracy_lost_at",
                    "stability_products", "accuracy", "message"):
            if key in a:
                out.unseen(f"/.{key}", f"set when the run ends (status {status!r})")
        return
    t = np.asarray(steps["time"], dtype=float)
    if "final_time" in a and not same(float(a["final_time"]), t[-1]):
        out.problems.append(f"root attribute final_time = {_g(a['final_time'])}, but the last /steps row is at "
                            f"t = {_g(t[-1])}")
    if "steps" in a and int(a["steps"]) != len(t) - 1:
        out.problems.append(f"root attribute steps = {a['steps']}, but /steps holds {len(t) - 1} steps after its "
                            f"initial row")
    _accuracy(st, out)
    _message(st, out)


def _created(a: dict[str, Any], out: Recheck) -> None:
    if "created" not in a:
        return
    try:
        _dt.datetime.fromisoformat(str(a["created"]))
    except ValueError:
        out.problems.append(f"root attribute created = {str(a['created'])[:40]!r} is no ISO 8601 time")
    out.unseen("/.created", "the time the file was made: checked to be an ISO 8601 time only")


def _nanmax(v: np.ndarray) -> float:
    v = np.asarray(v, dtype=float)
    finite = v[np.isfinite(v)]
    return float(finite.max()) if finite.size else math.nan


def _accuracy(st: Stored, out: Recheck) -> None:
    """``max_identity_defect``, ``max_stability_ratio``, ``accuracy_lost_at``, ``stability_products`` and the
    ``accuracy`` line against the /steps rows, the /steps attributes and the active checkpoint."""
    from pdeflow.core.problem import JVP_COST

    a, steps, notes = st.traj.attrs, st.traj.steps, st.traj.steps_attrs
    bound = float(notes.get("stability_bound", math.nan))
    defect = _nanmax(steps["identity_defect"]) if "identity_defect" in steps else math.nan
    lam = np.asarray(steps.get("lambda_max_dt", np.full(st.n_steps, np.nan)), dtype=float)
    ratio = _nanmax(lam / bound) if math.isfinite(bound) else math.nan
    for key, expected in (("max_identity_defect", defect), ("max_stability_ratio", ratio)):
        if key in a and not same(float(a[key]), expected):
            out.problems.append(f"root attribute {key} = {_g(a[key])}, but the largest of its /steps column gives "
                                f"{_g(expected)}")
    lost = float(a.get("accuracy_lost_at", math.nan))
    t = np.asarray(steps["time"], dtype=float)
    if math.isfinite(lost) and not np.any(t == lost):
        out.problems.append(f"root attribute accuracy_lost_at = {_g(lost)} is the time of no /steps row")
    products = a.get("stability_products")
    active = st.slots.get(f"slot{st.active}") if st.active in (0, 1) else None
    if products is not None and active and "extra/accuracy" in active and _digest_ok(active):
        counted = float(np.asarray(active["extra/accuracy"])[-1])
        if counted != float(products):
            out.problems.append(f"root attribute stability_products = {products}, but the active checkpoint's "
                                f"accuracy record counted {counted:g}")
    text = str(a.get("accuracy", ""))
    if not text:
        return
    parts = []
    if math.isfinite(defect):
        # run.identity_tol: the resuming config's, which the file does not keep (/steps.identity_tol is the first's)
        parts.append(re.escape(f"largest identity defect {defect:.3g} (run.identity_tol ") + r"[^)]*\)")
    if math.isfinite(ratio):
        parts.append(re.escape(f"largest lambda_max*dt/bound {ratio:.3g} (bound {bound:.4g})"))
    figures = re.escape(", ").join(parts)
    stages = getattr(st.stepper, "stages", None)
    cost = ""
    if stages and products is not None and int(products) >= 0 and math.isfinite(ratio) and len(t) > 1:
        evaluations = (len(t) - 1) * stages
        cost = (f"; stability checks cost {int(products)} Hessian-vector products, ~"
                f"{JVP_COST * int(products) / evaluations:.2g} of the steps' {evaluations} gradient evaluations "
                f"(a product ~ {JVP_COST:g} evaluations)")
    if not parts:
        pattern = re.escape("not checked: no check applies to this run")
    elif math.isfinite(lost):
        pattern = re.escape(f"LOST at t = {lost:.6g}: ") + ".*" + re.escape("; ") + figures + re.escape(cost)
    else:
        pattern = r"held( \(run\.accuracy = 'off'\))?: " + figures + re.escape(cost)
    if not re.fullmatch(pattern, text, flags=re.DOTALL):
        out.problems.append(f"root attribute accuracy = {text[:100]!r}... does not state the figures of the /steps "
                            f"rows and the attributes (max_identity_defect, max_stability_ratio, accuracy_lost_at, "
                            f"stability_products)")
    if math.isfinite(lost):
        out.unseen("/.accuracy", "the words of the loss (its figures are checked)")


def _message(st: Stored, out: Recheck) -> None:
    a = st.traj.attrs
    message = str(a.get("message", ""))
    if st.status == "finished" and "final_time" in a:
        expected = f"reached t_end = {float(a['final_time']):g}"
        lost = float(a.get("accuracy_lost_at", math.nan))
        if math.isfinite(lost):
            expected += f"; but accuracy was LOST at t = {lost:.6g} (root attribute accuracy)"
        if message != expected:
            out.problems.append(f"root attribute message = {message[:80]!r}, but a finished run at t = "
                                f"{float(a['final_time']):g} says {expected!r}")
    elif message:
        out.unseen("/.message", f"the words of a run that ended {st.status!r}")


# ---- the config ---------------------------------------------------------------------------------------------------
# [run] keys the frame schedule checks; the other keys of a section are checked as a whole or not at all
SCHEDULE_KEYS = ("frame_interval", "frame_spacing", "n_frames")


def check_config(st: Stored, out: Recheck) -> None:
    """The config text parses back to itself; it builds the stored problem and frame 0; the root attributes and
    /steps attributes it sets agree; the frames lie on its schedule. The keys none of this reaches are listed."""
    a = st.traj.attrs
    text = str(a.get("config", ""))
    if not text:
        return
    cfg = st.cfg
    canonical = cfg.to_toml()
    current = canonical == text
    if not current and not _keyed_lines(text) <= _keyed_lines(canonical):
        out.problems.append("root attribute config is not the text pdeflow writes for the config it parses to (a "
                            "changed character)")
    checked = {"task", "model", "init"} if current else set()
    if "method" in a and a["method"] != cfg.solver.method:
        out.problems.append(f"root attribute method = {a['method']!r}, but the config has solver.method = "
                            f"{cfg.solver.method!r}")
    if "seed" in a and int(a["seed"]) != cfg.init.seed:
        out.problems.append(f"root attribute seed = {a['seed']}, but the config has init.seed = {cfg.init.seed}")
    if current:
        _problem_from_config(st, out)
    else:
        for section in ("task", "model", "init"):
            for key in cfg.to_dict()[section]:
                out.unseen(f"/.config:{section}.{key}", "an earlier pdeflow wrote the file (its config lacks keys this "
                           "one has), whose problem and initial measure may differ from this one's: not rebuilt")
    if st.stepper is not None:
        _stepper_attributes(st, out)
    else:
        out.problems.append(f"root attribute config: {st.no_stepper}")
    if st.stepper is not None:
        checked.add("run.identity_tol")        # /steps.identity_tol
    if _schedule(st, out):
        checked |= {f"run.{k}" for k in SCHEDULE_KEYS}
    checked |= {"solver.method"}
    from pdeflow.solvers.methods import METHODS

    reads = METHODS[cfg.solver.method].reads if cfg.solver.method in METHODS else ()
    # a [solver] key the method does not read must hold its default (pdeflow.solvers.check_config, run when the
    # stepper was rebuilt): a changed one is refused
    unread = {f"solver.{k}" for k in cfg.to_dict()["solver"] if k != "method" and k not in reads}
    checked |= unread if st.stepper is not None else set()
    for section, values in cfg.to_dict().items():
        for key in values:
            name = f"{section}.{key}"
            if section not in checked and name not in checked:
                out.unseen(f"/.config:{name}", _why_unchecked(section, key))
    out.checked.append("the config: parses back to its text; task, model and init build the stored problem and "
                       "frame 0; method, seed, the solver keys the method does not read (at their defaults), the "
                       "/steps and /frames attributes and the frame schedule agree")


def _keyed_lines(text: str) -> set[tuple[str, str]]:
    """The lines of a config text with their section: the text an earlier pdeflow wrote (fewer keys, another order)
    holds a subset of the lines this one writes for the config it parses to."""
    section, out = "", set()
    for line in text.splitlines():
        if line.startswith("["):
            section = line
        elif line.strip():
            out.add((section, line))
    return out


def _why_unchecked(section: str, key: str) -> str:
    if section == "solver":
        return "it steers the integration, which validate does not repeat"
    if section == "run":
        return "it limits or steers the run (a resume may change it)"
    if section == "diagnostics":
        return "a setting of the analysis (pdeflow diagnose may have used others, which the config does not keep)"
    if section == "output":
        return "where and how the file was written"
    return "this run does not read it"


def _problem_from_config(st: Stored, out: Recheck) -> None:
    """Problem.from_config(cfg) gives the stored /model and /data (and /model's beta and precision); the config's
    initial measure is frame 0. A [task], [model] or [init] key whose change would give the same problem and frame 0
    is one this run does not read (:func:`_unread`): listed as unchecked."""
    try:
        built = Problem.from_config(st.cfg)
    except (ConfigError, OSError, ValueError) as exc:
        for section in ("task", "model"):
            for key in st.cfg.to_dict()[section]:
                out.unseen(f"/.config:{section}.{key}", f"the problem cannot be rebuilt here "
                           f"({' '.join(str(exc).split())[:80]})")
        return
    diff = array_difference(st.traj.arrays, built.arrays())
    if diff is not None:
        out.problems.append(f"root attribute config builds another problem than /model and /data ({diff} differs)")
    attrs = st.traj.model_attrs
    for key, value in (("beta", float(built.beta)), ("precision", built.precision)):
        if key in attrs and not (same(float(attrs[key]), value) if key == "beta" else attrs[key] == value):
            out.problems.append(f"attribute /model.{key} = {attrs[key]!r}, but the config has model.{key} = {value!r}")
    first = _first_fields(st, st.cfg)
    for key, value in (first or {}).items():
        stored = st.traj.frames.get(key)
        if stored is not None and not np.array_equal(np.asarray(stored[0]), value):
            out.problems.append(f"frame 0: /frames/{key} is not the initial measure the config's init.* sets")
    for name in _unread(st, built, first):
        out.unseen(f"/.config:{name}", "this run does not read it (another value builds the same problem and frame 0)")


def _first_fields(st: Stored, cfg: Any) -> dict[str, np.ndarray] | None:
    """The initial measure ``cfg`` sets, as the run's stepper holds it (None without a stepper or frames)."""
    if st.stepper is None or not st.n_frames:
        return None
    from pdeflow.solvers import initial_fields

    return initial_fields(st.stepper, cfg)


def _unread(st: Stored, built: Problem, first: dict[str, np.ndarray] | None) -> list[str]:
    """The numeric and true/false keys of [task], [model] and [init] that this run does not read: changed one at a
    time (a number by a factor 1.5 or plus one, a flag negated), the config still builds the same problem arrays,
    beta and precision, and the same frame 0."""
    arrays, found = built.arrays(), []
    for section in ("task", "model", "init"):
        for key, value in st.cfg.to_dict()[section].items():
            if isinstance(value, bool):
                other = not value
            elif isinstance(value, int):
                other = value + 1
            elif isinstance(value, float) and math.isfinite(value):
                other = value * 1.5 if value else 0.5
            else:
                continue
            try:
                cfg = st.cfg.replace(**{section: {key: other}})
                problem = Problem.from_config(cfg)
                same_first = first is None or all(np.array_equal(v, first[k]) for k, v in
                                                  (_first_fields(st, cfg) or {}).items())
            except (ConfigError, OSError, ValueError, KeyError, IndexError):
                continue
            if same_first and array_difference(arrays, problem.arrays()) is None and \
                    same(float(problem.beta), float(built.beta)) and problem.precision == built.precision:
                found.append(f"{section}.{key}")
    return found


def _stepper_attributes(st: Stored, out: Recheck) -> None:
    """/steps.identity_tol, stability_bound, accuracy_note and the /frames attributes (a grid's box) as the run's
    stepper and config set them."""
    from pdeflow.solvers.accuracy import AccuracyMonitor

    monitor = AccuracyMonitor(st.stepper, SERIAL, st.cfg.run, st.cfg.init.n_particles)
    notes = monitor.notes()
    for key, value in notes.items():
        stored = st.traj.steps_attrs.get(key)
        if stored is None:
            continue
        if key == "accuracy_note" and stored != value:
            # an MPI run skips the stability check, and says so
            if "the check runs only in serial runs" in str(stored) and math.isfinite(monitor.bound):
                continue
        if (isinstance(value, float) and not same(float(stored), value)) or \
                (not isinstance(value, float) and stored != value):
            out.problems.append(f"attribute /steps.{key} = {stored!r}, but the run's stepper and config give "
                                f"{value!r}")
    for key, value in st.stepper.frame_attrs().items():
        stored = st.traj.frame_attrs.get(key)
        if stored is not None and not np.array_equal(np.asarray(stored), np.asarray(value)):
            out.problems.append(f"attribute /frames.{key} = {stored!r}, but the run's stepper and config give "
                                f"{value!r}")


def _schedule(st: Stored, out: Recheck) -> bool:
    """Every frame but the last on the config's frame schedule (up to the last frame, or the stored t_end: a resume
    may extend it), and a frame at every scheduled time up to the last frame. False when not checked."""
    from pdeflow.solvers.loop import frame_times

    t = np.asarray(st.traj.time, dtype=float)
    if len(t) < 2:
        return False
    cfg = st.cfg
    r = cfg.run
    try:
        schedule = frame_times(cfg.replace(run={"t_end": float(t[-1])}))
    except ConfigError:
        return False
    allowed_times = set(schedule.tolist()) | {float(r.t_end)}
    for i in range(len(t) - 1):
        if float(t[i]) not in allowed_times:
            out.problems.append(f"frame {i}: /frames/time = {_g(t[i])} is not on the config's frame schedule "
                                f"(run.frame_interval = {r.frame_interval:g}, run.frame_spacing = "
                                f"{r.frame_spacing!r})")
    missing = [float(s) for s in schedule if s <= t[-1] and not np.any(t == s)]
    if missing:
        out.problems.append(f"the frame schedule has t = {', '.join(_g(s) for s in missing[:5])}, where /frames/time "
                            f"has no frame")
    return True


# ---- the checkpoint ---------------------------------------------------------------------------------------------
def check_checkpoint(st: Stored, out: Recheck) -> None:
    """Both slots: their SHA-256 (or all zeros, never written); what each commits lies in the file and agrees with
    it; once the run ended, the active slot commits every row, at the last frame's time and fields."""
    if not st.slots and st.active is None:
        return
    active = st.active
    if active not in (-1, 0, 1):
        out.problems.append(f"/checkpoint/active = {active}: it is 0 or 1 (-1 before the first commit)")
        active = None
    commits: dict[str, dict[str, np.ndarray]] = {}
    for name, arrays in st.slots.items():
        if arrays is None:
            out.problems.append(f"checkpoint {name} cannot be read ({st.slot_errors.get(name, '')})")
            continue
        stored = arrays.get(CHECKSUM)
        if stored is not None and not np.any(stored):
            if any(np.any(v) for k, v in arrays.items() if k != CHECKSUM):
                out.problems.append(f"checkpoint {name}: its checksum says never written (zeros), but its data is not "
                                    f"all zeros")
            if active == int(name[-1]):
                out.problems.append(f"checkpoint {name} is the active one (/checkpoint/active) but was never written")
            continue
        if stored is not None and not _digest_ok(arrays):
            inactive = active is not None and int(name[-1]) != active
            if st.writer_alive and inactive:
                out.unseen(f"/checkpoint/{name}", "being written by the live run")
            elif st.status == RUNNING and inactive:
                out.unseen(f"/checkpoint/{name}", "fails its SHA-256, as a kill during a commit leaves the slot "
                           "being written (the active slot holds)")
            else:
                out.problems.append(f"checkpoint {name}: its datasets do not match its SHA-256 "
                                    f"(/checkpoint/{name}/checksum)")
            continue
        commits[name] = arrays
    if len(commits) == 2 and active in (0, 1) and not st.ended:
        mine, other = commits[f"slot{active}"], commits[f"slot{1 - active}"]
        if int(other["step"]) > int(mine["step"]):
            # a kill between a commit's two flushes leaves this: the slot written, the flip to it never made
            del commits[f"slot{1 - active}"]
            out.unseen(f"/checkpoint/slot{1 - active}, /checkpoint/active",
                       f"slot{1 - active} holds a later step ({int(other['step'])} > {int(mine['step'])}) than the "
                       f"active slot of this unfinished run, as a kill after writing a slot and before making it "
                       f"active leaves it: its rows are not part of the trajectory (a resume overwrites it), and "
                       f"whether /checkpoint/active once named it cannot be told")
    for name, arrays in commits.items():
        _slot_against_rows(st, out, name, arrays)
    if active in (0, 1) and f"slot{active}" in commits and st.ended:
        _active_slot(st, out, f"slot{active}", commits[f"slot{active}"])
    if len(commits) == 2 and active in (0, 1):
        mine, other = commits[f"slot{active}"], commits[f"slot{1 - active}"]
        if int(other["step"]) > int(mine["step"]):
            out.problems.append(f"/checkpoint/active = {active}, but slot{1 - active} holds a later commit (step "
                                f"{int(other['step'])} > {int(mine['step'])})")
        elif int(other["step"]) == int(mine["step"]):
            out.unseen("/checkpoint/active", f"both slots commit step {int(mine['step'])} (each checked against "
                       "the rows): a resume from either starts there, so which one it names cannot be told wrong")
    out.checked.append("/checkpoint: both slots' SHA-256, their rows and times against /frames and /steps, the active "
                       "slot at the end of the run")


def _slot_against_rows(st: Stored, out: Recheck, name: str, arrays: dict[str, np.ndarray]) -> None:
    """A slot commits rows the file holds: ``n_steps = step + 1`` rows, the last at its time ``t``; ``n_frames``
    frames; when the last of them is at ``t``, its fields are the slot's."""
    n_frames, n_steps, step, t = (int(arrays["n_frames"]), int(arrays["n_steps"]), int(arrays["step"]),
                                  float(arrays["t"]))
    where = f"checkpoint {name}"
    if not 0 < n_steps <= st.n_steps or not 0 < n_frames <= st.n_frames:
        out.problems.append(f"{where} commits {n_frames} frames and {n_steps} /steps rows; the file holds "
                            f"{st.n_frames} and {st.n_steps}")
        return
    if step != n_steps - 1:
        out.problems.append(f"{where}: step = {step}, but it commits {n_steps} /steps rows (steps + the initial row)")
    steps_t = st.traj.steps["time"]
    if not same(t, steps_t[n_steps - 1]):
        out.problems.append(f"{where}: t = {_g(t)}, but its last committed /steps row is at t = "
                            f"{_g(steps_t[n_steps - 1])}")
    if same(t, st.traj.time[n_frames - 1]):
        for key, value in st.frame(n_frames - 1).items():
            if key in arrays and not np.array_equal(arrays[key], value):
                out.problems.append(f"{where}, taken at frame {n_frames - 1} (t = {t:.6g}): its {key} differs from "
                                    f"/frames/{key}[{n_frames - 1}]")


def _active_slot(st: Stored, out: Recheck, name: str, arrays: dict[str, np.ndarray]) -> None:
    """Once the run ended its last commit counts every row."""
    if int(arrays["n_frames"]) != st.n_frames or int(arrays["n_steps"]) != st.n_steps:
        out.problems.append(f"the run ended ({st.status}), but its active checkpoint {name} commits "
                            f"{int(arrays['n_frames'])} frames and {int(arrays['n_steps'])} /steps rows, not the "
                            f"file's {st.n_frames} and {st.n_steps}")
