"""The one place where numba compilation flags live.

Every numba kernel in pdeflow is compiled through :func:`jit`, so that caching (``cache=True``: a
second process loads machine code from ``__pycache__`` instead of recompiling), error model and
parallelism are chosen once. ``fastmath`` stays off: pdeflow is a reference solver and its results
must not depend on reassociation choices of the compiler.
"""
from __future__ import annotations

from typing import Any, Callable

import numba
from numba import prange  # noqa: F401  (re-exported so kernels import loops from one place)


def jit(parallel: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator compiling a kernel with pdeflow's flags: ``nopython``, ``cache=True``, no fastmath.

    ``parallel=True`` enables ``numba.prange`` loops; thread count follows ``NUMBA_NUM_THREADS``.
    """
    return numba.njit(cache=True, parallel=parallel, fastmath=False, error_model="numpy", nogil=True)


def num_threads() -> int:
    """Number of threads numba's parallel kernels use in this process."""
    return numba.get_num_threads()
