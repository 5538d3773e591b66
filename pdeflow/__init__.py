"""pdeflow: the mean-field Wasserstein gradient flow of multi-head causal self-attention.

See README.md for a tour and ``MODEL.md`` conventions restated in the docstrings.
"""
__version__ = "0.1.0"
