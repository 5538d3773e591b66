"""The stages of ``pdeflow report``: each run as the pdeflow command a user would type (so the report shows exactly
what those commands say), writing its file into the report's folder DIR, then the sections and the page.

The stages, in order: ``run`` (``pdeflow run``, or a copy of the given trajectory), ``stationary``
(``pdeflow stationary --kind minimum``), ``diagnose`` (``pdeflow diagnose``, with E* from the certified point when
there is one), ``minimum`` (``pdeflow stability --stationary``), ``dirac`` (``pdeflow stability DIR/run.h5``) and
``chaos`` (``pdeflow chaos DIR/run.h5``, the config's whole ladder: ``--quick``'s two seeds and three N cannot
tell a decay from none): the last two run the stored config on the problem the run file
stores, so a relative ``task.path`` is read once, by the run, from the config's own folder.

Each stage's record in ``DIR/stages.json`` holds the SHA-256 ``key`` of its inputs (:meth:`Stages.key`): its own
options, the keys of the stages it reads (:data:`UPSTREAM`) and the pdeflow version; the ``run`` stage's inputs are
the config after ``--set``, the content of the config file and of the data files it names, or the content of the
given trajectory. A stage whose key and file are unchanged is reused (the page and the summary say which); any change
re-runs it and every stage that reads it. Bad input (:class:`ReportInputError`) is found before DIR is created where
it can be; a stage that refuses its input (exit 2) removes everything this invocation created. A stage that fails
otherwise is recorded as failed with its message, its statements say so, and the report exits with
:data:`~pdeflow.core.exit_codes.EXIT_FAILED`. Then DIR/index.html (no network needed), DIR/report.json, every table
as CSV and LaTeX (DIR/tables) and every figure as PDF and PNG (DIR/figures).
"""
from __future__ import annotations

import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.config import Config, ConfigError, load_config
from ...core.tuner import cpu_model
from ...io.file_access import TrajectoryError
from ...io.trajectory import Trajectory, open_trajectory
from ..stages.records import Created, StageRefused, Stages, file_sha256, text_sha256
from .sections import FAILED, FIGURE_FORMATS, NOT_ESTABLISHED, Section

STAGES = ("run", "stationary", "diagnose", "minimum", "dirac", "chaos")
# the stages whose files each stage reads: a change of one re-runs the stages that read it
UPSTREAM: dict[str, tuple[str, ...]] = {"run": (), "stationary": ("run",), "diagnose": ("run", "stationary"),
                                        "minimum": ("stationary",), "dirac": ("run",), "chaos": ("run",)}
SKIPPABLE = ("stationary", "minimum", "dirac", "chaos", "gap")
# the default report of full.toml (k = 256) leaves dirac and chaos out: see --max-k
MAX_K = 64
# pdeflow stability's dense Hessians: the Dirac stage refuses more coordinates per head
DIRAC_MAX_K = 256
# the stationary search's default budget in gradient equivalents: a count, so the same config gives the same
# verdict on every machine (a wall limit would not)
STATIONARY_BUDGET = 500.0
# the statements diagnose's analysis decides (sections.py builds them from it): what the page shows when it is missing
ANALYSIS_SECTIONS = {"energy": "Energy dissipation and the energy identity",
                     "stationary": "The stationary set and the stationary point reached",
                     "optimality": "Optimality: the support condition and the gap",
                     "rates": "Convergence rates: PL and KL"}


class ReportInputError(ValueError):
    """Bad input to the report: one line naming the problem; nothing of this invocation is left on disk."""


@dataclass(frozen=True)
class ReportRequest:
    """What ``pdeflow report`` was asked: the CONFIG or trajectory ``target``, the folder ``output``, the config
    ``overrides`` (``--set``), the stages to ``skip`` and the stages' limits."""
    target: Path
    output: Path
    overrides: tuple[str, ...] = ()
    skip: frozenset[str] = frozenset()
    gap_frames: int = 3
    stationary_budget: float = STATIONARY_BUDGET
    stationary_wall: float = 0.0
    max_k: int = MAX_K
    quiet: bool = False

    @property
    def is_config(self) -> bool:
        return self.target.suffix.lower() == ".toml"


