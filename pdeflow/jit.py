"""The one place where numba compilation flags live.

Every numba kernel in pdeflow is compiled through :func:`jit`, so that caching (``cache=True``: a
second process loads machine code from ``__pycache__`` instead of recompiling), error model and
parallelism are chosen once. ``fastmath`` stays off: pdeflow is a reference solver and its results
must not depend on reassociation choices of the compiler.
"""
from __future__ import annotations

import os
from typing import Any, Callable

# pdeflow runs many short parallel kernels back to back, often on machines shared with other jobs.
# OpenMP's default active waiting makes idle worker threads spin between kernels and steal the cores the
# busy ones need: measured 30 s against 17 s wall for a short quickstart run at load 5, and 216 s against
# 9 s for `pdeflow chaos --quick` at load 10. Passive waiting costs a futex wake-up per kernel, negligible
# next to a kernel. Read by the OpenMP runtime when it starts; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# BLAS on one thread unless the user says otherwise: numba's kernels already use every core, and
# OpenBLAS's own threads spin between products and fight them for the cores. Measured on the 2-core
# machine: grad Phi at N = 256 on bench-reference.toml 0.52 s with one BLAS thread against 6.05 s with
# OpenBLAS's default two; the quickstart 4.3 s against 44 s for t_end = 8. Only effective when pdeflow
# is imported before numpy (the command line always is).
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numba  # noqa: E402 - after the environment is set
from numba import prange  # noqa: F401  (re-exported so kernels import loops from one place)


def jit(parallel: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator compiling a kernel with pdeflow's flags: ``nopython``, ``cache=True``, no fastmath.

    ``parallel=True`` enables ``numba.prange`` loops; thread count follows ``NUMBA_NUM_THREADS``.
    """
    return numba.njit(cache=True, parallel=parallel, fastmath=False, error_model="numpy", nogil=True)


def num_threads() -> int:
    """Number of threads numba's parallel kernels use in this process."""
    return numba.get_num_threads()
