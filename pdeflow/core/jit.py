"""The one place where numba compilation flags live.

Every numba kernel in pdeflow is compiled through :func:`jit`, so that caching (``cache=True``: a
second process loads machine code from ``__pycache__`` instead of recompiling), error model and
threading are chosen once. ``fastmath`` stays off: pdeflow is a reference solver and its results
must not depend on reassociation choices of the compiler.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

# BLAS on one thread unless the user says otherwise: pdeflow's own threads (pdeflow.core.workers) each run
# whole chunks - products and kernels - so the cores are already busy, and OpenBLAS's threads spin between
# products and fight them for the cores. Measured on the 2-core machine: grad Phi at N = 256 on
# bench-reference.toml 0.52 s with one BLAS thread against 6.05 s with OpenBLAS's default two.
# The variables are read when BLAS loads; if numpy (and so BLAS) was imported first, threadpoolctl sets
# the same limit at run time.
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_user_blas_threads = any(os.environ.get(_var) for _var in BLAS_VARIABLES)
for _var in BLAS_VARIABLES:
    os.environ.setdefault(_var, "1")
if "numpy" in sys.modules and not _user_blas_threads:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")

# Vector width of the kernels: 512 bits on every AVX-512 host, chosen here and not by LLVM's tuning tables.
# numba compiles for the host CPU's name and ISA features; the name brings LLVM's tuning with it, and for
# Intel's AVX-512 server cores (skylake-avx512, cascadelake, icelake-server, sapphirerapids, ...) that
# tuning sets `prefer-256-bit`: every loop of pdeflow.core.kernels then runs on 256-bit ymm registers (0 zmm
# instructions in the two core kernels), while on AMD Zen 4 the same source gets 512-bit zmm loops
# (`python -m pdeflow.benchmarks.codegen` shows both; studies/kernels/RESULTS.md). The kernels' inner loops are
# elementwise loops over a tile of heads with about two loads per fused multiply-add, load-bound; a core
# with two 64-byte load ports (Intel AVX-512 server cores) moves half the data per cycle with ymm. The
# preference exists because of the clock reduction of 512-bit code on the first AVX-512 generations; it
# is a compiler default, not a property of these loops, so pdeflow states the width itself:
# NUMBA_CPU_FEATURES = the host's features + ",-prefer-256-bit" whenever the host has AVX-512F. Results
# do not depend on the width: no fastmath, every sum in a fixed order, fused multiply-adds written out
# (pdeflow.core.kernels), so a lane computes the same operations in a 512-bit, a 256-bit or a scalar loop.
# The user's choice wins: set NUMBA_CPU_NAME or NUMBA_CPU_FEATURES (e.g. the host's features followed by
# ",+prefer-256-bit" for 256-bit vectors) and pdeflow leaves both alone. A value pdeflow set itself
# (inherited by a subprocess, marked by PDEFLOW_CPU_FEATURES) is recomputed for the host it runs on.
# The planner (pdeflow.core.tuner) may choose 256 bits instead: a width measured faster on this CPU and remembered,
# or forced by PDEFLOW_VARIANT="width=256" (per process: the width is fixed when the kernels compile).
PREFER_512_FLAG = "-prefer-256-bit"
PREFER_256_FLAG = "+prefer-256-bit"
_MARK = "PDEFLOW_CPU_FEATURES"


def _choose_vector_width() -> str:
    """Set NUMBA_CPU_FEATURES for 512-bit vectors on AVX-512 hosts, or 256-bit ones where the planner says
    so (see above); returns who chose the features: "user", "pdeflow", "pdeflow (measured: 256 bit)" /
    "pdeflow (PDEFLOW_VARIANT: ... bit)" or "numba" (no AVX-512: numba's host defaults)."""
    inherited = os.environ.get(_MARK)
    if inherited is not None and os.environ.get("NUMBA_CPU_FEATURES") == inherited:
        del os.environ["NUMBA_CPU_FEATURES"]  # pdeflow's choice in a parent process: decide again here
    os.environ.pop(_MARK, None)
    if "NUMBA_CPU_NAME" in os.environ or "NUMBA_CPU_FEATURES" in os.environ:
        return "user"
    import llvmlite.binding as ll

    try:
        features = ll.get_host_cpu_features()
    except RuntimeError:  # LLVM cannot read this host's features: numba falls back to its defaults too
        return "numba"
    if not features.get("avx512f"):
        return "numba"
    from . import tuner  # reads the plan file only: numba is not imported yet

    try:
        bits, who = tuner.vector_bits_choice()
    except ValueError:  # a malformed PDEFLOW_VARIANT: reported in one line where the variant is read
        bits, who = None, "default"
    flag = PREFER_256_FLAG if bits == 256 else PREFER_512_FLAG
    os.environ["NUMBA_CPU_FEATURES"] = os.environ[_MARK] = features.flatten() + "," + flag
    return "pdeflow" if who == "default" else f"pdeflow ({who}: {bits} bit)"


VECTOR_WIDTH_CHOICE = _choose_vector_width()

import numba  # noqa: E402 - after the environment is set


def jit() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator compiling a kernel with pdeflow's flags: ``nopython``, ``cache=True``, no fastmath, ``nogil``
    (pdeflow's own threads run kernels side by side: :mod:`pdeflow.core.workers`), and one compilation at a time
    per kernel across the processes that share its cache (:func:`compile_serially`).

    No kernel is ``parallel``: numba compiles a ``prange`` loop into a function of its own that takes in, and
    optimizes again, every kernel the loop calls, so thread-splitting wrappers of the causal kernels would cost
    more to compile than the kernels themselves (``python -m pdeflow.benchmarks.compile_cost``: a fresh install's
    first evaluations took 2.39 times as long to compile on two threads as on one with them, 1.00 times without).
    One item's work units are split over pdeflow's threads instead (:func:`pdeflow.core.workers.for_each_range`).
    """
    decorate = numba.njit(cache=True, parallel=False, fastmath=False, error_model="numpy", nogil=True)

    def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
        return compile_serially(decorate(fn))

    return compiled


# ---- one compilation at a time per kernel, across processes ----------------------------------------------
# numba's on-disk cache is safe for processes that load, not for processes that compile different signatures
# of one kernel at the same time: each reads the kernel's index, picks the first free data file name, writes
# the index, then the data (numba.core.caching.IndexDataCacheFile.save). Interleaved, an index entry can name
# the file holding the *other* signature's machine code, which a later process then runs. That happens when
# MPI ranks, two runs of one fresh install or the test suite's workers start together. So a kernel's
# compilation (the cache lookup, the compile and the save) holds an exclusive lock on a file beside its cache
# entries: a second process waits and then loads what the first compiled instead of compiling it again.
# numba's own in-process compiler lock is taken first: numba takes it before compiling a kernel's callees,
# so every process takes the file locks in call order (callers before callees), which cannot cycle.
try:
    import fcntl
except ImportError:  # no POSIX file locks (Windows): numba's behaviour, unlocked
    fcntl = None  # type: ignore[assignment]

_HELD: dict[str, int] = {}  # lock file -> depth, for a kernel whose compilation compiles itself again


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[None]:
    """Hold the POSIX lock on ``path`` (re-entrant within this process; callers hold numba's compiler lock).
    Where the file cannot be opened (a read-only cache: numba then caches nothing either) nothing is locked."""
    fd = None
    if path not in _HELD and fcntl is not None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
    _HELD[path] = _HELD.get(path, 0) + 1
    try:
        yield
    finally:
        _HELD[path] -= 1
        if _HELD[path] == 0:
            del _HELD[path]
            if fd is not None:
                os.close(fd)  # releases the lock


def compile_lock_path(dispatcher: Any) -> str | None:
    """The lock file of a cached kernel, ``<numba's cache folder>/<module>.<name>-<first line>.lock`` (beside
    numba's ``<module>.<name>-<first line>.py*.nbi`` index), or None
    for a function numba does not compile (``NUMBA_DISABLE_JIT``) or does not cache."""
    cache = getattr(dispatcher, "_cache", None)
    path = getattr(cache, "cache_path", None)
    if path is None:
        return None
    code = dispatcher.py_func.__code__
    module = os.path.splitext(os.path.basename(code.co_filename))[0]
    return os.path.join(path, f"{module}.{dispatcher.py_func.__qualname__}-{code.co_firstlineno}.lock")


def compile_serially(dispatcher: Any) -> Any:
    """``dispatcher`` whose ``compile`` (numba calls it for every new signature, from a call or from a caller's
    compilation) runs under numba's compiler lock and the kernel's file lock (see above)."""
    path = compile_lock_path(dispatcher)
    if path is None:
        return dispatcher
    from numba.core.compiler_lock import global_compiler_lock

    compile_ = dispatcher.compile

    def compile(sig: Any) -> Any:
        with global_compiler_lock, _exclusive(path):
            return compile_(sig)

    dispatcher.compile = compile
    return dispatcher


def num_threads() -> int:
    """Number of threads pdeflow's evaluations use in this thread (numba's count, ``NUMBA_NUM_THREADS``
    or ``numba.set_num_threads``)."""
    return numba.get_num_threads()


THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")  # the user's choice of pdeflow's thread count


def thread_environment(threads: int) -> dict[str, str]:
    """Environment variables that give a new pdeflow process ``threads`` threads: numba's count (pdeflow's thread
    count, :func:`num_threads`) and OpenMP's (for any OpenMP library in the process), BLAS on one thread."""
    env = {var: str(int(threads)) for var in THREAD_VARIABLES}
    env.update({var: "1" for var in BLAS_VARIABLES})
    return env
