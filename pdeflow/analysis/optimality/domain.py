"""The compact parameter set Omega of the optimality gap: a ball, a box, or the box of a grid run."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.config import ConfigError


@dataclass(frozen=True)
class Domain:
    """Omega: the ball ``|omega| <= radius`` (kind "ball") or the box ``lower <= omega <= upper`` ("box")."""
    kind: str
    lower: np.ndarray     # [k], the bounding box (for a ball: -radius)
    upper: np.ndarray     # [k]
    radius: float = math.inf

    @classmethod
    def make(cls, domain: str, k: int, radius: float,
             bounds: tuple[np.ndarray, np.ndarray] | None = None) -> Domain:
        """``ball``/``box`` of radius (half-width) ``radius`` about 0, or ``grid``: the box ``bounds``."""
        if domain == "ball":
            return cls("ball", np.full(k, -radius), np.full(k, radius), float(radius))
        if domain == "box":
            return cls("box", np.full(k, -radius), np.full(k, radius))
        if domain == "grid":
            if bounds is None:
                raise ConfigError("diagnostics.domain = 'grid' needs a grid run (the box of its grid)")
            lower, upper = (np.broadcast_to(np.asarray(b, dtype=float), (k,)).copy() for b in bounds)
            return cls("box", lower, upper)
        raise ConfigError(f"diagnostics.domain must be one of 'ball', 'box', 'grid', got {domain!r}")

    @property
    def k(self) -> int:
        return self.lower.size

    def project(self, x: np.ndarray) -> np.ndarray:
        """The nearest point of Omega: clip to the box, or scale onto the ball. [S, k] -> [S, k]."""
        if self.kind == "box":
            return np.clip(x, self.lower, self.upper)
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        return x * np.minimum(1.0, self.radius / np.maximum(norm, 1e-300))

    def outside(self, x: np.ndarray) -> np.ndarray:
        """Points of x [S, k] not in Omega (beyond a relative 1e-12): [S] bool."""
        if self.kind == "box":
            tol = 1e-12 * np.maximum(1.0, np.abs(self.upper - self.lower))
            return np.any((x < self.lower - tol) | (x > self.upper + tol), axis=1)
        return np.linalg.norm(x, axis=1) > self.radius * (1 + 1e-12)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n points uniform in Omega: [n, k]."""
        if self.kind == "box":
            return rng.uniform(self.lower, self.upper, size=(n, self.k))
        direction = rng.standard_normal((n, self.k))
        direction /= np.maximum(np.linalg.norm(direction, axis=1, keepdims=True), 1e-300)
        return direction * (self.radius * rng.random((n, 1)) ** (1.0 / self.k))

    def grid(self, points: int) -> tuple[np.ndarray, np.ndarray]:
        """A regular grid of ``points`` per axis over the bounding box: points [points^k, k] (row-major,
        axis 0 slowest) and which of them lie in Omega [points^k]."""
        axes = [np.linspace(lo, hi, points) for lo, hi in zip(self.lower, self.upper)]
        mesh = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, self.k)
        return mesh, ~self.outside(mesh)
