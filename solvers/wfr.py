"""Wasserstein-Fisher-Rao particles (``solver.method = "wfr"``): heads that move and trade mass.

The weighted particles ``rho = sum_i m_i delta_{omega_i}`` follow the Wasserstein-Fisher-Rao
(Hellinger-Kantorovich) gradient flow of the energy E (docs/model.md):

    d omega_i / dt = -alpha grad Phi(omega_i; rho),
    d m_i / dt     = -gamma m_i (Phi(omega_i; rho) - <Phi>),    <Phi> = sum_j m_j Phi_j / sum_j m_j,

with ``alpha = solver.alpha`` and ``gamma = solver.gamma``. The mass equation is the Fisher-Rao part
(birth-death: heads where Phi is below its rho-average gain weight); subtracting ``<Phi>`` makes
``sum_i dm_i/dt = 0``, so the total mass is conserved. Since ``dE/dm_i = Phi_i`` and
``dE/domega_i = m_i grad Phi_i``, the energy identity is ``dE/dt = -I`` with the dissipation

    I = alpha sum_i m_i |grad Phi_i|^2 + gamma sum_i m_i (Phi_i - <Phi>)^2,

which is what :meth:`WassersteinFisherRao.diagnostics` reports (the ``dissipation`` of ``/steps`` and
``/frames``).

Integration: the Dormand-Prince 5(4) pair of :class:`solvers.explicit.DormandPrince` (same tableau, same
controller and tolerances) on the joint state ``y = (omega, m)`` [N, k + 1], so the error control covers
the masses too: ``err = rms((y5 - y4) / (atol + rtol max(|y_n|, |y5|)))`` over all N (k + 1) entries. Each
stage is one pass of the Problem (Phi and grad Phi together), and the evaluation at the end of an
accepted step is the first stage of the next (first same as last). The mass equation is linear in m with
``sum_i dm_i = 0`` at every stage, so every Runge-Kutta combination keeps the total mass to rounding.

- ``gamma = 0`` and ``alpha = 1`` is the Wasserstein flow: the step is ``DormandPrince.step`` itself, so a
  trajectory equals the ``adaptive`` one bit for bit (masses untouched).
- ``gamma = 0``, ``alpha != 1``: the Wasserstein flow in the time ``alpha t`` (masses not integrated).

**Mass underflow.** Masses decay like ``exp(-gamma (Phi_i - <Phi>) t)``. A mass far below the absolute
tolerance no longer enters the error estimate, so nothing would keep a step inside the stability region of
its (possibly fast) decay and it could turn negative. Such particles are removed: after each accepted
step every particle with ``0 != m_i < solver.mass_floor * sum_j m_j`` (negative masses included) gets
``m_i = 0`` exactly, and the remaining masses are rescaled by ``M / (M - removed)`` so the total ``M`` is
unchanged (to rounding). A removed particle is kept in the arrays (frames keep N rows) at the position
where it was removed: zero is a fixed point of the mass equation and its velocity is set to zero, so it
never returns and costs the error control nothing. ``/steps/removed`` counts the particles removed at
each step and ``/steps/removed_mass`` the mass they had. (Integrating ``log m`` instead would avoid the
floor but not conserve the total mass under Runge-Kutta; removal keeps the linear invariant.)
"""
from __future__ import annotations

import math

import numpy as np

from . import register
from .base import SolverError, State
from .explicit import DormandPrince


