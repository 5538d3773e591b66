"""When one time is another: the one tolerance of pdeflow's time arithmetic.

A time reached by adding step lengths carries rounding: ``0.1 + 0.2`` is not ``0.3``. Two times are the same
time when they differ by at most :data:`TIME_RTOL` ``max(1, |target|)`` (relative, and absolute below 1): far
above the rounding of any sum of steps (some 1e-16 per step, relative) and far below any step a run takes.
The time loop (:mod:`pdeflow.solvers.loop`) snaps a step that ends this close to a frame or target time onto
it (:func:`landed`), the frame schedule merges a last frame this close to ``run.t_end`` into it, and the
diagnostics' windows start at a time up to this far before their start.

``pdeflow compare`` matches frames of two files with the same rule at its own, looser tolerance
(``pdeflow.io.reference.TIME_MATCH``): its files may come from other codes.
"""
from __future__ import annotations

import numpy as np

TIME_RTOL = 1e-12


def time_tolerance(target: float, rtol: float = TIME_RTOL) -> float:
    """How far from ``target`` a time may be and still be ``target``: ``rtol max(1, |target|)``."""
    return rtol * max(1.0, abs(float(target)))


def same_time(t, target: float, rtol: float = TIME_RTOL):
    """``|t - target| <= rtol max(1, |target|)``; ``t`` a number or an array (then elementwise, bool array)."""
    return np.abs(np.asarray(t, dtype=float) - target) <= time_tolerance(target, rtol) if np.ndim(t) else \
        abs(float(t) - target) <= time_tolerance(target, rtol)


def landed(t: float, target: float) -> float:
    """``target`` when ``t`` is the same time (:func:`same_time`), else ``t``: where a step that aimed at
    ``target`` ends."""
    return float(target) if same_time(t, target) else t


__all__ = ["TIME_RTOL", "time_tolerance", "same_time", "landed"]
