"""Finite volumes on a reduced-coordinate grid (``solver.method = "fv"``, ``init.measure = "grid"``).

The density ``rho`` [n_1(, n_2, n_3)] of a :class:`pdeflow.core.measure.Grid` follows
``d/dt rho = div(rho grad xi)``, ``xi = Phi(omega; rho) + (1/beta) log rho`` (docs/model.md), upwinded on the face
velocity ``u = -grad xi`` taken from differences of ``xi`` at the cell centres (Carrillo-Chertock-Huang), so the
semi-discrete scheme is an exact gradient flow of the discrete energy ``E_h``; ``upwind`` or ``muscl`` fluxes, no flux
through the boundary, SSP Runge-Kutta in time with a positivity-keeping step; with ``solver.gamma > 0`` a Fisher-Rao
reaction by Strang splitting. The choices and why, the step size, vacuum (:data:`DENSITY_FLOOR`) and the diagnostics:
docs/solvers.md, "The finite-volume scheme".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pdeflow.core.config import Config
from pdeflow.core.measure import Grid, entropy
from pdeflow.core.problem import Problem

from .base import SolverError, State, Stepper
from .controller import DT_MIN
from .parameters import Param
from .wfr import GAMMA

# the [solver] keys of the flux and the step on a grid (also of jko and wfr_jko)
SCHEME = Param("scheme", str, "muscl", "flux scheme", choices=("upwind", "muscl"))
LIMITER = Param("limiter", str, "minmod", "slope limiter", choices=("minmod", "vanleer"))
CFL = Param("cfl", float, 0.4, "CFL number", gt=0, le=1)
# Density (times the box volume) below which log rho is clamped in the entropy potential.
DENSITY_FLOOR = 1e-12
# Shu-Osher coefficients of SSP-RK2 and SSP-RK3: stage i is alpha * rho_n + (1 - alpha) * Euler(stage i-1).
SSP_ALPHA = {2: (0.0, 0.5), 3: (0.0, 0.75, 1.0 / 3.0)}


def _minmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a * b > 0, np.sign(a) * np.minimum(np.abs(a), np.abs(b)), 0.0)


def _vanleer(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    prod = a * b
    den = np.where(prod > 0, a + b, 1.0)
    return np.where(prod > 0, 2.0 * prod / den, 0.0)


LIMITERS = {"minmod": _minmod, "vanleer": _vanleer}


def face_values(rho: np.ndarray, axis: int, scheme: str, limiter: str = "minmod") -> tuple[np.ndarray, np.ndarray]:
    """Face values at the interior faces normal to ``axis``: ``rho^L`` (from the cell below the face) and
    ``rho^R`` (from the cell above), each of rho's shape with ``n_axis - 1`` along ``axis``.

    ``upwind``: the cell averages; ``muscl``: ``rho_c +- s_c/2`` with the limited slope ``s_c`` (zero in the
    boundary cells). Values are clipped at 0 against rounding (the limiters keep them >= 0 in exact arithmetic).
    """
    r = np.moveaxis(rho, axis, 0)
    if scheme == "upwind":
        left, right = r[:-1], r[1:]
    elif scheme == "muscl":
        d = np.diff(r, axis=0)
        slope = np.zeros_like(r)
        slope[1:-1] = LIMITERS[limiter](d[:-1], d[1:])
        left = np.maximum(r[:-1] + 0.5 * slope[:-1], 0.0)
        right = np.maximum(r[1:] - 0.5 * slope[1:], 0.0)
    else:
        raise ValueError(f"unknown flux scheme {scheme!r}")
    return np.moveaxis(left, 0, axis), np.moveaxis(right, 0, axis)


def face_velocities(xi: np.ndarray, width: np.ndarray) -> list[np.ndarray]:
    """``u_a = -(xi_{c+e_a} - xi_c) / h_a`` at the interior faces of each axis (k arrays)."""
    return [-np.diff(xi, axis=a) / width[a] for a in range(xi.ndim)]


def upwind_flux(u: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``F = max(u, 0) rho^L + min(u, 0) rho^R``."""
    return np.maximum(u, 0.0) * left + np.minimum(u, 0.0) * right


