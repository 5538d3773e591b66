"""``pdeflow report CONFIG_OR_TRAJECTORY -o DIR``: the theory on the user's problem in one command (the stages,
sections and page are :mod:`pdeflow.analysis.report`; this module is the command line around them).

Runs what is not yet computed, each stage as the pdeflow command a user would type (so the report shows exactly what
those commands say), writing its file into DIR: ``run`` (``pdeflow run``, or a copy of the given trajectory),
``stationary`` (``pdeflow stationary --kind minimum``), ``diagnose`` (``pdeflow diagnose``, with E* from the
certified point when there is one), ``minimum`` (``pdeflow stability --stationary``), ``dirac``
(``pdeflow stability DIR/run.h5``) and ``chaos`` (``pdeflow chaos DIR/run.h5``, the config's ladder); the last two
take the problem the run file stores, so relative paths in the config are read once, from the config's own folder.
DIR/stages.json keeps each stage's command, cost and the hash of its inputs (the config after --set, the content
of the config, its data files or the trajectory, the stage's options, the pdeflow version): a stage whose inputs
are unchanged is reused, and the page and the summary say which; any change re-runs it and the stages that read it,
and an interrupted report resumes. Then it writes DIR/index.html (no network needed), DIR/report.json, every table
as CSV and LaTeX (DIR/tables) and every figure as PDF and PNG (DIR/figures).

Bad input (exit 2) leaves no folder and no file of this invocation. A stage that fails is shown as failed, with its
message, on the page, in report.json and in the summary, and the report exits with 3.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..analysis.report.pipeline import (
    MAX_K,
    SKIPPABLE,
    STATIONARY_BUDGET,
    ReportInputError,
    ReportRequest,
    build_report,
)
from ..core.exit_codes import EXIT_FAILED, EXIT_OK, HELP


def cmd_report(args: argparse.Namespace) -> int:
    """Build the report, then print its summary: one line per statement of the model contract."""
    from .cli import UsageError

    request = ReportRequest(Path(args.target), Path(args.output), tuple(args.set),
                            frozenset(s.strip() for s in (args.skip or "").split(",") if s.strip()),
                            args.gap_frames, args.stationary_budget, args.stationary_wall, args.max_k, args.quiet)
    try:
        report = build_report(request)
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    if report.e_star_line:
        print(report.e_star_line)
    for s in report.sections:
        print(f"{s.title}: {s.verdict} - {s.reason}")
    if report.reused:
        print(f"reused from DIR (inputs unchanged): {', '.join(report.reused)}")
    for why in report.failed.values():
        print(f"pdeflow: error: {why}", file=sys.stderr)
    print(f"pdeflow: report -> {report.index}" + (f" ({len(report.failed)} stage(s) failed)" if report.failed else ""))
    return EXIT_FAILED if report.failed else EXIT_OK


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
