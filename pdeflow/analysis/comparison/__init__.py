"""pdeflow as a reference for other codes: convergence orders, manufactured cases, Wasserstein against
Wasserstein-Fisher-Rao."""
