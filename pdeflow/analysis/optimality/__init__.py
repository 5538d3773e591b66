"""The optimality gap G = int Phi d rho - min_Omega Phi: its domain Omega, the search for min Phi and its
certificate."""
