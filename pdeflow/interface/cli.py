"""The ``pdeflow`` command line: ``run``, ``info`` and the analysis commands.

Exit codes: :mod:`pdeflow.core.exit_codes`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .. import __version__
from ..core.config import Config, ConfigError, load_config
from ..core.exit_codes import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, EXIT_PIPE, EXIT_SIGINT, HELP
from ..core.parallel import abort_ranks, failed_alike, launcher_rank, world
from ..io.file_access import TrajectoryError
from ..io.recovery import recovery_hint
from ..io.resume import check_same_problem, config_difference, open_resumable
from ..io.trajectory import Trajectory, check_file, open_trajectory

EXIT_CODES = HELP  # the epilog of every command's --help
DEBUG_VARIABLE = "PDEFLOW_DEBUG"   # set: a file command's unexpected exception is raised with its traceback
# Modules adding subcommands: each has ``add_command(subparsers)`` setting ``func`` on its parser.
COMMAND_MODULES: tuple[str, ...] = (
    "pdeflow.interface.cli_diagnostics",   # diagnose, plot
    "pdeflow.interface.cli_reference",     # compare, validate
    "pdeflow.interface.cli_chaos",         # chaos
    "pdeflow.interface.cli_stability",     # stability
    "pdeflow.interface.cli_stationary",    # stationary
    "pdeflow.interface.cli_wfr",           # wfr
    "pdeflow.interface.cli_bench",         # bench
    "pdeflow.interface.cli_recover",       # recover
    "pdeflow.interface.cli_report",        # report
)


class UsageError(Exception):
    """Bad input found by a command; reported as one line with exit code 2."""


# Commands that read files another code may have written: the arguments naming them, and the exit code of a file that
# is not readable: 1 for the check commands (the file was read and failed), 2 for the others (bad input).
UNTRUSTED_FILES: dict[str, tuple[tuple[str, ...], int]] = {
    "validate": (("file",), EXIT_CHECK_FAILED), "compare": (("files",), EXIT_CHECK_FAILED),
    "info": (("file",), EXIT_BAD_INPUT), "diagnose": (("file",), EXIT_BAD_INPUT)}
# Datasets of a trajectory that must hold finite numbers (NaN elsewhere means "not computed").
FINITE = ("/model/embedding", "/model/positions", "/model/unembedding", "/model/theta0", "/model/basis",
          "/data/mask", "/data/weights", "/frames/time", "/frames/omega", "/frames/mass", "/frames/density")


def untrusted_paths(args: argparse.Namespace) -> list[str]:
    """The file arguments of a command of :data:`UNTRUSTED_FILES` (an argument may hold one path or a list)."""
    paths: list[str] = []
    for name in UNTRUSTED_FILES[args.command][0]:
        value = getattr(args, name)
        paths += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    return paths


def screen_files(args: argparse.Namespace) -> int:
    """For a command of :data:`UNTRUSTED_FILES`: UsageError for a path that is not a file; for a file that does not
    read back intact (:func:`pdeflow.io.untrusted.screen`, in a child process), one line on stderr and the command's
    exit code; else 0 (the command may read the files)."""
    from ..io.untrusted import screen

    _, code = UNTRUSTED_FILES[args.command]
    for path in map(Path, untrusted_paths(args)):
        if not path.exists():
            raise UsageError(f"{path}: no such file")
        if not path.is_file():
            raise UsageError(f"{path}: is not a file")
        problem = screen(path, FINITE)
        if problem:
            print(f"pdeflow: error: {path}: {_one_line(problem)}", file=sys.stderr)
            return code
    return EXIT_OK


def output_path(cfg: Config, config_path: str, explicit: str | None) -> Path:
    """``-o`` if given, else ``output.path``, else ``<config stem>.h5`` in the current directory."""
    if explicit:
        return Path(explicit)
    if cfg.output.path:
        return Path(cfg.output.path)
    return Path(Path(config_path).stem + ".h5")


def check_output_file(out: Path, config_path: str | None = None, force: bool = False,
                      resume: bool | None = None) -> Path:
    """``out`` if a command may write the file there, else UsageError: its directory is missing, it is a
    directory or the config file ``config_path``, or it exists and neither ``force`` (overwrite it) nor ``resume``
    (continue it; None: the command cannot continue a file) is set. The one check of every output file."""
    if not out.parent.exists():
        raise UsageError(f"output directory {str(out.parent)!r} does not exist")
    if out.is_dir():
        raise UsageError(f"output path {str(out)!r} is a directory")
    if config_path is not None and out.exists() and out.resolve() == Path(config_path).resolve():
        raise UsageError(f"output path {str(out)!r} is the config file")
    if out.exists() and not (force or resume):
        hint = "" if resume is None else " or --resume to continue it"
        raise UsageError(f"{str(out)!r} exists; pass --force to overwrite it{hint}")
    return out


def check_output_folder(out: Path) -> Path:
    """``out`` if a command may write files into that folder (made if missing), else UsageError: it exists and is
    not a folder, or its parent is missing."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"output {str(out)!r} exists and is not a directory")
    if not out.parent.exists():
        raise UsageError(f"output directory {str(out.parent)!r} does not exist")
    return out


