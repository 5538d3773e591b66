"""
Your own text
=============

The ``text`` task predicts the next character of a file of your own. Here a sentence written to a temporary file;
the attention maps of the heaviest head clusters read in its characters.
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
from pdeflow.solvers.driver import run

from pdeflow import Problem
from pdeflow.analysis import diagnostics as D
from pdeflow.analysis.plots import plotting as P
from pdeflow.core.config import DiagnosticsConfig, loads_config
from pdeflow.io.trajectory import open_trajectory

folder = Path(tempfile.mkdtemp())
(folder / "mine.txt").write_text("the cat sat on the mat; the rat sat on the cat. " * 4, encoding="utf-8")
CONFIG = f"""
[task]
name = "text"
path = "{(folder / 'mine.txt').as_posix()}"
vocab_size = 0            # the file's alphabet
seq_len = 8
n_samples = 64
[model]
d = 8
head_dim = 2
embedding = "gaussian"
[init]
n_particles = 6
[solver]
method = "rk4"
dt = 0.1
[run]
t_end = 1.0
frame_interval = 0.5
"""
cfg = loads_config(CONFIG)
run(cfg, Problem.from_config(cfg), folder / "text.h5", quiet=True)
traj = open_trajectory(folder / "text.h5")
analysis = D.analyse(traj, DiagnosticsConfig(gap=False))
print(f"{len(analysis.clusters.mass)} clusters of heads at t = {traj.time[-1]:g}")

# %%
# Attention of the representative heads: query position down, key position across, each labelled by its character
# (a space shows as an open box).
path = P.plot_attention(traj, analysis, folder / "attention.png")
image = plt.imread(path)
fig = plt.figure(figsize=(image.shape[1] / 100, image.shape[0] / 100))
fig.figimage(image)
