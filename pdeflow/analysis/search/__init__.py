"""The searches for a local minimum: L-BFGS on the live heads and the structured route."""
