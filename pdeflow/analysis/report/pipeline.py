"""The stages of ``pdeflow report``: each run as the pdeflow command a user would type (so the report shows exactly
what those commands say), writing its file into the report's folder DIR, then the sections and the page.

The stages, in order: ``run`` (``pdeflow run``, or a copy of the given trajectory), ``stationary``
(``pdeflow stationary --kind minimum``), ``diagnose`` (``pdeflow diagnose``, with E* from the certified point when
there is one), ``minimum`` (``pdeflow stability --stationary``), ``dirac`` (``pdeflow stability``) and ``chaos``
(``pdeflow chaos --quick``). A stage whose file is already in DIR is not run again (``DIR/stages.json`` keeps what
each cost), so a rerun is incremental and an interrupted report resumes. Then DIR/index.html (no network needed),
DIR/report.json, every table as CSV and LaTeX (DIR/tables) and every figure as PDF and PNG (DIR/figures).
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.config import ConfigError, load_config
from ...core.tuner import cpu_model
from ...io.file_access import TrajectoryError
from ...io.trajectory import Trajectory, open_trajectory
from .sections import FIGURE_FORMATS, Section

STAGES = ("run", "stationary", "diagnose", "minimum", "dirac", "chaos")
SKIPPABLE = ("stationary", "minimum", "dirac", "chaos", "gap")
# the default report of full.toml (k = 256) leaves dirac and chaos out: see --max-k
MAX_K = 64
# the stationary search's default budget in gradient equivalents: a count, so the same config gives the same
# verdict on every machine (a wall limit would not)
STATIONARY_BUDGET = 500.0


class ReportInputError(ValueError):
    """Bad input to the report, found before anything is written: one line naming the problem."""


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


@dataclass
class Report:
    """What the report found: its ``sections``, the E* line, the page's path."""
    sections: list[Section]
    e_star_line: str | None
    index: Path
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)


class Stages:
    """The stages' record in ``DIR/stages.json``: command, wall time, status of each, kept across reruns."""

    def __init__(self, folder: Path, quiet: bool) -> None:
        self.path = folder / "stages.json"
        self.done: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            try:
                self.done = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.done = {}
        self.quiet = quiet
        self.spent = 0.0   # the wall time of the stages run by this invocation (already in their records)

    def run(self, name: str, argv: list[str], output: Path, *, rerun: bool = False) -> bool:
        """Run ``pdeflow argv`` unless ``output`` exists from an earlier stage (or ``rerun``); True when the
        stage's output is there afterwards."""
        if output.exists() and name in self.done and not rerun and self.done[name].get("status") == "ok":
            return True
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pdeflow", *argv], capture_output=True, text=True,
                              env=dict(os.environ))
        wall = time.perf_counter() - start
        self.spent += wall
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
        self.done[name] = {"stage": name, "command": "pdeflow " + " ".join(argv), "wall_s": wall,
                           "status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {last[:300]}",
                           "stdout_tail": proc.stdout.strip().splitlines()[-12:]}
        self.save()
        return proc.returncode == 0 and output.exists()

    def note(self, name: str, command: str, wall: float, status: str = "ok") -> None:
        self.spent += wall
        self.done[name] = {"stage": name, "command": command, "wall_s": wall, "status": status}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.done, indent=1), encoding="utf-8")


def check_request(req: ReportRequest) -> None:
    """Refuse bad input before anything is written (:class:`ReportInputError`, one line)."""
    if not req.target.exists():
        raise ReportInputError(f"{req.target}: no such file")
    unknown = set(req.skip) - set(SKIPPABLE)
    if unknown:
        raise ReportInputError(f"--skip takes {', '.join(SKIPPABLE)}; got {', '.join(sorted(unknown))}")
    for option, value in (("--stationary-budget", req.stationary_budget),
                          ("--stationary-wall", req.stationary_wall)):
        if not (value >= 0 and value < float("inf")):
            raise ReportInputError(f"{option} must be a finite number >= 0, got {value:g}")
    if req.is_config:
        try:
            load_config(str(req.target), list(req.overrides))
        except ConfigError as exc:
            raise ReportInputError(str(exc)) from None
    elif req.overrides:
        raise ReportInputError("--set changes a CONFIG; a trajectory is reported as it is")
    if req.output.exists() and not req.output.is_dir():
        raise ReportInputError(f"{req.output}: exists and is not a folder")


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


def _run_stage(req: ReportRequest, stages: Stages, run_file: Path) -> None:
    """The ``run`` stage: ``pdeflow run`` of a CONFIG, or a copy of the given trajectory."""
    if req.is_config:
        overrides = [x for kv in req.overrides for x in ("--set", kv)]
        resume = ["--resume"] if run_file.exists() else []
        if not stages.run("run", ["run", str(req.target), "-o", str(run_file), "--quiet", *resume, *overrides],
                          run_file):
            raise ReportInputError(f"the run failed: {stages.done['run']['status']}")
    elif not run_file.exists():
        t0 = time.perf_counter()
        try:
            open_trajectory(req.target)
        except TrajectoryError as exc:
            raise ReportInputError(str(exc)) from None
        shutil.copy2(req.target, run_file)   # the user's file is never edited: diagnose writes into a copy
        stages.note("run", f"copy {req.target} -> {run_file}", time.perf_counter() - t0)


