"""CPU seconds per unit of work on one thread alone against each of two threads running at once, in one process.

A record of 2026-12-02 (studies/kernels/RESULTS.md, "Where the 1 -> 2 thread speedup goes"): if the same work costs
more CPU time when two threads run at once, the second thread shares something (caches, memory, the host's
cores) rather than waiting. Units: an FMA-bound loop on 4 KiB (L1-resident), a streaming loop over 8 MiB
(L3-resident on a 32 MiB L3) and over 256 MiB (memory), and pdeflow's gradient pass on one chunk of 64 heads of
the reference problem (``mean_field.grad_phi_data``, one numba thread per Python thread). Rounds alternate
1 and 2 threads; the ratio per round is (CPU per unit on each of 2) / (CPU per unit alone).

    NUMBA_NUM_THREADS=1 python -m studies.kernels.thread_contention [ROUNDS]
"""
from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np
from pdeflow.benchmarks.common import build

from pdeflow.core import mean_field
from pdeflow.core.jit import jit


@jit()
def fma_l1(a: np.ndarray, acc: np.ndarray, reps: int) -> float:
    for _ in range(reps):
        for i in range(a.shape[0]):
            acc[i] = acc[i] * 0.999999 + a[i]
    return acc[0]


@jit()
def stream(a: np.ndarray, out: np.ndarray, reps: int) -> float:
    for _ in range(reps):
        for i in range(a.shape[0]):
            out[i & 511] += a[i]
    return out[0]


def per_unit_cpu(work, threads: int, reps: int = 2) -> float:
    cpus: list[float] = []

    def body() -> None:
        c0 = time.thread_time()
        for _ in range(reps):
            work()
        cpus.append((time.thread_time() - c0) / reps)

    ts = [threading.Thread(target=body) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return statistics.mean(cpus)


def main(rounds: int) -> None:
    problem, omega, mass = build()
    G = problem.residual_features(omega, mass)
    theta = omega[:64].copy()
    small, l3, mem = np.random.rand(512), np.random.rand(2**20), np.random.rand(2**25)
    works = {"fma_l1_4KiB": lambda: fma_l1(small, np.zeros(512), 400_000),
             "stream_8MiB": lambda: stream(l3, np.zeros(512), 60),
             "stream_256MiB": lambda: stream(mem, np.zeros(512), 2),
             "gradient_pass_64_heads": lambda: mean_field.grad_phi_data(theta, G, problem._data)}
    for work in works.values():
        work()
    out: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for name, work in works.items():
            for threads in (1, 2):
                out.setdefault((name, threads), []).append(per_unit_cpu(work, threads))
    print("load average", open("/proc/loadavg").read().split()[:3])
    for name in works:
        one, two = out[(name, 1)], out[(name, 2)]
        ratios = [b / a for a, b in zip(one, two)]
        print(f"{name}: CPU s per unit alone {statistics.median(one):.4f}, on each of 2 at once "
              f"{statistics.median(two):.4f}; ratio per round: median {statistics.median(ratios):.3f} "
              f"(quartiles {np.percentile(ratios, 25):.3f}-{np.percentile(ratios, 75):.3f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
