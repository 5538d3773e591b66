"""Measurements that need a process of their own: thread counts (set before numba and BLAS start) and
peak memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` is a process-wide high-water mark).

``python -m pdeflow.benchmarks.worker TASK --config PATH [--n N] [--b B] [--repeats R]`` prints one JSON line.
Tasks: ``grad_phi`` (median time of ``Problem.grad_phi`` at the particles, and of its two passes,
interleaved), ``threads`` (1 against 2 threads alternated call by call in one process, see
:func:`thread_pairs`), ``torch`` (PyTorch autograd float64 and float32 interleaved with pdeflow, see
:func:`torch_baselines`), ``memory-step`` (peak memory of one ``Problem.evaluate`` + explicit Euler
update, done in place), ``memory-kernel`` (peak memory of ``mean_field.grad_phi_data`` alone, given the
residual features). The memory tasks draw their N particles in place (N x k floats allocated once) so that
the high-water mark is that of the evaluation.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from pdeflow.core.exit_codes import EXIT_OK

from .common import REFERENCE_CONFIG, build, interleaved, ratio, summary


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def run_task(task: str, config: str, n: int | None, b: int | None, repeats: int,
             t: int | None = None) -> dict[str, Any]:
    if task == "torch":
        try:
            import torch  # noqa: F401 - before numba starts its OpenMP pool: see torch_baselines
        except ImportError:
            pass
    import numba
    import numpy as np

    if task in ("grad_phi", "threads", "torch"):
        problem, omega, mass = build(config, n=n, b=b, t=t)
    else:
        # the particles are drawn in place (N x k floats once), so that the high-water mark measures the
        # evaluation and not the temporaries of Problem.initial_particles
        problem = build(config, n=1, b=b, t=t)[0]
        N = int(n) if n is not None else 1024
        omega = np.empty((N, problem.k))
        np.random.default_rng(0).standard_normal(out=omega)
        omega *= 0.5
        mass = np.full(N, 1.0 / N)
    out: dict[str, Any] = {"task": task, "numba_threads": numba.get_num_threads(), "N": int(omega.shape[0]),
                           "B": int(problem.arrays()["tokens"].shape[0])}
    if task == "grad_phi":
        import time

        cpu: list[float] = []

        def timed_grad():
            t0 = time.process_time()
            problem.grad_phi(omega, omega, mass)
            cpu.append(time.process_time() - t0)

        G = problem.residual_features(omega, mass)
        t = interleaved({"grad_phi": timed_grad, "logits_pass": lambda: problem.residual_features(omega, mass),
                         "gradient_pass": lambda: problem.grad_phi_field(omega, G)}, repeats)
        out["time"] = summary(t["grad_phi"])
        out["cpu_time"] = summary(cpu[-repeats:])  # process CPU seconds (all threads) of the timed runs
        out["passes"] = {k: summary(t[k]) for k in ("logits_pass", "gradient_pass")}
    elif task == "threads":
        out.update(thread_pairs(problem, omega, mass, repeats))
    elif task == "torch":
        out.update(torch_baselines(problem, omega, mass, numba.get_num_threads(), repeats))
    elif task == "memory-step":
        out["rss_before_mib"] = _maxrss_mib()
        ev = problem.evaluate(omega, mass)
        grad = ev.grad_phi
        grad *= -0.01  # the explicit Euler update omega - dt grad, in place
        omega += grad
        out["peak_rss_mib"] = _maxrss_mib()
    elif task == "memory-kernel":
        from pdeflow.core import mean_field

        G = problem.residual_features(omega, mass)
        out["rss_before_mib"] = _maxrss_mib()
        mean_field.grad_phi_data(problem.theta(omega), G, problem._data)
        out["peak_rss_mib"] = _maxrss_mib()
    else:
        raise ValueError(f"unknown worker task {task!r}")
    out["omega_mib"] = omega.nbytes / 2**20
    return out


def thread_pairs(problem, omega, mass, repeats: int) -> dict[str, Any]:
    """1 against 2 threads in this process (started with 2 numba threads), alternated call by call:
    ``repeats`` rounds, each timing grad Phi, the logits pass and the gradient pass on 1 thread
    (``numba.set_num_threads(1)``: pdeflow's threads never start, as in a 1-thread process) and then on 2.

    Per grad Phi: wall and process CPU seconds, the serial seconds outside the threaded regions
    (:func:`pdeflow.core.workers.occupancy`) and the regions' idle thread-seconds. Returns, per thread count,
    the samples of each (``"1"``, ``"2"``) and the per-round ratios 1-thread / 2-thread time of grad Phi and of
    each pass (``"pairs"``): a round's two calls are seconds apart, so a machine whose speed drifts (other
    jobs, a KVM host's neighbours) slows both alike, which ratios of medians over separate processes do not
    cancel.
    """
    import time

    import numba

    from pdeflow.core import workers

    G = problem.residual_features(omega, mass)
    calls = {"logits_pass": lambda: problem.residual_features(omega, mass),
             "gradient_pass": lambda: problem.grad_phi_field(omega, G)}
    keys = ("time", "cpu_time", "serial", "idle", *calls)
    samples: dict[int, dict[str, list[float]]] = {th: {k: [] for k in keys} for th in (1, 2)}
    for round_ in range(repeats + 1):  # the first round warms up (compiles, starts the pool)
        for th in (1, 2):
            numba.set_num_threads(th)
            with workers.occupancy() as regions:
                w0, c0 = time.perf_counter(), time.process_time()
                problem.grad_phi(omega, omega, mass)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
            got = {"time": wall, "cpu_time": cpu, "serial": wall - sum(r.wall for r in regions),
                   "idle": sum(r.idle for r in regions)}
            for key, fn in calls.items():
                t0 = time.perf_counter()
                fn()
                got[key] = time.perf_counter() - t0
            if round_:
                for key in keys:
                    samples[th][key].append(got[key])
    numba.set_num_threads(2)
    pairs = {k: [a / b for a, b in zip(samples[1][k], samples[2][k])] for k in ("time", *calls)}
    return {"1": samples[1], "2": samples[2], "pairs": pairs}


def torch_baselines(problem, omega, mass, threads: int, repeats: int) -> dict[str, Any]:
    """PyTorch autograd float64 and float32 (``threads`` intra-op threads) and pdeflow float64, interleaved.

    Run in a process of its own, with torch imported before numba starts its threading layer: torch and
    numba share the system's OpenMP runtime (libgomp), and when numba's OpenMP pool starts first, MKL's
    products inside PyTorch's parallel regions start nested thread teams - measured 3500 thread creations
    per second and PyTorch 15x slower (13.5 s against 0.88 s at N = 256). Importing torch first measures
    PyTorch as its users run it."""
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed (pip install '.[bench]')"}
    import numpy as np

    from .baselines import TorchModel

    torch.set_num_threads(threads)
    res: dict[str, Any] = {"version": torch.__version__, "threads": torch.get_num_threads()}
    arrays = problem.arrays()
    models = {dtype: TorchModel(arrays, dtype) for dtype in ("float64", "float32")}
    fns = {"pdeflow": lambda: problem.grad_phi(omega, omega, mass)}
    fns.update({f"torch_{k}": (lambda m=m: m.grad_phi(omega, mass)) for k, m in models.items()})
    t = interleaved(fns, repeats)
    ref = problem.grad_phi(omega, omega, mass)
    for dtype, model in models.items():
        g = np.asarray(model.grad_phi(omega, mass), float)
        res[dtype] = {"time": summary(t[f"torch_{dtype}"]), "speedup": ratio(t[f"torch_{dtype}"], t["pdeflow"]),
                      "rel_error": float(np.abs(g - ref).max() / max(np.abs(ref).max(), 1e-300))}
    res["pdeflow_time"] = summary(t["pdeflow"])
    return res


def spawn(task: str, threads: int | None = None, config: str | Path = REFERENCE_CONFIG, n: int | None = None,
          b: int | None = None, repeats: int = 3, timeout: float = 1800.0, t: int | None = None,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a worker task in a fresh interpreter; ``threads``: pdeflow's thread count in it (numba's and
    OpenMP's variables; BLAS on one thread, as pdeflow runs it - see :func:`pdeflow.core.jit.thread_environment`);
    ``env``: more environment variables (e.g. ``PDEFLOW_VARIANT``)."""
    from pdeflow.core.jit import thread_environment

    extra = env or {}
    env = dict(os.environ)
    env.update(extra)
    if threads is not None:
        env.update(thread_environment(threads))
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "pdeflow.benchmarks.worker", task, "--config", str(config), "--repeats", str(repeats)]
    if n is not None:
        cmd += ["--n", str(n)]
    if b is not None:
        cmd += ["--b", str(b)]
    if t is not None:
        cmd += ["--t", str(t)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker {task} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.worker")
    p.add_argument("task", choices=("grad_phi", "threads", "torch", "memory-step", "memory-kernel"))
    p.add_argument("--config", default=str(REFERENCE_CONFIG))
    p.add_argument("--n", type=int)
    p.add_argument("--b", type=int)
    p.add_argument("--t", type=int)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(json.dumps(run_task(args.task, args.config, args.n, args.b, args.repeats, args.t)))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
