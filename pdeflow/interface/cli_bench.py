"""``pdeflow bench [CONFIG]``: the benchmark suite (:mod:`pdeflow.benchmarks`) on the reference problem or a user's own.

Writes ``bench-<preset>-<time>.json`` and ``.md`` into ``--out`` (new, time-stamped names: nothing is
overwritten) and prints the table. The full preset takes several minutes on two cores; ``--preset quick``
about one.

The record says what the numbers were measured on (issue 18): the CPU model and cache sizes, the LLVM CPU
name and feature string the kernels were compiled for and who chose them (:mod:`pdeflow.core.jit`), the vector
width of their loops (read from their machine code, :mod:`pdeflow.benchmarks.codegen`) and the tiles with their
scratch sizes; it prints the rate of the logits pass, of the gradient pass and of the whole-system
Jacobian-vector product, and marks every missed target **MISSED**.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core.config import load_config
from ..core.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from .cli import UsageError, check_output_folder


def _check_variant() -> None:
    """A malformed PDEFLOW_VARIANT is one line and exit 2 before anything is measured."""
    import os

    from pdeflow.core import tuner

    try:
        tuner.parse(os.environ.get("PDEFLOW_VARIANT", ""))
    except ValueError as exc:
        msg = str(exc)
        raise UsageError(msg if msg.startswith("PDEFLOW_VARIANT") else f"PDEFLOW_VARIANT: {msg}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    from pdeflow.benchmarks.common import REFERENCE_CONFIG
    from pdeflow.benchmarks.suite import markdown, run, write

    config = Path(args.config) if args.config else REFERENCE_CONFIG
    load_config(config)  # a bad config is one line and exit 2 before anything is measured
    _check_variant()
    out = check_output_folder(Path(args.out))
    res = run(args.preset, config, log=lambda s: print(s, file=sys.stderr, flush=True))
    js, md = write(res, out)
    print(markdown(res))
    print(f"results: {js} and {md}")
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    """Measure the kernel variants (pdeflow.core.tuner) on the problem and remember the fastest for this CPU."""
    import os

    from pdeflow.benchmarks.common import REFERENCE_CONFIG, build
    from pdeflow.benchmarks.tuning import tune_problem, tune_width
    from pdeflow.core import tuner

    config = Path(args.config) if args.config else REFERENCE_CONFIG
    load_config(config)
    _check_variant()
    if os.environ.get("PDEFLOW_VARIANT"):
        print("PDEFLOW_VARIANT is set: it overrides any plan; unset it to measure", file=sys.stderr)
        return EXIT_BAD_INPUT
    if tuner.tuning_off():
        print("PDEFLOW_TUNE=off: plans are ignored; unset it to measure", file=sys.stderr)
        return EXIT_BAD_INPUT
    for precision in args.precision or ["float64"]:
        problem, omega, mass = build(config, n=args.n, b=args.b, t=args.t, precision=precision)
        rec = tune_problem(problem, omega, mass, args.repeats)
        print(f"{precision} [{rec['in_use']['shape_class']}]: {rec['variant']} - {rec['why']}")
        for label, sec in rec["seconds"].items():
            print(f"  {label}: {sec:.4f} s")
    if args.width:
        w = tune_width(config, n=args.n, b=args.b, t=args.t, repeats=args.repeats)
        print(f"vector width: {w['bits']} bit - {w['why']} (used from the next process on)")
    print(f"plans: {tuner.cache_dir() / tuner.PLAN_FILE} ({tuner.machine_key()})")
    return EXIT_OK


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time grad Phi against BLAS, PyTorch and numpy; record CPU, compile target, "
                                              "vector width and tiles; flag missed targets (JSON + markdown)")
    p.add_argument("config", nargs="?", help="problem config (default: benchmarks/bench-reference.toml)")
    p.add_argument("--preset", choices=("full", "quick", "tiny"), default="quick",
                   help="sizes and repeats (default quick; full: the reference sizes of studies/kernels/RESULTS.md)")
    p.add_argument("--out", default="pdeflow-bench", help="directory of the results (default ./pdeflow-bench)")
    p.set_defaults(func=cmd_bench)
    t = sub.add_parser("tune", help="measure the kernel variants (tile, chunks, vector width) on this CPU for a "
                                    "problem's shape and remember the fastest (pdeflow.core.tuner)")
    t.add_argument("config", nargs="?", help="problem config (default: benchmarks/bench-reference.toml)")
    t.add_argument("--n", type=int, help="particles (default: the config's)")
    t.add_argument("--b", type=int, help="sequences (default: the config's)")
    t.add_argument("--t", type=int, help="sequence length (default: the config's)")
    t.add_argument("--precision", action="append", choices=("float64", "float32"), help="default float64")
    t.add_argument("--repeats", type=int, default=3, help="interleaved rounds per variant (default 3)")
    t.add_argument("--width", action="store_true",
                   help="also time 512- against 256-bit vectors in fresh processes (compiles both once)")
    t.set_defaults(func=cmd_tune)
