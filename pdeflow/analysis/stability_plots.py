"""The figures of ``pdeflow stability`` (:mod:`pdeflow.analysis.stability`): the spectra of H0 and Htr per point, the
predicted against the measured rates, and the weight-decay sweep, drawn on matplotlib's Agg canvas (no pyplot).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.config import Config
from .stability import MEAN, SPREAD, StabilityResult


def figure_paths(out: Path) -> dict[str, Path]:
    """The PNG files written beside the output file."""
    stem = out.with_suffix("")
    return {name: stem.with_name(f"{stem.name}-{name}.png") for name in ("spectra", "rates", "sweep")}



def plot_stability(result: StabilityResult, cfg: Config, out: Path) -> list[Path]:
    """Spectra of H0 and Htr per point, predicted against measured rates, and the weight-decay sweep."""
    # matplotlib's Agg canvas, no pyplot: the caller's backend and pyplot's figure list stay as they were
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paths = figure_paths(out)
    written = []

    def figure(figsize: tuple[float, float]) -> Figure:
        fig = Figure(figsize=figsize)
        FigureCanvasAgg(fig)
        return fig

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(paths[name], dpi=120)
        written.append(paths[name])

    S = len(result.points)
    if S:
        fig = figure((4.2 * S, 3.6))
        axes = fig.subplots(1, S, squeeze=False)
        for ax, (i, a) in zip(axes[0], enumerate(result.points)):
            idx = np.arange(len(a.h0_values))
            ax.plot(idx, a.h0_values, "o", ms=3, label="H0 (frozen)")
            ax.plot(idx, a.htr_values, "x", ms=3, label="Htr (translation)")
            ax.axhline(0.0, color="k", lw=0.6)
            ax.set_title(f"point {i} ({a.origin}): {a.verdict}", fontsize=8)
            ax.set_xlabel("eigenvalue index")
            ax.set_ylabel("eigenvalue")
            ax.legend(fontsize=7)
        save(fig, "spectra")
    pairs = [(r.predicted[ax], r.measured[ax], ax) for runs in result.runs for r in runs for ax in (MEAN, SPREAD)]
    if result.sweep is not None:
        pairs += [(r.predicted[ax], r.measured[ax], ax) for r in result.sweep.runs for ax in (MEAN, SPREAD)]
    pairs = [p for p in pairs if np.isfinite(p[0]) and np.isfinite(p[1])]
    if pairs:
        fig = figure((4.5, 4.2))
        ax = fig.subplots()
        for axis, marker, label in ((MEAN, "o", "mean (-eig Htr)"), (SPREAD, "s", "spread (-eig H0)")):
            pr = np.array([p[0] for p in pairs if p[2] == axis])
            me = np.array([p[1] for p in pairs if p[2] == axis])
            ax.plot(pr, me, marker, mfc="none", label=label)
        lim = max(abs(p[0]) for p in pairs) * 1.1
        ax.plot([-lim, lim], [-lim, lim], "k-", lw=0.6)
        ax.set_xlabel("predicted rate")
        ax.set_ylabel("measured rate")
        ax.set_title("exponential rates of perturbations", fontsize=9)
        ax.legend(fontsize=7)
        save(fig, "rates")
    if result.sweep is not None and len(result.sweep.weight_decay):
        sw = result.sweep
        fig = figure((5.0, 3.8))
        ax = fig.subplots()
        ax.plot(sw.weight_decay, sw.predicted[:, SPREAD], "-", label="predicted  -lambda_min(H0)")
        ax.plot(sw.weight_decay, sw.measured[:, SPREAD], "o", mfc="none", label="measured (simulation)")
        ax.axhline(0.0, color="k", lw=0.6)
        ax.axvline(sw.lam_c_predicted, color="C2", ls="--", lw=0.8, label=f"lam_c = {sw.lam_c_predicted:.4f}")
        ax.set_xlabel("weight decay lam")
        ax.set_ylabel("growth rate of the zero head's perturbation")
        ax.legend(fontsize=7)
        save(fig, "sweep")
    return written