@register
class WassersteinFisherRao(DormandPrince):
    """Dormand-Prince 5(4) on ``(omega, m)`` for the WFR particle flow (see the module docstring)."""
    name = "wfr"
    step_columns = ("rejected", "removed", "removed_mass")
    sharded = True  # the rho-averages are sums over ranks, like the energy

    def __init__(self, problem, cfg) -> None:
        super().__init__(problem, cfg)
        s = cfg.solver
        self.alpha, self.gamma, self.mass_floor = float(s.alpha), float(s.gamma), float(s.mass_floor)

    # ---- the vector field ---------------------------------------------------------------------
    def mean_phi(self, phi: np.ndarray, mass: np.ndarray) -> float:
        """``<Phi> = sum_i m_i Phi_i / sum_i m_i`` (summed over ranks)."""
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

    def _joint_rates(self, y: np.ndarray) -> np.ndarray:
        omega, mass = y[:, :-1], y[:, -1]
        phi, grad = self.problem.grad_phi_field(omega, self.problem.residual_features(omega, mass))
        return self._rates(y, phi, grad)

    # ---- stepping -----------------------------------------------------------------------------
    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        if self.gamma == 0.0 and self.alpha == 1.0:
            new, extra = super().step(state, dt_limit)
            return new, {**extra, "removed": 0.0, "removed_mass": 0.0}
        # gamma = 0, alpha != 1: the mass column is carried along unchanged and left out of the error
        ev = self.evaluate(state)
        y0 = np.concatenate([state.fields["omega"], state.fields["mass"][:, None]], axis=1)
        masses = self.gamma != 0.0
        new, rejected = self._controlled(state, y0, self._rates(y0, ev.phi, ev.grad_phi), dt_limit, masses)
        removed, removed_mass = self._remove_underflow(new) if masses else (0, 0.0)
        return new, {"rejected": float(rejected), "removed": float(removed), "removed_mass": removed_mass}

    def _controlled(self, state: State, y0: np.ndarray, k0: np.ndarray, dt_limit: float,
                    masses: bool) -> tuple[State, int]:
        """The Dormand-Prince step with error control on y (its mass column only when ``masses``)."""
        s = self.cfg.solver
        cols = slice(None) if masses else slice(0, -1)
        dt = min(state.dt, s.dt_max)
        rejected = 0
        while True:
            h = min(dt, dt_limit)
            stages = [k0]
            for i in range(1, 6):
                stages.append(self._joint_rates(self._combine(y0, h, self.A[i][:i], stages)))
            y5 = self._combine(y0, h, self.b[:6], stages)
            if not masses:
                y5[:, -1] = y0[:, -1]
            new = state.advanced({"omega": np.ascontiguousarray(y5[:, :-1]), "mass": y5[:, -1].copy()}, h)
            ev = self.evaluate(new)
            stages.append(self._rates(y5, ev.phi, ev.grad_phi))
            err_vec = self._combine(np.zeros_like(y0), h, self.e, stages)[:, cols]
            scale = s.atol + s.rtol * np.maximum(np.abs(y0[:, cols]), np.abs(y5[:, cols]))
            squares, count = self.problem.comm.sum_over_ranks(float(np.sum((err_vec / scale) ** 2)), err_vec.size)
            err = math.sqrt(squares / count) if count else 0.0
            if not np.isfinite(err):
                err = np.inf
            factor = s.max_growth if err == 0.0 else min(s.max_growth, max(0.2, 0.9 * err ** -0.2))
            if err <= 1.0:
                proposal = dt * factor if h >= dt else max(dt, h * factor)
                new.dt = float(np.clip(proposal, s.dt_min, s.dt_max))
                return new, rejected
            rejected += 1
            dt = h * max(0.2, factor)
            if dt < s.dt_min:
                raise SolverError(f"wfr step size fell below solver.dt_min = {s.dt_min:g} at t = {state.t:.6g} "
                                  f"(error estimate {err:.3g}); loosen solver.rtol/atol or lower solver.dt_min")

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
        mass = np.where(dead, 0.0, mass * (total / (total - dead_mass)))
        state.fields = {"omega": state.fields["omega"], "mass": mass}
        state.evaluation = None
        return int(n_dead), dead_mass

    # ---- diagnostics --------------------------------------------------------------------------
    def fisher_rao_dissipation(self, phi: np.ndarray, mass: np.ndarray) -> float:
        """``sum_i m_i (Phi_i - <Phi>)^2`` (summed over ranks)."""
        centred = phi - self.mean_phi(phi, mass)
        return self.problem.comm.sum_over_ranks(float(np.dot(mass, centred * centred)))[0]

    def diagnostics(self, state: State) -> dict[str, float]:
        """``energy``, ``risk`` and the WFR ``dissipation`` ``I`` (module docstring), so ``dE/dt = -I``."""
        ev = self.evaluate(state)
        if self.gamma == 0.0 and self.alpha == 1.0:
            return {"energy": ev.energy, "risk": ev.risk, "dissipation": ev.dissipation}
        fr = self.fisher_rao_dissipation(ev.phi, state.fields["mass"]) if self.gamma else 0.0
        # removed particles have mass 0 and add nothing to either sum
        return {"energy": ev.energy, "risk": ev.risk, "dissipation": self.alpha * ev.dissipation + self.gamma * fr}

    def likely_cause(self, state: State) -> str:
        return (f"the wfr stepper's tolerances (solver.rtol = {self.cfg.solver.rtol:g}, solver.atol = "
                f"{self.cfg.solver.atol:g}) are too loose for solver.gamma = {self.gamma:g}; tighten them")
