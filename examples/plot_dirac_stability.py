"""
Dirac stationary measures and their stability
=============================================

A measure that puts all its mass on one head, ``delta_w``, is stationary when ``grad Phi(w; delta_w) = 0``. Whether
the flow leaves it is read off two Hessians: ``H0`` (every head moves alone: the spread of the measure) and ``Htr``
(all heads move together: the mean). The verdict is checked by simulation: a perturbation along the least stable
eigenvector grows or decays like ``exp(-lambda t)``, and the measured rate is compared with the predicted one.
This is ``pdeflow stability data/configs/stability.toml`` shrunk to a few seconds: fewer starts, one mode per
point, three weight decays in the sweep of the zero head, which turns stable as the weight decay crosses
``lambda_c = -lambda_min(H0 at lambda = 0)``.
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from pdeflow import Problem
from pdeflow.analysis.dirac.stability import run_stability
from pdeflow.analysis.dirac.stability_plots import plot_stability
from pdeflow.core.config import loads_config

CONFIG = """
[task]
name = "lookback"         # copy the previous token: a head has to attend by position
vocab_size = 4
seq_len = 4
lag = 1
n_samples = 16
[model]
d = 8
head_dim = 2
embedding = "onehot"
positions = "sinusoidal"
unembedding = "tied"
coordinates = "full"      # k = 4 d dh = 64
weight_decay = 0.05
[diagnostics]
radius = 6.0
n_starts = 8
[stability]
n_starts = 2
weight_decays = [0.0, 0.3]
n_modes = 1
n_particles = 4
t_end = 20.0
"""

cfg = loads_config(CONFIG)
result = run_stability(cfg, Problem.from_config(cfg))

# %%
# Each stationary Dirac found, its verdict from the two spectra, and the rates: predicted ``-lambda_min`` against
# the rate measured on the simulated perturbation (mean and spread).
for i, (a, runs) in enumerate(zip(result.points, result.runs)):
    print(f"point {i} ({a.origin}): e = {a.energy:.8f}, {a.verdict}; lambda_min(H0) = {a.h0_relevant[0]:+.4g}, "
          f"lambda_min(Htr) = {a.htr_relevant[0]:+.4g}")
    for r in runs:
        print(f"    rates predicted {r.predicted[0]:+.5f} / {r.predicted[1]:+.5f}, "
              f"measured {r.measured[0]:+.5f} / {r.measured[1]:+.5f} (mean / spread)")
sweep = result.sweep
print(f"zero head: lambda_c = {sweep.lam_c_predicted:.4f} predicted")


def show(path: Path) -> None:
    """Show a figure pdeflow wrote (pdeflow draws without pyplot; the gallery collects pyplot figures)."""
    image = plt.imread(path)
    fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100))
    fig.figimage(image)


# %%
# The spectra of ``H0`` and ``Htr`` at each point, the predicted against the measured rates (the diagonal is the
# theory), and the zero head's growth rate across the weight decays.
for path in plot_stability(result, cfg, Path(tempfile.mkdtemp()) / "stability.h5"):
    show(path)