@dataclass(frozen=True)
class Plan:
    """What :func:`check_request` established before anything is written: the ``config`` the run uses, the
    coordinates per head ``k``, the stages ``sized_out`` by ``--max-k`` (stage -> why) and the ``source`` inputs of
    the run stage (hashes of the config and its data files, or of the trajectory)."""
    config: Config
    k: int
    sized_out: dict[str, str]
    source: dict[str, Any]


@dataclass
class Report:
    """What the report found: its ``sections``, the E* line, the page's path, the stage records, the stages
    ``reused`` from an earlier report and those that ``failed`` (stage -> message)."""
    sections: list[Section]
    e_star_line: str | None
    index: Path
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _source(req: ReportRequest, cfg: Config) -> dict[str, Any]:
    """The run stage's source: the config after ``--set`` with the content of its file and of the data files it
    names (task.path, model.basis_path), or the content of the given trajectory."""
    if not req.is_config:
        return {"trajectory_sha256": file_sha256(req.target)}
    named = {"task.path": cfg.task.path, "model.basis_path": cfg.model.basis_path}
    return {"config_sha256": text_sha256(cfg.to_toml()), "config_file_sha256": file_sha256(req.target),
            "data_files_sha256": {key: file_sha256(cfg.resolve_path(value)) for key, value in named.items() if value}}


def _sized_out(req: ReportRequest, k: int) -> dict[str, str]:
    """Stage -> why ``--max-k`` leaves it out."""
    return {name: (f"left out: k = {k} > --max-k {req.max_k} (its dense Hessians / mean-field reference cost grows "
                   f"with k; rerun with --max-k {k} to include it)")
            for name in ("dirac", "chaos") if name not in req.skip and k > req.max_k}


def _check_options(req: ReportRequest) -> None:
    if not req.target.exists():
        raise ReportInputError(f"{req.target}: no such file")
    unknown = set(req.skip) - set(SKIPPABLE)
    if unknown:
        raise ReportInputError(f"--skip takes {', '.join(SKIPPABLE)}; got {', '.join(sorted(unknown))}")
    for option, value in (("--stationary-budget", req.stationary_budget),
                          ("--stationary-wall", req.stationary_wall)):
        if not (value >= 0 and value < float("inf")):
            raise ReportInputError(f"{option} must be a finite number >= 0, got {value:g}")
    if req.gap_frames < 1:
        raise ReportInputError(f"--gap-frames must be >= 1, got {req.gap_frames}")
    if req.max_k < 0:
        raise ReportInputError(f"--max-k must be >= 0, got {req.max_k}")
    if req.output.exists() and not req.output.is_dir():
        raise ReportInputError(f"{req.output}: exists and is not a folder")
    if not req.is_config and req.overrides:
        raise ReportInputError("--set changes a CONFIG; a trajectory is reported as it is")


def check_request(req: ReportRequest) -> Plan:
    """Everything that can be checked before anything is written: the options, the config with its method's rules
    and its problem (data files read), or the trajectory, and the rules of the Dirac and chaos stages that will run.
    :class:`ReportInputError` (one line) for bad input."""
    from pdeflow.solvers import check_config

    from ...core.problem import Problem

    _check_options(req)
    try:
        if req.is_config:
            cfg = load_config(str(req.target), list(req.overrides))
            check_config(cfg)
            k = Problem.from_config(cfg).k
        else:
            traj = open_trajectory(req.target)
            cfg, k = traj.config, int(traj.model_attrs.get("k", 0))
        sized_out = _sized_out(req, k)
        if "dirac" not in req.skip | set(sized_out) and k > DIRAC_MAX_K:
            raise ReportInputError(f"--max-k {req.max_k} runs the Dirac stage at k = {k}, but pdeflow stability's "
                                   f"dense Hessians need k <= {DIRAC_MAX_K} (--skip dirac, or a smaller --max-k)")
        if "chaos" not in req.skip | set(sized_out):
            from ..finite_heads.chaos import check_config as check_chaos

            check_chaos(cfg)
        return Plan(cfg, k, sized_out, _source(req, cfg))
    except (ConfigError, TrajectoryError) as exc:
        raise ReportInputError(str(exc)) from None


