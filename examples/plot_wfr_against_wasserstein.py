"""
Wasserstein-Fisher-Rao against Wasserstein
==========================================

In one coordinate (the attention sharpness of a head, data/configs/wfr1d.toml) ``Phi`` is not convex, and the
Wasserstein flow, which only moves heads, can end with heads stuck at a critical point of ``Phi`` that is not its
minimum: the optimality gap ``G = int Phi d rho - min Phi`` stays positive. The Wasserstein-Fisher-Rao flow also
moves mass between heads, towards lower ``Phi``, and its gap keeps falling. In one dimension ``min Phi`` is
certified on a grid with Taylor bounds, so both gaps below are certified. This is ``pdeflow wfr
data/configs/wfr1d.toml`` shrunk to a few seconds: a horizon of ``t = 30`` instead of 300, 8 frames.
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from pdeflow.solvers.driver import run

import pdeflow
from pdeflow import Problem
from pdeflow.analysis.comparison.wfr_comparison import frame_gaps, plot_comparison, summary_line
from pdeflow.core.config import load_config

# the config (and the basis file it names) of the repository's data/configs
CONFIG = Path(pdeflow.__file__).resolve().parent.parent / "data" / "configs" / "wfr1d.toml"
cfg = load_config(str(CONFIG), ["run.t_end=30", "run.n_frames=8"])
problem = Problem.from_config(cfg)
folder = Path(tempfile.mkdtemp())
paths = {"wfr": folder / "wfr.h5", "w2": folder / "w2.h5"}
run(cfg, problem, paths["wfr"], quiet=True)
run(cfg.replace(solver={"gamma": 0.0}), problem, paths["w2"], quiet=True)   # gamma = 0: the Wasserstein flow

# %%
# The certified gap of each flow at every frame.
gaps = {key: frame_gaps(path, cfg) for key, path in paths.items()}
for key, label in (("w2", "Wasserstein"), ("wfr", "WFR")):
    print(summary_line(label, gaps[key]))

# %%
# The heads' paths (``omega`` against ``log(1 + t)``; WFR's final heads sized by their mass), the gaps, WFR's
# masses and the energies.
image = plt.imread(plot_comparison(paths["wfr"], paths["w2"], gaps, folder / "wfr.png"))
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100))
fig.figimage(image)
