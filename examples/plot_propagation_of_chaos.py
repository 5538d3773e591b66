"""
Propagation of chaos
====================

``N`` heads trained together follow the mean-field flow at a distance of order ``N^(-1/2)``. A reference flow of
many heads carries tracers started at the initial points of every finite-head run (a synchronous coupling), and the
RMS distance between each head and its tracer is fitted against ``N`` on a small ladder; the same initial points
are trained by minibatch SGD at two step sizes, and ``N`` draws from the reference give the static approximation.
This is ``pdeflow chaos data/configs/chaos.toml`` shrunk to a few seconds: ``N`` = 8 to 64, three seeds, a
reference of 512 heads, a horizon of ``t = 1``. The dotted lines are the predicted ``N^(-1/2)``; the fits carry 95 %
intervals (on three seeds, wide ones).
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from pdeflow import Problem
from pdeflow.analysis.finite_heads.chaos import run_chaos, summary
from pdeflow.analysis.finite_heads.chaos_plots import plot_result
from pdeflow.core.config import loads_config

CONFIG = """
[task]
name = "markov"
vocab_size = 4
seq_len = 5
n_samples = 32
concentration = 0.5
[model]
d = 8
head_dim = 2
embedding = "onehot"
positions = "sinusoidal"
unembedding = "tied"
coordinates = "full"
weight_decay = 1e-3
[init]
distribution = "gaussian"
scale = 0.5
[solver]
method = "rk4"
dt = 0.1
[run]
t_end = 1.0
frame_interval = 0.5
[sgd]
batch_size = 4
sampling = "resample"
[chaos]
n_ref = 512
n_list = [8, 16, 32, 64]
seeds = 3
eta_list = [0.1, 0.05]
probe_size = 16
static_draws = 8
converge_time = 1.0
"""

cfg = loads_config(CONFIG)
result = run_chaos(cfg, Problem.from_config(cfg))
print(summary(result))

# %%
# The distances against ``N`` with their fits and the ``N^(-1/2)`` reference, ``D_N(t)`` per ``N``, the SGD excess
# against the step and the static gap.
path = Path(tempfile.mkdtemp()) / "chaos.png"
plot_result(path, result)
image = plt.imread(path)
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100))
fig.figimage(image)
