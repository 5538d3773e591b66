"""A certified local minimum of data/configs/longtime.toml from t = 0 by the structured route, through the commands.

``python -m studies.minimum.fast_minimum [--threads 2 1] [--t-start 1] [--shipped] [--out DIR]``:

For each NUMBA_NUM_THREADS value of ``--threads`` (a child process each, so the thread count is fixed before numba
starts):

1. **flow**: ``pdeflow run data/configs/longtime.toml --set run.t_end=T --set run.wall_time_limit=1e9``: the shipped
   rkc run from t = 0 to the fixed time ``T = --t-start`` (default 1: the end of the fast transient, where I has
   fallen from I(0) to 0.028 I(0) for 217 gradient equivalents and then stays near 0.017 I(0) for t = 1..4,
   studies/minimum/FAST_MINIMUM.md): the start frame is fixed by the problem, not by a wall-time limit;
2. **search + certification**: ``pdeflow stationary FLOW --kind minimum`` (the default route, structured: L-BFGS,
   a Newton-PCG endgame preconditioned by the per-head blocks of S, the Cholesky certificate of S assembled from
   its structure), read back from its result file: counts in gradient equivalents
   (:func:`pdeflow.core.problem.gradient_equivalents`, a JVP or an assembly pass at
   :data:`pdeflow.core.problem.JVP_COST`), wall seconds, the child's peak memory.

Then E* of the thread counts compared (the same minimum: E* to 1e-12), and with ``--shipped`` both routes started at
the shipped minimum (data/stationary/longtime-minimum-from-t0.h5): each stays there (E to 1e-12), the structured
route certifying it by Cholesky. Writes ``fast_minimum.json`` into DIR (default benchmarks/results) with the CPU
model (lscpu) and the load average before and after each step.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LONGTIME = ROOT / "data" / "configs" / "longtime.toml"
SHIPPED = ROOT / "data" / "stationary" / "longtime-minimum-from-t0.h5"
T_START = 1.0


def _child(argv: list[str], threads: int, log, transcript: Path) -> tuple[float, float]:
    """Run ``python -m pdeflow ARGV`` (``pdeflow ARGV``) with NUMBA_NUM_THREADS = ``threads``, its output into
    ``transcript`` as it comes; its wall seconds and peak resident memory in MB (RUSAGE_CHILDREN after it: the
    largest child so far)."""
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    with transcript.open("w") as sink:
        proc = subprocess.run([sys.executable, "-m", "pdeflow", *argv], env=env, cwd=ROOT, stdout=sink,
                              stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    lines = transcript.read_text().splitlines()
    for line in lines[-14:]:
        log(f"  {line}")
    if proc.returncode != 0:
        raise RuntimeError(f"pdeflow {' '.join(argv)} failed ({proc.returncode}): {lines[-1:] or ''}")
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def result_summary(path: Path) -> dict[str, Any]:
    """The counts and the verdict of a ``pdeflow stationary`` result file."""
    from pdeflow.analysis.stationary.stationary import read_stationary
    from pdeflow.core.problem import gradient_equivalents

    r = read_stationary(path)
    return {"verdict": r["verdict"], "certified": bool(r["certified"]), "energy": float(r["energy"]),
            "dissipation": float(r["dissipation"]), "ratio": float(r["dissipation"] / r["initial_dissipation"]),
            "route": r.get("route"), "start_rule": r.get("start_rule"), "certificate": r["certificate_text"],
            "lambda_min_lower": float(r["lambda_min_lower"]), "lambda_min_upper": float(r["lambda_min_upper"]),
            "lambda_max": float(r["lambda_max"]), "live_heads": int((abs(r["omega"]).sum(axis=1) > 0).sum()),
            "iterations": int(r["iterations"]), "gradients": int(r["gradients"]), "products": int(r["products"]),
            "certify_products": int(r["certify_products"]),
            "search_equivalents": gradient_equivalents({"gradient": r["gradients"], "jvp_exact": r["products"]}),
            "certify_equivalents": gradient_equivalents({"jvp_exact": r["certify_products"]}),
            "wall": float(r["wall"]), "certify_wall": float(r["certify_wall"]), "message": r["message"]}


def flow_summary(path: Path) -> dict[str, Any]:
    """Status, reach and cost of the flow's trajectory."""
    from pdeflow.analysis.convergence.spectral import run_gradient_equivalents
    from pdeflow.io.trajectory import open_trajectory

    traj = open_trajectory(path)
    return {"status": str(traj.attrs.get("status")), "t": float(traj.time[-1]),
            "energy": float(traj.frames["energy"][-1]), "dissipation": float(traj.frames["dissipation"][-1]),
            "initial_dissipation": float(traj.frames["dissipation"][0]),
            "equivalents": run_gradient_equivalents(traj.steps), "wall_in_file": float(traj.frames["wall_time"][-1])}


