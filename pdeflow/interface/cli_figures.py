"""The figure options every command that draws shares: ``--format pdf|png|svg`` and ``--dpi``
(:mod:`pdeflow.analysis.plots.figures` is the one saving path they set)."""
from __future__ import annotations

import argparse

from ..analysis.plots.figures import DEFAULT_DPI, FORMATS


def add_figure_arguments(p: argparse.ArgumentParser) -> None:
    """Register ``--format`` and ``--dpi`` on ``p``."""
    p.add_argument("--format", choices=FORMATS, default="png",
                   help="file format of the figures (default png; pdf and svg are vector graphics for a paper)")
    p.add_argument("--dpi", type=float, default=DEFAULT_DPI,
                   help=f"resolution of raster figures and of the images inside vector ones (default {DEFAULT_DPI})")


def figure_dpi(args: argparse.Namespace) -> float:
    """``--dpi`` after its check: UsageError unless it is a positive number of at most 1200."""
    from .cli import UsageError

    if not 0 < args.dpi <= 1200:
        raise UsageError(f"--dpi must be in (0, 1200], got {args.dpi:g}")
    return float(args.dpi)


__all__ = ["add_figure_arguments", "figure_dpi"]
