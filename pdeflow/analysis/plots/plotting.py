"""Figures and movies of a trajectory and its analysis, headless (matplotlib's Agg canvas, no pyplot).

One function per figure, each ``(traj, analysis, path, ...) -> Path`` writing one file in the format of the path's
suffix (PDF, PNG or SVG; :mod:`pdeflow.analysis.plots.figures`, the one saving path, also sets the resolution):

- :func:`plot_energy`: ``E - E*`` and the dissipation ``I`` against time (log scale), with the lower bound;
- :func:`plot_energy_identity`: the residual of the energy identity ``E(t) - E(0) + int_0^t I ds`` against time;
- :func:`plot_gap`: the optimality gap G at the frames where it was computed, E and E - G;
- :func:`plot_pl`: the PL ratio ``mu(t) = I / (2 (E - E*))`` and, at a given stationary point, the theory's limit;
- :func:`plot_kl`: ``log I`` against ``log(E - E*)``, and the local exponent theta(t) over the window with the range
  holding it and the theory's value;
- :func:`plot_particles`: the particles of a frame in two coordinates (chosen, or the two principal axes of
  the whole trajectory), coloured by ``Phi(omega_i; rho)`` and sized by mass; for k = 1, Phi on Omega;
- :func:`plot_density`: a grid run's density (k = 1 a curve, k = 2 a heat map, k = 3 the marginal of the
  first two axes);
- :func:`plot_attention`: attention maps of the representative heads of the heaviest clusters;
- :func:`animate_measure`: the measure over the frames, a GIF (Pillow) and an MP4 where ffmpeg exists;
- :func:`plot_spectrum`: E, I and ``lambda_min`` of S over a log time axis, the phases near saddles shaded
  (:mod:`pdeflow.analysis.convergence.spectral`).

:func:`plot_all` writes every figure the file supports into a folder.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import animation
from matplotlib.figure import Figure

from ...core.problem import task_params
from ...core.tasks import TaskError, make_task
from ...io.trajectory import Trajectory
from ..convergence.spectral import DEGENERATE, DESCENT, MINIMUM, phase_spans
from ..diagnostics import (
    Analysis,
    attention_pattern,
    energy_identity_residual,
    frame_measure,
    kl_fit,
    pl_constant,
    trajectory_grid,
    trusted_excess,
)
from .figures import check_format, current_dpi, figure_output, new_figure, save_figure

MAX_ANIMATION_FRAMES = 120
# at most this many tick labels along an attention map's axis (every n-th position beyond)
MAX_ATTENTION_TICKS = 16


def _figure(width: float = 6.4, height: float = 4.0, ncols: int = 1, *, constrained: bool = True):
    return new_figure(width, height, 1, ncols, constrained=constrained)


def _save(fig: Figure, path: str | Path) -> Path:
    return save_figure(fig, path)


def _steps(traj: Trajectory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time, energy and dissipation of every step (the frames when the file has no step rows)."""
    s = traj.steps
    if len(s.get("time", ())) >= 2:
        return (np.asarray(s["time"], dtype=float), np.asarray(s["energy"], dtype=float),
                np.asarray(s["dissipation"], dtype=float))
    return tuple(np.asarray(traj.frames[c], dtype=float) for c in ("time", "energy", "dissipation"))


def time_axis(ax, t: np.ndarray) -> str:
    """Set a log time axis (``symlog``, linear below the first positive time, so t = 0 stays) when the positive
    times span more than two decades (a long run with log-spaced frames); returns the scale set."""
    pos = np.asarray(t, dtype=float)
    pos = pos[np.isfinite(pos) & (pos > 0)]
    if pos.size and pos.max() > 100.0 * pos.min():
        ax.set_xscale("symlog", linthresh=float(pos.min()))
        return "symlog"
    return "linear"


def math_t(text: str) -> str:
    """A command's sentence (``over t in [a, b]``) as a figure writes it: the time ``t`` as mathtext ``$t$``
    outside what is already mathtext."""
    parts = re.split(r"(\$[^$]*\$)", text)
    return "".join(p if p.startswith("$") else re.sub(r"(?<![\w\\'])t(?![\w'])", "$t$", p) for p in parts)


def _title(traj: Trajectory, what: str) -> str:
    return f"{what} - {traj.path.name} ({traj.attrs.get('method', '?')}, {traj.measure})"


