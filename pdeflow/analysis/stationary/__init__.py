"""Stationary points of the flow: the searches' driver, Newton polish, the verdict and the result file."""
