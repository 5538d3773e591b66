"""Figures and movies of a trajectory and its analysis, headless (matplotlib's Agg canvas, no pyplot).

One function per figure, each ``(traj, analysis, path, ...) -> Path`` writing one PNG:

- :func:`plot_energy`: ``E - E*`` and the dissipation ``I`` against time (log scale), with the lower bound;
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
  (:mod:`pdeflow.analysis.diagnostics.spectral`).

:func:`plot_all` writes every figure the file supports into a folder.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib import animation
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..io.trajectory import Trajectory
from .diagnostics import (
    Analysis,
    attention_pattern,
    frame_measure,
    kl_fit,
    pl_constant,
    trajectory_grid,
    trusted_excess,
)
from .diagnostics.spectral import DEGENERATE, DESCENT, MINIMUM, phase_spans

DPI = 100
MAX_ANIMATION_FRAMES = 120


def _figure(width: float = 6.4, height: float = 4.0, ncols: int = 1):
    # fixed margins: a layout engine would double the drawing time of every figure and movie frame
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols)
    fig.subplots_adjust(left=1.0 / width, right=1 - 0.25 / width, bottom=0.55 / height,
                        top=1 - 0.5 / height, wspace=0.35)
    return fig, axes


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    fig.savefig(path, dpi=DPI)
    return path


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


def _title(traj: Trajectory, what: str) -> str:
    return f"{what} - {traj.path.name} ({traj.attrs.get('method', '?')}, {traj.measure})"


def plot_energy(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """``E - E*`` (or E when E* is unknown) and ``I`` against time, log scale; a log time axis over decades."""
    t, e, i = _steps(traj)
    fig, (ax_e, ax_i) = _figure(10, 4, 2)
    e_star = analysis.e_star
    if math.isfinite(e_star) and np.any(e - e_star > 0):
        ok = e - e_star > 0
        ax_e.semilogy(t[ok], (e - e_star)[ok], lw=1.2, label="E - E*")
        ax_e.semilogy(analysis.time, np.where(analysis.energy > e_star, analysis.energy - e_star, np.nan), "o",
                      ms=3, label="frames")
        if np.any(analysis.kl_predicted > 0):
            ax_e.semilogy(analysis.time, np.where(analysis.kl_predicted > 0, analysis.kl_predicted, np.nan), "--",
                          color="C3", label=f"KL prediction (theta = {analysis.kl_theta:.3f})")
        gf = analysis.gap_frames
        if gf.size and np.any(analysis.gap[gf] > 0):
            ax_e.semilogy(analysis.time[gf], np.where(analysis.gap[gf] > 0, analysis.gap[gf], np.nan), "s",
                          mfc="none", label="gap G")
        ax_e.set_ylabel("E - E*")
        ax_e.set_title(f"E* = {e_star:.10g} ({analysis.e_star_source})", fontsize=9)
    else:
        ax_e.plot(t, e, lw=1.2, label="E")
        ax_e.set_ylabel("energy E")
    ax_e.set_xlabel("t")
    ax_e.legend(fontsize=8)
    pos = i > 0
    ax_i.semilogy(t[pos], i[pos], lw=1.2, color="C3", label="dissipation I")
    if math.isfinite(analysis.stationary_time):
        ax_i.axvline(analysis.stationary_time, color="k", ls=":", label="stationary")
    ax_i.set_xlabel("t")
    for ax in (ax_e, ax_i):
        time_axis(ax, t)
    ax_i.set_ylabel("I")
    ax_i.set_title("dissipation I = int |grad Phi|^2 d rho", fontsize=9)
    ax_i.legend(fontsize=8)
    fig.suptitle(_title(traj, "energy and dissipation"))
    return _save(fig, path)


def plot_gap(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """The gap G at the frames where it was computed (log scale when positive), and E with E - G."""
    gf = analysis.gap_frames
    fig, (ax_g, ax_b) = _figure(10, 4, 2)
    tg, g = analysis.time[gf], analysis.gap[gf]
    certified = analysis.gap_certified[gf].astype(bool)
    if np.all(g > 0):
        ax_g.set_yscale("log")
    ax_g.plot(tg, g, "-", color="0.6")
    ax_g.plot(tg[certified], g[certified], "o", label="G found (min Phi certified)")
    if np.any(certified & np.isfinite(analysis.gap_bound[gf])):
        ax_g.plot(tg[certified], analysis.gap_bound[gf][certified], "v", label="certified upper bound on G")
    ax_g.plot(tg[~certified], g[~certified], "^", label="estimate (non-exhaustive search)")
    ax_g.set_xlabel("t")
    ax_g.set_ylabel("G")
    ax_g.set_title("G = int Phi d rho - min_Omega Phi", fontsize=9)
    ax_g.legend(fontsize=8)
    ax_b.plot(analysis.time, analysis.energy, "-", label="E")
    if np.any(np.isfinite(analysis.lower_bound)):
        ax_b.plot(tg, analysis.lower_bound[gf], "s-", label="E - G bound (certified lower bound on Omega)")
    ax_b.set_xlabel("t")
    ax_b.legend(fontsize=8)
    radius = f" {analysis.gap_radius:g}" if math.isfinite(analysis.gap_radius) else ""
    fig.suptitle(_title(traj, f"optimality gap, Omega = {analysis.gap_domain}{radius}"))
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
                   label=f"theory: lambda_min = {analysis.predicted_mu:.4g} (limit, bound near the point){ratio}")
    elif analysis.prediction:
        ax.set_title(analysis.prediction, fontsize=7, wrap=True)
    ax.set_xlabel("t")
    ax.set_ylabel("mu = I / (2 (E - E*))")
    ax.legend(fontsize=7)
    fig.suptitle(_title(traj, f"PL ratio (E* = {analysis.e_star:.10g}, {analysis.e_star_source})"))
    return _save(fig, path)


def plot_kl(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """Left: ``I`` against ``E - E*`` on log-log axes, the window highlighted, the line ``C (E - E*)^(2 (1 - theta))``
    where one theta is established. Right: the local exponent ``theta(t) = 1 - (1/2) d ln I / d ln(E - E*)`` over the
    window (its secants, :func:`pdeflow.analysis.diagnostics.rates.local_exponent`), the range that holds it, and the
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
                  label=f"theta = {analysis.kl_theta:.4f}; theta(t) in [{lo:.4f}, {hi:.4f}]")
    ax.set_xlabel("E - E*")
    ax.set_ylabel("I")
    ax.legend(fontsize=7)
    refused = analysis.kl_status.startswith("refused")
    fit = None if refused or not win.any() else kl_fit(e[win], i[win], analysis.e_star, time=t[win],
                                                        e_star_range=(analysis.e_star_low, analysis.e_star_high))
    if fit is not None and fit.local is not None:
        local = fit.local
        ax_t.plot(local.time, local.theta, "o-", ms=3, color="C0", label="theta(t), secants")
        ax_t.axhspan(local.low, local.high, color="C0", alpha=0.15, label="range holding theta(t) (window, E*)")
    if math.isfinite(analysis.predicted_theta):
        ax_t.axhline(analysis.predicted_theta, color="C3", ls="--",
                     label=f"theory: {analysis.predicted_theta:g} at the stationary point")
    ax_t.set_xlabel("t")
    ax_t.set_ylabel("local exponent theta(t)")
    if ax_t.lines:
        ax_t.legend(fontsize=7)
    ax_t.set_title(analysis.kl_status or "not computed", fontsize=7, wrap=True)
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
        return np.zeros(k), axes, [f"omega_{c[0]}", f"omega_{c[1]}"]
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
        ax.plot(xs[:, 0], _phi_at(traj, index, xs), "-", color="0.5", label="Phi(omega; rho)")
        sc = ax.scatter(omega[:, 0], phi, c=phi, s=size, cmap="viridis", zorder=3)
        if analysis is not None and np.isfinite(analysis.minimizer[index]).all():
            ax.axvline(analysis.minimizer[index, 0], color="C3", ls=":", label="argmin Phi")
        ax.set_xlabel("omega")
        ax.set_ylabel("Phi")
        ax.legend(fontsize=8)
    else:
        origin, axes, labels = projection(traj, coords)
        xy = (omega - origin) @ axes
        sc = ax.scatter(xy[:, 0], xy[:, 1], c=phi, s=size, cmap="viridis")
        if analysis is not None and np.isfinite(analysis.minimizer[index]).all():
            m = (analysis.minimizer[index] - origin) @ axes
            ax.plot(m[0], m[1], "r*", ms=12, label="argmin Phi on Omega")
            ax.legend(fontsize=8)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
    fig.colorbar(sc, ax=ax, label="Phi(omega_i; rho)")
    fig.suptitle(_title(traj, f"particles at t = {traj.time[index]:.4g}"))
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
        ax.set_xlabel("omega")
        ax.set_ylabel("density")
        return None
    im = ax.imshow(density.T, origin="lower", extent=(lower[0], upper[0], lower[1], upper[1]), aspect="auto",
                   cmap="magma")
    ax.set_xlabel("omega_0")
    ax.set_ylabel("omega_1")
    return im


