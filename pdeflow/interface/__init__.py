"""pdeflow's interface layer (docs/layers.md).

The command line, on top of everything.
"""
