"""``python -m pdeflow.benchmarks.mpi_scaling [--quick] [--out DIR]``: heads sharded across MPI ranks - strong scaling
1 -> 2 ranks on this machine, and a model of the communication per evaluation for P ranks on a cluster.

Measured: one ``Problem.evaluate`` on 1 and 2 ranks (and 1 rank with 2 threads), the ``Allreduce`` of ``O``
[B, T, d], and this machine's ``alpha``, ``beta`` from an Allreduce sweep. Modelled (alpha-beta, MPICH's
algorithms): per evaluation one Allreduce of ``8 B T d`` bytes plus the compute ``t_rep + (N / P) B T t_token``,
per step ``SCALAR_COLLECTIVES`` scalar collectives, per frame the gather of the particles. Results:
``mpi_scaling-<time>.json`` and ``.md`` in ``--out`` (default ``benchmarks/results``).
Details: docs/benchmarks.md, "Strong scaling across MPI ranks".
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pdeflow.core.exit_codes import EXIT_OK
from pdeflow.core.parallel import child_environment, find_mpiexec

from .common import REFERENCE_CONFIG, RESULTS, build, summary

# The test suite's tiny problem (V = 3, T = 3, d = 7, dh = 2, k = 56) with N = 64: fixed costs dominate.
TINY_TOML = """[task]
name = "markov"
vocab_size = 3
seq_len = 3
exact = true
concentration = 0.7

[model]
d = 7
head_dim = 2
weight_decay = 0.05