def h5_group(path: Path, group: str) -> dict[str, Any] | None:
    """The attributes and datasets (not subgroups) of ``group`` in an HDF5 result file, strings decoded."""
    import h5py
    import numpy as np

    if not path.exists():
        return None
    with h5py.File(path, "r") as f:
        if group not in f:
            return None
        g = f[group]
        out: dict[str, Any] = {}
        for k, v in g.attrs.items():
            out[k] = v.decode() if isinstance(v, bytes) else v
        for k, d in g.items():
            if isinstance(d, h5py.Dataset):
                v = d[()]
                if isinstance(v, np.ndarray) and v.dtype.kind in "SO":
                    v = [x.decode() if isinstance(x, bytes) else str(x) for x in v.ravel()]
                out[k] = v
    return out


def read_analysis_ok(path: Path) -> bool:
    """Whether the trajectory at ``path`` holds a stored analysis."""
    from ..diagnostics import read_analysis

    try:
        return read_analysis(open_trajectory(path)) is not None
    except Exception:   # an unreadable /analysis is recomputed, never fatal
        return False


def adopt(folder: Path, figures: Path, stems: list[str]) -> list[str]:
    """Move the figures a wrapped command wrote beside its file (``<stem>.<fmt>`` for each of FIGURE_FORMATS) into
    ``figures``; returns the stems present there in every format (the page shows the PNG and links the PDF)."""
    found = []
    for stem in stems:
        for fmt in FIGURE_FORMATS:
            src = folder / f"{stem}.{fmt}"
            if src.exists():
                shutil.move(str(src), figures / src.name)
        if all((figures / f"{stem}.{fmt}").exists() for fmt in FIGURE_FORMATS):
            found.append(stem)
    return found


def _run_stage(req: ReportRequest, stages: Stages, run_file: Path, source: dict[str, Any]) -> bool:
    """The ``run`` stage: ``pdeflow run`` of a CONFIG (continued with --resume when the same inputs were
    interrupted, replaced when they changed), or a copy of the given trajectory; True when the run file is there."""
    if req.is_config:
        argv = ["run", str(req.target), "-o", str(run_file), "--quiet",
                *[x for kv in req.overrides for x in ("--set", kv)]]
        inputs = stages.inputs("run", stages.portable(argv, req.target), source)
        state = stages.state("run", stages.key(inputs), run_file)
        extra = {"continue": ("--resume",), "new": ("--force",) if run_file.exists() else ()}.get(state, ())
        return stages.run("run", argv, run_file, inputs, extra)
    inputs = stages.inputs("run", ["copy", "TARGET", "DIR/run.h5"], source)
    if req.target.resolve() == run_file.resolve():   # the report's own copy: whatever made it, it is the run
        rec = stages.done.get("run", {})
        if rec.get("status") == "ok" and rec.get("key"):
            stages.reuse("run", rec["key"])
            return True
        stages.note("run", f"the report's own {run_file.name}", 0.0, inputs)
        return True
    if stages.state("run", stages.key(inputs), run_file) == "reuse":
        stages.reuse("run", stages.key(inputs))
        return True
    t0 = time.perf_counter()
    shutil.copy2(req.target, run_file)   # the user's file is never edited: diagnose writes into a copy
    stages.note("run", f"copy {req.target} -> {run_file}", time.perf_counter() - t0, inputs)
    return True


def _stationary_stage(req: ReportRequest, stages: Stages, run_file: Path, out: Path,
                      particles: bool) -> dict[str, Any] | None:
    """``pdeflow stationary --kind minimum`` under the report's budget: the result, or None."""
    from ..stationary.stationary import read_stationary

    stationary_file = out / "stationary.h5"
    if "stationary" in req.skip or not particles:
        return None
    limits = ["--max-cost", f"{req.stationary_budget:g}"]
    if req.stationary_wall > 0:
        limits += ["--max-wall", f"{req.stationary_wall:g}"]
    search = ["stationary", str(run_file), "--kind", "minimum", "-o", str(stationary_file), "--quiet", "--force",
              *limits]
    if stages.run("stationary", search, stationary_file, stages.inputs("stationary", stages.portable(search))):
        return read_stationary(stationary_file)
    return None


def _diagnose_stage(req: ReportRequest, stages: Stages, run_file: Path, stationary_file: Path,
                    certified: bool) -> bool:
    """``pdeflow diagnose`` (E* from the certified point when there is one); True when it stored its analysis."""
    diag = ["diagnose", str(run_file)]
    if certified:   # E* is the energy of a certified local minimum only: a stopped search's point is no E*
        diag += ["--stationary", str(stationary_file)]
    if "gap" in req.skip:
        diag.append("--no-gap")
    else:
        diag += ["--set", "gap=true", "--frames", str(req.gap_frames)]
    return stages.run("diagnose", diag, run_file, stages.inputs("diagnose", stages.portable(diag)),
                      valid=read_analysis_ok(run_file))