def _sized_out(req: ReportRequest, k: int) -> dict[str, str]:
    """Stage -> why ``--max-k`` leaves it out."""
    return {name: (f"left out: k = {k} > --max-k {req.max_k} (its dense Hessians / mean-field reference cost grows "
                   f"with k; rerun with --max-k {k} to include it)")
            for name in ("dirac", "chaos") if name not in req.skip and k > req.max_k}


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
    # another budget is another search: rerun it rather than report the earlier one
    earlier = stages.done.get("stationary", {}).get("command")
    if stages.run("stationary", search, stationary_file, rerun=earlier != "pdeflow " + " ".join(search)):
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
    return stages.run("diagnose", diag, run_file, rerun=stages.done.get("diagnose", {}).get("command")
                      != "pdeflow " + " ".join(diag) or not read_analysis_ok(run_file))


def _experiment_stages(req: ReportRequest, stages: Stages, out: Path, certified: bool,
                       sized_out: dict[str, str]) -> dict[str, dict[str, Any] | None]:
    """The ``minimum``, ``dirac`` and ``chaos`` stages: each one's result group, or None."""
    stationary_file, config_file = out / "stationary.h5", out / "config.toml"
    wanted = {"minimum": certified, "dirac": "dirac" not in sized_out, "chaos": "chaos" not in sized_out}
    commands = {
        "minimum": (["stability", "--stationary", str(stationary_file)], "minimum-rates.h5", "rates"),
        "dirac": (["stability", str(config_file)], "stability.h5", "stability"),
        "chaos": (["chaos", str(config_file), "--quick"], "chaos.h5", "chaos"),
    }
    found: dict[str, dict[str, Any] | None] = {}
    for name, (argv, filename, group) in commands.items():
        found[name] = None
        if name in req.skip or not wanted[name]:
            continue
        path = out / filename
        formats = ",".join(FIGURE_FORMATS)   # the page shows the PNG and links the PDF
        if stages.run(name, [*argv, "-o", str(path), "--quiet", "--format", formats, "--force"], path):
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


def build_report(req: ReportRequest) -> Report:
    """Run the stages that are not yet done, then write the page: the whole of ``pdeflow report``.

    Raises :class:`ReportInputError` for bad input (checked before anything is written) or a failed run."""
    from tqdm import tqdm

    from ... import __version__
    from ..diagnostics import read_analysis
    from .page import write_report
    from .sections import (
        chaos_section,
        dirac_section,
        energy_section,
        minimum_section,
        optimality_section,
        rates_section,
        stationary_section,
    )

    check_request(req)
    out = req.output
    (out / "figures").mkdir(parents=True, exist_ok=True)
    stages = Stages(out, req.quiet)
    started = time.perf_counter()
    bar = tqdm(total=len(STAGES) + 1, disable=req.quiet or not sys.stderr.isatty(), unit="stage")
    run_file, config_file, stationary_file = out / "run.h5", out / "config.toml", out / "stationary.h5"
    _run_stage(req, stages, run_file)
    bar.update()
    traj = open_trajectory(run_file)
    if not config_file.exists():
        config_file.write_text(str(traj.attrs.get("config", "")) or str(traj.config), encoding="utf-8")
    sized_out = _sized_out(req, int(traj.model_attrs.get("k", 0)))
    stationary = _stationary_stage(req, stages, run_file, out, traj.measure == "particles")
    certified = stationary is not None and bool(stationary.get("certified", False))
    bar.update()
    diagnosed = _diagnose_stage(req, stages, run_file, stationary_file, certified)
    bar.update()
    found = _experiment_stages(req, stages, out, certified, sized_out)
    bar.update(3)

    figures = out / "figures"
    traj = open_trajectory(run_file)
    analysis = read_analysis(traj) if diagnosed else None
    sections = []
    if analysis is not None:
        sections += [energy_section(traj, analysis, figures), stationary_section(traj, analysis, stationary, figures),
                     optimality_section(traj, analysis, figures), rates_section(traj, analysis, figures)]
    tail = {"minimum": minimum_section(found["minimum"], adopt(out, figures, ["minimum-rates-rates"])),
            "dirac": dirac_section(found["dirac"], adopt(out, figures, ["stability-spectra", "stability-rates",
                                                                        "stability-sweep"])),
            "chaos": chaos_section(found["chaos"], adopt(out, figures, ["chaos"]))}
    for name, section in tail.items():
        if name in req.skip:
            section.reason = f"skipped (--skip {name})"
        elif name in sized_out:
            section.reason = sized_out[name]
    sections += tail.values()
    _stage_costs(traj, stationary, found["minimum"], stages)
    provenance = {"pdeflow_version": __version__, "cpu": cpu_model(), "cores": os.cpu_count(),
                  "python": platform.python_version(), "target": str(req.target),
                  # every stage's recorded wall once (this invocation's or an earlier one's), and this
                  # invocation's time outside its stages: a fresh report's own elapsed time
                  "total_wall_s": round(sum(s.get("wall_s", 0.0) for s in stages.done.values())
                                        + time.perf_counter() - started - stages.spent, 1),
                  "stages": [stages.done[s] for s in STAGES if s in stages.done],
                  "config": config_file.read_text(encoding="utf-8")}
    write_report(out, f"pdeflow report: {req.target.name}", sections, provenance)
    bar.update()
    bar.close()
    e_star_line = None
    if analysis is not None:
        source = (f"the energy of the certified local minimum in {stationary_file.name}" if certified
                  else analysis.e_star_text)
        e_star_line = (f"E* = {analysis.e_star:.10g} ({source})" if analysis.e_star == analysis.e_star
                       else "E* not established: no certified local minimum, and diagnose found no limit of E(t)")
    return Report(sections, e_star_line, out / "index.html", stages.done)
