"""The figures of a trajectory and the one figure-saving path."""
