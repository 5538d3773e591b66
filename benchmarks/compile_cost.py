"""``python -m pdeflow.benchmarks.compile_cost [--repeats R]``: what a fresh install's first evaluations cost in
numba compilation, on one thread and on two, and what a split of one item over two threads costs per kernel call.

Each child process starts with an empty numba cache (``NUMBA_CACHE_DIR`` a new folder) and ``NUMBA_NUM_THREADS``
1 or 2, and times the first call of each evaluation of a small problem (the benchmark's reference problem, 4 heads):
float64 energy, velocity, Hessian-vector product and whole-system JVP, the complex step, then float32 energy,
velocity and JVP - every kernel signature pdeflow compiles. Runs ``R`` pairs in alternation and prints the median
seconds per thread count and their ratio (two threads over one: 1.0 when the thread count compiles nothing of its
own, :func:`pdeflow.core.jit.jit`), then the median wall of a hand-over of one item's work units to the second
thread (:func:`pdeflow.core.workers.for_each_range` with work that does nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = """
import json, sys, time
start = time.perf_counter()
from pdeflow.benchmarks.common import build
problem, omega, mass = build(n=4)
q = problem.in_precision("float32")
steps = [("float64 energy", lambda: problem.energy(omega, mass)),
         ("float64 velocity", lambda: problem.velocity(omega, mass)),
         ("float64 hvp", lambda: problem.hvp(omega[0], omega[1], omega, mass)),
         ("float64 jvp", lambda: problem.system_jvp(omega, mass, omega)),
         ("complex step", lambda: problem.system_jvp_complex_step(omega, mass, omega)),
         ("float32 energy", lambda: q.energy(omega, mass)),
         ("float32 velocity", lambda: q.velocity(omega, mass)),
         ("float32 jvp", lambda: q.system_jvp(omega, mass, omega))]
out = {}
for name, step in steps:
    t = time.perf_counter()
    step()
    out[name] = time.perf_counter() - t
out["total"] = time.perf_counter() - start
print(json.dumps(out))
"""


def cold_child(threads: int) -> dict[str, float]:
    """The first evaluations' seconds in a process with an empty numba cache and ``threads`` threads."""
    with tempfile.TemporaryDirectory(prefix="pdeflow-compile-") as cache:
        env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "PDEFLOW_TUNE")}
        env.update(NUMBA_CACHE_DIR=cache, NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                   PDEFLOW_TUNE="off")
        proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def hand_over_seconds(calls: int = 20000) -> float:
    """Wall seconds of one ``for_each_range(2, 2, nothing)``: the hand-over to the second thread and its join."""
    from pdeflow.core.workers import for_each_range

    def nothing(lo: int, hi: int) -> None:
        return None

    for_each_range(2, 2, nothing)
    start = time.perf_counter()
    for _ in range(calls):
        for_each_range(2, 2, nothing)
    return (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="pairs of cold processes, in alternation")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print(f"compile_cost: --repeats must be at least 1, got {args.repeats}", file=sys.stderr)
        return 2
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for threads in (1, 2):
            runs[threads].append(cold_child(threads))
    print(f"first evaluations with an empty numba cache, median of {args.repeats} process(es) each:")
    for name in runs[1][0]:
        one, two = (statistics.median(r[name] for r in runs[t]) for t in (1, 2))
        print(f"  {name:17s} one thread {one:6.1f} s, two threads {two:6.1f} s: {two / one:.2f}x")
    hand_over = statistics.median(hand_over_seconds() for _ in range(5))
    print(f"one item's work units handed to a second thread and joined: {1e6 * hand_over:.1f} us a kernel call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
