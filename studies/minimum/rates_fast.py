"""The rates at the shipped certified minimum of data/configs/longtime.toml by the frozen engine (issue 43, target 2).

``python -m studies.minimum.rates_fast [--out DIR] [--engine frozen|products] [--krylov-dim 900] [--random 2]``

Runs :func:`pdeflow.analysis.linearised.minimum_rates.minimum_rates` as ``pdeflow stability --stationary
data/stationary/longtime-minimum-from-t0.h5 --krylov-dim 900 --random 2`` does (its defaults: eps 1e-4 and eps/2 along
the slowest direction, eps-random 1e-3, a tenth of an e-fold of the slowest mode, 21 samples), writes the rates file
``DIR/longtime-rates-fast.h5`` and ``DIR/rates_fast.json``, and prints a Markdown table: each rate against its
prediction and against the shipped rates (data/stationary/longtime-rates.h5, the products engine's), the counts
(grad Phi calls and exact products, in gradient equivalents by :func:`pdeflow.core.problem.gradient_equivalents`),
the wall time of each phase, the peak memory (``ru_maxrss``), the CPU model (``lscpu``) and the load average
(``uptime``) before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
MINIMUM = ROOT / "data" / "stationary" / "longtime-minimum-from-t0.h5"
SHIPPED = ROOT / "data" / "stationary" / "longtime-rates.h5"


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def shipped_rates() -> dict[str, tuple[float, float, float]]:
    """direction -> (energy rate, distance rate, least PL ratio in the window) of the shipped rates file."""
    with h5py.File(SHIPPED, "r") as f:
        g = f["rates"]
        names = [d.decode() if isinstance(d, bytes) else str(d) for d in g["direction"][()]]
        return {n: (float(g["energy_rate"][j]), float(g["distance_rate"][j]), float(g["pl_ratio_min"][j]))
                for j, n in enumerate(names)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("rates-fast"))
    ap.add_argument("--engine", default="frozen")
    ap.add_argument("--krylov-dim", type=int, default=900)
    ap.add_argument("--random", type=int, default=2)
    args = ap.parse_args(argv)

    from pdeflow.analysis.linearised.minimum_rates import minimum_rates, write_minimum_rates
    from pdeflow.analysis.stationary.stationary import read_stationary
    from pdeflow.core.config import loads_config
    from pdeflow.core.problem import gradient_equivalents
    from pdeflow.io.problem_file import stored_problem

    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    start = time.perf_counter()
    phases: list[tuple[float, float, str]] = []

    def say(msg: str) -> None:
        phases.append((time.perf_counter() - start, peak_mib(), msg))
        print(f"[{phases[-1][0]:7.1f} s, peak {phases[-1][1]:.0f} MiB] {msg}", flush=True)

    r = read_stationary(MINIMUM)
    problem = stored_problem(MINIMUM)
    result = minimum_rates(problem, np.asarray(r["omega"]), np.asarray(r["mass"]), eps=1e-4, eps_random=1e-3,
                           n_random=args.random, seed=0, progress=say, engine=args.engine,
                           lambda_hint=float(r["lambda_min"]), source_certificate=str(r["certificate_text"]),
                           krylov_dim=args.krylov_dim)
    wall = time.perf_counter() - start
    peak = peak_mib()
    load_after = os.getloadavg()
    counts = dict(problem.counts)
    write_minimum_rates(args.out / "longtime-rates-fast.h5", result, loads_config(r["config"]), problem,
                        source=str(MINIMUM))
    shipped = shipped_rates()
    rows = []
    for run in result.runs:
        old = shipped.get(run.direction, (np.nan,) * 3)
        measured = (run.energy_rate, run.distance_rate, run.pl_ratio_min)
        predicted = (run.predicted_energy_rate, run.predicted_distance_rate, run.predicted_pl_ratio_min)
        for q, name in enumerate(("E - E* rate", "distance rate", "least PL ratio (window)")):
            rows.append({"direction": run.direction, "eps": run.eps, "steps": run.steps, "gradients": run.gradients,
                         "quantity": name, "predicted": predicted[q], "measured": measured[q],
                         "error": measured[q] / predicted[q] - 1.0, "shipped": old[q],
                         "vs_shipped": measured[q] / old[q] - 1.0})
    record = {"engine": result.engine, "wall_s": wall, "peak_mib": peak, "cpu": cpu_model(),
              "load_before": load_before, "load_after": load_after, "counts": counts,
              "gradient_equivalents": gradient_equivalents(counts), "numba_threads": os.environ.get(
                  "NUMBA_NUM_THREADS", ""), "e_star": result.e_star, "i_star": result.i_star,
              "lambda_min": result.lambda_min, "lambda_max": result.lambda_max, "certificate": result.certificate,
              "products": result.products, "prediction_products": result.prediction_products,
              "run_gradients": result.gradients, "worst_error": result.worst_error,
              "phases": [{"t": t, "peak_mib": m, "message": s} for t, m, s in phases], "rows": rows,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (args.out / "rates_fast.json").write_text(json.dumps(record, indent=1, default=float))
    print(f"\nengine {result.engine}: {wall:.1f} s wall, peak {peak:.0f} MiB, {record['gradient_equivalents']:.0f} "
          f"gradient equivalents ({counts}), CPU {record['cpu']}, load {load_before} -> {load_after}")
    print("\n| direction | eps | steps | gradients | quantity | predicted | measured | error | shipped | vs shipped |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['direction']} | {row['eps']:g} | {row['steps']} | {row['gradients']} | {row['quantity']} | "
              f"{row['predicted']:.6g} | {row['measured']:.6g} | {row['error']:+.2e} | {row['shipped']:.6g} | "
              f"{row['vs_shipped']:+.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
