"""Shared helpers of the benchmarks: building the reference problem, timing, fits, machine facts."""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

# the reference problem ships inside the package (package data), so the benchmarks run outside a checkout
REFERENCE_CONFIG = Path(__file__).resolve().parent / "bench-reference.toml"
RESULTS = Path("benchmarks") / "results"  # default folder of the results, relative to the working directory
THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # recorded


def build(config: str | Path = REFERENCE_CONFIG, n: int | None = None, b: int | None = None,
          t: int | None = None, precision: str | None = None):
    """(problem, omega, mass) of the config with N, B, T and precision overridden where given."""
    from pdeflow.core.config import load_config
    from pdeflow.core.problem import Problem

    overrides = []
    if n is not None:
        overrides.append(f"init.n_particles={int(n)}")
    if b is not None:
        overrides.append(f"task.n_samples={int(b)}")
    if t is not None:
        overrides.append(f"task.seq_len={int(t)}")
    if precision is not None:
        overrides.append(f'model.precision="{precision}"')
    cfg = load_config(config, overrides)
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    return problem, omega, mass


def sizes(problem, omega) -> dict[str, int]:
    """N, B, T, d, dh, V of a problem and its particles."""
    B, T = problem.arrays()["tokens"].shape
    return {"N": int(omega.shape[0]), "B": int(B), "T": int(T), "d": problem.d, "dh": problem.head_dim,
            "V": problem.vocab_size}


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall times of several functions, run in alternation (round r runs each once), so that a noisy
    machine slows them alike and their ratios stay meaningful. ``warmup`` untimed rounds first."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn))
    return times


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def summary(xs: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and all samples (seconds)."""
    return {"median": median(xs), "min": float(min(xs)), "max": float(max(xs)), "samples": [float(x) for x in xs]}


def ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Ratio of medians ``median(a) / median(b)``."""
    return median(a) / median(b)


def loglog_exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log y against log x (the fitted power-law exponent)."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def matmul_call(n: int = 2000, dtype=np.float64, threads: int = 1) -> Callable[[], None]:
    """One numpy ``a @ b`` of n x n matrices with BLAS on ``threads`` threads for the call only (pdeflow itself
    runs BLAS on one thread per worker); the limit costs microseconds against the product's 0.1-1 s. Timed in
    :func:`interleaved` beside the kernels, so that a rate and a fraction of it come from the same rounds."""
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)).astype(dtype), rng.random((n, n)).astype(dtype)
    out = np.empty((n, n), dtype=dtype)

    def call() -> None:
        with controller.limit(limits=threads, user_api="blas"):
            np.matmul(a, b, out=out)
    return call


def matmul_record(n: int, threads: int, times: Sequence[float]) -> dict[str, Any]:
    """GFLOP/s ``2 n^3 / median(times)`` of :func:`matmul_call`'s samples, with the samples."""
    return {"n": n, "threads": threads, "gflops": 2.0 * n ** 3 / median(times) / 1e9, "time": summary(times)}


def cpu_model() -> dict[str, Any]:
    """The CPU as the kernel reports it (``/proc/cpuinfo``: model name, vendor, family, model, stepping)."""
    out: dict[str, Any] = {}
    keys = {"model name": "model", "vendor_id": "vendor", "cpu family": "family", "model": "model_number",
            "stepping": "stepping"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in keys and keys[key] not in out:
                    out[keys[key]] = value.strip()
                if not line.strip() and out:
                    break  # the first processor is enough
    except OSError:
        pass
    if "model" not in out:
        out["model"] = platform.processor() or platform.machine()
    return out


def cache_sizes() -> dict[str, int]:
    """Per-core cache sizes in bytes of CPU 0 (``L1d``, ``L2``, ``L3``; sysfs), those that the system reports."""
    out: dict[str, int] = {}
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        name = f"L{level}" + ("d" if kind == "Data" else "")
        value = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        out[name] = value
    return out


def machine() -> dict[str, Any]:
    """CPU model, caches, core count, library versions, BLAS and thread settings of this process."""
    import numba

    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "numpy": np.__version__, "numba": numba.__version__,
                            "numba_threads": numba.get_num_threads(), "cpu_count": os.cpu_count(),
                            "cpu": cpu_model(), "caches": cache_sizes()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket",
                               "Socket(s)", "L2 cache", "L3 cache", "Flags"):
                value = value.strip()
                if key.strip() == "Flags":
                    value = " ".join(f for f in value.split() if f.startswith(("avx", "fma")))
                info["lscpu " + key.strip()] = value
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from threadpoolctl import threadpool_info

        info["blas"] = [{k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                                               "threading_layer")} for p in threadpool_info()]
    except ImportError:
        info["blas"] = "threadpoolctl not installed"
    try:
        info["numba_threading_layer"] = numba.threading_layer()
    except ValueError:
        info["numba_threading_layer"] = "not yet initialized"
    try:
        info["load_average_1_5_15min"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    info["environment"] = {k: os.environ[k] for k in THREAD_VARIABLES + ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
                           if k in os.environ}
    return info
