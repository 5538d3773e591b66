"""``python -m pdeflow.benchmarks.allocator_cost [--plans P] [--repeats R]``: what glibc's default thresholds cost
pdeflow (:mod:`pdeflow.core.allocator`).

Runs the same loop - ``P`` semi-relaxed plans of wfr_jko on a 24 x 24 grid (576 x 576 temporaries, as in the grid2d
runs), then ``P`` assemblies of a 2,000 x 2,000 symmetric matrix from a [4,000, 2,000] factor - in child processes
with ``PDEFLOW_ALLOCATOR=default`` (glibc's own thresholds) and without it (pdeflow's), ``R`` times each in alternation,
and prints per loop the median wall seconds, the system seconds and the minor page faults (a count that does not
depend on the machine's load) of each, and their ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import json, resource, sys, time
import numpy as np
from pdeflow.core import allocator
from pdeflow.solvers.unbalanced_jko import hk_cost, semi_relaxed_plan
plans = int(sys.argv[1])
rng = np.random.default_rng(0)
g = np.linspace(-3.0, 3.0, 24)
points = np.stack([a.ravel() for a in np.meshgrid(g, g)], axis=1)
cost, a = hk_cost(points, 1.0), rng.random(576) + 0.1
W = rng.standard_normal((4000, 2000))
out = {"allocator": allocator.state}
for name, work in (("wfr_jko plan", lambda: semi_relaxed_plan(a, cost + 0.01 * rng.random(576)[None, :], 1e-3)),
                   ("assembly", lambda: W.T @ W + np.diag(rng.random(2000)))):
    work()
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(plans):
        work()
    after = resource.getrusage(resource.RUSAGE_SELF)
    out[name] = {"seconds": time.perf_counter() - start, "system": after.ru_stime - before.ru_stime,
                 "minor_faults": after.ru_minflt - before.ru_minflt}
print(json.dumps(out))
"""


def child(plans: int, default: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PDEFLOW_ALLOCATOR"}
    if default:
        env["PDEFLOW_ALLOCATOR"] = "default"
    proc = subprocess.run([sys.executable, "-c", CHILD, str(plans)], env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plans", type=int, default=200, help="iterations of each loop per process")
    parser.add_argument("--repeats", type=int, default=3, help="processes per setting, in alternation")
    args = parser.parse_args(argv)
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.repeats):
        for default in (True, False):
            runs[default].append(child(args.plans, default))
    print(f"pdeflow's thresholds: {runs[False][0]['allocator']}; {args.plans} iterations a loop, "
          f"median of {args.repeats} processes each")
    for name in ("wfr_jko plan", "assembly"):
        row = {}
        for default in (True, False):
            row[default] = {key: statistics.median(r[name][key] for r in runs[default])
                            for key in ("seconds", "system", "minor_faults")}
        glibc, ours = row[True], row[False]
        print(f"{name}: glibc's {1e3 * glibc['seconds'] / args.plans:.2f} ms (system {glibc['system']:.2f} s, "
              f"{glibc['minor_faults']:.0f} page faults), pdeflow's {1e3 * ours['seconds'] / args.plans:.2f} ms "
              f"(system {ours['system']:.2f} s, {ours['minor_faults']:.0f} page faults): "
              f"{glibc['seconds'] / ours['seconds']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
