"""The one place where numba compilation flags live.

Every numba kernel in pdeflow is compiled through :func:`jit`, so that caching (``cache=True``: a
second process loads machine code from ``__pycache__`` instead of recompiling), error model and
parallelism are chosen once. ``fastmath`` stays off: pdeflow is a reference solver and its results
must not depend on reassociation choices of the compiler.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

# pdeflow runs many short parallel kernels back to back, often on machines shared with other jobs.
# OpenMP's default active waiting makes idle worker threads spin between kernels and steal the cores the
# busy ones need: measured 30 s against 17 s wall for a short quickstart run at load 5, and 216 s against
# 9 s for `pdeflow chaos --quick` at load 10. Passive waiting costs a futex wake-up per kernel, negligible
# next to a kernel. Read by the OpenMP runtime when it starts; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# BLAS on one thread unless the user says otherwise: pdeflow's own threads (pdeflow.workers) each run
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

import numba  # noqa: E402 - after the environment is set
from numba import prange  # noqa: F401  (re-exported so kernels import loops from one place)


def jit(parallel: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator compiling a kernel with pdeflow's flags: ``nopython``, ``cache=True``, no fastmath.

    ``parallel=True`` enables ``numba.prange`` loops; thread count follows ``NUMBA_NUM_THREADS``.
    """
    return numba.njit(cache=True, parallel=parallel, fastmath=False, error_model="numpy", nogil=True)


def num_threads() -> int:
    """Number of threads pdeflow's evaluations use in this thread (numba's count, ``NUMBA_NUM_THREADS``
    or ``numba.set_num_threads``)."""
    return numba.get_num_threads()


THREAD_VARIABLES = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")  # the user's choice of pdeflow's thread count


def thread_environment(threads: int) -> dict[str, str]:
    """Environment variables that give a new pdeflow process ``threads`` threads: numba's (and OpenMP's)
    count, BLAS on one thread."""
    env = {var: str(int(threads)) for var in THREAD_VARIABLES}
    env.update({var: "1" for var in BLAS_VARIABLES})
    return env
