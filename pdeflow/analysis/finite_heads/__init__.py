"""Finite-head SGD against the mean-field limit: propagation of chaos, the static approximation, their figures."""
