"""Anderson acceleration (type II) of a fixed-point iteration: what the grid JKO step uses to re-linearize the
risk at large ``tau`` (:class:`pdeflow.solvers.jko.GridJKO`).
"""
from __future__ import annotations

import numpy as np


# ---- the entropic proximal step on a grid ---------------------------------------------------------
class Anderson:
    """Anderson acceleration (type II) of a fixed-point iteration ``x = G(x)`` from the last ``depth`` pairs.

    ``update(x, G(x), weight)`` returns the next iterate ``G(x) - sum_i gamma_i dG_i`` with gamma minimizing
    ``|weight * (f - sum_i gamma_i df_i)|``, ``f = G(x) - x``; with one pair it is the plain iteration.
    For a linear map this is GMRES on ``x - G(x) = 0``: it converges where the plain iteration
    oscillates (the re-linearized risk overshoots at large tau).
    """

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.xs: list[np.ndarray] = []
        self.gs: list[np.ndarray] = []

    def update(self, x: np.ndarray, gx: np.ndarray, weight: np.ndarray) -> np.ndarray:
        self.xs.append(x)
        self.gs.append(gx)
        self.xs, self.gs = self.xs[-(self.depth + 1):], self.gs[-(self.depth + 1):]
        if len(self.xs) == 1:
            return gx
        G = np.array(self.gs)
        F = (G - np.array(self.xs)) * weight
        dF, dG = np.diff(F, axis=0), np.diff(G, axis=0)
        gamma = np.linalg.lstsq(dF.T, F[-1], rcond=None)[0]
        return gx - gamma @ dG
