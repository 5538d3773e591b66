"""pdeflow's core layer (docs/layers.md).

The model, its data and its evaluation: no file format, no solver, no command line.
"""