def new_output_path(cfg: Config, config_path: str, explicit: str | None, force: bool) -> Path:
    """:func:`output_path` for a command that writes a new file, checked by :func:`check_output_file`."""
    return check_output_file(output_path(cfg, config_path, explicit), config_path, force=force)


def cmd_run(args: argparse.Namespace) -> int:
    from pdeflow.solvers import check_config, make_stepper
    from pdeflow.solvers.driver import run

    from ..core.problem import Problem

    comm = world()  # under mpiexec -n P: the particles are split across the P ranks; rank 0 writes and prints
    cfg = load_config(args.config, args.set)
    check_config(cfg)  # the method's rules, before any file is touched
    out = check_output_file(output_path(cfg, args.config, args.output), args.config, force=args.force,
                            resume=args.resume)
    stored = None
    if args.resume:
        if args.force:
            raise UsageError("--resume and --force exclude each other")
        stored = open_resumable(out, cfg)
        if stored.checkpoint_note and comm.is_root:   # a damaged active slot: the previous checkpoint is used
            print(f"pdeflow: warning: {stored.checkpoint_note}", file=sys.stderr)
    try:
        problem = Problem.from_config(cfg).with_comm(comm)
        stepper = make_stepper(problem, cfg)
    except MemoryError as exc:
        raise UsageError(f"the problem does not fit in memory ({_first_line(exc)}); "
                         f"reduce init.n_particles, task.n_samples or model.d") from None
    if stored is not None:
        check_same_problem(stored, problem.arrays(), out)
    on_finish = None
    if cfg.diagnostics.enabled and comm.is_root:
        try:
            from ..analysis.diagnostics import analyse_run as on_finish  # noqa: N813
        except ModuleNotFoundError as exc:
            if exc.name != "pdeflow.analysis.diagnostics":
                raise
    try:
        result = run(cfg, problem, out, resume=args.resume, overwrite=args.force, quiet=args.quiet or not comm.is_root,
                     stepper=stepper, on_finish=on_finish, exiting=args.exiting)
    except MemoryError as exc:
        if comm.size > 1:
            raise  # perhaps on this rank only: main() aborts every rank
        raise UsageError(f"the problem does not fit in memory ({_first_line(exc)}); "
                         f"reduce init.n_particles, task.n_samples or model.d") from None
    if comm.is_root and result.exit_code == EXIT_OK:
        print(f"pdeflow: {result.status}: {result.message} -> {out}")
    elif comm.is_root:
        print(f"pdeflow: {result.status}: {result.message}", file=sys.stderr)
    return result.exit_code


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [exc.__class__.__name__])[0][:120]


def cmd_config(args: argparse.Namespace) -> int:
    from pdeflow.solvers.methods import schema_text  # importing pdeflow.solvers declares every method

    print(schema_text())
    return EXIT_OK


def result_kind(path: str | Path):
    """The :class:`pdeflow.io.result_schema.ResultKind` of a result file (None: a trajectory, or not a pdeflow file)."""
    from ..io.file_access import open_for_reading, plain
    from ..io.result_schema import kind_of

    try:
        with open_for_reading(path) as f:
            return kind_of(plain(f.attrs.get("schema")))
    except (OSError, TypeError, ValueError):
        return None


def cmd_info(args: argparse.Namespace) -> int:
    from ..analysis.stationary.stationary import format_stationary, read_stationary
    from ..io.file_access import open_for_reading
    from ..io.result_schema import STATIONARY, summary

    kind = result_kind(args.file)
    if kind is STATIONARY:
        print(format_stationary(args.file, read_stationary(args.file)))
    elif kind is not None:
        with open_for_reading(args.file) as f:
            print(summary(f, kind, args.file))
    else:
        print(format_info(open_trajectory(args.file)))
    return EXIT_OK


