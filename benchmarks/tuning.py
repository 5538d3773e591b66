"""Measuring the kernel variants of :mod:`pdeflow.core.tuner` on a problem, for ``pdeflow tune`` and ``pdeflow bench``.

In-process variants (tile, chunks of heads and sequences) are timed on ``Problem.grad_phi`` at the particles,
interleaved, and the choice is remembered for the problem's shape class. The vector width is fixed when the
kernels compile, so each width is timed in fresh processes (``PDEFLOW_VARIANT=width=...``, alternated rounds;
the first run of a width compiles its kernels into numba's cache) and the choice is remembered for this CPU,
read by :mod:`pdeflow.core.jit` in the next process.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pdeflow.core import mean_field, tuner

from .common import REFERENCE_CONFIG, median
from .worker import spawn


def shape_of(problem, n_heads: int) -> str:
    """The shape class of grad Phi at ``n_heads`` particles of ``problem`` in its precision."""
    data = problem._data
    B, T, d = data.shape
    return tuner.shape_class(problem.dtype, B, T, d, data.head_dim, n_heads, data.factored)


def in_use(problem, n_heads: int) -> dict[str, Any]:
    """The variant this process runs for the problem (label and why), with the tile and chunk it gives."""
    v, why = mean_field.variant(problem._data, problem.dtype, n_heads)
    item = problem.dtype.itemsize
    heads, seqs = mean_field._blocks(problem._data, item, n_heads, v)
    return {"variant": v.label, "why": why, "shape_class": shape_of(problem, n_heads),
            "heads_per_work_unit": mean_field._tile(problem.dtype, v), "heads_per_chunk": heads,
            "sequences_per_chunk": seqs}


def tune_problem(problem, omega, mass, repeats: int = 3) -> dict[str, Any]:
    """Time the in-process candidates on grad Phi at the particles and remember the fastest (see
    :func:`pdeflow.core.tuner.tune`); returns the record with the variant now in use."""
    rec = tuner.tune(lambda: problem.grad_phi(omega, omega, mass), shape_of(problem, omega.shape[0]), repeats)
    rec["in_use"] = in_use(problem, omega.shape[0])
    return rec


def tune_width(config: str | Path = REFERENCE_CONFIG, n: int | None = None, b: int | None = None,
               t: int | None = None, repeats: int = 3, rounds: int = 2, threads: int | None = None,
               margin: float = 0.03) -> dict[str, Any]:
    """Time grad Phi with 512- and 256-bit kernels in fresh processes (alternated, ``rounds`` each, after one
    warm-up process per width that compiles), remember the faster for this CPU (512 kept unless 256 is faster
    by more than ``margin`` in the median of the per-round ratios and in every round, as
    :func:`pdeflow.core.tuner.choose` decides) and return the choice, why, and the per-width median seconds."""
    samples: dict[int, list[float]] = {512: [], 256: []}
    for bits in samples:  # warm-up: compiles this width's kernels into numba's cache
        spawn("grad_phi", threads=threads, config=config, n=n, b=b, t=t, repeats=1,
              env={"PDEFLOW_VARIANT": f"width={bits}"})
    rounds_of: dict[str, list[float]] = {"512": [], "256": []}  # a process pair per round: its medians
    for _ in range(rounds):
        for bits in samples:
            r = spawn("grad_phi", threads=threads, config=config, n=n, b=b, t=t, repeats=repeats,
                      env={"PDEFLOW_VARIANT": f"width={bits}"})
            samples[bits] += r["time"]["samples"]
            rounds_of[str(bits)].append(r["time"]["median"])
    med = {bits: median(s) for bits, s in samples.items()}
    # the rule of the in-process variants (tuner.choose), on the per-round ratios of the two processes
    label, _ = tuner.choose(rounds_of, margin, base="512")
    bits = int(label)
    if bits == 256:
        why = f"256 bit {med[512] / med[256]:.3f}x faster than 512 ({med[256]:.4g} s vs {med[512]:.4g} s)"
    else:
        why = (f"512 bit kept: 256 bit {med[512] / med[256]:.3f}x its speed ({med[256]:.4g} s vs {med[512]:.4g} s), "
               f"not faster by > {margin:.0%} in the median of {rounds} per-round ratios and in every round")
    path = tuner.remember_width(bits, why, {str(k): v for k, v in med.items()})
    return {"bits": bits, "why": why, "seconds": {str(k): v for k, v in med.items()}, "file": str(path)}
