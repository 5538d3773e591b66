"""``pdeflow wfr CONFIG -o OUT.h5``: the Wasserstein-Fisher-Rao flow against the Wasserstein flow.

Runs CONFIG (``solver.method = "wfr"``) into OUT.h5 and with ``solver.gamma = 0`` into ``OUT-w2.h5``, computes the
optimality gap of every frame of both, writes ``OUT-gaps.csv`` and the figure ``OUT.png`` (``--format pdf|svg``,
``--dpi``) and prints a summary. Only ``gap_bound <= 1e-6`` certifies ``G <= 1e-6`` at a frame (``gap_found`` is a
lower bound on the gap). The experiment and its two numbers: docs/design.md, "The Wasserstein-Fisher-Rao experiment".
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..analysis.comparison.wfr_comparison import frame_gaps, plot_comparison, summary_line, write_gaps_csv
from ..core.config import load_config
from ..core.exit_codes import EXIT_OK, HELP
from .cli import UsageError, add_config_arguments
from .cli_figures import add_figure_arguments, figure_dpi


def beside(out: Path, suffix: str) -> Path:
    stem = out.with_suffix("")
    return stem.with_name(stem.name + suffix)


def cmd_wfr(args: argparse.Namespace) -> int:
    from pdeflow.solvers.driver import run

    from ..analysis.plots.figures import figure_output
    from ..core.problem import Problem
    from .cli import check_output_file, new_output_path

    dpi = figure_dpi(args)
    cfg = load_config(args.config, args.set)
    if cfg.solver.method != "wfr" or cfg.solver.gamma <= 0:
        raise UsageError(f"pdeflow wfr compares a Wasserstein-Fisher-Rao run with its Wasserstein limit: the config "
                         f"needs solver.method = 'wfr' and solver.gamma > 0 (got {cfg.solver.method!r}, "
                         f"gamma = {cfg.solver.gamma:g})")
    if cfg.solver.total_mass != "fixed":
        raise UsageError("pdeflow wfr compares flows of probability measures (G assumes mass 1): "
                         "set solver.total_mass = 'fixed'")
    if cfg.diagnostics.domain == "grid":
        raise UsageError("diagnostics.domain = 'grid' is for grid runs; use 'ball' or 'box'")
    out = new_output_path(cfg, args.config, args.output, args.force)
    w2_out = check_output_file(beside(out, "-w2.h5"), args.config, force=args.force)
    csv_out = check_output_file(beside(out, "-gaps.csv"), args.config, force=args.force)
    png_out = None if args.no_plots else check_output_file(out.with_suffix("." + args.format), args.config,
                                                               force=args.force)
    w2_cfg = cfg.replace(solver={"gamma": 0.0})
    problem = Problem.from_config(cfg)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"wfr: {msg}", flush=True))
    for label, c, path in (("WFR", cfg, out), ("Wasserstein", w2_cfg, w2_out)):
        say(f"running the {label} flow -> {path}")
        result = run(c, problem, path, overwrite=args.force, quiet=True, exiting=args.exiting)
        if result.exit_code != EXIT_OK:
            print(f"pdeflow: wfr: the {label} run ended {result.status}: {result.message}")
            return result.exit_code
    say("optimality gaps at every frame")
    gaps = {"w2": frame_gaps(w2_out, cfg), "wfr": frame_gaps(out, cfg)}
    csv = write_gaps_csv(gaps, csv_out)
    with figure_output(dpi):
        figure = None if png_out is None else plot_comparison(out, w2_out, gaps, png_out)
    for key, label in (("w2", "Wasserstein"), ("wfr", "WFR")):
        print(summary_line(label, gaps[key]))
    print(f"pdeflow: wfr: {out}, {w2_out}, {csv}" + (f", {figure}" if figure else ""))
    return EXIT_OK


def add_command(subparsers) -> None:
    """Register ``pdeflow wfr``."""
    p = subparsers.add_parser("wfr", help="Wasserstein-Fisher-Rao against Wasserstein: both runs, G(t), figure",
                              epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p, "TOML config file (solver.method = 'wfr', solver.gamma > 0)",
                         "WFR trajectory file (default: output.path, else <config>.h5); the Wasserstein run "
                         "goes to <OUT>-w2.h5")
    p.add_argument("--no-plots", action="store_true", help="do not write the figure")
    add_figure_arguments(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_wfr)
