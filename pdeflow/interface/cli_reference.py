"""``pdeflow compare A.h5 B.h5`` and ``pdeflow validate FILE``: pdeflow as a reference for other codes."""
from __future__ import annotations

import argparse

from ..core.exit_codes import EXIT_CHECK_FAILED, EXIT_OK
from ..io.recovery import recovery_hint
from ..io.reference import compare, validate


def cmd_compare(args: argparse.Namespace) -> int:
    result = compare(args.a, args.b, rtol=args.rtol, atol=args.atol, allow_partial=args.allow_partial)
    print(result.table())
    return EXIT_OK if result.ok else EXIT_CHECK_FAILED


def cmd_validate(args: argparse.Namespace) -> int:
    problems = validate(args.file)
    for line in problems:
        print(f"{args.file}: {line}")
    if not problems:
        print(f"{args.file}: valid pdeflow trajectory (schema version 1)")
    hint = recovery_hint(args.file)
    if hint:
        print(hint)
    return EXIT_OK if not problems else EXIT_CHECK_FAILED


def _positive(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare",
                       help="compare a trajectory with a reference trajectory (exit 0 within tolerance, 1 otherwise)")
    p.add_argument("a", help="trajectory to check")
    p.add_argument("b", help="reference trajectory")
    p.add_argument("--rtol", type=_positive, default=1e-6, help="relative tolerance (default 1e-6)")
    p.add_argument("--atol", type=_positive, default=1e-10, help="absolute tolerance (default 1e-10)")
    p.add_argument("--allow-partial", action="store_true",
                   help="compare only the time span both files cover (by default a candidate covering less of the "
                        "reference's span fails); the table states the matched fraction either way")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("validate", help="check a file written by any code against schema version 1 (exit 0 or 1)")
    p.add_argument("file")
    p.set_defaults(func=cmd_validate)
