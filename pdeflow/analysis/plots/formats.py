"""The figure formats and the default resolution, apart from matplotlib: the command line's parser reads them, and
importing matplotlib (about half a second) would otherwise be paid by every pdeflow process."""
from __future__ import annotations

FORMATS = ("png", "pdf", "svg")
DEFAULT_DPI = 150



def check_format(fmt: str) -> str:
    """``fmt`` lower-cased when it is one of FORMATS; ValueError naming the choices otherwise."""
    if fmt.lower() not in FORMATS:
        raise ValueError(f"figure format {fmt!r} is not one of {', '.join(FORMATS)}")
    return fmt.lower()


__all__ = ["FORMATS", "DEFAULT_DPI", "check_format"]