[init]
n_particles = 64
"""
SCALAR_COLLECTIVES = 6  # per step: 1 sums (evaluate), 1 finite flags, 3 wall-clock broadcasts, 1 signal check
CLUSTER = {"alpha": 2.0e-6, "beta": 1.0 / 12.5e9,
           "about": "alpha = 2 us per message (InfiniBand HDR/EDR with MPI software overhead), "
                    "beta = 1 / (12.5 GB/s) per byte (100 Gb/s links)"}
SHORT_MESSAGE = 2048  # bytes: MPICH's MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE, below which recursive doubling is used
PRESETS = {"full": {"n": 256, "b": 128, "repeats": 3, "tiny_repeats": 200},
           "quick": {"n": 64, "b": 64, "repeats": 2, "tiny_repeats": 50}}


# ---- inside the launched processes ----------------------------------------------------------------
def worker(config: str, n: int | None, b: int | None, repeats: int, sweep: bool) -> dict[str, Any] | None:
    """Time ``Problem.evaluate`` on this rank's block (slowest rank counts), the Allreduce of O alone and,
    with ``sweep``, Allreduce over message sizes. Returns the results on rank 0, None elsewhere."""
    import numba

    from pdeflow.core.parallel import world

    comm = world()
    problem, omega, mass = build(config, n=n, b=b)
    problem = problem.with_comm(comm)
    omega, mass = comm.local_rows(omega), comm.local_rows(mass)
    ev = problem.evaluate(omega, mass)  # warm-up: numba's cached machine code is loaded here
    times, cpu = [], []
    for _ in range(repeats):
        comm.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        problem.evaluate(omega, mass)
        times.append(max(comm.allgather(time.perf_counter() - t0)))
        cpu.append(max(comm.allgather(time.process_time() - c0)))
    # the work every rank repeats whatever its share of heads (cross-entropy and residual features over all
    # B T tokens, the fixed Python cost of an evaluation): an evaluation of an empty block of particles
    fixed = []
    for _ in range(repeats):
        comm.barrier()
        c0 = time.process_time()
        problem.evaluate(omega[:0], mass[:0])
        fixed.append(max(comm.allgather(time.process_time() - c0)))
    B, T = problem.arrays()["tokens"].shape
    O = np.ones((B, T, problem.d))
    out: dict[str, Any] = {"ranks": comm.size, "numba_threads": numba.get_num_threads(), "N": int(sum(
        comm.allgather(omega.shape[0]))), "B": int(B), "T": int(T), "d": problem.d, "k": problem.k,
        "evaluate": summary(times), "evaluate_cpu": summary(cpu),
        "replicated_cpu": summary(fixed), "energy": ev.energy, "dissipation": ev.dissipation,
        "allreduce_O": summary(_allreduce_times(comm, O, max(5, 4 * repeats))),
        "load_average": os.getloadavg()}
    if sweep and comm.size > 1:
        out["sweep"] = [{"bytes": 8 * m, "seconds": float(np.min(_allreduce_times(comm, np.ones(m), reps)))}
                        for m, reps in ((1, 400), (16, 400), (256, 200), (4096, 100), (65536, 30), (2**20, 10))]
    return out if comm.is_root else None


def _allreduce_times(comm, array: np.ndarray, repeats: int) -> list[float]:
    comm.allreduce_sum(array)
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        comm.allreduce_sum(array)
        times.append(max(comm.allgather(time.perf_counter() - t0)))
    return times


# ---- launching ------------------------------------------------------------------------------------
def mpiexec() -> str:
    found = find_mpiexec()
    if not found:
        raise SystemExit("mpiexec not found: pip install -e '.[mpi]' (mpi4py with the MPICH wheel)")
    return found


def launch(ranks: int, threads: int, config: Path, n: int | None, b: int | None, repeats: int,
           sweep: bool = False) -> dict[str, Any]:
    """One worker run in fresh processes: ``ranks`` ranks (1: plain python), ``threads`` threads each."""
    env = child_environment(threads)
    cmd = [sys.executable, "-m", "pdeflow.benchmarks.mpi_scaling", "--worker", "--config", str(config),
           "--repeats", str(repeats)] + (["--n", str(n)] if n else []) + (["--b", str(b)] if b else []) \
        + (["--sweep"] if sweep else [])
    if ranks > 1:
        cmd = [mpiexec(), "-n", str(ranks)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(f"mpi_scaling worker ({ranks} ranks) failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _tiny_config(directory: Path) -> Path:
    path = directory / "mpi_tiny.toml"
    path.write_text(TINY_TOML)
    return path


def strong_scaling(config: Path, n: int | None, b: int | None, repeats: int, rounds: int = 2) -> dict[str, Any]:
    """1 rank, 2 ranks (1 thread each) and 1 rank with 2 threads, interleaved over ``rounds`` rounds so that
    the load of a shared machine hits them alike; per configuration the best round's median."""
    setups = {"1 rank": (1, 1), "2 ranks": (2, 1), "1 rank, 2 threads": (1, 2)}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    for _ in range(rounds):
        for name, (ranks, threads) in setups.items():
            runs[name].append(launch(ranks, threads, config, n, b, repeats))
    best = {name: min(rs, key=lambda r: r["evaluate"]["median"]) for name, rs in runs.items()}
    one, two = best["1 rank"]["evaluate"]["median"], best["2 ranks"]["evaluate"]["median"]
    cpu_one, cpu_two = best["1 rank"]["evaluate_cpu"]["median"], best["2 ranks"]["evaluate_cpu"]["median"]
    energies = [r["energy"] for rs in runs.values() for r in rs]
    return {"sizes": {k: best["1 rank"][k] for k in ("N", "B", "T", "d", "k")}, "runs": runs, "best": best,
            "speedup_1_to_2_ranks": one / two, "efficiency_2_ranks": one / (2 * two),
            "cpu_speedup_1_to_2_ranks": cpu_one / cpu_two,
            "speedup_1_to_2_threads": one / best["1 rank, 2 threads"]["evaluate"]["median"],
            "allreduce_O_seconds": best["2 ranks"]["allreduce_O"]["median"],
            "allreduce_fraction": best["2 ranks"]["allreduce_O"]["median"] / two,
            "energy_spread": float(max(energies) - min(energies))}


# ---- the model --------------------------------------------------------------------------------------
def allreduce_seconds(nbytes: float, ranks: int, alpha: float, beta: float) -> float:
    """Alpha-beta time of an Allreduce of ``nbytes`` over ``ranks`` ranks (MPICH's choice of algorithm)."""
    if ranks <= 1:
        return 0.0
    steps = math.ceil(math.log2(ranks))
    if nbytes <= SHORT_MESSAGE:
        return steps * (alpha + nbytes * beta)
    return 2 * steps * alpha + 2 * (ranks - 1) / ranks * nbytes * beta


