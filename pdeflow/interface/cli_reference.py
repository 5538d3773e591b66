"""``pdeflow compare A.h5 B.h5``, ``pdeflow compare --order A1.h5 A2.h5 ... REF.h5 --expect P`` and
``pdeflow validate FILE``: pdeflow as a reference for other codes."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core.exit_codes import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, HELP
from ..io.file_access import TrajectoryError
from ..io.recovery import recovery_hint
from ..io.reference import compare, validate
from .cli import UsageError, check_output_file, result_kind

COMPARE_HELP = """Compare a candidate trajectory A with a reference trajectory B (any code's files of schema version 1).

What is checked: both files hold the same problem (/model, /data and the dynamics); A's frames cover B's time
span (else FAIL, unless --allow-partial); every frame of B in the common span has a frame of A at the same time
(|t_a - t_b| <= 1e-9 max(1, |t_b|)); at each such time
  energy, dissipation       |a - b| <= atol + rtol |b|      (recomputed from the stored problem when absent)
  logits                    max|z_a - z_b| <= atol + rtol max|z_b|   over the stored data set [B, T, V]
  W2 between the measures   W2 <= atol + rtol * radius,  radius = (int |omega|^2 d rho_b)^(1/2)
                            (exact W2 by POT up to 2000 particles, else sliced W2)
  L1 between densities      L1 <= atol + rtol             (two grid files on the same grid)
The table lists every row; the last line is PASS or FAIL with the count within tolerance.

--order A1.h5 A2.h5 ... REF.h5 --expect P: the convergence order of a family of a candidate code's runs at
decreasing step sizes (read from each file's /steps/time rows: the largest step, or the mean with --step mean).
Per quantity (energy, dissipation, logits, W2) the largest error against REF over its frames, the observed
order from successive ratios log(e_i/e_i+1)/log(h_i/h_i+1), a least-squares slope with its standard error, a
table and, with --figure, a log-log figure. A quantity passes when the observed order of the finest pair is
within --order-tol of P. REF must be at least 10x more accurate than the finest run in every quantity: its
error is estimated by comparing it with a tighter pdeflow run of REF's stored config (rtol, atol / 10 and
steps at most half REF's largest, or dt / 2 for a fixed explicit step; other methods need --tighter FILE), or
with --tighter FILE; otherwise the family is refused (exit 2).

exit codes of compare: 0 pass; 1 a check failed, or a file is not a valid pdeflow trajectory (missing or wrong-shaped
dataset, damaged data, checksum failure); 2 bad input: a path that does not exist, bad options, or a family
whose order cannot be judged (the reason in one line on stderr)."""


VALIDATE_HELP = """Check a file against its table in docs/schema.md: a trajectory of schema version 1 (written by any
code) or a result file of pdeflow's analysis commands (stationary, stability, stability --stationary,
chaos).

What is checked:
  1. every stored byte reads back (in a child process, with a time limit): each chunk of /frames and /steps
     passes its Fletcher-32 checksum, no object is unreadable or declares more than half this machine's memory,
     and /model, /data and the frames' time, omega, mass and density hold finite numbers;
  2. every group, dataset and attribute the table requires is present, with its rank, type and shape (the sizes
     V, d, T, B, N, k, ... bound by the file itself; /frames and /steps hold at least their committed rows);
  3. for a trajectory, the rules on values: tokens and targets in [0, V), at least one 1 in every mask row,
     weights >= 0 summing to 1 within 1e-9 (|sum - 1| <= 1e-9), frame times non-decreasing;
  4. for a trajectory up to 64 MiB (any size with --recompute; none with --no-recompute), the stored numbers:
     copies equal bit for bit (a frame's energy in /frames, /steps and /analysis), relations between them
     (/steps/dt, every step's identity defect, checkpoint SHA-256s, end-of-run attributes, the config), and each
     frame's energy, dissipation and risk recomputed from its fields by the run's stepper within 4096 eps
     relative; what cannot be checked is listed as "unchecked:" with the reason (docs/schema.md, "Checking the
     stored numbers").
Every departure is one line naming the dataset and the frame or row. Exit 0: valid; 1: the file was read and a
check failed (also a damaged file or one that is not a pdeflow file); 2: bad input (no such file)."""


def _existing(paths: list[str]) -> None:
    for path in paths:
        if not Path(path).is_file():
            raise UsageError(f"no such file: {path}")


def _read_failure(exc: BaseException) -> int:
    """A file that was read but is no valid trajectory: one line, the check's exit code."""
    print(f"FAIL: {' '.join(str(exc).split())[:300]}")
    return EXIT_CHECK_FAILED


ORDER_OPTIONS = ("expect", "tighter", "figure")


def cmd_compare(args: argparse.Namespace) -> int:
    _existing(args.files)
    if args.order and (args.allow_partial or args.rtol is not None or args.atol is not None):
        raise UsageError("--rtol, --atol and --allow-partial do not apply to --order (it measures errors, every "
                         "reference frame is needed)")
    given = [f"--{name}" for name in ORDER_OPTIONS if getattr(args, name) is not None]
    if not args.order and given:
        raise UsageError(f"{', '.join(given)} only apply with --order")
    if args.order:
        return _compare_order(args)
    if len(args.files) != 2:
        raise UsageError(f"compare takes two files, the candidate and the reference, got {len(args.files)} "
                         f"(an order check: --order A1.h5 A2.h5 ... REF.h5 --expect P)")
    # the tolerances given; compare's own defaults otherwise
    tolerances = {k: v for k, v in (("rtol", args.rtol), ("atol", args.atol)) if v is not None}
    try:
        result = compare(*args.files, allow_partial=args.allow_partial, **tolerances)
    except (TrajectoryError, OSError, RuntimeError) as exc:   # h5py reports damaged files as OSError/RuntimeError
        return _read_failure(exc)
    print(result.table())
    return EXIT_OK if result.ok else EXIT_CHECK_FAILED


def _compare_order(args: argparse.Namespace) -> int:
    from ..analysis.comparison.convergence_order import OrderRefused, order_study, plot_order

    if args.expect is None:
        raise UsageError("--order needs --expect P, the order the candidate's method should have")
    if args.tighter is not None:
        _existing([args.tighter])
    figure = check_output_file(Path(args.figure), force=args.force) if args.figure else None
    try:
        study = order_study(args.files[:-1], args.files[-1], args.expect, tol=args.order_tol, step=args.step,
                            tighter=args.tighter)
    except OrderRefused as exc:
        print(f"pdeflow: compare --order: refused: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (TrajectoryError, OSError, RuntimeError) as exc:
        return _read_failure(exc)
    print(study.table())
    if figure is not None:
        plot_order(figure, study)
        print(f"figure -> {figure}")
    return EXIT_OK if study.ok else EXIT_CHECK_FAILED


def cmd_validate(args: argparse.Namespace) -> int:
    """``pdeflow validate``: a result file checked against its table (:mod:`pdeflow.io.result_schema`), anything
    else as a trajectory of schema version 1 (:func:`pdeflow.io.reference.validate`)."""
    kind = result_kind(args.file)
    if kind is not None:
        from ..io.file_access import open_for_reading
        from ..io.result_schema import check_result

        with open_for_reading(args.file) as f:
            problems = check_result(f, kind)
        for line in problems:
            print(f"{args.file}: {line}")
        if not problems:
            print(f"{args.file}: valid {kind.schema} file (schema version {kind.version}: {kind.title})")
        return EXIT_CHECK_FAILED if problems else EXIT_OK
    problems = validate(args.file)
    if not problems:
        problems = _recheck(args)
    for line in problems:
        print(f"{args.file}: {line}")
    if not problems:
        print(f"{args.file}: valid pdeflow trajectory (schema version 1)")
    hint = recovery_hint(args.file)
    if hint:
        print(hint)
    return EXIT_OK if not problems else EXIT_CHECK_FAILED


def _recheck(args: argparse.Namespace) -> list[str]:
    """The stored numbers recomputed (:func:`pdeflow.interface.recompute.recheck`) when ``--recompute`` or, without
    ``--no-recompute``, when the file is at most :data:`~pdeflow.interface.recompute.RECOMPUTE_MAX_BYTES`; prints
    what was checked and what was not; returns the disagreements."""
    from .recompute import RECOMPUTE_MAX_BYTES, recheck

    size = Path(args.file).stat().st_size
    if args.recompute is False or (args.recompute is None and size > RECOMPUTE_MAX_BYTES):
        why = "--no-recompute" if args.recompute is False else \
            f"the file has {size / 2**20:.0f} MiB, more than {RECOMPUTE_MAX_BYTES >> 20} MiB: --recompute checks them"
        print(f"{args.file}: unchecked: the stored numbers were not recomputed ({why})")
        return []
    found = recheck(args.file)
    for line in found.checked:
        print(f"{args.file}: checked: {line}")
    for line in found.unchecked_lines():
        print(f"{args.file}: {line}")
    return found.problems


def _positive(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="compare a trajectory with a reference (--order: the convergence order of a "
                       "family of runs)", description=COMPARE_HELP, epilog=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="A.h5 B.h5: the candidate, then the reference; with --order: the runs, then the reference")
    p.add_argument("--rtol", type=_positive, help="relative tolerance (default 1e-6)")
    p.add_argument("--atol", type=_positive, help="absolute tolerance (default 1e-10)")
    p.add_argument("--allow-partial", action="store_true",
                   help="compare only the time span both files cover (by default a candidate covering less of the "
                        "reference's span fails); the table states the matched fraction either way")
    p.add_argument("--order", action="store_true", help="the convergence order of the runs against the last file")
    p.add_argument("--expect", type=_positive, metavar="P", help="--order: the expected order")
    p.add_argument("--order-tol", type=_positive, default=0.2,
                   help="--order: |observed order - P| allowed (default 0.2)")
    p.add_argument("--step", choices=("max", "mean"), default="max",
                   help="--order: each run's step size h, the largest or the mean of its steps (default max)")
    p.add_argument("--tighter", metavar="FILE",
                   help="--order: a tighter run of the reference's problem to check the reference against "
                        "(default: pdeflow reruns the reference's config tighter)")
    p.add_argument("--figure", metavar="PNG", help="--order: write the log-log figure there")
    p.add_argument("--force", action="store_true", help="overwrite an existing --figure file")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("validate", help="check a file written by any code against schema version 1 (exit 0 or 1)",
                       description=VALIDATE_HELP, epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--recompute", dest="recompute", action="store_true", default=None,
                       help="recompute the stored numbers whatever the file's size (default: files up to "
                            "64 MiB)")
    group.add_argument("--no-recompute", dest="recompute", action="store_false",
                       help="check the schema and the stored bytes only")
    p.set_defaults(func=cmd_validate)
