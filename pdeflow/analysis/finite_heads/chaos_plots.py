"""The figure of ``pdeflow chaos`` (:mod:`pdeflow.analysis.finite_heads.chaos`): the measured distances against N and
t with their
fitted rates, drawn on matplotlib's Agg canvas (no pyplot).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..plots.figures import new_figure, save_figure
from .chaos import ChaosResult

# propagation of chaos and the static approximation: distances of order N^(-1/2) (docs/model.md)
PREDICTED_SLOPE = -0.5


def plot_result(path: str | Path, result: ChaosResult) -> None:
    """Four panels (format of ``path``'s suffix): the coupling distance, logit gap and sliced W2 against N at t_end
    (every seed, the geometric mean over seeds - the level the log-log fits see - and the fits); D_N(t) per N (a
    note instead where the horizon is the only time measured after t = 0); the
    SGD excess against eta per N; the static gap against N (every draw, the mean and RMS over draws, their fits).
    The predicted ``N^(-1/2)`` is a dotted reference line through the first N's level on the N panels."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    d, n, eta = result.data, result.n_list, result.eta_list
    fig, ax = new_figure(11, 8.5, 2, 2)

    def geomean(y: np.ndarray, axis: int) -> np.ndarray:
        return np.exp(np.mean(np.log(y), axis=axis))

    def fitted(axis, x, name, color):
        fit = result.fits.get(name)
        if fit is not None:
            xs = np.geomspace(x.min(), x.max(), 50)
            axis.plot(xs, fit.prefactor * xs**fit.slope, "--", color=color, lw=1,
                      label=f"fit: slope {fit.slope:+.2f} [{fit.ci[0]:+.2f}, {fit.ci[1]:+.2f}]")

    def predicted(axis, x, level):
        if np.isfinite(level) and level > 0 and len(x) > 1:
            axis.plot(x, level * (x / x[0]) ** PREDICTED_SLOPE, ":", color="k", lw=1,
                      label=r"prediction $\propto N^{-1/2}$")

    def ticks(axis, values):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.xaxis.set_major_locator(FixedLocator(values))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.xaxis.set_major_formatter(ScalarFormatter())

    a = ax[0, 0]
    for (name, label), color in zip((("coupling", "coupling distance"), ("logit_gap", "logit gap"),
                                     ("sliced_w2", "sliced W2 (beside)")), ("C0", "C3", "C2")):
        y = d[name][:, :, -1]
        a.plot(np.repeat(n, y.shape[1]), y.ravel(), "o", color=color, alpha=0.25, ms=3)
        a.plot(n, geomean(y, 1), "o-", color=color, label=f"{label} (geometric mean over seeds)")
        fitted(a, n.astype(float), name, color)
    predicted(a, n.astype(float), float(geomean(d["coupling"][:, :, -1], 1)[0]))
    ticks(a, n)
    a.set_xlabel("$N$ (heads)")
    a.set_ylabel("distance to the mean-field limit")
    a.set_title(f"$N$ heads against the mean-field limit at $t$ = {result.times[-1]:g}")
    a.legend(fontsize=7)
    a = ax[0, 1]
    if len(result.times) > 2:
        for k, nn in enumerate(n):
            a.semilogy(result.times[1:], geomean(d["coupling"][k, :, 1:], 0), "o-", ms=3, label=f"N = {nn}")
        a.set_xlabel("$t$")
        a.set_ylabel("coupling distance (geometric mean over seeds)")
        a.legend(fontsize=7)
    else:  # one point per N, the first panel's: no curve to draw, and an axis around one time would suggest one
        a.set_axis_off()
        a.text(0.5, 0.5, f"measured at one time only, t = {result.times[-1]:g}\n(the horizon, the first panel's)"
               "\n\na curve over time needs frames before it:\nrun.frame_interval < chaos.t_end",
               transform=a.transAxes, ha="center", va="center", fontsize=9)
    a.set_title("coupling distance over time")
    a = ax[1, 0]
    for k, nn in enumerate(n):
        a.plot(eta, geomean(d["sgd_excess"][k, :, :, -1], 0), "o-", ms=3, label=f"N = {nn}")
    fitted(a, eta, "sgd_eta", "k")
    ticks(a, eta)
    a.set_xlabel(r"$\eta$ (SGD step, mean-field time)")
    a.set_ylabel("SGD excess over the flow (geometric mean over seeds)")
    a.set_title(f"SGD against the finite-head flow at $t$ = {result.times[-1]:g}")
    a.legend(fontsize=7)
    a = ax[1, 1]
    g = d["static_gap"]
    a.plot(np.repeat(n, g.shape[1]), np.abs(g.ravel()), ".", color="C1", alpha=0.3, label="|gap| per draw")
    a.plot(n, np.sqrt(np.mean(g**2, axis=1)), "o-", color="C0", label="rms over draws")
    fitted(a, n.astype(float), "static", "C0")
    predicted(a, n.astype(float), float(np.sqrt(np.mean(g[0] ** 2))))
    mean = g.mean(axis=1)
    a.errorbar(n, np.where(mean > 0, mean, np.nan), yerr=g.std(axis=1, ddof=1) / math.sqrt(g.shape[1]), fmt="s",
               color="C3", ms=4, capsize=3, label=r"mean over draws ($\pm$ s.e.)")
    fitted(a, n.astype(float), "static_mean", "C3")
    ticks(a, n)
    a.set_xlabel("$N$ (heads)")
    a.set_ylabel(r"$E(\hat\rho_N) - E(\rho_{\mathrm{ref}})$")
    a.set_title(f"static approximation at $t$ = {result.attrs.get('converge_time', float('nan')):g}")
    a.legend(fontsize=7)
    fig.suptitle("propagation of chaos: finite heads and SGD against the mean-field flow")
    save_figure(fig, path)