def flux_divergence(fluxes: list[np.ndarray], width: np.ndarray) -> np.ndarray:
    """``d rho/dt = -sum_a (F_{c+1/2} - F_{c-1/2}) / h_a`` with zero flux through the boundary faces."""
    out = None
    for a, F in enumerate(fluxes):
        Fm = np.moveaxis(F, a, 0)
        div = np.zeros((Fm.shape[0] + 1,) + Fm.shape[1:])
        div[:-1] -= Fm
        div[1:] += Fm
        div = np.moveaxis(div, 0, a) / width[a]
        out = div if out is None else out + div
    return out


def outflow_rate(velocities: list[np.ndarray], width: np.ndarray, scheme: str) -> np.ndarray:
    """Per cell, the outgoing transport rate ``sum_a w_a / h_a`` (see the module docstring): [shape]."""
    total = None
    for a, u in enumerate(velocities):
        um = np.moveaxis(u, a, 0)
        pad = np.zeros((1,) + um.shape[1:])
        out_right = np.maximum(np.concatenate([um, pad]), 0.0)   # face c+1/2, flow leaving upward
        out_left = np.maximum(-np.concatenate([pad, um]), 0.0)   # face c-1/2, flow leaving downward
        w = out_right + out_left if scheme == "upwind" else 2.0 * np.maximum(out_right, out_left)
        w = np.moveaxis(w, 0, a) / width[a]
        total = w if total is None else total + w
    return total


def reaction_factor(rho: np.ndarray, exponent: np.ndarray, total: float) -> np.ndarray:
    """``rho exp(exponent)`` rescaled so that its sum is ``total`` (the exponent shifted by its largest value on
    the occupied cells first, against overflow; the shift is a constant factor the rescaling removes)."""
    occupied = rho > 0
    if not occupied.any():
        return rho.copy()
    out = np.zeros_like(rho)
    out[occupied] = rho[occupied] * np.exp(exponent[occupied] - np.max(exponent[occupied]))
    return out * (total / float(np.sum(out)))


def reaction_dissipation(xi: np.ndarray, masses: np.ndarray) -> float:
    """``sum_c m_c (xi_c - <xi>)^2`` with ``<xi> = sum_c m_c xi_c / sum_c m_c``: the Fisher-Rao part of ``I_h``."""
    xi, masses = np.ravel(xi), np.ravel(masses)
    centred = xi - float(np.dot(masses, xi)) / float(np.sum(masses))
    return float(np.dot(masses, centred * centred))


def _dilate(mask: np.ndarray) -> np.ndarray:
    """The cells of ``mask`` and their face neighbours."""
    out = mask.copy()
    for a in range(mask.ndim):
        m = np.moveaxis(mask, a, 0)
        o = np.moveaxis(out, a, 0)
        o[1:] |= m[:-1]
        o[:-1] |= m[1:]
    return out


@dataclass
class GridEvaluation:
    """Everything one evaluation of a grid density gives.

    ``energy = risk + confinement + entropy`` (``E_h``), ``phi`` and ``xi`` [shape] at the centres,
    ``velocities`` and ``fluxes`` per axis at the interior faces, ``rate`` (the largest outflow rate,
    entropy's parabolic part included), ``drho_dt`` [shape] and ``dissipation`` ``I_h``.
    """
    energy: float
    risk: float
    entropy: float
    phi: np.ndarray
    xi: np.ndarray
    velocities: list[np.ndarray]
    fluxes: list[np.ndarray]
    rate: float
    drho_dt: np.ndarray
    dissipation: float


