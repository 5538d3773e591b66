"""The C allocator's thresholds for the arrays pdeflow makes and frees at every step.

A step, a plan of the grid's JKO or a Hessian's assembly makes temporaries of one to tens of megabytes and frees them
at once, thousands of times. glibc's defaults hand them back to the kernel as soon as they are freed (a block above
``M_MMAP_THRESHOLD`` is its own mapping; a heap top above ``M_TRIM_THRESHOLD`` is trimmed), and the next temporary of
the same size faults every one of its pages in again: the system time of a run then matched its compute. Measured on
the 2-core machine (``python -m pdeflow.benchmarks.allocator_cost``): a wfr_jko plan on a 24 x 24 grid 7.5 ms -> 3.8 ms,
its page faults over 200 plans 641,600 -> 1; wfr_jko on grid2d (24 x 24, t_end 1, tests/methods/test_accuracy.py)
65 s -> 39 s.

:func:`keep_freed_memory` raises both thresholds (blocks below 32 MiB come from the heap; up to 128 MiB of freed heap
is kept, 64 MiB of padding taken at each growth), so a process holds at most that much memory it no longer uses.
It acts only where the C library is glibc, and not when the user set any of glibc's ``MALLOC_*_`` variables (theirs
win) or ``PDEFLOW_ALLOCATOR=default``.
"""
from __future__ import annotations

import ctypes
import os
import sys

# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
# 32 MiB is the largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2)
SETTINGS = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 128 << 20, M_TOP_PAD: 64 << 20}
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
OPT_OUT = "PDEFLOW_ALLOCATOR"

# what keep_freed_memory did ("kept", or why not), for benchmarks/allocator_cost.py and the tests
state = "not set"


def keep_freed_memory() -> str:
    """Set :data:`SETTINGS` through glibc's ``mallopt`` (module docstring); returns and records in :data:`state`
    what was done: ``"kept"``, or the reason nothing was."""
    global state
    if os.environ.get(OPT_OUT, "").lower() == "default":
        state = f"{OPT_OUT}=default: glibc's own thresholds"
    elif any(os.environ.get(name) for name in USER_VARIABLES):
        state = "the user's MALLOC_* settings"
    elif not sys.platform.startswith("linux"):
        state = f"not glibc ({sys.platform})"
    else:
        try:
            libc = ctypes.CDLL(None)
            libc.gnu_get_libc_version  # noqa: B018 - present in glibc only (musl has mallopt as a stub)
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            state = "not glibc"
        else:
            mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
            refused = [p for p, value in SETTINGS.items() if mallopt(p, value) != 1]
            state = "kept" if not refused else f"mallopt refused parameters {refused}"
    return state


__all__ = ["keep_freed_memory", "SETTINGS", "OPT_OUT", "state"]