def model(t_token: float, t_replicated: float, alpha: float, beta: float, problems: dict[str, dict[str, int]],
          ranks: list[int]) -> dict[str, Any]:
    """Per evaluation and per RK4 step: bytes, communication, compute and parallel efficiency against
    P times the 1-rank speed, and the heads per rank for 90 % efficiency (large P), for each problem and
    rank count. An evaluation on P ranks takes ``t_rep + (N/P) B T t_token + allreduce``; ``t_rep``, the
    work every rank repeats, is ``t_replicated`` per token (it grows like B T)."""
    out: dict[str, Any] = {}
    for name, p in problems.items():
        nbytes = 8 * p["B"] * p["T"] * p["d"]
        t_rep = t_replicated * p["B"] * p["T"]
        serial = t_rep + p["N"] * p["B"] * p["T"] * t_token
        rows = []
        for P in ranks:
            comm = allreduce_seconds(nbytes, P, alpha, beta)
            compute = t_rep + p["N"] / P * p["B"] * p["T"] * t_token
            scalars = SCALAR_COLLECTIVES * math.ceil(math.log2(P)) * alpha if P > 1 else 0.0
            step = 4 * (compute + comm) + scalars
            heads_90 = 9 * (t_rep + comm) / (p["B"] * p["T"] * t_token)
            rows.append({"P": P, "bytes_per_evaluation": nbytes, "allreduce_seconds": comm,
                         "compute_seconds": compute, "evaluation_efficiency": serial / (P * (compute + comm)),
                         "rk4_step_seconds": step, "rk4_step_efficiency": 4 * serial / (P * step),
                         "heads_per_rank_for_90pct": heads_90,
                         "frame_gather_seconds": (math.ceil(math.log2(P)) * alpha + 8 * p["N"] * p["k"] * beta)
                         if P > 1 else 0.0})
        out[name] = {"problem": p, "rows": rows}
    return out


