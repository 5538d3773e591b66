"""The figures of ``pdeflow stability`` (:mod:`pdeflow.analysis.dirac.stability`): the spectra of H0 and Htr per
point, the
predicted against the measured rates, and the weight-decay sweep, drawn on matplotlib's Agg canvas (no pyplot).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import MaxNLocator

from ...core.config import Config
from ..linearised.minimum_rates import MinimumRates
from ..plots.figures import check_format, new_figure, save_figure
from .stability import MEAN, SPREAD, StabilityResult

# the predictions are drawn over the measurements: a dashed line under a solid one of the same path is hidden
MEASURED_Z, PREDICTED_Z = 2.0, 3.0


def figure_paths(out: Path, fmt: str = "png") -> dict[str, Path]:
    """The figure files written beside the output file, ``<OUT>-spectra.<fmt>`` and so on."""
    stem = out.with_suffix("")
    ext = check_format(fmt)
    return {name: stem.with_name(f"{stem.name}-{name}.{ext}") for name in ("spectra", "rates", "sweep")}


def plot_stability(result: StabilityResult, cfg: Config, out: Path, fmt: str = "png") -> list[Path]:
    """Spectra of H0 and Htr per point, predicted against measured rates (the line measured = predicted is the
    theory's), and the weight-decay sweep."""
    paths = figure_paths(out, fmt)
    written = []

    def save(fig, name: str) -> None:
        written.append(save_figure(fig, paths[name]))

    S = len(result.points)
    if S:
        fig, axes = new_figure(4.2 * S, 3.6, 1, S, squeeze=False)
        for ax, (i, a) in zip(axes[0], enumerate(result.points)):
            idx = np.arange(len(a.h0_values))
            ax.plot(idx, a.h0_values, "o", ms=3, label=r"$H_0$ (frozen)")
            ax.plot(idx, a.htr_values, "x", ms=3, label=r"$H_{\mathrm{tr}}$ (translation)")
            ax.axhline(0.0, color="k", lw=0.6)
            ax.set_title(f"point {i} ({a.origin}): {a.verdict}", fontsize=8)
            ax.set_xlabel("eigenvalue index")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))   # an index: no fractional ticks
            ax.set_ylabel("eigenvalue")
            ax.legend(fontsize=7)
        fig.suptitle(r"spectra of $H_0$ and $H_{\mathrm{tr}}$ at the stationary Diracs", fontsize=10)
        save(fig, "spectra")
    pairs = [(r.predicted[ax], r.measured[ax], ax) for runs in result.runs for r in runs for ax in (MEAN, SPREAD)]
    if result.sweep is not None:
        pairs += [(r.predicted[ax], r.measured[ax], ax) for r in result.sweep.runs for ax in (MEAN, SPREAD)]
    pairs = [p for p in pairs if np.isfinite(p[0]) and np.isfinite(p[1])]
    if pairs:
        fig, ax = new_figure(4.5, 4.2)
        lim = max(abs(p[0]) for p in pairs) * 1.1
        ax.plot([-lim, lim], [-lim, lim], "k-", lw=0.6, zorder=1, label="measured = predicted")
        # the larger open squares under the smaller filled circles: where both sit on one point, both show
        for axis, style, label in ((SPREAD, dict(marker="s", ms=9, mfc="none", mew=1.2, color="C1", zorder=2),
                                    r"spread ($-\lambda_{\min}(H_0)$)"),
                                   (MEAN, dict(marker="o", ms=4, color="C0", zorder=3),
                                    r"mean ($-\lambda_{\min}(H_{\mathrm{tr}})$)")):
            pr = np.array([p[0] for p in pairs if p[2] == axis])
            me = np.array([p[1] for p in pairs if p[2] == axis])
            if pr.size:
                ax.plot(pr, me, ls="none", label=label, **style)
        ax.set_xlabel("predicted rate")
        ax.set_ylabel("measured rate")
        ax.set_title("exponential rates of perturbations", fontsize=9)
        ax.legend(fontsize=7)
        fig.suptitle("Dirac measures: measured against predicted rates", fontsize=10)
        save(fig, "rates")
    if result.sweep is not None and len(result.sweep.weight_decay):
        sw = result.sweep
        fig, ax = new_figure(5.0, 3.8)
        ax.plot(sw.weight_decay, sw.predicted[:, SPREAD], "-", label=r"predicted $-\lambda_{\min}(H_0)$")
        ax.plot(sw.weight_decay, sw.measured[:, SPREAD], "o", mfc="none", label="measured (simulation)")
        ax.axhline(0.0, color="k", lw=0.6)
        ax.axvline(sw.lam_c_predicted, color="C2", ls="--", lw=0.8,
                   label=rf"$\lambda_c$ = {sw.lam_c_predicted:.4f}")
        ax.set_xlabel(r"weight decay $\lambda$")
        ax.set_ylabel("growth rate of the zero head's perturbation")
        ax.legend(fontsize=7)
        fig.suptitle("the zero head against the weight decay", fontsize=10)
        save(fig, "sweep")
    return written


def plot_minimum_rates(result: MinimumRates, path: Path) -> Path:
    """The perturbations of a local minimum (``pdeflow stability --stationary``): ``E - E*`` and the distance to the
    minimum against time for every run (a broad coloured line), each with its prediction drawn over it as a black
    dashed line (``2 lambda_min`` and ``lambda_min`` for the slowest direction, the linear flow's curve for a random
    one): where measurement and prediction agree the dashes lie on the run, visible."""
    fig, (ax_e, ax_d) = new_figure(10.0, 4.2, 1, 2)
    for j, run in enumerate(result.runs):
        color = f"C{j % 10}"
        t = np.asarray(run.times, dtype=float)
        for ax, measured, rate, curve in ((ax_e, run.excess, run.predicted_energy_rate, run.predicted_excess),
                                          (ax_d, run.distance, run.predicted_distance_rate, run.predicted_distance)):
            y = np.asarray(measured, dtype=float)
            ok = np.isfinite(y) & (y > 0)
            if not ok.any():
                continue
            ax.semilogy(t[ok], y[ok], "-", color=color, lw=3.0, alpha=0.6, zorder=MEASURED_Z, label=run.direction)
            predicted = np.asarray(curve, dtype=float)
            first_prediction = not any(line.get_zorder() == PREDICTED_Z for line in ax.get_lines())
            label = "predicted (black dashes)" if first_prediction else None
            if predicted.shape == t.shape and np.any(predicted > 0):
                good = np.isfinite(predicted) & (predicted > 0)
                ax.semilogy(t[good], predicted[good], "--", color="k", lw=1.0, zorder=PREDICTED_Z, label=label)
            elif np.isfinite(rate):
                first = int(np.argmax(ok))
                ax.semilogy(t, y[first] * np.exp(-rate * (t - t[first])), "--", color="k", lw=1.0,
                            zorder=PREDICTED_Z, label=label)
    lam = result.lambda_min
    ax_e.set_title(r"$E - E^*$: predicted decay $e^{-2\lambda_{\min} t}$ along the slowest mode", fontsize=9)
    ax_d.set_title(r"distance to the minimum: predicted $e^{-\lambda_{\min} t}$ along the slowest mode", fontsize=9)
    for ax, label in ((ax_e, r"$E - E^*$"), (ax_d, "distance (mass-weighted)")):
        ax.set_xlabel("$t$")
        ax.set_ylabel(label)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(rf"perturbations of the local minimum ($\lambda_{{\min}}$ = {lam:.4g}): measured and predicted "
                 "rates", fontsize=10)
    return save_figure(fig, path)
