"""
Checking a file written by another code
=======================================

pdeflow as a reference: a file written by another solver of the same problem (here, standing in for it, pdeflow's
own Heun method at a coarser step) is first validated against the trajectory schema, then compared frame by frame
with pdeflow's RK4 run. Every compared quantity gets its measured difference and the tolerance it is held to.
"""
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from pdeflow.solvers.driver import run

from pdeflow import Problem
from pdeflow.core.config import loads_config
from pdeflow.io.reference import compare, validate

BASE = """
[task]
name = "markov"
vocab_size = 3
seq_len = 3
exact = true
concentration = 0.7
[model]
d = 7
head_dim = 2
weight_decay = 0.05
coordinates = "gain2"
[init]
n_particles = 6
[run]
t_end = 2.0
frame_interval = 0.5
"""
folder = Path(tempfile.mkdtemp())
files = {}
for name, solver in (("reference", 'method = "rk4"\ndt = 0.01'), ("other", 'method = "heun"\ndt = 0.1')):
    cfg = loads_config(BASE + "[solver]\n" + solver + "\n")
    run(cfg, Problem.from_config(cfg), folder / f"{name}.h5", quiet=True)
    files[name] = folder / f"{name}.h5"

# %%
# The schema check: an empty list means the file is a valid pdeflow trajectory.
print("validate:", validate(files["other"]) or "valid")

# %%
# The comparison at the reference's frame times, with a tolerance loose enough for Heun at dt = 0.1.
result = compare(files["other"], files["reference"], rtol=1e-3, atol=1e-6)
print(result.coverage())
within = sum(r.ok for r in result.rows)
print("passes" if result.ok else "fails", f"({within}/{len(result.rows)} rows within tolerance)")

quantities = sorted({r.quantity for r in result.rows})
fig, ax = plt.subplots(figsize=(6.4, 4.0), layout="constrained")
for q in quantities:
    rows = [r for r in result.rows if r.quantity == q and r.value > 0]   # t = 0: both start from the same measure
    ax.semilogy([r.time for r in rows], [r.value for r in rows], "o-", label=f"{q}: difference")
ax.semilogy([r.time for r in result.rows if r.quantity == quantities[0]],
            [r.allowed for r in result.rows if r.quantity == quantities[0]], "k--", label=f"{quantities[0]}: allowed")
ax.set_xlabel("$t$")
ax.set_ylabel("measured difference")
ax.set_title("Heun (dt = 0.1) against RK4 (dt = 0.01)")
ax.legend(fontsize=7)
print("largest difference:", float(np.max([r.value for r in result.rows])))
