"""pdeflow's performance benchmarks (issue 4): ``python -m pdeflow.benchmarks [--quick] [--out DIR]``.

Times grad Phi at the particles of ``benchmarks/bench-reference.toml`` (N = 1024 heads, B = 128, T = 32,
d = 32, dh = 8), counts its flops (:mod:`pdeflow.benchmarks.flops`), compares with the float64 matrix-multiply rate
measured in the same run, with PyTorch autograd (float64, float32) and with plain numpy
(:mod:`pdeflow.benchmarks.baselines`), and measures scaling in N, B and T, 1 vs 2 threads, the overhead of an
explicit step, peak memory and float32 speed (:mod:`pdeflow.benchmarks.suite`). Results: a JSON record and a
markdown table in ``benchmarks/results/`` (git-ignored); the table is also printed.
"""
import pdeflow.core.jit  # noqa: F401 - first, as in every pdeflow process: BLAS on one thread (see pdeflow/core/jit.py)

__all__ = ["PRESETS", "markdown", "run", "write", "main"]


def __getattr__(name):  # lazy, so that ``python -m pdeflow.benchmarks.worker`` does not import the suite first
    if name in ("PRESETS", "markdown", "run", "write"):
        from . import suite

        return getattr(suite, name)
    raise AttributeError(name)


def main(argv=None) -> int:
    """The command line; see ``python -m pdeflow.benchmarks --help``."""
    from .__main__ import main as _main

    return _main(argv)
