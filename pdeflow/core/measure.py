"""Grid discretization of the head distribution rho on a box in reduced coordinates omega (k <= 3).

A :class:`Grid` cuts the box into ``shape = (n_1, .., n_k)`` equal cells; a grid measure is a piecewise-constant
density ``rho`` [n_1(, n_2, n_3)] (cell averages, C order) with cell masses ``m_c = rho_c |C|`` summing to one, seen
by the Problem as weighted particles at the cell centres (docs/model.md, "The grid measure"). Energy:
``E(rho) = R(rho) + (lam/2) sum_c m_c |c|^2 + (1/beta) sum_c |C| rho_c log rho_c``. Initial densities
(:func:`initial_density`) are exact cell averages. Details: docs/design.md, "The grid measure".
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from scipy.special import ndtr

from .config import ConfigError, GridConfig, InitConfig

# Fraction of the initial law that must fall inside the box; below it the box is surely misplaced.
MIN_MASS_IN_BOX = 0.99


@dataclass(frozen=True)
class Grid:
    """A box in omega cut into equal cells: ``lower`` [k], ``upper`` [k], ``shape`` (n_1, .., n_k).

    Build with :meth:`from_config` (the ``[grid]`` section), :meth:`from_frame_attrs` (a trajectory) or
    directly: ``Grid((-3.0,), (3.0,), (64,))``.
    """
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "lower", tuple(float(v) for v in np.atleast_1d(self.lower)))
        object.__setattr__(self, "upper", tuple(float(v) for v in np.atleast_1d(self.upper)))
        object.__setattr__(self, "shape", tuple(int(v) for v in np.atleast_1d(self.shape)))
        if not (len(self.lower) == len(self.upper) == len(self.shape) >= 1):
            raise ValueError(f"grid lower, upper and shape must have one entry per axis, got "
                             f"{len(self.lower)}, {len(self.upper)}, {len(self.shape)}")
        if any(not (math.isfinite(a) and math.isfinite(b) and a < b) for a, b in zip(self.lower, self.upper)):
            raise ValueError(f"grid box needs finite lower < upper on every axis, got {self.lower}, {self.upper}")
        if any(n < 1 for n in self.shape):
            raise ValueError(f"grid shape must be positive, got {self.shape}")

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_config(cls, grid: GridConfig, k: int) -> Grid:
        """The grid of the ``[grid]`` section for k reduced coordinates; ConfigError naming ``grid.<key>``."""
        if k > 3:
            raise ConfigError(f"a grid needs k <= 3 reduced coordinates, the model has k = {k} "
                              f"(choose model.coordinates = output_gain, gain2, gain3 or a basis_file with k <= 3)")
        corners = {}
        for key, default in (("lower", -grid.radius), ("upper", grid.radius)):
            values = list(getattr(grid, key))
            if len(values) == 0:
                values = [default] * k
            elif len(values) == 1:
                values = values * k
            elif len(values) != k:
                raise ConfigError(f"grid.{key} must hold 0, 1 or k = {k} numbers, got {len(values)}")
            corners[key] = values
        for a, (lo, hi) in enumerate(zip(corners["lower"], corners["upper"])):
            if not lo < hi:
                raise ConfigError(f"grid.upper must exceed grid.lower on every axis, got {hi!r} <= {lo!r} on axis {a}")
        return cls(tuple(corners["lower"]), tuple(corners["upper"]), (grid.n,) * k)

    def frame_attrs(self) -> dict[str, np.ndarray]:
        """``lower``, ``upper`` (float [k]) and ``shape`` (int [k]): the ``/frames`` attributes of a grid run."""
        return {"lower": np.array(self.lower), "upper": np.array(self.upper),
                "shape": np.array(self.shape, dtype=np.int64)}

    @classmethod
    def from_frame_attrs(cls, attrs: dict[str, Any]) -> Grid:
        """Inverse of :meth:`frame_attrs` (e.g. ``Grid.from_frame_attrs(traj.frame_attrs)``)."""
        return cls(tuple(np.atleast_1d(attrs["lower"])), tuple(np.atleast_1d(attrs["upper"])),
                   tuple(np.atleast_1d(attrs["shape"])))

    # ---- geometry -----------------------------------------------------------------------------
    @property
    def k(self) -> int:
        """Number of axes (reduced coordinates)."""
        return len(self.shape)

    @property
    def n_cells(self) -> int:
        """``M = n_1 ... n_k``."""
        return int(np.prod(self.shape))

    @cached_property
    def width(self) -> np.ndarray:
        """Cell widths ``h_a = (upper_a - lower_a) / n_a``: [k]."""
        return (np.array(self.upper) - np.array(self.lower)) / np.array(self.shape)

    @property
    def cell_volume(self) -> float:
        """``|C| = prod_a h_a``."""
        return float(np.prod(self.width))

    @property
    def box_volume(self) -> float:
        """``prod_a (upper_a - lower_a)``."""
        return float(np.prod(np.array(self.upper) - np.array(self.lower)))

    def edges(self, axis: int) -> np.ndarray:
        """Cell boundaries along an axis: [n_a + 1], from lower_a to upper_a."""
        n = self.shape[axis]
        return self.lower[axis] + self.width[axis] * np.arange(n + 1)

    @cached_property
    def axes(self) -> tuple[np.ndarray, ...]:
        """Cell-centre coordinates along each axis: k arrays [n_a]."""
        return tuple(self.lower[a] + self.width[a] * (np.arange(n) + 0.5) for a, n in enumerate(self.shape))

    @cached_property
    def centres(self) -> np.ndarray:
        """Cell centres [M, k], C order (row c is the cell ``np.unravel_index(c, shape)``)."""
        mesh = np.meshgrid(*self.axes, indexing="ij")
        out = np.stack([m.ravel() for m in mesh], axis=1)
        out.setflags(write=False)
        return out

    def face_centres(self, axis: int) -> np.ndarray:
        """Centres of the interior faces normal to ``axis`` (between cells i and i + e_axis):
        [n_1 .. (n_axis - 1) .. n_k flattened in C order, k]. Boundary faces carry no flux and are left out."""
        axes = list(self.axes)
        axes[axis] = self.edges(axis)[1:-1]
        mesh = np.meshgrid(*axes, indexing="ij")
        return np.stack([m.ravel() for m in mesh], axis=1)

    def cell_index(self, point: Sequence[float]) -> tuple[int, ...] | None:
        """Index of the cell containing ``point`` [k] (upper faces belong to the last cell), None outside."""
        point = np.asarray(point, dtype=float)
        idx = np.floor((point - np.array(self.lower)) / self.width).astype(int)
        if np.any(point < np.array(self.lower)) or np.any(point > np.array(self.upper)):
            return None
        return tuple(int(min(i, n - 1)) for i, n in zip(idx, self.shape))

    # ---- conversions --------------------------------------------------------------------------
    def masses(self, density: np.ndarray) -> np.ndarray:
        """Cell masses ``m_c = rho_c |C|``: density [shape] -> [M] (C order)."""
        return np.asarray(density, dtype=float).reshape(self.n_cells) * self.cell_volume

    def density(self, masses: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`masses`: [M] -> density [shape]."""
        return np.asarray(masses, dtype=float).reshape(self.shape) / self.cell_volume

    def particles(self, density: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The grid measure as weighted particles: cell centres [M, k] and masses [M]."""
        return self.centres, self.masses(density)

    def total_mass(self, density: np.ndarray) -> float:
        """``sum_c |C| rho_c``."""
        return float(np.sum(density) * self.cell_volume)

    def integrate(self, values: np.ndarray) -> float:
        """Midpoint rule ``sum_c |C| f_c`` for values at the cell centres [shape] (or [M])."""
        return float(np.sum(values) * self.cell_volume)

    def mean(self, density: np.ndarray) -> np.ndarray:
        """``sum_c m_c c / sum_c m_c``: [k]."""
        m = self.masses(density)
        return m @ self.centres / m.sum()

    def covariance(self, density: np.ndarray) -> np.ndarray:
        """Covariance of the weighted centres ``sum_c m_c (c - mean)(c - mean)^T / sum m``: [k, k]."""
        m = self.masses(density)
        x = self.centres - m @ self.centres / m.sum()
        return (x * m[:, None]).T @ x / m.sum()

    # ---- densities ----------------------------------------------------------------------------
    def gaussian(self, mean: Sequence[float] | float, scale: Sequence[float] | float,
                 normalize: bool = True) -> np.ndarray:
        """Exact cell averages of ``N(mean, diag(scale^2))`` [shape] (mean, scale: a number or k numbers).

        With ``normalize`` the mass in the box is scaled to one; otherwise the density is the law's own
        (mass outside the box missing)."""
        mean = np.broadcast_to(np.asarray(mean, dtype=float), (self.k,))
        scale = np.broadcast_to(np.asarray(scale, dtype=float), (self.k,))
        factors = []
        for a in range(self.k):
            z = (self.edges(a) - mean[a]) / scale[a]
            # CDF differences on the side of the smaller tail keep relative accuracy far from the mean
            lower_tail = np.diff(ndtr(z))
            upper_tail = -np.diff(ndtr(-z))
            factors.append(np.where(z[:-1] < 0, lower_tail, upper_tail) / self.width[a])
        return self._product(factors, normalize)

    def uniform(self, mean: Sequence[float] | float, half_width: Sequence[float] | float,
                normalize: bool = True) -> np.ndarray:
        """Exact cell averages of the uniform law on ``mean + [-half_width, half_width]^k``: [shape]."""
        mean = np.broadcast_to(np.asarray(mean, dtype=float), (self.k,))
        half = np.broadcast_to(np.asarray(half_width, dtype=float), (self.k,))
        factors = []
        for a in range(self.k):
            e = self.edges(a)
            lo, hi = mean[a] - half[a], mean[a] + half[a]
            overlap = np.clip(np.minimum(e[1:], hi) - np.maximum(e[:-1], lo), 0.0, None)
            factors.append(overlap / (2.0 * half[a]) / self.width[a])
        return self._product(factors, normalize)

    def point(self, centre: Sequence[float]) -> np.ndarray:
        """All mass in the cell containing ``centre`` [k]: density ``1/|C|`` there, 0 elsewhere. ValueError outside."""
        idx = self.cell_index(np.broadcast_to(np.asarray(centre, dtype=float), (self.k,)))
        if idx is None:
            raise ValueError(f"point {list(np.atleast_1d(centre))} lies outside the grid box")
        rho = np.zeros(self.shape)
        rho[idx] = 1.0 / self.cell_volume
        return rho

    def _product(self, factors: list[np.ndarray], normalize: bool) -> np.ndarray:
        rho = factors[0]
        for f in factors[1:]:
            rho = np.multiply.outer(rho, f)
        rho = np.array(rho, dtype=float).reshape(self.shape)
        if normalize:
            mass = self.total_mass(rho)
            if not mass > 0:
                raise ValueError("the law puts no mass in the grid box")
            rho /= mass
        return rho


def _init_centre(mean: Sequence[float], k: int) -> np.ndarray:
    mean = np.atleast_1d(np.asarray(mean, dtype=float))
    if mean.size not in (0, 1, k):
        raise ConfigError(f"init.mean must hold 0, 1 or k = {k} numbers, got {mean.size}")
    return np.broadcast_to(mean if mean.size else np.zeros(1), (k,)).copy()


def initial_density(grid: Grid, init: InitConfig) -> np.ndarray:
    """The initial density of ``[init]`` on the grid (docs/design.md, "The grid measure"): [shape], mass one.

    ConfigError if ``init.mean`` has the wrong length, a point lies outside the box, or less than
    :data:`MIN_MASS_IN_BOX` of the law falls inside the box.
    """
    centre = _init_centre(init.mean, grid.k)
    if init.distribution == "point" or init.scale == 0.0:
        if grid.cell_index(centre) is None:
            raise ConfigError(f"init.mean = {list(centre)} lies outside the grid box "
                              f"{list(grid.lower)} .. {list(grid.upper)}; move it or change grid.lower/upper")
        return grid.point(centre)
    if init.distribution == "gaussian":
        raw = grid.gaussian(centre, init.scale, normalize=False)
    elif init.distribution == "uniform":
        raw = grid.uniform(centre, init.scale, normalize=False)
    else:
        raise ConfigError(f"init.distribution must be gaussian, uniform or point, got {init.distribution!r}")
    inside = grid.total_mass(raw)
    if not inside >= MIN_MASS_IN_BOX:
        raise ConfigError(f"only {inside:.3g} of the initial {init.distribution} law lies in the grid box "
                          f"{list(grid.lower)} .. {list(grid.upper)}; widen grid.radius (or grid.lower/upper) "
                          f"or change init.mean/init.scale")
    return raw / inside


# ---- functionals ------------------------------------------------------------------------------
def entropy(grid: Grid, density: np.ndarray, beta: float) -> float:
    """``(1/beta) int rho log rho = (1/beta) sum_c |C| rho_c log rho_c`` (``0 log 0 = 0``); 0 when beta = inf."""
    if not math.isfinite(beta):
        return 0.0
    rho = np.asarray(density, dtype=float)
    positive = rho > 0
    return float(np.sum(rho[positive] * np.log(rho[positive])) * grid.cell_volume / beta)


def free_energy(problem: Any, grid: Grid, density: np.ndarray) -> float:
    """``E(rho) = R(rho) + (lam/2) sum_c m_c |c|^2 + (1/beta) int rho log rho`` of a grid density
    (``problem`` a :class:`pdeflow.core.problem.Problem`; its ``beta`` sets the entropy)."""
    omega, mass = grid.particles(density)
    return problem.energy(omega, mass) + entropy(grid, density, problem.beta)


def l1_distance(grid: Grid, a: np.ndarray, b: np.ndarray) -> float:
    """``int |rho_a - rho_b| = sum_c |C| |a_c - b_c|`` for two densities on the same grid."""
    return float(np.sum(np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))) * grid.cell_volume)


__all__ = ["Grid", "initial_density", "entropy", "free_energy", "l1_distance", "MIN_MASS_IN_BOX"]