def plot_density(traj: Trajectory, path: str | Path, frame: int = -1) -> Path:
    """A grid run's density at a frame: a curve (k = 1), a heat map (k = 2) or the (omega_0, omega_1) marginal."""
    index = frame % len(traj.time)
    fig, ax = _figure(6.4, 4.8)
    im = _draw_density(ax, traj, index)
    if im is not None:
        fig.colorbar(im, ax=ax, label="density")
    fig.suptitle(_title(traj, f"density at t = {traj.time[index]:.4g}"))
    return _save(fig, path)


def plot_attention(traj: Trajectory, analysis: Analysis, path: str | Path) -> Path:
    """Attention maps ``a[l, j]`` of the representative heads of the heaviest clusters on the probe sequence."""
    c = analysis.clusters
    maps = c.attention
    if maps.shape[0] == 0:
        problem = traj.problem()
        omega, _ = frame_measure(traj, c.frame)
        maps = attention_pattern(problem, problem.theta(omega[c.representative[:1]]), c.probe)
    n = maps.shape[0]
    fig, axes = _figure(3.2 * n + 0.8, 3.4, n)
    axes = np.atleast_1d(axes)
    ticks = [f"{pos}:{int(tok)}" for pos, tok in enumerate(c.probe)]
    for j, ax in enumerate(axes):
        im = ax.imshow(maps[j], vmin=0, vmax=1, cmap="Blues")
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_yticks(range(len(ticks)), ticks)
        ax.set_xlabel("key position j : token")
        ax.set_ylabel("query position l : token")
        ax.set_title(f"cluster {j}: mass {c.mass[j]:.3g}, {int(c.size[j])} heads", fontsize=9)
    fig.colorbar(im, ax=list(axes), label="attention a[l, j]")
    fig.suptitle(_title(traj, f"attention of representative heads, {len(c.mass)} clusters"))
    return _save(fig, path)