def one_route(threads: int, t_start: float, out: Path, log) -> dict[str, Any]:
    """Steps 1 and 2 of the module docstring with ``threads`` numba threads."""
    flow, point = out / f"flow-t{threads}.h5", out / f"minimum-t{threads}.h5"
    res: dict[str, Any] = {"threads": threads, "load_before": list(os.getloadavg())}
    log(f"threads {threads}: flow to t = {t_start:g}")
    wall, _ = _child(["run", str(LONGTIME), "-o", str(flow), "--force", "--quiet", "--set",
                      f"run.t_end={t_start!r}", "--set", "run.wall_time_limit=1e9"], threads, log,
                     out / f"flow-t{threads}.log")
    res["flow"] = flow_summary(flow) | {"wall": wall}
    log(f"threads {threads}: pdeflow stationary --kind minimum")
    wall, peak = _child(["stationary", str(flow), "--kind", "minimum", "-o", str(point), "--force"], threads, log,
                        out / f"minimum-t{threads}.log")
    res["minimum"] = result_summary(point) | {"process_wall": wall, "peak_mb": peak}
    res["total_wall"] = res["flow"]["wall"] + wall
    res["total_equivalents"] = (res["flow"]["equivalents"] + res["minimum"]["search_equivalents"]
                                + res["minimum"]["certify_equivalents"])
    res["load_after"] = list(os.getloadavg())
    return res


def shipped_check(threads: int, out: Path, log) -> dict[str, Any]:
    """Both routes from the shipped minimum: where each ends (E, verdict, counts)."""
    res: dict[str, Any] = {"load_before": list(os.getloadavg())}
    for route in ("structured", "lbfgs"):
        path = out / f"shipped-{route}.h5"
        log(f"shipped minimum: pdeflow stationary --route {route}")
        wall, _ = _child(["stationary", str(SHIPPED), "--kind", "minimum", "--route", route, "-o", str(path),
                          "--force"], threads, log, out / f"shipped-{route}.log")
        res[route] = result_summary(path) | {"process_wall": wall}
    from pdeflow.analysis.stationary.stationary import read_stationary

    res["shipped_energy"] = float(read_stationary(SHIPPED)["energy"])
    res["load_after"] = list(os.getloadavg())
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.minimum.fast_minimum", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="NUMBA_NUM_THREADS of each run (2 1)")
    p.add_argument("--t-start", type=float, default=T_START, help=f"the flow's end time (default {T_START:g})")
    p.add_argument("--shipped", action="store_true", help="also start both routes at the shipped minimum")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from pdeflow.benchmarks.common import machine

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    res: dict[str, Any] = {"config": LONGTIME.name, "t_start": args.t_start, "machine": machine(), "runs": []}
    target = out / "fast_minimum.json"
    for threads in args.threads:
        res["runs"].append(one_route(threads, args.t_start, out, log))
        target.write_text(json.dumps(res, indent=2, default=float) + "\n")
    energies = [r["minimum"]["energy"] for r in res["runs"]]
    res["energy_spread"] = max(energies) - min(energies)
    if args.shipped:
        res["shipped"] = shipped_check(args.threads[0], out, log)
    target.write_text(json.dumps(res, indent=2, default=float) + "\n")
    for r in res["runs"]:
        m = r["minimum"]
        print(f"threads {r['threads']}: {m['verdict']}, E* = {m['energy']!r}, total {r['total_wall']:.1f} s, "
              f"{r['total_equivalents']:.0f} gradient equivalents (flow {r['flow']['equivalents']:.0f}, search "
              f"{m['search_equivalents']:.0f}, certification {m['certify_equivalents']:.0f}), "
              f"peak {m['peak_mb']:.0f} MB")
    print(f"E* spread over thread counts: {res['energy_spread']:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
