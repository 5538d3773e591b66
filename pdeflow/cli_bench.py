"""``pdeflow bench [CONFIG]``: the benchmark suite (:mod:`pdeflow.benchmarks`) on the reference problem or a user's own.

Writes ``bench-<preset>-<time>.json`` and ``.md`` into ``--out`` (new, time-stamped names: nothing is
overwritten) and prints the table. The full preset takes several minutes on two cores; ``--preset quick``
about one.

The record says what the numbers were measured on (issue 18): the CPU model and cache sizes, the LLVM CPU
name and feature string the kernels were compiled for and who chose them (:mod:`pdeflow.jit`), the vector
width of their loops (read from their machine code, :mod:`pdeflow.benchmarks.codegen`) and the tiles with their
scratch sizes; it prints the rate of the logits pass, of the gradient pass and of the whole-system
Jacobian-vector product, and marks every missed target **MISSED**.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cli import check_output_folder
from .config import load_config
from .exit_codes import EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    from pdeflow.benchmarks.common import REFERENCE_CONFIG
    from pdeflow.benchmarks.suite import markdown, run, write

    config = Path(args.config) if args.config else REFERENCE_CONFIG
    load_config(config)  # a bad config is one line and exit 2 before anything is measured
    out = check_output_folder(Path(args.out))
    res = run(args.preset, config, log=lambda s: print(s, file=sys.stderr, flush=True))
    js, md = write(res, out)
    print(markdown(res))
    print(f"results: {js} and {md}")
    return EXIT_OK


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time grad Phi against BLAS, PyTorch and numpy; record CPU, compile target, "
                                              "vector width and tiles; flag missed targets (JSON + markdown)")
    p.add_argument("config", nargs="?", help="problem config (default: benchmarks/bench-reference.toml)")
    p.add_argument("--preset", choices=("full", "quick", "tiny"), default="quick",
                   help="sizes and repeats (default quick; full: the reference sizes of benchmarks/RESULTS.md)")
    p.add_argument("--out", default="pdeflow-bench", help="directory of the results (default ./pdeflow-bench)")
    p.set_defaults(func=cmd_bench)
