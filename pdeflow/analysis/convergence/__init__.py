"""The rates of a trajectory: the energy identity, the PL ratio and the local KL exponent, the theory's rates at a
stationary point, the spectral record of a run's phases."""
