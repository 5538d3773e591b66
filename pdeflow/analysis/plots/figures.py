"""The one figure-saving path of pdeflow: a headless figure with constrained layout, saved as PDF, PNG or SVG at a
chosen resolution, and the layout checks a figure fit for a paper passes.

Every figure of :mod:`pdeflow.analysis.plots.plotting`, :mod:`pdeflow.analysis.finite_heads.chaos_plots`,
:mod:`pdeflow.analysis.dirac.stability_plots` and the report is made by :func:`new_figure` and written by
:func:`save_figure`. The format is the file's suffix; the resolution of raster output is :func:`current_dpi`, set for
a block of figures by :func:`figure_output` (``pdeflow plot --format pdf --dpi 300``).

:func:`layout_problems` lists what would make a figure unfit: texts whose rendered boxes overlap or leave the
canvas, legend entries naming an artist with nothing drawn inside its axes.
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import Collection
from matplotlib.container import Container
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

from .formats import DEFAULT_DPI, FORMATS, check_format

# a box this many pixels inside another's edge still counts as touching, not overlapping (antialiasing)
TOLERANCE_PX = 1.0
# layouts run at most before a figure is saved, whether or not its axes have stopped moving (settle_layout)
LAYOUT_PASSES = 6


def new_figure(width: float = 6.4, height: float = 4.0, nrows: int = 1, ncols: int = 1, *,
               constrained: bool = True, **subplots) -> tuple[Figure, object]:
    """A figure on matplotlib's Agg canvas (no pyplot: the caller's backend stays) and its axes
    (``Figure.subplots(nrows, ncols, **subplots)``), laid out by the constrained layout engine unless
    ``constrained`` is false (movie frames, where a layout per frame would double the drawing time)."""
    fig = Figure(figsize=(width, height), layout="constrained" if constrained else None)
    FigureCanvasAgg(fig)
    if not constrained:
        fig.subplots_adjust(left=1.0 / width, right=1 - 0.25 / width, bottom=0.55 / height,
                            top=1 - 0.5 / height, wspace=0.35)
    return fig, fig.subplots(nrows, ncols, **subplots)


def current_dpi() -> float:
    """The resolution of raster figures: matplotlib's ``savefig.dpi`` when a block set it, else DEFAULT_DPI."""
    dpi = mpl.rcParams["savefig.dpi"]
    return DEFAULT_DPI if dpi == "figure" else float(dpi)


# the formats every figure saved inside a figure_output block is also written in (beside it, the same stem)
_ALSO_IN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("also_in", default=())