def grid_summary(traj: Trajectory) -> str:
    """One line for ``pdeflow info``: the grid, and the total mass and minimum density of the first and
    last frames (a trajectory with ``/frames/density`` and the grid's ``/frames`` attributes)."""
    from ..core.measure import Grid

    grid = Grid.from_frame_attrs(traj.frame_attrs)
    rho = traj.frames["density"]
    box = " x ".join(f"[{lo:g}, {hi:g}]" for lo, hi in zip(grid.lower, grid.upper))
    m0, m1 = grid.total_mass(rho[0]), grid.total_mass(rho[-1])
    return (f"grid        n = {' x '.join(map(str, grid.shape))} on {box}; mass {m1:.15g} "
            f"(relative change {abs(m1 - m0) / m0:.2g} since t = 0), min density {float(np.min(rho[-1])):.3g} "
            f"(over all frames {float(np.min(rho)):.3g})")


def entropic_summary(traj: Trajectory) -> str:
    """One line for ``pdeflow info`` on a grid JKO trajectory: eps and its implied diffusion ``eps / (4 tau)``
    against the physical ``1/beta`` (with beta = inf: how far it spreads mass by the last frame, in cells)."""
    from pdeflow.core.measure import Grid
    from pdeflow.solvers.jko import grid_epsilon, jko_tau

    cfg, grid = traj.config, Grid.from_frame_attrs(traj.frame_attrs)
    eps = float(traj.frame_attrs.get("epsilon", grid_epsilon(cfg, grid.width)))
    diffusion = eps / (4.0 * jko_tau(cfg))
    beta = float(traj.model_attrs.get("beta", np.inf))
    line = (f"entropic    eps = {eps:.4g}{' (default h^2)' if cfg.solver.epsilon == 0 else ''}, "
            f"tau = {jko_tau(cfg):g}: "
            f"implied diffusion eps/(4 tau) = {diffusion:.3g}")
    if np.isfinite(beta):
        return line + f", {diffusion * beta:.3g} x the physical 1/beta = {1 / beta:.3g}"
    t = float(traj.time[-1]) if len(traj.time) else 0.0
    spread = np.sqrt(2 * diffusion * t) / float(np.min(grid.width))
    return line + f" (beta = inf: the flow has none; it spreads mass by {spread:.2g} cells by t = {t:g})"