def _experiment_stages(req: ReportRequest, stages: Stages, out: Path, certified: bool,
                       sized_out: dict[str, str]) -> dict[str, dict[str, Any] | None]:
    """The ``minimum``, ``dirac`` and ``chaos`` stages: each one's result group, or None. Dirac and chaos take the
    config and the problem the run file stores (its /data: no task file is read again)."""
    stationary_file, run_file = out / "stationary.h5", out / "run.h5"
    wanted = {"minimum": certified, "dirac": "dirac" not in sized_out, "chaos": "chaos" not in sized_out}
    commands = {
        "minimum": (["stability", "--stationary", str(stationary_file)], "minimum-rates.h5", "rates"),
        "dirac": (["stability", str(run_file)], "stability.h5", "stability"),
        "chaos": (["chaos", str(run_file)], "chaos.h5", "chaos"),
    }
    found: dict[str, dict[str, Any] | None] = {}
    for name, (argv, filename, group) in commands.items():
        found[name] = None
        if name in req.skip or not wanted[name]:
            continue
        path = out / filename
        formats = ",".join(FIGURE_FORMATS)   # the page shows the PNG and links the PDF
        argv = [*argv, "-o", str(path), "--quiet", "--format", formats, "--force"]
        if stages.run(name, argv, path, stages.inputs(name, stages.portable(argv))):
            found[name] = h5_group(path, group)
    return found


def _stage_costs(traj: Trajectory, stationary: dict[str, Any] | None, rates: dict[str, Any] | None,
                 stages: Stages) -> None:
    """Each stage's cost in gradient equivalents, into its record."""
    import numpy as np

    from ...core.problem import gradient_equivalents
    from ..convergence.spectral import run_gradient_equivalents

    costs = {"run": run_gradient_equivalents(traj.steps),
             "stationary": float(stationary["gradient_equivalents"]) if stationary else float("nan"),
             # per run [R], and the exact products of the polish, the spectrum and the predictions
             "minimum": (gradient_equivalents({"gradient": float(np.sum(rates["gradients"])),
                                               "jvp_exact": float(np.sum(rates["products"])
                                                                  + np.sum(rates["prediction_products"]))})
                         if rates else float("nan"))}
    for name, cost in costs.items():
        if name in stages.done and cost == cost:
            stages.done[name]["cost"] = f"{cost:,.0f} gradient equivalents"


def _failed(section: Section, why: str) -> Section:
    section.verdict, section.reason = FAILED, why
    return section


def _analysis_sections(traj: Trajectory | None, analysis, stationary: dict[str, Any] | None, figures: Path,
                       why: str | None) -> list[Section]:
    """The statements diagnose's analysis decides, or each shown as failed with ``why`` (the run or diagnose
    stage failed)."""
    from .sections import energy_section, optimality_section, rates_section, stationary_section

    if traj is None or analysis is None:
        return [_failed(Section(key, title, "", source="pdeflow diagnose"),
                        why or "not established: pdeflow diagnose stored no analysis")
                for key, title in ANALYSIS_SECTIONS.items()]
    return [energy_section(traj, analysis, figures), stationary_section(traj, analysis, stationary, figures),
            optimality_section(traj, analysis, figures), rates_section(traj, analysis, figures)]


def _tail_sections(req: ReportRequest, plan: Plan, stages: Stages, found: dict[str, Any], run_failed: str | None,
                   out: Path) -> list[Section]:
    """The minimum, Dirac and chaos statements, each with why it was left out or failed where it was."""
    from .sections import chaos_section, dirac_section, minimum_section

    figures = out / "figures"
    tail = {"minimum": minimum_section(found.get("minimum"), adopt(out, figures, ["minimum-rates-rates"])),
            "dirac": dirac_section(found.get("dirac"), adopt(out, figures, ["stability-spectra", "stability-rates",
                                                                            "stability-sweep"])),
            "chaos": chaos_section(found.get("chaos"), adopt(out, figures, ["chaos"]))}
    for name, section in tail.items():
        if name in req.skip:
            section.reason = f"skipped (--skip {name})"
        elif name in plan.sized_out:
            section.reason = plan.sized_out[name]
        elif run_failed or stages.failure(name):
            _failed(section, run_failed or stages.failure(name) or "")
        elif name == "minimum" and stages.failure("stationary"):
            section.verdict, section.reason = NOT_ESTABLISHED, f"not run: {stages.failure('stationary')}"
    return list(tail.values())


