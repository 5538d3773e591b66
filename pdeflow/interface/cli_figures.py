"""The figure options every command that draws shares: ``--format pdf|png|svg`` and ``--dpi``
(:mod:`pdeflow.analysis.plots.figures` is the one saving path they set)."""
from __future__ import annotations

import argparse

from ..analysis.plots.formats import DEFAULT_DPI, FORMATS


def figure_formats(text: str) -> tuple[str, ...]:
    """``--format`` of a command that writes each figure in several formats: ``png``, ``pdf,png``, ...; an
    argparse error naming the choices otherwise."""
    formats = tuple(dict.fromkeys(f.strip().lower() for f in text.split(",")))
    if not formats or any(f not in FORMATS for f in formats):
        raise argparse.ArgumentTypeError(f"{text!r}: each format must be one of {', '.join(FORMATS)} "
                                         "(comma-separated for several)")
    return formats


def add_figure_arguments(p: argparse.ArgumentParser, several: bool = False) -> None:
    """Register ``--format`` and ``--dpi`` on ``p``; with ``several``, ``--format`` takes a comma-separated list
    (``args.format`` a tuple: each figure written in each format)."""
    if several:
        p.add_argument("--format", type=figure_formats, default=("png",), metavar="FMT[,FMT...]",
                       help="file formats of the figures, comma-separated: each figure in each (default png; pdf "
                            "and svg are vector graphics for a paper; png,pdf writes both)")
    else:
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


__all__ = ["add_figure_arguments", "figure_dpi", "figure_formats"]
