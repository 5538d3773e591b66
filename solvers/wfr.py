"""Wasserstein-Fisher-Rao particles (``solver.method = "wfr"``): heads that move and trade mass.

The weighted particles ``rho = sum_i m_i delta_{omega_i}`` follow (docs/model.md)
``d omega_i/dt = -alpha grad Phi(omega_i; rho)``, ``d m_i/dt = -gamma m_i (Phi(omega_i; rho) - <Phi>)`` (total mass
kept; ``solver.total_mass = "free"`` drops ``<Phi>``), with dissipation
``I = alpha sum_i m_i |grad Phi_i|^2 + gamma sum_i m_i (Phi_i - <Phi>)^2``. Integrated by the step of
:class:`pdeflow.solvers.explicit.DormandPrince` on the joint state ``y = (omega, m)`` [N, k + 1] (its vector, rates and
fields are this module's); ``gamma = 0``, ``alpha = 1`` integrates ``omega`` alone, ``adaptive`` bit for bit.
Masses below ``solver.mass_floor`` times the total are removed (``/steps/removed``,
``/steps/removed_mass``). Details: docs/solvers.md, "WFR particles: wfr".
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from pdeflow.core.config import Config, ConfigError
from pdeflow.core.problem import Problem

from .base import SolverError, State
from .controller import CONTROLLER_PARAMS
from .explicit import DormandPrince
from .parameters import Param
from .step_size import StepSizeController

# the [solver] keys of the Wasserstein-Fisher-Rao flow (alpha, gamma: also of fv and wfr_jko)
ALPHA = Param("alpha", float, 1.0, "transport speed alpha in d omega/dt = -alpha grad Phi", ge=0)
GAMMA = Param("gamma", float, 0.0, "Fisher-Rao rate gamma in d m/dt = -gamma m (Phi - <Phi>) (0: Wasserstein flow)",
              ge=0)
TOTAL_MASS = Param("total_mass", str, "fixed", "'fixed' (d m/dt = -gamma m (Phi - <Phi>), probability measures) or "
                   "'free' (d m/dt = -gamma m Phi, the unbalanced/conic flow)", choices=("fixed", "free"))
MASS_FLOOR = Param("mass_floor", float, 1e-12, "a particle whose mass falls below this fraction of the total is "
                   "removed (mass set to 0, counted in /steps/removed)", ge=0, le=1e-3)


class WassersteinFisherRao(DormandPrince):
    """Dormand-Prince 5(4) on ``(omega, m)`` for the WFR particle flow (see the module docstring)."""
    name = "wfr"
    summary = "the Wasserstein-Fisher-Rao flow of weighted particles (Dormand-Prince on positions and masses)"
    use_when = "heads that gain and lose mass: leaving stationary points that are not global minimizers"
    step_columns = ("rejected", "removed", "removed_mass")
    explicit_flow = False  # its own vector field on (omega, m)
    params = (*CONTROLLER_PARAMS, ALPHA, GAMMA, TOTAL_MASS, MASS_FLOOR)
    sharded = True  # the rho-averages are sums over ranks, like the energy

    def __init__(self, problem: Problem, dt: float, *, controller: StepSizeController, alpha: float, gamma: float,
                 mass_floor: float, total_mass: str = "fixed") -> None:
        """The transport rate ``alpha``, the Fisher-Rao rate ``gamma``, the removal threshold ``mass_floor`` and
        ``total_mass`` (``"fixed"`` or ``"free"``), ``solver.*`` of the same names; ``dt`` and ``controller``
        as for :class:`~pdeflow.solvers.explicit.DormandPrince`."""
        super().__init__(problem, dt, controller=controller)
        self.alpha, self.gamma, self.mass_floor = float(alpha), float(gamma), float(mass_floor)
        self.fixed_mass = total_mass == "fixed"
        # Dormand-Prince on the joint state y = (omega, m), or on omega alone for the Wasserstein flow (gamma = 0,
        # alpha = 1: adaptive bit for bit)
        self.joint = not (self.gamma == 0.0 and self.alpha == 1.0)

    @classmethod
    def check_keys(cls, cfg: Config) -> None:
        if cfg.solver.alpha == 0.0 and cfg.solver.gamma == 0.0:
            raise ConfigError("solver.alpha and solver.gamma are both 0: the wfr flow would not move")

    # ---- the vector field ---------------------------------------------------------------------
    def mean_phi(self, phi: np.ndarray, mass: np.ndarray) -> float:
        """``<Phi> = sum_i m_i Phi_i / sum_i m_i`` (summed over ranks); 0 with ``solver.total_mass = "free"``."""
        if not self.fixed_mass:
            return 0.0
        weighted, total = self.problem.comm.sum_over_ranks(float(np.dot(mass, phi)), float(np.sum(mass)))
        # a trial step far outside the stability region can cancel the total: its error is then inf
        return weighted / total if total != 0.0 else math.nan

    def _rates(self, y: np.ndarray, phi: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """``dy/dt`` [N, k + 1] at the joint state y from Phi [N] and grad Phi [N, k] at its particles."""
        mass = y[:, -1]
        out = np.empty_like(y)
        out[:, :-1] = -self.alpha * grad
        out[mass == 0.0, :-1] = 0.0  # removed particles stay where they are
        out[:, -1] = -self.gamma * mass * (phi - self.mean_phi(phi, mass))
        return out

    # ---- the joint state y = (omega, m) [N, k + 1] of Dormand-Prince (gamma = 0, alpha = 1: y = omega) ------------
    def _solution(self, state: State) -> np.ndarray:
        if not self.joint:
            return super()._solution(state)
        return np.concatenate([state.fields["omega"], state.fields["mass"][:, None]], axis=1)

    def _rate_at(self, state: State) -> np.ndarray:
        if not self.joint:
            return super()._rate_at(state)
        y = self._solution(state)
        if state.evaluation is None:  # a step's new state: evaluated at the columns of y, as the stages are
            state.evaluation = self.problem.evaluate(y[:, :-1], y[:, -1])
        return self._rates(y, state.evaluation.phi, state.evaluation.grad_phi)

    def _velocity(self, y: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """The stage derivative ``dy/dt`` at ``y`` (the masses are y's last column on the joint state)."""
        if not self.joint:
            return super()._velocity(y, mass)
        omega, m = y[:, :-1], y[:, -1]
        phi, grad = self.problem.grad_phi_field(omega, self.problem.residual_features(omega, m))
        return self._rates(y, phi, grad)

    def _fields(self, y: np.ndarray, state: State) -> dict[str, np.ndarray]:
        if not self.joint:
            return super()._fields(y, state)
        return {"omega": np.ascontiguousarray(y[:, :-1]), "mass": y[:, -1].copy()}

    # ---- stepping -----------------------------------------------------------------------------
    def _quadrature(self, state: State, h: float, weights: tuple[float, ...], stages: list[np.ndarray]) -> float | None:
        """The stage quadrature of ``int I dt`` on the Wasserstein path; on the joint state ``(omega, m)`` None, so
        the accuracy record takes the trapezoid on the WFR dissipation of the step's ends: the stages hold
        ``dy/dt``, and ``m |d omega/dt|^2`` is not the WFR dissipation (its mass term needs the stage masses)."""
        if self.joint:
            return None
        return super()._quadrature(state, h, weights, stages)

    def _accept_step(self, state: State, new: State, h: float, plan: Any,
                     columns: dict[str, float]) -> dict[str, float]:
        columns = super()._accept_step(state, new, h, plan, columns)
        removed, removed_mass = self._remove_underflow(new) if self.gamma else (0, 0.0)
        return {**columns, "removed": float(removed), "removed_mass": removed_mass}

    def _remove_underflow(self, state: State) -> tuple[int, float]:
        """Remove the particles whose mass fell below ``mass_floor`` times the total (module docstring);
        returns how many (over all ranks) and the mass they had."""
        mass = state.fields["mass"]
        local_total = float(np.sum(mass))
        (total,) = self.problem.comm.sum_over_ranks(local_total)
        dead = (mass != 0.0) & (mass < self.mass_floor * total)
        n_dead, dead_mass = self.problem.comm.sum_over_ranks(float(np.count_nonzero(dead)), float(np.sum(mass[dead])))
        if n_dead == 0:
            return 0, 0.0
        if total - dead_mass <= 0.0:
            raise SolverError("every particle's mass underflowed; lower solver.mass_floor or solver.gamma")
        mass = np.where(dead, 0.0, mass * (total / (total - dead_mass)) if self.fixed_mass else mass)
        state.fields = {"omega": state.fields["omega"], "mass": mass}
        state.evaluation = None
        return int(n_dead), dead_mass

    # ---- diagnostics --------------------------------------------------------------------------
    def fisher_rao_dissipation(self, phi: np.ndarray, mass: np.ndarray) -> float:
        """``sum_i m_i (Phi_i - <Phi>)^2`` (summed over ranks; ``<Phi> = 0`` with a free total mass)."""
        centred = phi - self.mean_phi(phi, mass)
        return self.problem.comm.sum_over_ranks(float(np.dot(mass, centred * centred)))[0]

    def diagnostics(self, state: State) -> dict[str, float]:
        """``energy``, ``risk`` and the WFR ``dissipation`` ``I`` (module docstring), so ``dE/dt = -I``."""
        ev = self.evaluate(state)
        if not self.joint:
            return {"energy": ev.energy, "risk": ev.risk, "dissipation": ev.dissipation}
        fr = self.fisher_rao_dissipation(ev.phi, state.fields["mass"]) if self.gamma else 0.0
        # removed particles have mass 0 and add nothing to either sum
        return {"energy": ev.energy, "risk": ev.risk, "dissipation": self.alpha * ev.dissipation + self.gamma * fr}

    def likely_cause(self, state: State) -> str:
        return (f"the wfr stepper's tolerances (solver.rtol = {self.rtol:g}, solver.atol = "
                f"{self.atol:g}) are too loose for solver.gamma = {self.gamma:g}; tighten them")