@contextlib.contextmanager
def figure_output(dpi: float | None = None, formats: tuple[str, ...] = ()) -> Iterator[None]:
    """The figures saved inside the block are rasterised at ``dpi`` (None: DEFAULT_DPI) and written in each of
    ``formats`` besides their own path's (the same stem): a figure is built, laid out and thinned once, whatever
    the number of formats."""
    token = _ALSO_IN.set(tuple(check_format(f) for f in formats))
    try:
        with mpl.rc_context({"savefig.dpi": float(dpi or DEFAULT_DPI)}):
            yield
    finally:
        _ALSO_IN.reset(token)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` in the format of its suffix at :func:`current_dpi`, after hiding the tick labels
    that would overlap a neighbour (:func:`thin_tick_labels`), and in each further format a :func:`figure_output`
    block names (``path`` with that suffix). The layout is settled once (:func:`settle_layout`) and then frozen:
    ``fig`` leaves with no layout engine, every format drawn once on that one layout. Returns the path."""
    path = Path(path)
    own = check_format(path.suffix.lstrip("."))
    # laid out at the raster resolution, so that the PNG's text is the one measured here (mathtext is parsed per dpi)
    fig.set_dpi(current_dpi())
    thin_tick_labels(fig)
    # frozen: every format gets the layout the tick labels were thinned on; without an engine (not even 'none')
    # savefig does not lay the figure out again in a draw of its own before each format
    with mpl.rc_context({"figure.autolayout": False, "figure.constrained_layout.use": False}):
        fig.set_layout_engine(None)
    for fmt in dict.fromkeys((own, *_ALSO_IN.get())):
        fig.savefig(path.with_suffix(f".{fmt}"), dpi=current_dpi(),
                    metadata={"Creator": "pdeflow"} if fmt != "png" else None)
    return path


def settle_layout(fig: Figure, passes: int = LAYOUT_PASSES) -> int:
    """Lay ``fig`` out without rendering until no axes moves by more than :data:`TOLERANCE_PX` (at most
    ``passes`` layouts; returns how many ran). One pass of the constrained layout engine is not always its fixed
    point: the axes it resizes get other ticks, whose labels need other margins (a colorbar beside maps with a
    suptitle above them settle on the fourth pass)."""
    def positions() -> np.ndarray:
        return np.array([ax.get_position().bounds for ax in fig.axes]).reshape(-1) * np.tile(
            fig.bbox.size, 2 * len(fig.axes))

    before = positions()
    for count in range(1, passes + 1):
        fig.draw_without_rendering()
        after = positions()
        if np.all(np.abs(after - before) <= TOLERANCE_PX):
            return count
        before = after
    return passes


def _drawn_tick_labels(axis) -> list[Text]:
    """The non-empty visible tick labels of ``axis`` whose tick lies inside the axes (what a draw shows)."""
    ax = axis.axes
    lo, hi = (ax.bbox.x0, ax.bbox.x1) if axis.axis_name == "x" else (ax.bbox.y0, ax.bbox.y1)
    j = 0 if axis.axis_name == "x" else 1
    labels = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        for label in (tick.label1, tick.label2):
            if not (label.get_visible() and label.get_text()):
                continue
            at = label.get_transform().transform(label.get_position())[j]
            if lo - TOLERANCE_PX <= at <= hi + TOLERANCE_PX:
                labels.append(label)
    return labels


def _overlap(a, b) -> bool:
    return (min(a.x1, b.x1) - max(a.x0, b.x0) > TOLERANCE_PX and min(a.y1, b.y1) - max(a.y0, b.y0) > TOLERANCE_PX)


def thin_tick_labels(fig: Figure) -> None:
    """Hide every tick label that overlaps one kept before it along its axis (a symlog axis puts "0" and
    ``10^-2`` side by side; a long tick label runs into the next)."""
    settle_layout(fig)   # the layout and the tick labels of the final size
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            labels = _drawn_tick_labels(axis)
            j = 0 if axis.axis_name == "x" else 1
            labels.sort(key=lambda t: t.get_transform().transform(t.get_position())[j])
            kept = []
            for label in labels:
                box = label.get_window_extent(renderer)
                if any(_overlap(box, k) for k in kept):
                    label.set_visible(False)
                else:
                    kept.append(box)


def _figure_texts(fig: Figure) -> list[Text]:
    """The visible, non-empty texts a draw of ``fig`` shows: titles, labels, legends, annotations, drawn ticks."""
    ticks = set()
    texts: list[Text] = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                ticks.update((id(tick.label1), id(tick.label2)))
            texts.extend(_drawn_tick_labels(axis))
    for t in fig.findobj(Text):
        if id(t) in ticks or not (t.get_visible() and t.get_text().strip()):
            continue
        texts.append(t)
    return texts


def _has_drawn_data(artist, ax) -> bool:
    """Whether ``artist`` draws at least one finite point inside the axes ``ax``."""
    if isinstance(artist, Container):
        return any(_has_drawn_data(a, ax) for a in artist.get_children() if a is not None)
    if isinstance(artist, Line2D):
        xy = np.asarray(artist.get_xydata(), dtype=float)
        if xy.size == 0:
            return False
        xy = xy[np.all(np.isfinite(xy), axis=1)]
        if xy.size == 0:
            return False
        if ax.get_yscale() == "log":
            xy = xy[xy[:, 1] > 0]
        if ax.get_xscale() == "log":
            xy = xy[xy[:, 0] > 0]
        if xy.size == 0:
            return False
        pts = artist.get_transform().transform(xy)
    elif isinstance(artist, Collection):
        offsets = np.asarray(artist.get_offsets(), dtype=float)
        if offsets.size == 0:
            return any(len(p.vertices) for p in artist.get_paths())
        pts = artist.get_offset_transform().transform(offsets[np.all(np.isfinite(offsets), axis=1)])
    elif isinstance(artist, Patch):
        return artist.get_visible()
    else:
        return True
    box = ax.bbox
    inside = ((pts[:, 0] >= box.x0 - TOLERANCE_PX) & (pts[:, 0] <= box.x1 + TOLERANCE_PX)
              & (pts[:, 1] >= box.y0 - TOLERANCE_PX) & (pts[:, 1] <= box.y1 + TOLERANCE_PX))
    return bool(np.any(inside))


def _data_lines(ax) -> list[Line2D]:
    """The lines of ``ax`` that draw data (not a reference line spanning the axes: axhline, axvline)."""
    lines = []
    for line in ax.get_lines():
        if not line.get_visible() or line.get_transform() != ax.transData:
            continue
        if _has_drawn_data(line, ax):
            lines.append(line)
    return lines


def _outside_math(text: str) -> str:
    """``text`` with its mathtext (``$...$``) removed."""
    return re.sub(r"\$[^$]*\$", " ", text)


def upright_time(text: str) -> bool:
    """Whether ``text`` writes the time ``t`` as a word outside mathtext (the figures write ``$t$``, italic)."""
    return bool(re.search(r"(?<![\w\\'])t(?![\w'])", _outside_math(text)))


def axis_problems(ax) -> list[str]:
    """What makes the axes ``ax`` hard to read, one line each, after a draw:

    - its title's box reaches its frame (a subscript below ``min`` collides with the top edge);
    - it draws data lines but has no y label;
    - an axis label writes the time ``t`` (or any single-letter symbol) upright outside mathtext, where the
      figures write ``$t$``;
    - an axis labelled an "index" or a count shows a fractional tick;
    - a drawn point of a data line lies farther from every labelled y tick than the widest gap between two labelled
      ticks (the points sit against an edge with no readable value near them), or fewer than two y ticks are
      labelled on a linear axis."""
    problems = []
    renderer = ax.figure.canvas.get_renderer()
    title = ax.title
    if title.get_visible() and title.get_text().strip():
        # a title's box ends a few points above the frame (matplotlib's pad); one touching it has a descender
        if title.get_window_extent(renderer).y0 < ax.bbox.y1 + 2 * TOLERANCE_PX:
            problems.append(f"title {title.get_text()!r} collides with the frame of its axes")
    lines = _data_lines(ax)
    if lines and not ax.get_ylabel().strip():
        problems.append(f"axes {ax.get_title() or ax.get_xlabel()!r} draw data but have no y label")
    if upright_time(ax.get_title()):
        problems.append(f"title {ax.get_title()!r} writes the time t upright (write $t$)")
    for axis in (ax.xaxis, ax.yaxis):
        label = axis.get_label().get_text()
        if upright_time(label) or re.fullmatch(r"\s*[A-Za-z]\s*", _outside_math(label)):
            problems.append(f"axis label {label!r} writes a symbol upright (write it as mathtext, e.g. $t$)")
        if re.search(r"\b(index|count)$", label.strip()):
            lo, hi = sorted(axis.get_view_interval())
            ticks = [v for v in axis.get_majorticklocs() if lo - 1e-9 <= v <= hi + 1e-9]
            if any(abs(v - round(v)) > 1e-9 for v in ticks):
                problems.append(f"axis {label!r} counts but shows fractional ticks")
    if lines:
        labelled = [t.get_transform().transform(t.get_position())[1] for t in _drawn_tick_labels(ax.yaxis)]
        labelled = sorted(set(np.round(labelled, 1)))
        if len(labelled) < 2 and ax.get_yscale() == "linear":
            problems.append(f"y axis {ax.get_ylabel()!r} labels fewer than two ticks")
        elif len(labelled) >= 2:
            gap = float(np.max(np.diff(labelled)))
            ys = np.concatenate([line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))[:, 1]
                                 for line in lines])
            ys = ys[np.isfinite(ys) & (ys >= ax.bbox.y0 - TOLERANCE_PX) & (ys <= ax.bbox.y1 + TOLERANCE_PX)]
            far = np.min(np.abs(ys[:, None] - np.asarray(labelled)[None, :]), axis=1) if ys.size else ys
            if far.size and float(far.max()) > gap + TOLERANCE_PX:
                problems.append(f"y axis {ax.get_ylabel()!r}: drawn points lie {far.max():.0f} px from every "
                                f"labelled tick (ticks {gap:.0f} px apart)")
    return problems


def layout_problems(fig: Figure) -> list[str]:
    """What makes ``fig`` unfit for a paper, one line each (empty when fit), after a draw:

    - two texts (titles, axis and tick labels, legend entries, annotations) whose rendered boxes overlap;
    - a text whose box leaves the canvas (a clipped colorbar label);
    - a legend entry whose artist draws no finite point inside its axes;
    - an axes hard to read (:func:`axis_problems`)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    problems = []
    texts = _figure_texts(fig)
    boxes = [t.get_window_extent(renderer) for t in texts]
    canvas = fig.bbox
    for a, (t, box) in enumerate(zip(texts, boxes)):
        if (box.x0 < canvas.x0 - TOLERANCE_PX or box.y0 < canvas.y0 - TOLERANCE_PX
                or box.x1 > canvas.x1 + TOLERANCE_PX or box.y1 > canvas.y1 + TOLERANCE_PX):
            problems.append(f"text {t.get_text()!r} is clipped by the canvas")
        for u, other in zip(texts[a + 1:], boxes[a + 1:]):
            if _overlap(box, other):
                problems.append(f"texts {t.get_text()!r} and {u.get_text()!r} overlap")
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        handles, labels = ax.get_legend_handles_labels()
        by_label = dict(zip(labels, handles))
        for text in legend.get_texts():
            artist = by_label.get(text.get_text())
            if artist is not None and not _has_drawn_data(artist, ax):
                problems.append(f"legend entry {text.get_text()!r} names nothing drawn")
    for ax in fig.axes:
        problems += axis_problems(ax)
    suptitle = fig.get_suptitle() if hasattr(fig, "get_suptitle") else getattr(fig, "_suptitle", None)
    text = suptitle if isinstance(suptitle, str) else (suptitle.get_text() if suptitle is not None else "")
    if upright_time(text):
        problems.append(f"title {text!r} writes the time t upright (write $t$)")
    return problems


__all__ = ["FORMATS", "DEFAULT_DPI", "new_figure", "save_figure", "figure_output", "current_dpi", "check_format",
           "thin_tick_labels", "layout_problems", "axis_problems", "upright_time"]
