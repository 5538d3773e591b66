"""``pdeflow report CONFIG_OR_TRAJECTORY -o DIR``: the theory on the user's problem in one command.

Runs what is not yet computed, each stage as the pdeflow command a user would type (so the report shows exactly what
those commands say), writing its file into DIR: ``run`` (``pdeflow run``, or a copy of the given trajectory),
``stationary`` (``pdeflow stationary --kind minimum``), ``diagnose`` (``pdeflow diagnose``, with E* from the
certified point when there is one), ``minimum`` (``pdeflow stability --stationary``), ``dirac``
(``pdeflow stability``) and ``chaos`` (``pdeflow chaos --quick``). A stage whose file is already in DIR is not run
again (``DIR/stages.json`` keeps what each cost), so a rerun is incremental and an interrupted report resumes.
Then it writes DIR/index.html (no network needed), DIR/report.json, every table as CSV and LaTeX (DIR/tables) and
every figure as PDF and PNG (DIR/figures).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core.exit_codes import EXIT_OK, HELP

STAGES = ("run", "stationary", "diagnose", "minimum", "dirac", "chaos")
SKIPPABLE = ("stationary", "minimum", "dirac", "chaos", "gap")
# the default report of the quickstart (k = 256) leaves dirac and chaos out: see --max-k
MAX_K = 64
# the stationary search's default budget in gradient equivalents: a count, so the same config gives the same
# verdict on every machine (a wall limit would not); small enough that the quickstart's report ends in about a
# minute on 2 cores (README, "Two commands")
STATIONARY_BUDGET = 500.0


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

    def run(self, name: str, argv: list[str], output: Path, *, rerun: bool = False) -> bool:
        """Run ``pdeflow argv`` unless ``output`` exists from an earlier stage (or ``rerun``); True when the
        stage's output is there afterwards."""
        if output.exists() and name in self.done and not rerun and self.done[name].get("status") == "ok":
            return True
        start = time.perf_counter()
        env = dict(os.environ)
        proc = subprocess.run([sys.executable, "-m", "pdeflow", *argv], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
        self.done[name] = {"stage": name, "command": "pdeflow " + " ".join(argv), "wall_s": wall,
                           "status": "ok" if proc.returncode == 0 else f"exit {proc.returncode}: {last[:300]}",
                           "stdout_tail": proc.stdout.strip().splitlines()[-12:]}
        self.save()
        return proc.returncode == 0 and output.exists()

    def note(self, name: str, command: str, wall: float, status: str = "ok") -> None:
        self.done[name] = {"stage": name, "command": command, "wall_s": wall, "status": status}
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.done, indent=1), encoding="utf-8")


def _h5_group(path: Path, group: str) -> dict[str, Any] | None:
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


