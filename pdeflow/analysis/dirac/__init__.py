"""Dirac stationary measures: H0 / Htr spectra, verdicts, rates checked by simulation, their figures."""