def plot_energy(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """``E - E*`` (or E when E* is unknown) and ``I`` against time, log scale; a log time axis over decades."""
    t, e, i = _steps(traj)
    fig, (ax_e, ax_i) = _figure(10, 4, 2)
    e_star = analysis.e_star
    if math.isfinite(e_star) and np.any(e - e_star > 0):
        ok = e - e_star > 0
        ax_e.semilogy(t[ok], (e - e_star)[ok], lw=1.2, label=r"$E - E^*$")
        ax_e.semilogy(analysis.time, np.where(analysis.energy > e_star, analysis.energy - e_star, np.nan), "o",
                      ms=3, label="frames")
        if np.any(analysis.kl_predicted > 0):
            ax_e.semilogy(analysis.time, np.where(analysis.kl_predicted > 0, analysis.kl_predicted, np.nan), "--",
                          color="C3", label=rf"KL prediction ($\theta$ = {analysis.kl_theta:.3f})")
        # the gap G is drawn on its own axis (gap.png): it bounds E - E* only where certified, and is no E - E*
        ax_e.set_ylabel(r"$E - E^*$")
        ax_e.set_title(f"$E^*$ = {e_star:.10g} ({analysis.e_star_text})", fontsize=9)
    else:
        ax_e.plot(t, e, lw=1.2, label="$E$")
        ax_e.set_ylabel("energy $E$")
    ax_e.set_xlabel("$t$")
    ax_e.legend(fontsize=8)
    pos = i > 0
    ax_i.semilogy(t[pos], i[pos], lw=1.2, color="C3", label="dissipation $I$")
    if math.isfinite(analysis.stationary_time):
        ax_i.axvline(analysis.stationary_time, color="k", ls=":", label="stationary")
    ax_i.set_xlabel("$t$")
    for ax in (ax_e, ax_i):
        time_axis(ax, t)
    ax_i.set_ylabel("$I$")
    ax_i.set_title(r"dissipation $I = \int |\nabla\Phi|^2\,d\rho$", fontsize=9)
    ax_i.legend(fontsize=8)
    fig.suptitle(_title(traj, "energy and dissipation"))
    return _save(fig, path)


def plot_gap(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """The gap G at the frames where it was computed (log scale when positive), and E with E - G; markers only
    (a line through a handful of gaps would suggest values between them), legend entries only for drawn ones."""
    gf = analysis.gap_frames
    fig, (ax_g, ax_b) = _figure(10, 4, 2)
    tg, g = analysis.time[gf], analysis.gap[gf]
    certified = analysis.gap_certified[gf].astype(bool)
    if np.all(g > 0):
        ax_g.set_yscale("log")
    bound = analysis.gap_bound[gf]
    series = ((certified, g, "o", r"$G$ found ($\min\Phi$ certified)"),
              (certified & np.isfinite(bound), bound, "v", "certified upper bound on $G$"),
              (~certified, g, "^", "estimate (non-exhaustive search)"))
    for shown, values, marker, label in series:
        drawn = shown & np.isfinite(values) & ((values > 0) if ax_g.get_yscale() == "log" else True)
        if drawn.any():
            ax_g.plot(tg[drawn], values[drawn], marker, ls="none", label=label)
    ax_g.set_xlabel("$t$")
    ax_g.set_ylabel("$G$")
    ax_g.set_title(r"$G = \int \Phi\, d\rho - \min\,\Phi$, the minimum over $\Omega$", fontsize=9)
    if ax_g.get_legend_handles_labels()[0]:
        ax_g.legend(fontsize=8)
    ax_b.plot(analysis.time, analysis.energy, "-", label="$E$")
    lower = analysis.lower_bound[gf]
    if np.any(np.isfinite(lower)):
        ax_b.plot(tg, lower, "s", ls="none", label=r"$E - G$ (certified lower bound on $\Omega$)")
    ax_b.set_xlabel("$t$")
    ax_b.set_ylabel(r"energy $E$ and $E - G$")
    ax_b.legend(fontsize=8)
    radius = f" {analysis.gap_radius:g}" if math.isfinite(analysis.gap_radius) else ""
    fig.suptitle(_title(traj, rf"optimality gap, $\Omega$ = {analysis.gap_domain}{radius}"))
    return _save(fig, path)


def plot_energy_identity(traj: Trajectory, analysis: Analysis | None, path: str | Path) -> Path:
    """The residual ``r(t) = E(t) - E(0) + int_0^t I ds`` of the energy identity ``dE/dt = -I`` over the steps
    (the run's own stage quadrature where stored, else the trapezoid rule:
    :func:`pdeflow.analysis.diagnostics.energy_identity_residual`), relative to the energy decrease
    ``E(0) - E(t)``; zero for the exact flow, of the stepper's order for a discretised one."""
    t, e, i = _steps(traj)
    integral = traj.steps.get("dissipation_integral")
    own = integral is not None and len(integral) == len(t)
    residual = energy_identity_residual(t, e, i, np.asarray(integral, dtype=float) if own else None)
    fig, (ax_r, ax_d) = _figure(10, 4, 2)
    ok = np.abs(residual) > 0
    ax_r.semilogy(t[ok], np.abs(residual[ok]), lw=1.2, label=r"$|r(t)|$")
    ax_r.set_xlabel("$t$")
    ax_r.set_ylabel(r"$|E(t) - E(0) + \int_0^t I\,ds|$")
    quadrature = "the stepper's stage quadrature" if own else "trapezoid rule on the steps"
    ax_r.set_title(f"energy identity residual ({quadrature})", fontsize=9)
    drop = e[0] - e
    rel = np.where(drop > 0, np.abs(residual) / np.where(drop > 0, drop, 1.0), np.nan)
    ok = np.isfinite(rel) & (rel > 0)
    ax_d.semilogy(t[ok], rel[ok], lw=1.2, color="C3", label=r"$|r(t)| / (E(0) - E(t))$")
    ax_d.set_xlabel("$t$")
    ax_d.set_ylabel("relative residual")
    ax_d.set_title("relative to the energy decrease", fontsize=9)
    for ax in (ax_r, ax_d):
        time_axis(ax, t)
    fig.suptitle(_title(traj, r"energy identity $dE/dt = -I$"))
    return _save(fig, path)


def _window_samples(traj: Trajectory, analysis: Analysis) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Time, energy and dissipation of every step, and which lie in the window of the rates (``t >= start``)."""
    t, e, i = _steps(traj)
    start = analysis.kl_window_start
    return t, e, i, (t >= start - 1e-12 * max(1.0, abs(start))) if math.isfinite(start) else np.zeros(t.shape, bool)


def plot_pl(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """``mu(t) = I / (2 (E - E*))`` at every step and frame where E - E* is trustworthy, the window of the rates
    marked, and the theory's ``lambda_min`` at a given stationary point (the limit along the slowest mode and the
    bound near it) drawn beside it."""
    t, e, i, win = _window_samples(traj, analysis)
    mu = pl_constant(e, i, analysis.e_star)
    mu[~trusted_excess(e, (analysis.e_star_low, analysis.e_star_high))] = np.nan   # E - E* not known well enough
    fig, ax = _figure()
    ok = mu > 0
    ax.semilogy(t[ok], mu[ok], lw=1.0, color="0.6", label="steps")
    ax.semilogy(t[ok & win], mu[ok & win], lw=1.4, color="C0", label="window of the rates")
    fm = analysis.pl_mu
    ax.semilogy(analysis.time[fm > 0], fm[fm > 0], "o", ms=3, color="C0", label="frames")
    if math.isfinite(analysis.predicted_mu):
        last = analysis.pl_mu_last
        ratio = f", measured / theory {last / analysis.predicted_mu:.3g} at the end" if math.isfinite(last) else ""
        ax.axhline(analysis.predicted_mu, color="C3", ls="--",
                   label=rf"theory: $\lambda_{{\min}}$ = {analysis.predicted_mu:.4g} (limit, bound near the point)"
                         + ratio)
    elif analysis.prediction:
        ax.set_title(math_t(analysis.prediction), fontsize=7, wrap=True)
    ax.set_xlabel("$t$")
    ax.set_ylabel(r"$\mu = I\,/\,(2\,(E - E^*))$")
    ax.legend(fontsize=7)
    if not ax.get_title():
        ax.set_title(f"$E^*$ = {analysis.e_star:.10g} ({analysis.e_star_text})", fontsize=9)
    fig.suptitle(_title(traj, "PL ratio"))
    return _save(fig, path)


def plot_kl(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """Left: ``I`` against ``E - E*`` on log-log axes, the window highlighted, the line ``C (E - E*)^(2 (1 - theta))``
    where one theta is established. Right: the local exponent ``theta(t) = 1 - (1/2) d ln I / d ln(E - E*)`` over the
    window (its secants, :func:`pdeflow.analysis.convergence.rates.local_exponent`), the range that holds it, and the
    theory's 1/2 at a given stationary point."""
    t, e, i, win = _window_samples(traj, analysis)
    fig, (ax, ax_t) = _figure(11, 4.2, 2)
    excess = e - analysis.e_star
    ok = (excess > 0) & (i > 0)
    ax.loglog(excess[ok], i[ok], ".", ms=3, color="0.6", label="all steps")
    win = win & ok
    ax.loglog(excess[win], i[win], ".", ms=4, color="C0", label="window")
    if math.isfinite(analysis.kl_theta) and win.any():
        x = np.geomspace(excess[win].min(), excess[win].max(), 50)
        lo, hi = analysis.kl_theta_range
        ax.loglog(x, analysis.kl_constant * x ** (2 * (1 - analysis.kl_theta)), "-", color="C3",
                  label=rf"$\theta$ = {analysis.kl_theta:.4f}; $\theta(t)$ in [{lo:.4f}, {hi:.4f}]")
    ax.set_xlabel(r"$E - E^*$")
    ax.set_ylabel(r"$I = \int |\nabla\Phi|^2\,d\rho$")
    ax.legend(fontsize=7)
    refused = analysis.kl_status.startswith("refused")
    fit = None if refused or not win.any() else kl_fit(e[win], i[win], analysis.e_star, time=t[win],
                                                        e_star_range=(analysis.e_star_low, analysis.e_star_high))
    if fit is not None and fit.local is not None:
        local = fit.local
        ax_t.plot(local.time, local.theta, "o-", ms=3, color="C0", label=r"$\theta(t)$, secants")
        ax_t.axhspan(local.low, local.high, color="C0", alpha=0.15, label=r"range holding $\theta(t)$ (window, $E^*$)")
    if math.isfinite(analysis.predicted_theta):
        ax_t.axhline(analysis.predicted_theta, color="C3", ls="--",
                     label=f"theory: {analysis.predicted_theta:g} at the stationary point")
    ax_t.set_xlabel("$t$")
    ax_t.set_ylabel(r"local exponent $\theta(t)$")
    if ax_t.lines:
        ax_t.legend(fontsize=7)
    ax_t.set_title(math_t(analysis.kl_status) or "not computed", fontsize=7, wrap=True)
    fig.suptitle(_title(traj, "Kurdyka-Lojasiewicz exponent"))
    return _save(fig, path)


def projection(traj: Trajectory, coords: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """An affine map omega -> 2 plotting coordinates ``(origin [k], axes [k, 2], labels)``: the chosen
    coordinates, the identity for k = 2, or the two principal axes of all frames' particles (mass-weighted)."""
    omega = np.asarray(traj.frames["omega"], dtype=float)
    mass = np.asarray(traj.frames["mass"], dtype=float)
    k = omega.shape[-1]
    if coords is not None or k == 2:
        c = list(coords) if coords is not None else [0, 1]
        axes = np.zeros((k, 2))
        axes[c[0], 0] = axes[c[1], 1] = 1.0
        return np.zeros(k), axes, [f"$\\omega_{c[0]}$", f"$\\omega_{c[1]}$"]
    pts, w = omega.reshape(-1, k), mass.reshape(-1)
    w = w / w.sum()
    origin = w @ pts
    _, sv, vt = np.linalg.svd((pts - origin) * np.sqrt(w)[:, None], full_matrices=False)
    share = sv ** 2 / max(float(np.sum(sv ** 2)), 1e-300)
    return origin, vt[:2].T, [f"PC{j + 1} ({100 * share[j]:.0f}% of the variance)" for j in range(2)]


def _phi_at(traj: Trajectory, index: int, query: np.ndarray) -> np.ndarray:
    omega, mass = frame_measure(traj, index)
    return traj.problem().phi(query, omega, mass)


def plot_particles(traj: Trajectory, analysis: Analysis | None, path: str | Path, frame: int = -1,
                   coords: Sequence[int] | None = None, radius: float | None = None) -> Path:
    """The particles of a frame coloured by ``Phi(omega_i; rho)``, sized by mass; for k = 1 the curve of
    Phi over ``[-radius, radius]`` (the gap's domain) with the particles on it."""
    index = frame % len(traj.time)
    omega, mass = frame_measure(traj, index)
    phi = _phi_at(traj, index, omega)
    fig, ax = _figure(6.4, 4.8)
    size = 8 + 60 * mass / max(float(mass.max()), 1e-300)
    if omega.shape[1] == 1:
        r = radius or (analysis.gap_radius if analysis is not None and math.isfinite(analysis.gap_radius) else None)
        r = r or 1.2 * float(np.abs(omega).max() + 1e-12)
        xs = np.linspace(-r, r, 400)[:, None]
        ax.plot(xs[:, 0], _phi_at(traj, index, xs), "-", color="0.5", label=r"$\Phi(\omega; \rho)$")
        sc = ax.scatter(omega[:, 0], phi, c=phi, s=size, cmap="viridis", zorder=3)
        if analysis is not None and np.isfinite(analysis.minimizer[index]).all():
            ax.axvline(analysis.minimizer[index, 0], color="C3", ls=":", label=r"argmin $\Phi$")
        ax.set_xlabel(r"$\omega$")
        ax.set_ylabel(r"$\Phi$")
        ax.legend(fontsize=8)
    else:
        origin, axes, labels = projection(traj, coords)
        xy = (omega - origin) @ axes
        sc = ax.scatter(xy[:, 0], xy[:, 1], c=phi, s=size, cmap="viridis")
        if analysis is not None and np.isfinite(analysis.minimizer[index]).all():
            m = (analysis.minimizer[index] - origin) @ axes
            ax.plot(m[0], m[1], "r*", ms=12, label=r"argmin $\Phi$ on $\Omega$")
            ax.legend(fontsize=8)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
    fig.colorbar(sc, ax=ax, label=r"$\Phi(\omega_i; \rho)$")
    fig.suptitle(_title(traj, f"particles at $t$ = {traj.time[index]:.4g}"))
    return _save(fig, path)


def _grid_image(traj: Trajectory, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A frame's density as (values, lower, upper): 1-D as is, 2-D as is, 3-D summed over the third axis
    (times its cell width: the marginal density of the first two coordinates)."""
    grid = trajectory_grid(traj)
    density = np.asarray(traj.frames["density"][index], dtype=float)
    if density.ndim == 3:
        density = density.sum(axis=2) * grid.width[2]
    return density, np.array(grid.lower), np.array(grid.upper)


def _draw_density(ax, traj: Trajectory, index: int):
    density, lower, upper = _grid_image(traj, index)
    if density.ndim == 1:
        ax.plot(trajectory_grid(traj).axes[0], density, "-")
        ax.set_xlabel(r"$\omega$")
        ax.set_ylabel("density")
        return None
    im = ax.imshow(density.T, origin="lower", extent=(lower[0], upper[0], lower[1], upper[1]), aspect="auto",
                   cmap="magma")
    ax.set_xlabel(r"$\omega_0$")
    ax.set_ylabel(r"$\omega_1$")
    return im


def plot_density(traj: Trajectory, path: str | Path, frame: int = -1) -> Path:
    """A grid run's density at a frame: a curve (k = 1), a heat map (k = 2) or the (omega_0, omega_1) marginal."""
    index = frame % len(traj.time)
    fig, ax = _figure(6.4, 4.8)
    im = _draw_density(ax, traj, index)
    if im is not None:
        fig.colorbar(im, ax=ax, label="density")
    fig.suptitle(_title(traj, f"density at $t$ = {traj.time[index]:.4g}"))
    return _save(fig, path)


def token_labels(traj: Trajectory, tokens: np.ndarray) -> list[str]:
    """How the tokens [T] read: the characters of a ``text`` task, token ids otherwise (or when the text file is
    not found). The file stores the config, not the alphabet: the text is looked for at the config's path as
    written, then beside the trajectory file, then from the folder of the shipped configs (where relative paths of
    ``data/configs/*.toml`` point from)."""
    cfg = traj.config
    if cfg.task.name == "text":
        t = cfg.task
        params = task_params(cfg)
        written = Path(t.path)
        shipped = Path(__file__).resolve().parents[2] / "data" / "configs"
        for candidate in (written, traj.path.parent / written, shipped / written):
            if not candidate.is_file():
                continue
            try:
                task = make_task("text", vocab_size=t.vocab_size, seq_len=t.seq_len, exact=t.exact,
                                 n_samples=t.n_samples, seed=t.seed, **{**params, "path": str(candidate)})
            except (TaskError, OSError, ValueError):
                continue
            if task.alphabet is not None and len(task.alphabet) > int(np.max(tokens)):
                return [_visible(task.alphabet[int(tok)]) for tok in tokens]
    return [str(int(tok)) for tok in tokens]


def _visible(ch: str) -> str:
    """A character as a tick label shows it: whitespace named, mathtext's specials escaped."""
    names = {" ": "\u2423", "\n": "\u21b5", "\t": "\u21e5", "$": "\\$"}  # a lone "$" would start mathtext
    return names.get(ch, ch)


def _attention_ticks(ax, labels: list[str]) -> None:
    """Every position's token on both axes (every n-th beyond MAX_ATTENTION_TICKS); long labels turned upright."""
    step = max(1, math.ceil(len(labels) / MAX_ATTENTION_TICKS))
    pos = list(range(0, len(labels), step))
    shown = [labels[j] for j in pos]
    ax.set_xticks(pos, shown, rotation=90 if max(map(len, shown)) > 1 else 0)
    ax.set_yticks(pos, shown)


def plot_attention(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """Attention maps ``a[l, j]`` of the representative heads of the heaviest clusters on the probe sequence, its
    tokens (characters for a text task) along both axes, in order of position."""
    c = analysis.clusters
    maps = c.attention
    if maps.shape[0] == 0:
        problem = traj.problem()
        omega, _ = frame_measure(traj, c.frame)
        maps = attention_pattern(problem, problem.theta(omega[c.representative[:1]]), c.probe)
    n = maps.shape[0]
    fig, axes = _figure(2.9 * n + 1.2, 3.6, n)
    axes = np.atleast_1d(axes)
    labels = token_labels(traj, c.probe)
    for j, ax in enumerate(axes):
        im = ax.imshow(maps[j], vmin=0, vmax=1, cmap="Blues")
        _attention_ticks(ax, labels)
        ax.set_xlabel("key $j$ (token)")
        if j == 0:
            ax.set_ylabel("query $l$ (token)")
        heads = int(c.size[j])
        ax.set_title(f"cluster {j}: mass {c.mass[j]:.3g}\n{heads} head{'s' if heads != 1 else ''}", fontsize=9)
    fig.colorbar(im, ax=list(axes), label="attention $a[l, j]$")
    clusters = len(c.mass)
    fig.suptitle(f"attention of representative heads, {clusters} cluster{'s' if clusters != 1 else ''}\n"
                 f"{traj.path.name} ({traj.attrs.get('method', '?')}, {traj.measure})", fontsize=10)
    return _save(fig, path)


def animate_measure(traj: Trajectory, path: str | Path, coords: Sequence[int] | None = None, fps: int = 5,
                    mp4: bool = True) -> list[Path]:
    """The measure over the frames (at most MAX_ANIMATION_FRAMES, evenly chosen): particles in the
    coordinates of :func:`projection` coloured by Phi, or the grid density. Writes ``path`` as a GIF with
    Pillow, and the same movie as ``.mp4`` when ``mp4`` and ffmpeg is available. Returns the files written."""
    path = Path(path)
    F = len(traj.time)
    frames = np.unique(np.round(np.linspace(0, F - 1, min(F, MAX_ANIMATION_FRAMES))).astype(int))
    fig, ax = _figure(6.4, 4.8, constrained=False)  # a layout per movie frame would double the drawing time
    if "density" in traj.frames:
        images = [_grid_image(traj, f)[0] for f in frames]
        vmax = max(float(np.max(im)) for im in images)

        def draw(j: int):
            ax.clear()
            im = _draw_density(ax, traj, int(frames[j]))
            if im is not None:
                im.set_clim(0, vmax)
            else:
                ax.set_ylim(0, 1.05 * vmax)
            ax.set_title(f"t = {traj.time[frames[j]]:.4g}")
    else:
        k = traj.frames["omega"].shape[-1]
        if k == 1:
            origin, axes, labels = np.zeros(1), np.array([[1.0, 0.0]]), [r"$\omega$", r"$\Phi$"]
        else:
            origin, axes, labels = projection(traj, coords)
        points, colours = [], []
        for f in frames:
            omega, _ = frame_measure(traj, int(f))
            phi = _phi_at(traj, int(f), omega)
            xy = (omega - origin) @ axes
            if k == 1:
                xy[:, 1] = phi
            points.append(xy)
            colours.append(phi)
        allxy = np.concatenate(points)
        lo, hi = allxy.min(axis=0), allxy.max(axis=0)
        pad = 0.05 * np.maximum(hi - lo, 1e-12)

        def draw(j: int):
            ax.clear()
            ax.scatter(points[j][:, 0], points[j][:, 1], c=colours[j], s=12, cmap="viridis")
            ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
            ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
            ax.set_xlabel(labels[0])
            ax.set_ylabel(labels[1])
            ax.set_title(f"t = {traj.time[frames[j]]:.4g} (colour: Phi)")

    anim = animation.FuncAnimation(fig, draw, frames=len(frames), interval=1000 / fps, blit=False)
    written = [path]
    dpi = min(current_dpi(), 100.0)   # a movie is for the screen: a paper's resolution only makes it heavy
    anim.save(path, writer=animation.PillowWriter(fps=fps), dpi=dpi)
    if mp4 and animation.FFMpegWriter.isAvailable():
        movie = path.with_suffix(".mp4")
        anim.save(movie, writer=animation.FFMpegWriter(fps=fps), dpi=dpi)
        written.append(movie)
    return written


def _span_edges(times: np.ndarray, end: float) -> np.ndarray:
    """Edges [A + 1] of the time bands of the analysed frames ``times`` [A]: the geometric (arithmetic at t = 0)
    midpoints between neighbours, the first frame's time and ``end`` outside."""
    times = np.asarray(times, dtype=float)
    mids = [math.sqrt(a * b) if a > 0 else 0.5 * (a + b) for a, b in zip(times[:-1], times[1:])]
    return np.array([times[0], *mids, max(end, times[-1])])


def plot_spectrum(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """E, I and ``lambda_min`` of S (error bars: its residual; the lower bound on the Morse index beside each
    negative one) against time on a log axis, the spans of analysed frames near a saddle shaded and near a
    minimum shaded green (:func:`pdeflow.analysis.convergence.spectral.phase_of`)."""
    rec = analysis.spectrum
    t, e, i = _steps(traj)
    fig, axes = _figure(15, 4, 3)
    axes[0].plot(t, e, lw=1.2)
    axes[0].set_ylabel("energy $E$")
    pos = i > 0
    axes[1].semilogy(t[pos], i[pos], lw=1.2, color="C3")
    axes[1].axhline(rec.spectrum_near * rec.i0, color="0.5", ls=":", lw=0.8, label="near a stationary point below")
    axes[1].set_ylabel("dissipation $I$")
    axes[1].legend(fontsize=7)
    ts, lo = rec.spectrum_time, rec.lambda_min
    ritz = np.full_like(lo, np.nan) if rec.lowest_ritz is None else np.asarray(rec.lowest_ritz, dtype=float)
    # the lowest converged value is lambda_min only when no Ritz value lies below it; else the lowest Ritz value
    # (unconverged: an upper bound on lambda_min) is drawn, marked as such
    unresolved = np.isfinite(ritz) & (ritz < np.where(np.isfinite(lo), lo, np.inf))
    ok = np.isfinite(lo) & ~unresolved
    axes[2].errorbar(ts[ok], lo[ok], yerr=rec.lambda_min_residual[ok], fmt="o-", ms=3, lw=1.0, capsize=2,
                     label=r"$\lambda_{\min}$ (converged)")
    if unresolved.any():
        axes[2].plot(ts[unresolved], ritz[unresolved], "v", ms=4, mfc="none", color="C1",
                     label="lowest Ritz value (not converged: an upper bound)")
        axes[2].legend(fontsize=7)
    drawn = np.where(unresolved, ritz, lo)
    shown = ok | unresolved
    for x, y, n in zip(ts[shown], drawn[shown], rec.morse_index_lower[shown]):
        if n > 0:
            axes[2].annotate(f"{n}", (x, y), textcoords="offset points", xytext=(0, -10), fontsize=6, ha="center")
    values = drawn[shown]
    if values.size and np.all(values > 0):
        # near a minimum every value is positive: a linear axis (log over two decades) with ticks among the points;
        # a symlog axis from 0 squeezed them against its top edge, no tick near them
        if values.max() > 100.0 * values.min():
            axes[2].set_yscale("log")
    else:
        axes[2].axhline(0.0, color="k", lw=0.6)
        axes[2].set_yscale("symlog", linthresh=max(1e-8, float(np.min(np.abs(values)))) if values.size else 1e-3)
    axes[2].set_ylabel(r"$\lambda_{\min}(S)$ (Morse index $\geq n$ marked)")
    spans = phase_spans(ts, rec.phases)
    edges = _span_edges(ts, float(t[-1]))
    for ax in axes:
        time_axis(ax, np.concatenate([t, ts]))
        ax.set_xlim(float(min(t[0], ts[0])), float(max(t[-1], ts[-1])))
        ax.set_xlabel("$t$")
        start = 0
        for _, _, phase, n in spans:
            if phase != DESCENT:
                ax.axvspan(edges[start], edges[start + n], lw=0, alpha=0.2,
                           color={MINIMUM: "C2", DEGENERATE: "0.6"}.get(phase, "C1"))
            start += n
    axes[2].set_title("shaded: near a saddle (orange), near a minimum (green)", fontsize=8)
    fig.suptitle(_title(traj, r"spectrum of $S$: $E$, $I$ and $\lambda_{\min}$"))
    return _save(fig, path)


def plot_all(traj: Trajectory, analysis: Analysis, outdir: str | Path, *, coords: Sequence[int] | None = None,
             frame: int = -1, movie: bool = True, fps: int = 5, fmt: str = "png", dpi: float | None = None
             ) -> list[Path]:
    """Every figure the file supports, as ``energy``, ``identity`` (the energy-identity residual), ``gap``, ``pl``,
    ``kl``, ``particles`` or ``density``, ``attention``, ``spectrum`` (a spectral record with at least one spectrum
    computed), each ``.{fmt}`` (pdf, png or svg, raster at ``dpi``), and ``measure.gif`` (+ ``.mp4``) in ``outdir``.

    Figures whose data are missing (no gap computed, no E*) are left out. Returns the files written."""
    out = Path(outdir)
    ext = "." + check_format(fmt)
    with figure_output(dpi):
        written = [plot_energy(traj, analysis, out / f"energy{ext}")]
        if len(_steps(traj)[0]) >= 2:
            written.append(plot_energy_identity(traj, analysis, out / f"identity{ext}"))
        if analysis.gap_computed:
            written.append(plot_gap(traj, analysis, out / f"gap{ext}"))
        if math.isfinite(analysis.e_star):
            written.append(plot_pl(traj, analysis, out / f"pl{ext}"))
            written.append(plot_kl(traj, analysis, out / f"kl{ext}"))
        if "density" in traj.frames:
            written.append(plot_density(traj, out / f"density{ext}", frame))
        else:
            written.append(plot_particles(traj, analysis, out / f"particles{ext}", frame, coords))
        if analysis.clusters is not None and len(analysis.clusters.mass):
            written.append(plot_attention(traj, analysis, out / f"attention{ext}"))
        if analysis.spectrum is not None and np.any(analysis.spectrum.spectrum_products > 0):  # a spectrum computed
            written.append(plot_spectrum(traj, analysis, out / f"spectrum{ext}"))
        if movie and len(traj.time) > 1:
            written.extend(animate_measure(traj, out / "measure.gif", coords, fps))
    return written


__all__ = ["plot_all", "plot_energy", "plot_energy_identity", "plot_gap", "plot_pl", "plot_kl", "plot_particles",
           "plot_density", "plot_attention", "animate_measure", "projection", "plot_spectrum", "token_labels"]
