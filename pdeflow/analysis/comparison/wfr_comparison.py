"""The Wasserstein-Fisher-Rao experiment's analysis (``pdeflow wfr``): the optimality gap of every frame of the WFR
run and of its Wasserstein twin, when each first falls below :data:`TARGET_GAP` (certified only by ``gap_bound``),
the CSV of the gaps and the comparison figure (matplotlib's Agg canvas, no pyplot). docs/design.md, "The
Wasserstein-Fisher-Rao experiment".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.config import Config

TARGET_GAP = 1e-6



@dataclass
class FlowGaps:
    """The gap at every frame of one trajectory, all [F] (``minimizer`` [F, k]): ``gap`` the gap found (a lower
    bound on the true gap), ``gap_bound`` the certified upper bound (nan where not certified), ``min_phi`` the
    least Phi found and ``min_phi_lower`` the proven lower bound on min Phi, ``certified`` per frame (a proven
    bound and no mass outside Omega), ``evaluations`` of Phi and grad Phi the certificate spent."""
    time: np.ndarray
    gap: np.ndarray
    gap_bound: np.ndarray
    min_phi: np.ndarray
    min_phi_lower: np.ndarray
    minimizer: np.ndarray
    certified: np.ndarray
    evaluations: np.ndarray



def frame_gaps(path: Path, cfg: Config) -> FlowGaps:
    """``G`` at every frame of the trajectory file ``path`` with the ``[diagnostics]`` search of ``cfg``."""
    from ...io.trajectory import open_trajectory
    from ..diagnostics import frame_measure, optimality_gap

    traj = open_trajectory(path)
    problem, d = traj.problem(), cfg.diagnostics
    results = []
    for i in range(len(traj.time)):
        omega, mass = frame_measure(traj, i)
        results.append(optimality_gap(problem, omega, mass, domain=d.domain, radius=d.radius, n_starts=d.n_starts,
                                      grid_points=d.grid_points, seed=d.seed))
    certified = np.array([r.certified and r.outside_mass == 0.0 for r in results])
    return FlowGaps(time=np.asarray(traj.time, dtype=float), gap=np.array([r.gap for r in results]),
                    gap_bound=np.where(certified, [r.gap_bound for r in results], math.nan),
                    min_phi=np.array([r.min_phi for r in results]),
                    min_phi_lower=np.where(certified, [r.min_phi_lower for r in results], math.nan),
                    minimizer=np.array([r.minimizer for r in results]), certified=certified,
                    evaluations=np.array([r.evaluations for r in results], dtype=np.int64))



def first_below(time: np.ndarray, values: np.ndarray, level: float = TARGET_GAP) -> float:
    """The first frame time from which on ``values`` stays <= level (nan if it never does; nan counts as above)."""
    above = np.flatnonzero(~(values <= level))
    start = 0 if above.size == 0 else above[-1] + 1
    return float(time[start]) if start < time.size else math.nan



def summary_line(label: str, g: FlowGaps) -> str:
    """One line per flow: the final gap found, the final certified bound, and from when each stays <= 1e-6."""
    def since(values: np.ndarray) -> str:
        reached = first_below(g.time, values)
        return f"<= {TARGET_GAP:g} from t = {reached:.4g}" if math.isfinite(reached) else f"> {TARGET_GAP:g} at t_end"

    bound = (f"certified G <= {g.gap_bound[-1]:.3e} ({since(g.gap_bound)})" if g.certified[-1]
             else "NOT certified (k > 3 or mass outside Omega)")
    return (f"{label:<12s} G found {g.gap[-1]:.3e} ({since(g.gap)}; a lower bound on G)  {bound}  "
            f"min Phi in [{g.min_phi_lower[-1]:.12g}, {g.min_phi[-1]:.12g}]")



def plot_comparison(wfr_path: Path, w2_path: Path, gaps: dict[str, FlowGaps], out: Path) -> Path:
    """One figure, four panels: the particle paths of both flows (first two coordinates, or omega against
    log(1 + t) when k = 1; WFR's final heads sized by mass, the point of least Phi found starred), G(t) found
    and certified, WFR's masses m_i(t), E(t)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ...io.trajectory import open_trajectory
    from ..plots.figures import save_figure

    fig = Figure(figsize=(11.0, 8.5))
    FigureCanvasAgg(fig)
    (ax_path, ax_gap), (ax_mass, ax_energy) = fig.subplots(2, 2)
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.07, top=0.95, wspace=0.28, hspace=0.3)
    wfr, w2 = open_trajectory(wfr_path), open_trajectory(w2_path)
    for traj, colour, label in ((w2, "0.55", "Wasserstein"), (wfr, "C0", "WFR")):
        omega = np.asarray(traj.frames["omega"], dtype=float)
        if omega.shape[2] > 1:
            x, y = omega[:, :, 0], omega[:, :, 1]
        else:   # k = 1: omega against log(1 + t)
            x = np.broadcast_to(np.log1p(np.asarray(traj.time, dtype=float))[:, None], omega.shape[:2])
            y = omega[:, :, 0]
        ax_path.plot(x, y, "-", color=colour, lw=0.8)
        mass = np.asarray(traj.frames["mass"][-1], dtype=float)
        ax_path.scatter(x[-1], y[-1], s=400 * mass * mass.size / 4 + 4, color=colour, alpha=0.7, label=f"{label} (end)")
    star = gaps["wfr"].minimizer[-1]
    one_d = star.size == 1
    ax_path.plot(x[-1, 0] if one_d else star[0], star[0] if one_d else star[1], "*", color="C3", ms=14,
                 label="least Phi found (WFR end)")
    ax_path.set_xlabel("log(1 + t)" if one_d else "omega_1")
    ax_path.set_ylabel("omega_1" if one_d else "omega_2")
    ax_path.set_title("particle paths (marker area ~ mass)", fontsize=9)
    ax_path.legend(fontsize=7)
    for key, colour, label in (("w2", "0.4", "Wasserstein"), ("wfr", "C0", "WFR")):
        g = gaps[key]
        keep = g.time > 0
        ax_gap.loglog(g.time[keep], np.maximum(g.gap[keep], 1e-16), "o-", ms=3, color=colour, label=f"{label}: found")
        if g.certified[keep].any():
            ax_gap.loglog(g.time[keep], g.gap_bound[keep], "--", color=colour, label=f"{label}: certified bound")
    ax_gap.axhline(TARGET_GAP, color="C3", ls=":", lw=0.8, label="1e-6")
    ax_gap.set_xlabel("t")
    ax_gap.set_ylabel("optimality gap G")
    ax_gap.set_title("G found <= true G <= certified bound", fontsize=9)
    ax_gap.legend(fontsize=7)
    t = np.asarray(wfr.frames["time"], dtype=float)
    keep = t > 0
    ax_mass.loglog(t[keep], np.asarray(wfr.frames["mass"], dtype=float)[keep], lw=0.9)
    ax_mass.set_xlabel("t")
    ax_mass.set_ylabel("mass m_i (WFR)")
    ax_mass.set_title("masses over time (removed heads leave the plot)", fontsize=9)
    for traj, colour, label in ((w2, "0.4", "Wasserstein"), (wfr, "C0", "WFR")):
        st = traj.steps
        ax_energy.semilogx(np.asarray(st["time"])[1:], np.asarray(st["energy"])[1:], color=colour, label=label)
    ax_energy.set_xlabel("t")
    ax_energy.set_ylabel("energy E")
    ax_energy.legend(fontsize=7)
    return save_figure(fig, out)


def write_gaps_csv(gaps: dict[str, FlowGaps], out: Path) -> Path:
    """One row per flow and frame: ``gap_found <= G <= gap_bound`` (nan where not certified), the least Phi found,
    the proven lower bound on min Phi, whether certified, the certificate's evaluations."""
    lines = ["flow,time,gap_found,gap_bound,min_phi,min_phi_lower,certified,evaluations"]
    for key, g in gaps.items():
        lines += [f"{key},{float(t)!r},{float(v)!r},{float(b)!r},{float(m)!r},{float(ml)!r},{int(c)},{int(n)}"
                  for t, v, b, m, ml, c, n in zip(g.time, g.gap, g.gap_bound, g.min_phi, g.min_phi_lower,
                                                   g.certified, g.evaluations)]
    out.write_text("\n".join(lines) + "\n")
    return out
