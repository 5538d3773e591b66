"""``pdeflow chaos CONFIG|FILE -o OUT.h5 [--quick]``: propagation of chaos and the static approximation.

Runs the experiment of pdeflow.analysis.finite_heads.chaos (N heads, their SGD training and the mean-field
characteristics from the same initial points; the static approximation) on a CONFIG, or on the problem a pdeflow
FILE stores with its stored config (a task that reads a file, text, then draws its fresh sequences from the file's
/data), writes the measurements and fitted rates to OUT.h5
(group /chaos), the figure to OUT.png beside it, and prints one line per rate. Every finished (N, seed)
block is kept in OUT.h5.work until the end: after a kill, --resume continues from there.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core.exit_codes import EXIT_FAILED, EXIT_OK, HELP
from ..io.problem_file import config_and_problem
from .cli import UsageError, add_config_arguments, check_output_file
from .cli_figures import add_figure_arguments, figure_dpi


def cmd_chaos(args: argparse.Namespace) -> int:
    from pdeflow.solvers import make_stepper

    from ..analysis.finite_heads import chaos
    from ..analysis.finite_heads.chaos_plots import plot_result
    from ..analysis.plots.figures import figure_output

    dpi = figure_dpi(args)
    cfg, problem, stored = config_and_problem(args.config, args.set)
    if args.quick:
        cfg = chaos.quick_config(cfg)
    out = check_output_file(Path(args.output) if args.output else Path(Path(args.config).stem + "-chaos.h5"),
                            args.config, force=args.force)
    work = chaos.work_path(out)
    if args.resume and not work.exists():
        raise UsageError(f"nothing to resume: {str(work)!r} does not exist")
    if work.exists() and not (args.resume or args.force):
        raise UsageError(f"{str(work)!r} holds an unfinished experiment: --resume continues it, --force starts over")
    chaos.check_config(cfg)
    make_stepper(problem, cfg)  # a bad solver setting fails here, before any work
    if work.exists() and not args.resume:  # --force: start over
        work.unlink()
    progress = _progress(cfg, quiet=args.quiet)
    try:
        result = chaos.run_chaos(cfg, problem, progress=progress, work=work, stored=stored)
    except chaos.ChaosError as exc:
        print(f"pdeflow: error: chaos: {exc}; no output written", file=sys.stderr)
        return EXIT_FAILED
    finally:
        progress.close()
    chaos.write_result(out, result, cfg, problem, quick=args.quick)
    work.unlink(missing_ok=True)
    figures = [out.with_suffix("." + fmt) for fmt in args.format]
    with figure_output(dpi, formats=args.format):
        plot_result(figures[0], result)
    print(chaos.summary(result))
    print(f"pdeflow: chaos: finished in {result.attrs['wall_time']:.0f} s -> {out}, {', '.join(map(str, figures))}")
    return EXIT_OK


class _Progress:
    """A tqdm bar over the experiment's cost units (particle-time), shown on a terminal only."""

    def __init__(self, total: float, quiet: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, disable=quiet or not sys.stderr.isatty(), unit="",
                        bar_format="{l_bar}{bar}| {postfix} [{elapsed}<{remaining}]")

    def __call__(self, label: str, units: float) -> None:
        self.bar.set_postfix_str(label, refresh=False)
        self.bar.update(units)

    def close(self) -> None:
        self.bar.close()


def _progress(cfg, quiet: bool) -> _Progress:
    from ..analysis.finite_heads import chaos

    c = cfg.chaos
    heads = sum(int(n) for n in set(int(v) for v in c.n_list)) * c.seeds
    etas = len(set(c.eta_list))
    t = chaos.horizon_config(cfg).run.t_end
    total = (c.n_ref + heads) * t + heads * t * (1 + etas) + c.n_ref * max(0.0, c.converge_time - t)
    return _Progress(total, quiet)


def add_command(subparsers) -> None:
    p = subparsers.add_parser("chaos", help="propagation of chaos: N heads and SGD against the mean-field limit",
                              epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description=__doc__.split("\n\n")[1])
    add_config_arguments(p, "TOML config file (sections [chaos], [sgd], [solver], [run]), or a pdeflow file "
                         "(trajectory or result: its stored config on its stored problem)",
                         "HDF5 result file (default: <config>-chaos.h5); the figure is written beside it with "
                         "the suffix of each --format")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted experiment from OUT.h5.work (finished (N, seed) blocks are kept)")
    p.add_argument("--quick", action="store_true",
                   help="a smaller experiment for a smoke test: three smallest N, two seeds, two largest eta, "
                        "a quarter of chaos.n_ref")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_figure_arguments(p, several=True)
    p.set_defaults(func=cmd_chaos)
