"""pdeflow's io layer (docs/layers.md).

The files: what a run writes and how a file is read, checked and continued.
"""