class GridEvaluator:
    """One evaluation of a grid density (module docstring): the discrete energy ``E_h``, ``Phi`` and ``xi`` at the
    centres, face velocities and fluxes (``scheme``, ``limiter``), the outflow rate and the dissipation ``I_h``
    (with the reaction term when ``gamma > 0``). Shared by the finite-volume stepper and the grid JKO steppers,
    whose energies and dissipations therefore compare."""

    def __init__(self, problem: Problem, grid: Grid, scheme: str = "muscl", limiter: str = "minmod",
                 gamma: float = 0.0) -> None:
        self.problem, self.grid, self.scheme, self.limiter, self.gamma = problem, grid, scheme, limiter, float(gamma)
        self.beta = float(problem.beta)
        self.floor = DENSITY_FLOOR / grid.box_volume
        width = grid.width
        self.parabolic_rate = 0.0 if not math.isfinite(self.beta) else float(2.0 / self.beta * np.sum(1.0 / width ** 2))

    def __call__(self, rho: np.ndarray) -> GridEvaluation:
        """Energy, potential, face velocities and fluxes, outflow rate and dissipation of a density [shape]."""
        grid, problem = self.grid, self.problem
        centres, masses = grid.particles(rho)
        occupied = masses > 0
        risk, G = problem.risk_and_features(centres[occupied], masses[occupied])
        needed = _dilate(rho > 0).ravel()
        phi = np.zeros(grid.n_cells)
        if needed.all():
            phi[:] = problem.phi_field(centres, G)
        elif needed.any():
            phi[needed] = problem.phi_field(centres[needed], G)
        phi = phi.reshape(grid.shape)
        ent = entropy(grid, rho, self.beta)
        xi = phi if not math.isfinite(self.beta) else phi + np.log(np.maximum(rho, self.floor)) / self.beta
        width = grid.width
        velocities = face_velocities(xi, width)
        fluxes = []
        for a, u in enumerate(velocities):
            left, right = face_values(rho, a, self.scheme, self.limiter)
            fluxes.append(upwind_flux(u, left, right))
        rates = outflow_rate(velocities, width, self.scheme)
        positive = rho > 0
        rate = (float(np.max(rates[positive])) if positive.any() else 0.0) + self.parabolic_rate
        dissipation = grid.cell_volume * float(sum(np.sum(F * u) for F, u in zip(fluxes, velocities)))
        if self.gamma:
            dissipation += self.gamma * reaction_dissipation(xi, grid.masses(rho))
        energy = risk + problem.confinement(centres, masses) + ent
        return GridEvaluation(energy=energy, risk=risk, entropy=ent, phi=phi, xi=xi, velocities=velocities,
                              fluxes=fluxes, rate=rate, drho_dt=flux_divergence(fluxes, width),
                              dissipation=dissipation)

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config, grid: Grid | None = None) -> GridEvaluator:
        """The evaluator of ``cfg``'s grid (or ``grid``), ``solver.scheme``, ``solver.limiter``, ``solver.gamma``."""
        s = cfg.solver
        return cls(problem, grid or Grid.from_config(cfg.grid, problem.k), s.scheme, s.limiter, s.gamma)


