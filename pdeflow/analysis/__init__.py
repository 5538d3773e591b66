"""pdeflow's analysis layer (docs/layers.md).

What the runs mean: diagnostics, experiments and figures.
"""