# ---- report -----------------------------------------------------------------------------------------
def markdown(res: dict[str, Any]) -> str:
    lines = [f"MPI scaling, {res['date']}; machine: {res['machine'].get('lscpu Model name', '?')}, "
             f"{res['machine'].get('cpu_count')} CPUs, load average at start {res['load_average'][0]:.1f}.", "",
             "Strong scaling of one `Problem.evaluate` (Phi, grad Phi, energy at all particles), median wall seconds "
             "(the slowest rank), and the CPU seconds of the busiest rank (what an idle machine's wall time would be; "
             "robust to the load of a shared machine):", "",
             "| problem | 1 rank | 2 ranks | speedup (efficiency) | CPU: 1 rank -> 2 ranks (speedup) | "
             "1 rank, 2 threads | Allreduce of O | its share |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in res["strong_scaling"].items():
        z, b = s["sizes"], s["best"]
        lines.append(f"| {name}: N={z['N']}, B={z['B']}, T={z['T']}, d={z['d']}, k={z['k']} | "
                     f"{b['1 rank']['evaluate']['median']:.4g} | {b['2 ranks']['evaluate']['median']:.4g} | "
                     f"{s['speedup_1_to_2_ranks']:.2f}x ({100 * s['efficiency_2_ranks']:.0f} %) | "
                     f"{b['1 rank']['evaluate_cpu']['median']:.4g} -> {b['2 ranks']['evaluate_cpu']['median']:.4g} "
                     f"({s['cpu_speedup_1_to_2_ranks']:.2f}x) | "
                     f"{b['1 rank, 2 threads']['evaluate']['median']:.4g} | "
                     f"{1e6 * s['allreduce_O_seconds']:.0f} us | {100 * s['allreduce_fraction']:.2g} % |")
    loc = res["local_alpha_beta"]
    sweep = ", ".join(f"{s['bytes']} B: {1e6 * s['seconds']:.3g} us" for s in loc["sweep"])
    lines += ["", f"This machine, 2 ranks (shared memory; fastest of the repetitions): "
                  f"alpha = {1e6 * loc['alpha']:.2g} us, beta = {1e9 * loc['beta']:.3g} ns/byte "
                  f"({1e-9 / loc['beta']:.2g} GB/s); Allreduce {sweep}.", "",
              f"Cluster model: {res['cluster']['about']}; compute per evaluation t_rep + (N/P) B T t_token with "
              f"t_token = {res['t_token']:.3g} s per head and token and t_rep = {res['t_replicated']:.3g} B T s "
              f"(the work every rank repeats), both measured as CPU time on 1 rank, 1 thread, reference problem.",
              ""]
    for name, m in res["model"].items():
        p = m["problem"]
        lines += [f"{name}: N={p['N']}, B={p['B']}, T={p['T']}, d={p['d']}, k={p['k']}; "
                  f"Allreduce of {m['rows'][0]['bytes_per_evaluation'] / 2**20:.3g} MiB per evaluation.", "",
                  "| P | Allreduce | compute / evaluation | efficiency (evaluation) | RK4 step efficiency | "
                  "heads/rank for 90 % | frame gather |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in m["rows"]:
            lines.append(f"| {r['P']} | {1e3 * r['allreduce_seconds']:.3g} ms | {r['compute_seconds']:.3g} s | "
                         f"{100 * r['evaluation_efficiency']:.1f} % | {100 * r['rk4_step_efficiency']:.1f} % | "
                         f"{r['heads_per_rank_for_90pct']:.2g} | {r['frame_gather_seconds']:.3g} s |")
        lines.append("")
    return "\n".join(lines)


def run(preset: str, out_dir: Path, log) -> tuple[dict[str, Any], Path, Path]:
    from .common import machine

    cfg = PRESETS[preset]
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S+0000"),
                           "preset": preset, "machine": machine(), "load_average": os.getloadavg(),
                           "cluster": CLUSTER, "strong_scaling": {}}
    tiny = _tiny_config(out_dir)
    log("tiny problem: 1 rank, 2 ranks, 1 rank 2 threads ...")
    res["strong_scaling"]["tiny"] = strong_scaling(tiny, None, None, cfg["tiny_repeats"])
    log(f"reference data, N = {cfg['n']}, B = {cfg['b']}: 1 rank, 2 ranks, 1 rank 2 threads ...")
    ref = strong_scaling(REFERENCE_CONFIG, cfg["n"], cfg["b"], cfg["repeats"])
    res["strong_scaling"]["reference"] = ref
    log("Allreduce sweep (alpha, beta of this machine) ...")
    sweep = launch(2, 1, tiny, None, None, 3, sweep=True)["sweep"]
    alpha = sweep[0]["seconds"]
    large = [s for s in sweep if s["bytes"] >= 32768]
    slope = np.polyfit([s["bytes"] for s in large], [s["seconds"] for s in large], 1)[0]
    res["local_alpha_beta"] = {"sweep": sweep, "alpha": alpha, "beta": float(slope)}
    z, one = ref["sizes"], ref["best"]["1 rank"]
    # compute rates from CPU seconds (a loaded shared machine inflates wall times, not the work)
    res["t_replicated"] = one["replicated_cpu"]["median"] / (z["B"] * z["T"])
    res["t_token"] = (one["evaluate_cpu"]["median"] - one["replicated_cpu"]["median"]) / (z["N"] * z["B"] * z["T"])
    problems = {"reference data, N = 1024": {"N": 1024, "B": 128, "T": 32, "d": 32, "k": z["k"]},
                "a million heads, B = 1024": {"N": 2**20, "B": 1024, "T": 32, "d": 32, "k": z["k"]}}
    ranks = [2, 8, 64, 512, 4096]
    res["model"] = model(res["t_token"], res["t_replicated"], CLUSTER["alpha"], CLUSTER["beta"], problems, ranks)
    res["model_this_machine"] = model(res["t_token"], res["t_replicated"], alpha, res["local_alpha_beta"]["beta"],
                                      {"reference data, N = 1024": problems["reference data, N = 1024"]}, [2])
    stamp = res["date"].replace(":", "").replace("-", "").replace("+0000", "Z")
    js, md = out_dir / f"mpi_scaling-{stamp}.json", out_dir / f"mpi_scaling-{stamp}.md"
    js.write_text(json.dumps(res, indent=2, default=float) + "\n")
    md.write_text(markdown(res))
    tiny.unlink(missing_ok=True)
    return res, js, md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.mpi_scaling", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller reference problem, fewer repeats")
    p.add_argument("--out", default=str(RESULTS), help="directory of the JSON and markdown")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", default=str(REFERENCE_CONFIG), help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    p.add_argument("--b", type=int, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=3, help=argparse.SUPPRESS)
    p.add_argument("--sweep", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        result = worker(args.config, args.n, args.b, args.repeats, args.sweep)
        if result is not None:
            print(json.dumps(result, default=float))
        return EXIT_OK
    res, js, md = run("quick" if args.quick else "full", Path(args.out),
                      lambda s: print(s, file=sys.stderr, flush=True))
    print(markdown(res))
    print(f"results: {js} and {md}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