class FiniteVolume(Stepper):
    """Upwind / MUSCL finite volumes with SSP Runge-Kutta time stepping (see the module docstring)."""
    name = "fv"
    summary = "finite volumes on a grid (`k <= 3`), SSP Runge-Kutta, entropy and an optional Fisher-Rao reaction"
    use_when = "the density itself without particle noise, or an entropy term (`beta < inf`)"
    measure: ClassVar[str] = "grid"
    params = (CFL, DT_MIN, SCHEME, LIMITER, GAMMA)
    step_columns = ("mass", "min_density", "rejected")

    def __init__(self, problem: Problem, grid: Grid, dt: float, *, cfl: float = 0.4, dt_min: float = 0.0,
                 scheme: str = "muscl", limiter: str = "minmod", time_order: int = 2, gamma: float = 0.0) -> None:
        """On ``grid``: steps of at most ``dt`` and ``cfl`` over the outflow rate, never below ``dt_min``; the
        flux ``scheme`` and ``limiter``; SSP Runge-Kutta of ``time_order`` (2 or 3); the Fisher-Rao rate
        ``gamma`` (``solver.*`` and ``grid.time_order``)."""
        super().__init__(problem)
        self.grid, self.dt, self.dt_min, self.cfl = grid, float(dt), float(dt_min), cfl
        self.evaluator = GridEvaluator(problem, grid, scheme, limiter, gamma)
        self.beta, self.scheme, self.limiter, self.gamma = self.evaluator.beta, scheme, limiter, self.evaluator.gamma
        self.alphas = SSP_ALPHA[time_order]

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> FiniteVolume:
        return cls(problem, Grid.from_config(cfg.grid, problem.k), **cls.parameters(cfg))

    @staticmethod
    def parameters(cfg: Config) -> dict[str, Any]:
        """The finite-volume parameters of ``cfg`` (``solver.*``, ``grid.time_order``), as keyword arguments."""
        s = cfg.solver
        return {"dt": s.dt, "cfl": s.cfl, "dt_min": s.dt_min, "scheme": s.scheme, "limiter": s.limiter,
                "time_order": cfg.grid.time_order, "gamma": s.gamma}

    def frame_attrs(self) -> dict[str, Any]:
        return self.grid.frame_attrs()

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate_density(self, rho: np.ndarray) -> GridEvaluation:
        """The evaluation of a density [shape] (:class:`GridEvaluator`)."""
        return self.evaluator(rho)

    def evaluate(self, state: State) -> GridEvaluation:  # type: ignore[override]
        """The evaluation at the state's density, cached on the state."""
        if state.evaluation is None:
            state.evaluation = self.evaluate_density(state.fields["density"])
        return state.evaluation

    def diagnostics(self, state: State) -> dict[str, float]:
        ev = self.evaluate(state)
        return {"energy": ev.energy, "risk": ev.risk, "dissipation": ev.dissipation}

    # ---- stepping -----------------------------------------------------------------------------
    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        rho0 = state.fields["density"]
        ev0 = self.evaluate(state)
        dt = self.dt if ev0.rate == 0.0 else min(self.dt, self.cfl / ev0.rate)
        if self.gamma:
            spread = float(np.ptp(ev0.xi[rho0 > 0])) if np.any(rho0 > 0) else 0.0
            if spread > 0.0:
                dt = min(dt, self.cfl / (self.gamma * spread))
        rejected = 0
        while True:
            h = min(dt, dt_limit)
            result = self._split_step(rho0, ev0, h) if self.gamma else self._ssp_step(rho0, ev0, h)
            if result is not None:
                rho, ev = result
                break
            rejected += 1
            dt = 0.5 * h
            if dt < self.dt_min:
                raise SolverError(f"finite-volume step fell below solver.dt_min = {self.dt_min:g} "
                                  f"keeping the density nonnegative; lower solver.cfl")
        new = state.advanced({"density": rho}, h, dt=h)
        new.evaluation = ev
        return new, {"mass": self.grid.total_mass(rho), "min_density": float(np.min(rho)),
                     "rejected": float(rejected)}

    def _reaction(self, rho: np.ndarray, ev: GridEvaluation, tau: float) -> tuple[np.ndarray, GridEvaluation]:
        """``R(tau)``: the Fisher-Rao reaction over tau by the exponential trapezoid rule (module docstring);
        the density after it and its evaluation."""
        total = float(np.sum(rho))
        predictor = reaction_factor(rho, -self.gamma * tau * ev.xi, total)
        ev_p = self.evaluate_density(predictor)
        out = reaction_factor(rho, -0.5 * self.gamma * tau * (ev.xi + ev_p.xi), total)
        return out, self.evaluate_density(out)

    def _split_step(self, rho0: np.ndarray, ev0: GridEvaluation,
                    h: float) -> tuple[np.ndarray, GridEvaluation] | None:
        """Strang splitting ``R(h/2) T(h) R(h/2)``, or None if the transport step breaks positivity."""
        rho, ev = self._reaction(rho0, ev0, 0.5 * h)
        if h * ev.rate > 1.0:
            return None
        result = self._ssp_step(rho, ev, h)
        if result is None:
            return None
        return self._reaction(*result, 0.5 * h)

    def _ssp_step(self, rho0: np.ndarray, ev0: GridEvaluation, h: float) -> tuple[np.ndarray, GridEvaluation] | None:
        """One SSP-RK step of length h, or None if a stage breaks the positivity bound ``h r <= 1``."""
        rho, ev = rho0, ev0
        for i, alpha in enumerate(self.alphas):
            if i > 0:
                ev = self.evaluate_density(rho)
                if h * ev.rate > 1.0:
                    return None
            euler = rho + h * ev.drho_dt
            rho = euler if alpha == 0.0 else alpha * rho0 + (1.0 - alpha) * euler
            if np.min(rho) < 0.0:
                return None
        return rho, self.evaluate_density(rho)

    def likely_cause(self, state: State) -> str:
        return (f"the finite-volume step (solver.cfl = {self.cfl:g}, solver.dt = {self.dt:g}) "
                f"is too large for this problem on grid.n = {self.grid.shape[0]}; lower solver.cfl or solver.dt")