def build_report(req: ReportRequest) -> Report:
    """Run the stages whose inputs changed, then write the page: the whole of ``pdeflow report``.

    Raises :class:`ReportInputError` for bad input: found before anything is written, or by a stage (exit 2), and
    then every file and folder this invocation created is removed."""
    plan = check_request(req)
    created = Created(req.output)
    (req.output / "figures").mkdir(parents=True, exist_ok=True)
    try:
        return _build(req, plan)
    except (ReportInputError, StageRefused) as exc:
        created.remove()
        raise ReportInputError(str(exc)) from None


def _build(req: ReportRequest, plan: Plan) -> Report:
    from tqdm import tqdm

    from ... import __version__
    from ..diagnostics import read_analysis
    from .page import write_report

    out = req.output
    stages = Stages(out, __version__, UPSTREAM)
    started = time.perf_counter()
    bar = tqdm(total=len(STAGES) + 1, disable=req.quiet or not sys.stderr.isatty(), unit="stage")
    run_file, config_file, stationary_file = out / "run.h5", out / "config.toml", out / "stationary.h5"
    ran = _run_stage(req, stages, run_file, plan.source)
    bar.update()
    run_failed = stages.failure("run") if not ran else None
    traj = open_trajectory(run_file) if ran else None
    stationary, analysis, found = None, None, {}
    if traj is not None:
        config_file.write_text(str(traj.attrs.get("config", "")) or traj.config.to_toml(), encoding="utf-8")
        stationary = _stationary_stage(req, stages, run_file, out, traj.measure == "particles")
        certified = stationary is not None and bool(stationary.get("certified", False))
        bar.update()
        diagnosed = _diagnose_stage(req, stages, run_file, stationary_file, certified)
        bar.update()
        found = _experiment_stages(req, stages, out, certified, plan.sized_out)
        bar.update(3)
        traj = open_trajectory(run_file)
        analysis = read_analysis(traj) if diagnosed else None
        _stage_costs(traj, stationary, found["minimum"], stages)
    sections = _analysis_sections(traj, analysis, stationary, out / "figures", run_failed or stages.failure("diagnose"))
    sections += _tail_sections(req, plan, stages, found, run_failed, out)
    current = [s for s in STAGES if s in stages.keys]
    records = [{**stages.done[s], "reused": s in stages.reused} for s in current]
    provenance = {"pdeflow_version": __version__, "cpu": cpu_model(), "cores": os.cpu_count(),
                  "python": platform.python_version(), "target": str(req.target),
                  # every stage's recorded wall once (this invocation's or an earlier one's), and this
                  # invocation's time outside its stages: a fresh report's own elapsed time
                  "total_wall_s": round(sum(r.get("wall_s", 0.0) for r in records)
                                        + time.perf_counter() - started - stages.spent, 1),
                  "reused": [s for s in current if s in stages.reused],
                  "stages": [{**r, "status": r["status"] + (" (reused: inputs unchanged)" if r["reused"] else "")}
                             for r in records],
                  "config": config_file.read_text(encoding="utf-8") if config_file.exists() else ""}
    write_report(out, f"pdeflow report: {req.target.name}", sections, provenance)
    bar.update()
    bar.close()
    return Report(sections, _e_star_line(analysis, stationary, stationary_file), out / "index.html",
                  {s: stages.done[s] for s in current}, provenance["reused"],
                  {s: why for s in current if (why := stages.failure(s))})


def _e_star_line(analysis, stationary: dict[str, Any] | None, stationary_file: Path) -> str | None:
    if analysis is None:
        return None
    certified = stationary is not None and bool(stationary.get("certified", False))
    source = (f"the energy of the certified local minimum in {stationary_file.name}" if certified
              else analysis.e_star_text)
    return (f"E* = {analysis.e_star:.10g} ({source})" if analysis.e_star == analysis.e_star
            else "E* not established: no certified local minimum, and diagnose found no limit of E(t)")