def animate_measure(traj: Trajectory, path: str | Path, coords: Sequence[int] | None = None, fps: int = 5,
                    mp4: bool = True) -> list[Path]:
    """The measure over the frames (at most MAX_ANIMATION_FRAMES, evenly chosen): particles in the
    coordinates of :func:`projection` coloured by Phi, or the grid density. Writes ``path`` as a GIF with
    Pillow, and the same movie as ``.mp4`` when ``mp4`` and ffmpeg is available. Returns the files written."""
    path = Path(path)
    F = len(traj.time)
    frames = np.unique(np.round(np.linspace(0, F - 1, min(F, MAX_ANIMATION_FRAMES))).astype(int))
    fig, ax = _figure(6.4, 4.8)
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
            origin, axes, labels = np.zeros(1), np.array([[1.0, 0.0]]), ["omega", "Phi"]
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
    anim.save(path, writer=animation.PillowWriter(fps=fps), dpi=DPI)
    if mp4 and animation.FFMpegWriter.isAvailable():
        movie = path.with_suffix(".mp4")
        anim.save(movie, writer=animation.FFMpegWriter(fps=fps), dpi=DPI)
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
    minimum shaded green (:func:`pdeflow.analysis.diagnostics.spectral.phase_of`)."""
    rec = analysis.spectrum
    t, e, i = _steps(traj)
    fig, axes = _figure(15, 4, 3)
    axes[0].plot(t, e, lw=1.2)
    axes[0].set_ylabel("energy E")
    pos = i > 0
    axes[1].semilogy(t[pos], i[pos], lw=1.2, color="C3")
    axes[1].axhline(rec.spectrum_near * rec.i0, color="0.5", ls=":", lw=0.8, label="near a stationary point below")
    axes[1].set_ylabel("dissipation I")
    axes[1].legend(fontsize=7)
    ts, lo = rec.spectrum_time, rec.lambda_min
    ok = np.isfinite(lo)
    axes[2].errorbar(ts[ok], lo[ok], yerr=rec.lambda_min_residual[ok], fmt="o-", ms=3, lw=1.0, capsize=2)
    for x, y, n in zip(ts[ok], lo[ok], rec.morse_index_lower[ok]):
        if n > 0:
            axes[2].annotate(f"{n}", (x, y), textcoords="offset points", xytext=(0, -10), fontsize=6, ha="center")
    axes[2].axhline(0.0, color="k", lw=0.6)
    axes[2].set_yscale("symlog", linthresh=max(1e-8, float(np.nanmin(np.abs(lo[ok])))) if ok.any() else 1e-3)
    axes[2].set_ylabel("lambda_min of S (index >= n marked)")
    spans = phase_spans(ts, rec.phases)
    edges = _span_edges(ts, float(t[-1]))
    for ax in axes:
        time_axis(ax, np.concatenate([t, ts]))
        ax.set_xlim(float(min(t[0], ts[0])), float(max(t[-1], ts[-1])))
        ax.set_xlabel("t")
        start = 0
        for _, _, phase, n in spans:
            if phase != DESCENT:
                ax.axvspan(edges[start], edges[start + n], lw=0, alpha=0.2,
                           color={MINIMUM: "C2", DEGENERATE: "0.6"}.get(phase, "C1"))
            start += n
    axes[2].set_title("shaded: near a saddle (orange), near a minimum (green)", fontsize=8)
    fig.suptitle(_title(traj, "spectrum of S: E, I and lambda_min"))
    return _save(fig, path)


def plot_all(traj: Trajectory, analysis: Analysis, outdir: str | Path, *, coords: Sequence[int] | None = None,
             frame: int = -1, movie: bool = True, fps: int = 5) -> list[Path]:
    """Every figure the file supports, as ``energy.png``, ``gap.png``, ``pl.png``, ``kl.png``,
    ``particles.png`` or ``density.png``, ``attention.png``, ``spectrum.png`` (a spectral record with at least one
    spectrum computed) and ``measure.gif`` (+ ``.mp4``) in ``outdir``.

    Figures whose data are missing (no gap computed, no E*) are left out. Returns the files written."""
    out = Path(outdir)
    written = [plot_energy(traj, analysis, out / "energy.png")]
    if analysis.gap_computed:
        written.append(plot_gap(traj, analysis, out / "gap.png"))
    if math.isfinite(analysis.e_star):
        written.append(plot_pl(traj, analysis, out / "pl.png"))
        written.append(plot_kl(traj, analysis, out / "kl.png"))
    if "density" in traj.frames:
        written.append(plot_density(traj, out / "density.png", frame))
    else:
        written.append(plot_particles(traj, analysis, out / "particles.png", frame, coords))
    if analysis.clusters is not None and len(analysis.clusters.mass):
        written.append(plot_attention(traj, analysis, out / "attention.png"))
    if analysis.spectrum is not None and np.any(analysis.spectrum.spectrum_products > 0):  # a spectrum computed
        written.append(plot_spectrum(traj, analysis, out / "spectrum.png"))
    if movie and len(traj.time) > 1:
        written.extend(animate_measure(traj, out / "measure.gif", coords, fps))
    return written


__all__ = ["plot_all", "plot_energy", "plot_gap", "plot_pl", "plot_kl", "plot_particles", "plot_density",
           "plot_attention", "animate_measure", "projection", "plot_spectrum"]