def cmd_report(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..analysis.diagnostics import read_analysis
    from ..analysis.report import (
        chaos_section,
        dirac_section,
        energy_section,
        minimum_section,
        optimality_section,
        rates_section,
        stationary_section,
    )
    from ..analysis.report_page import write_report
    from ..analysis.stationary import read_stationary
    from ..core.config import load_config
    from ..io.file_access import TrajectoryError
    from ..io.trajectory import open_trajectory
    from .cli import UsageError

    target = Path(args.target)
    if not target.exists():
        raise UsageError(f"{target}: no such file")
    skip = {s.strip() for s in (args.skip or "").split(",") if s.strip()}
    unknown = skip - set(SKIPPABLE)
    if unknown:
        raise UsageError(f"--skip takes {', '.join(SKIPPABLE)}; got {', '.join(sorted(unknown))}")
    for option, value in (("--stationary-budget", args.stationary_budget), ("--stationary-wall", args.stationary_wall)):
        if not (value >= 0 and value < float("inf")):
            raise UsageError(f"{option} must be a finite number >= 0, got {value:g}")
    is_config = target.suffix.lower() == ".toml"
    if is_config:
        load_config(str(target), args.set)   # bad config: one line, exit 2, before anything is written
    elif args.set:
        raise UsageError("--set changes a CONFIG; a trajectory is reported as it is")
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a folder")
    (out / "figures").mkdir(parents=True, exist_ok=True)
    stages = Stages(out, args.quiet)
    started = time.perf_counter()
    bar = tqdm(total=len(STAGES) + 1, disable=args.quiet or not sys.stderr.isatty(), unit="stage")

    def step(label: str) -> None:
        bar.set_postfix_str(label, refresh=True)

    run_file = out / "run.h5"
    step("run")
    if is_config:
        overrides = [x for kv in args.set for x in ("--set", kv)]
        resume = ["--resume"] if run_file.exists() else []
        if not stages.run("run", ["run", str(target), "-o", str(run_file), "--quiet", *resume, *overrides], run_file):
            raise UsageError(f"the run failed: {stages.done['run']['status']}")
    elif not run_file.exists():
        t0 = time.perf_counter()
        try:
            open_trajectory(target)
        except TrajectoryError as exc:
            raise UsageError(str(exc)) from None
        shutil.copy2(target, run_file)   # the user's file is never edited: diagnose writes /analysis into a copy
        stages.note("run", f"copy {target} -> {run_file}", time.perf_counter() - t0)
    bar.update()
    traj = open_trajectory(run_file)
    config_file = out / "config.toml"
    if not config_file.exists():
        config_file.write_text(str(traj.attrs.get("config", "")) or str(traj.config), encoding="utf-8")
    particles = traj.measure == "particles"
    k = int(traj.model_attrs.get("k", 0))
    sized_out = {}   # stage -> why it was left out by --max-k
    for name in ("dirac", "chaos"):
        if name not in skip and k > args.max_k:
            sized_out[name] = (f"left out: k = {k} > --max-k {args.max_k} (its dense Hessians / mean-field reference "
                               f"cost grows with k; rerun with --max-k {k} to include it)")

    step("stationary")
    stationary_file = out / "stationary.h5"
    have_stationary = False
    if "stationary" not in skip and particles:
        limits = ["--max-cost", f"{args.stationary_budget:g}"]
        if args.stationary_wall > 0:
            limits += ["--max-wall", f"{args.stationary_wall:g}"]
        search = ["stationary", str(run_file), "--kind", "minimum", "-o", str(stationary_file), "--quiet", "--force",
                  *limits]
        # another budget is another search: rerun it rather than report the earlier one
        earlier = stages.done.get("stationary", {}).get("command")
        have_stationary = stages.run("stationary", search, stationary_file,
                                     rerun=earlier != "pdeflow " + " ".join(search))
    bar.update()
    stationary = read_stationary(stationary_file) if have_stationary else None
    certified = stationary is not None and bool(stationary.get("certified", False))
    step("diagnose")
    diag = ["diagnose", str(run_file)]
    if certified:   # E* is the energy of a certified local minimum only: a stopped search's point is no E*
        diag += ["--stationary", str(stationary_file)]
    if "gap" in skip:
        diag.append("--no-gap")
    else:
        diag += ["--set", "gap=true", "--frames", str(args.gap_frames)]
    diagnosed = stages.run("diagnose", diag, run_file, rerun=stages.done.get("diagnose", {}).get("command")
                           != "pdeflow " + " ".join(diag) or not read_analysis_ok(run_file))
    bar.update()
    step("minimum")
    rates_file = out / "minimum-rates.h5"
    rates = None
    if "minimum" not in skip and certified:
        if stages.run("minimum", ["stability", "--stationary", str(stationary_file), "-o", str(rates_file),
                                  "--quiet", "--format", "png", "--force"], rates_file):
            rates = _h5_group(rates_file, "rates")
    bar.update()
    step("dirac")
    stability_file = out / "stability.h5"
    stability = None
    if "dirac" not in skip and "dirac" not in sized_out:
        if stages.run("dirac", ["stability", str(config_file), "-o", str(stability_file), "--quiet", "--format",
                                "png", "--force"], stability_file):
            stability = _h5_group(stability_file, "stability")
    bar.update()
    step("chaos")
    chaos_file = out / "chaos.h5"
    chaos = None
    if "chaos" not in skip and "chaos" not in sized_out:
        if stages.run("chaos", ["chaos", str(config_file), "--quick", "-o", str(chaos_file), "--quiet", "--format",
                                "png", "--force"], chaos_file):
            chaos = _h5_group(chaos_file, "chaos")
    bar.update()

    step("figures and page")
    figures = out / "figures"
    traj = open_trajectory(run_file)
    analysis = read_analysis(traj) if diagnosed else None
    sections = []
    if analysis is not None:
        sections += [energy_section(traj, analysis, figures), stationary_section(traj, analysis, stationary, figures),
                     optimality_section(traj, analysis, figures), rates_section(traj, analysis, figures)]
    sections.append(minimum_section(rates, _adopt(out, figures, ["minimum-rates-rates"])))
    sections.append(dirac_section(stability, _adopt(out, figures, ["stability-spectra", "stability-rates",
                                                                   "stability-sweep"])))
    sections.append(chaos_section(chaos, _adopt(out, figures, ["chaos"])))
    for name, section in (("minimum", sections[-3]), ("dirac", sections[-2]), ("chaos", sections[-1])):
        if name in skip:
            section.reason = f"skipped (--skip {name})"
        elif name in sized_out:
            section.reason = sized_out[name]
    import numpy as np

    from ..analysis.diagnostics.spectral import run_gradient_equivalents
    from ..benchmarks.common import cpu_model
    from ..core.problem import gradient_equivalents

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

    provenance = {"pdeflow_version": traj.attrs.get("pdeflow_version", ""),
                  "cpu": cpu_model().get("model", platform.processor() or "unknown"),
                  "cores": os.cpu_count(), "python": platform.python_version(), "target": str(target),
                  "total_wall_s": round(sum(s.get("wall_s", 0.0) for s in stages.done.values())
                                        + time.perf_counter() - started, 1),
                  "stages": [stages.done[s] for s in STAGES if s in stages.done],
                  "config": config_file.read_text(encoding="utf-8")}
    from .. import __version__
    provenance["pdeflow_version"] = __version__
    write_report(out, f"pdeflow report: {target.name}", sections, provenance)
    bar.update()
    bar.close()
    if analysis is not None:
        source = (f"the energy of the certified local minimum in {stationary_file.name}" if certified
                  else analysis.e_star_source)
        print(f"E* = {analysis.e_star:.10g} ({source})" if analysis.e_star == analysis.e_star
              else "E* not established: no certified local minimum, and diagnose found no limit of E(t)")
    for s in sections:
        print(f"{s.title}: {s.verdict} - {s.reason}")
    print(f"pdeflow: report -> {out / 'index.html'}")
    return EXIT_OK


def read_analysis_ok(path: Path) -> bool:
    """Whether the trajectory at ``path`` holds a stored analysis."""
    from ..analysis.diagnostics import read_analysis
    from ..io.trajectory import open_trajectory

    try:
        return read_analysis(open_trajectory(path)) is not None
    except Exception:   # an unreadable /analysis is recomputed, never fatal
        return False


def _adopt(folder: Path, figures: Path, stems: list[str]) -> list[str]:
    """Move the PNG figures a wrapped command wrote beside its file (``<stem>.png``) into ``figures``; returns the
    stems present there."""
    found = []
    for stem in stems:
        src, dst = folder / f"{stem}.png", figures / f"{stem}.png"
        if src.exists():
            shutil.move(str(src), dst)
        if dst.exists():
            found.append(stem)
    return found


def add_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``report``."""
    p = subparsers.add_parser("report", help="the theory on your problem: every statement of the model contract, "
                              "with its verdict, in one page", description=__doc__.split("\n\n", 1)[1],
                              epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", metavar="CONFIG_OR_TRAJECTORY", help="a TOML config (run first) or a trajectory (.h5)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the report's folder (created; reused)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="change a config key (CONFIG)")
    p.add_argument("--skip", metavar="A,B", default="",
                   help=f"stages to leave out: {', '.join(SKIPPABLE)} (gap: no search for min Phi)")
    p.add_argument("--gap-frames", type=int, default=3, metavar="N", help="frames where the gap is computed")
    p.add_argument("--stationary-budget", type=float, default=STATIONARY_BUDGET, metavar="GRADIENTS",
                   help=f"the stationary search stops after this many gradient equivalents (default "
                        f"{STATIONARY_BUDGET:g}; 0: no limit); a count, so the verdict is the same on every machine")
    p.add_argument("--stationary-wall", type=float, default=0.0, metavar="SECONDS",
                   help="also stop the stationary search after this many seconds (default 0: no wall limit; "
                        "machine-dependent)")
    p.add_argument("--max-k", type=int, default=MAX_K, metavar="K",
                   help=f"run the Dirac stability and chaos stages only for k <= K coordinates per head (default "
                        f"{MAX_K}: at k = 256 each takes longer than the rest of the report)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_report)


__all__ = ["add_command"]