def format_info(traj) -> str:
    """A short human summary of a trajectory file."""
    cfg, a = traj.config, traj.arrays
    V, d = a["embedding"].shape
    B, T = a["tokens"].shape
    lines = [f"file        {traj.path}",
             f"problem     task {cfg.task.name}, V={V} T={T} B={B} d={d} dh={a['head_dim']} "
             f"k={traj.model_attrs.get('k')} ({cfg.model.coordinates} coordinates), "
             f"weight decay {a['weight_decay']:g}, beta {traj.model_attrs.get('beta')}",
             f"solver      {traj.attrs.get('method')} on {traj.measure}, solver.dt = {cfg.solver.dt:g}",
             f"frames      {len(traj.time)}"
             + (f", t = {traj.time[0]:g} .. {traj.time[-1]:g}" if len(traj.time) else "")]
    if "omega" in traj.frames and len(traj.time):
        lines.append(f"particles   N = {traj.frames['omega'].shape[1]}")
    if "density" in traj.frames and len(traj.time):
        lines.append(grid_summary(traj))
        if traj.attrs.get("method") == "jko":
            lines.append(entropic_summary(traj))
    if len(traj.steps.get("time", [])):
        lines.append(f"steps       {len(traj.steps['time']) - 1}")
        lines.append(f"final       energy {traj.steps['energy'][-1]:.10g}"
                     f", dissipation {traj.steps['dissipation'][-1]:.4g}")
    from pdeflow.solvers.accuracy import file_verdict
    lines.append(f"accuracy    {file_verdict(traj)}")
    status = traj.attrs.get("status")
    if status == "running":
        lines.append("status      running, or its process died: the frames listed are those committed so far "
                     "(continue a dead run with pdeflow run --resume)")
        hint = recovery_hint(traj.path)
        if hint:
            lines.append(f"recover     {hint}")
    else:
        lines.append(f"status      {status}: {traj.attrs.get('message')}")
    if traj.checkpoint_note or traj.checkpoint_error:
        lines.append(f"checkpoint  {traj.checkpoint_note or traj.checkpoint_error}")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors reported like every other bad input: one line, exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def add_config_arguments(p: argparse.ArgumentParser, config_help: str, output_help: str,
                         optional_config: bool = False) -> None:
    """The arguments of every command that runs a config: CONFIG (may be left out with ``optional_config``: None),
    -o/--output, --set (repeatable), --force."""
    p.add_argument("config", help=config_help, **({"nargs": "?", "default": None} if optional_config else {}))
    p.add_argument("-o", "--output", help=output_help)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config key (repeatable)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pdeflow", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_CODES,
        description="Mean-field Wasserstein gradient flow of multi-head causal self-attention.")
    parser.add_argument("--version", action="version", version=f"pdeflow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser("run", help="integrate a config into an HDF5 trajectory", epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p, "TOML config file", "trajectory file (default: output.path, else <config>.h5)")
    p.add_argument("--resume", action="store_true", help="continue the run in the output file from its checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("info", help="summarize a trajectory or a result file (stationary, rates, stability, chaos)",
                       epilog=EXIT_CODES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser("config", help="print every config key with its default and meaning")
    p.set_defaults(func=cmd_config)
    for module in COMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.add_command(sub)
    return parser


def main(argv: Sequence[str] | None = None, exiting: bool = False) -> int:
    """The ``pdeflow`` command; returns the exit code. ``exiting``: the process ends right after (see
    :func:`pdeflow.solvers.driver.run`)."""
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.exiting = exiting
        if args.command in UNTRUSTED_FILES:
            code = screen_files(args)
            if code:
                return code
        return int(args.func(args) or EXIT_OK)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_BAD_INPUT)
    except (ConfigError, TrajectoryError, UsageError) as exc:
        if failed_alike(_one_line(str(exc))) and launcher_rank() == 0:  # under MPI: rank 0 reports
            print(f"pdeflow: error: {_one_line(str(exc))}", file=sys.stderr)
        if isinstance(exc, TrajectoryError) and args is not None and args.command in UNTRUSTED_FILES:
            return UNTRUSTED_FILES[args.command][1]   # a file that is not valid: a failed check for validate, compare
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("pdeflow: interrupted", file=sys.stderr)
        return EXIT_SIGINT
    except Exception as exc:
        if args is not None and args.command in UNTRUSTED_FILES and not os.environ.get(DEBUG_VARIABLE):
            # the last resort for files that passed the screen but hold values no reader expected; the same line
            # would hide a bug of pdeflow's, so it names both and how to see the traceback
            names = ", ".join(untrusted_paths(args))
            print(f"pdeflow: error: {args.command} failed on {names} ({exc.__class__.__name__}: "
                  f"{_one_line(str(exc))[:120]}): a damaged or unexpected file, or a bug of pdeflow's "
                  f"({DEBUG_VARIABLE}=1 shows the traceback)", file=sys.stderr)
            return UNTRUSTED_FILES[args.command][1]
        abort_ranks(exc)  # under MPI the other ranks may wait for this one forever: end them all
        raise


def _one_line(text: str) -> str:
    """A message as one line (a message from a library may carry newlines)."""
    return " ".join(text.split("\n")).strip()


class PipeGuard:
    """A text stream (stdout, stderr) whose reader may go away (``pdeflow stationary ... | head -2``): the first write
    or flush that meets the closed pipe points the stream's descriptor at /dev/null (as the signal module's note on
    SIGPIPE recommends: Python flushes again at exit) and everything after is dropped, so the command finishes its
    work and writes its files whole. :attr:`broken` says whether output was lost."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._lost()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._lost()

    def _lost(self) -> None:
        self.broken = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def entry() -> None:
    """The console script ``pdeflow`` (and ``python -m pdeflow``). A reader of the output that goes away
    (``pdeflow info FILE | head -3``) loses the rest of the output, never the work: the command runs to its end and
    writes its files (:class:`PipeGuard`), then exits with 141 (128 + SIGPIPE, as a killed pipe would) if it
    succeeded, else with its own code."""
    sys.stdout, sys.stderr = out, err = PipeGuard(sys.stdout), PipeGuard(sys.stderr)
    code = main(exiting=True)
    sys.stdout.flush()
    sys.exit(EXIT_PIPE if code == EXIT_OK and (out.broken or err.broken) else code)


__all__ = ["main", "build_parser", "output_path", "config_difference", "check_file", "EXIT_CODES"]
