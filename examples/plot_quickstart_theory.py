"""
The theory on a small problem
=============================

A Markov-chain task learned by six heads in the two-coordinate family ``gain2``: run the flow, then ask what the
theory predicts and what was measured: the energy identity, the gap of the support condition (certified here,
since ``k = 2``) and the rates.
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from pdeflow.solvers.driver import run

import pdeflow
from pdeflow import Problem
from pdeflow.analysis import diagnostics as D
from pdeflow.analysis.plots import plotting as P
from pdeflow.core.config import DiagnosticsConfig, load_config
from pdeflow.io.trajectory import open_trajectory

# the repository's tiny problem: 6 heads, an exactly enumerated 3-token Markov chain, rk4 to t = 5
CONFIG = Path(pdeflow.__file__).resolve().parent.parent / "data" / "configs" / "tiny.toml"

folder = Path(tempfile.mkdtemp())
cfg = load_config(CONFIG)
run(cfg, Problem.from_config(cfg), folder / "small.h5", quiet=True)
traj = open_trajectory(folder / "small.h5")

# %%
# The analysis: the gap at three frames (certified: k = 2 is searched exhaustively), E* from the data.
analysis = D.analyse(traj, DiagnosticsConfig(gap_frames=3))
print(f"E(t_end) = {traj.frames['energy'][-1]:.10f}")
last = int(analysis.gap_frames[-1])
certified = "certified" if analysis.gap_certified[last] else "an estimate"
print(f"gap G at t = {analysis.time[last]:g}: {analysis.gap[last]:.3e} ({certified})")
print(f"E* = {analysis.e_star:.10f} ({analysis.e_star_source})")


def show(path: Path) -> None:
    """Show a figure pdeflow wrote (pdeflow draws without pyplot; the gallery collects pyplot figures)."""
    image = plt.imread(path)
    fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100))
    fig.figimage(image)


# %%
# Energy and dissipation, then the residual of the energy identity ``E(t) - E(0) + int_0^t I ds``.
show(P.plot_energy(traj, analysis, folder / "energy.png"))
show(P.plot_energy_identity(traj, analysis, folder / "identity.png"))

# %%
# The optimality gap: ``G = int Phi d rho - min Phi`` bounds ``E - E*`` from above.
show(P.plot_gap(traj, analysis, folder / "gap.png"))
