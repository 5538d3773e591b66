"""JKO (minimizing-movement) steppers: ``rho_{n+1} = argmin_rho E(rho) + W2^2(rho, rho_n) / (2 tau)``.

An implicit, variational time step of the Wasserstein gradient flow (docs/model.md): energy-decreasing at any
``tau`` (:func:`pdeflow.core.system_jacobian.euler_stability_limit` measures the explicit limit it avoids), first
order; ``tau = solver.tau`` (0: ``solver.dt``).
:class:`ParticleJKO` moves the cloud ``Y`` [N, k] (masses and labels kept) to the minimizer of
``F(Y) = E(rho_Y) + (1/(2 tau)) sum_i m_i |y_i - omega_i|^2`` (L-BFGS-B, then Newton), checking the identity
coupling with POT. :class:`GridJKO` takes an entropic step over plans ``pi`` [M, M] between cell masses ``p`` and
``q`` [M] (at most :data:`MAX_GRID_CELLS` cells; Newton on the semi-dual; default eps :func:`grid_epsilon` = ``h^2``).
The proximal steps themselves: :mod:`pdeflow.solvers.particle_proximal`, :mod:`pdeflow.solvers.entropic_ot`.
Details, with the ``/steps`` columns: docs/solvers.md, "Particle JKO steps" and "Grid JKO steps (entropic)".
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from pdeflow.core.config import Config, ConfigError
from pdeflow.core.measure import Grid, entropy
from pdeflow.core.problem import Problem

from .anderson import Anderson
from .base import DefectSource, SolverError, State, Stepper
from .entropic_ot import blur_setting, blur_source, entropic_epsilon, entropic_prox
from .finite_volume import LIMITER, SCHEME, GridEvaluator
from .parameters import Param
from .particle_proximal import coupling_gap, proximal_step

# A coupling counts as optimal when the identity's cost exceeds W2^2 by at most this (relative) amount:
# ot.emd2's network simplex is exact up to rounding of the cost matrix.
COUPLING_RTOL = 1e-9



# Anderson acceleration of the re-linearization of the risk in a grid JKO step: past iterates kept.
ANDERSON_DEPTH = 6



# The grid JKO forms dense [M, M] costs and plans: the few it holds at 2500 cells take some 200 MB.
MAX_GRID_CELLS = 2500



def jko_tau(cfg: Config) -> float:
    """The proximal step ``tau``: ``solver.tau``, or ``solver.dt`` when it is 0."""
    return cfg.solver.tau if cfg.solver.tau > 0 else cfg.solver.dt



def grid_epsilon(cfg: Config, cell_widths) -> float:
    """:func:`entropic_epsilon` of ``solver.epsilon``."""
    return entropic_epsilon(cfg.solver.epsilon, cell_widths)



def implied_diffusion(cfg: Config, cell_widths) -> float:
    """The diffusion ``eps / (4 tau)`` that the entropic plan adds to the flow's ``1/beta`` (module docstring)."""
    return grid_epsilon(cfg, cell_widths) / (4.0 * jko_tau(cfg))



# ---- steppers -------------------------------------------------------------------------------------
# the [solver] keys of the minimizing movements (tau, outer_maxiter: also of wfr_jko)
TAU = Param("tau", float, 0.0, "proximal time step (0: solver.dt)", ge=0)
EPSILON = Param("epsilon", float, 0.0, "entropic regularization eps (0: h^2, h the smallest cell width - the smallest "
                "eps whose blur resolves the grid; below it sub-cell motion is pinned); adds diffusion eps/(4 tau), "
                "printed by pdeflow info (raise solver.tau or grid.n to shrink it)", ge=0)
INNER_TOL = Param("inner_tol", float, 1e-10, "tolerance of the inner solve (particles: Euler-Lagrange residual in "
                  "velocity units; grid: L1 marginal violation and linearization change)", gt=0)
INNER_MAXITER = Param("inner_maxiter", int, 500, "iteration limit of the inner solve (particles: L-BFGS-B and "
                      "Newton; grid: Newton per linearization)", ge=1)
OUTER_MAXITER = Param("outer_maxiter", int, 50, "linearizations of the risk per step (fixed-point iteration)", ge=1)


class JKO(Stepper):
    """``solver.method = "jko"``: :meth:`from_config` builds :class:`ParticleJKO` or :class:`GridJKO` after
    ``init.measure``."""
    name = "jko"
    summary = "minimizing movement: implicit, first order (particles: L-BFGS and Newton; grid: entropic transport)"
    use_when = "steps far beyond the explicit stability limit, or an energy that must decrease every step"
    measures = ("particles", "grid")
    # scheme, limiter: the flux of the grid evaluation (energy, dissipation) that grid JKO shares with fv
    params = (TAU, EPSILON, INNER_TOL, INNER_MAXITER, OUTER_MAXITER, SCHEME, LIMITER)
    quadrature = "right"  # the energy-identity check's quadrature of a minimizing movement (pdeflow.solvers.accuracy)
    tau: float

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> JKO:
        if cls is JKO:
            return (GridJKO if cfg.init.measure == "grid" else ParticleJKO).from_config(problem, cfg)
        raise NotImplementedError(f"{cls.__name__}.from_config")

    def likely_cause(self, state: State) -> str:
        return (f"the JKO step with solver.tau = {self.tau:g} left the region where the problem is finite; "
                f"reduce solver.tau")



class ParticleJKO(JKO):
    """Particle JKO: the proximal step of the module docstring, one L-BFGS-B solve per step."""
    measure = "particles"
    step_columns = ("inner_iterations", "inner_evaluations", "inner_grad_norm", "inner_tol",
                    "coupling_optimal", "transport_gap")

    def __init__(self, problem: Problem, tau: float, *, inner_tol: float = 1e-10, inner_maxiter: int = 500) -> None:
        """Proximal steps of ``tau``; the inner solve stops at the residual ``inner_tol`` or after
        ``inner_maxiter`` iterations (``solver.*``)."""
        super().__init__(problem)
        self.tau = self.dt = float(tau)
        self.inner_tol, self.inner_maxiter = inner_tol, inner_maxiter
        self.non_optimal_couplings = 0

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> ParticleJKO:
        return cls(problem, jko_tau(cfg), inner_tol=cfg.solver.inner_tol, inner_maxiter=cfg.solver.inner_maxiter)

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        h = min(self.tau, dt_limit)
        omega, mass = state.fields["omega"], state.fields["mass"]
        result = proximal_step(self.problem, omega, mass, h, self.inner_tol, self.inner_maxiter, self.evaluate(state))
        if not result.converged:
            raise SolverError(
                f"the inner solve (L-BFGS-B, then Newton) of JKO step {state.step + 1} "
                f"(t = {state.t:.6g}, tau = {h:.3g}) stopped "
                f"after {result.iterations} iterations with Euler-Lagrange residual {result.residual:.3g} > "
                f"solver.inner_tol = {self.inner_tol:g} ({result.message}); raise solver.inner_maxiter or "
                f"solver.inner_tol, or reduce solver.tau")
        gap = coupling_gap(omega, result.omega, mass)
        optimal = gap <= COUPLING_RTOL
        if not optimal:
            self.non_optimal_couplings += 1
            if self.non_optimal_couplings == 1:
                warnings.warn(f"JKO step {state.step + 1} (t = {state.t:.6g}): the identity coupling between the "
                              f"old and new particles is not optimal (transport gap {gap:.2e}), so the step is not "
                              f"the W2 JKO step of the cloud; /steps/coupling_optimal marks every such step - "
                              f"reduce solver.tau", RuntimeWarning, stacklevel=2)
        new = state.advanced({"omega": result.omega, "mass": mass}, h, dt=self.tau)
        new.evaluation = result.evaluation
        return new, {"inner_iterations": float(result.iterations), "inner_evaluations": float(result.evaluations),
                     "inner_grad_norm": result.residual, "inner_tol": self.inner_tol,
                     "coupling_optimal": float(optimal), "transport_gap": gap}



class GridJKO(JKO):
    """Entropic JKO on a grid density (see the module docstring)."""
    measure = "grid"
    step_columns = ("mass", "min_density", "outer_iterations", "newton_iterations", "cg_iterations",
                    "marginal_violation", "linearization_residual", "energy_change", "transport_cost")

    def __init__(self, problem: Problem, grid: Grid, tau: float, *, epsilon: float = 0.0, inner_tol: float = 1e-10,
                 inner_maxiter: int = 500, outer_maxiter: int = 50, evaluator: GridEvaluator | None = None) -> None:
        """Entropic JKO steps of ``tau`` on ``grid``: the entropic ``epsilon`` (0: ``h^2``, :func:`grid_epsilon`);
        each linearized problem solved to ``inner_tol`` in at most ``inner_maxiter`` Newton steps, at most
        ``outer_maxiter`` linearizations (``solver.*``). ``evaluator``: the grid evaluation of energy, risk and
        dissipation (default: the finite-volume one with its default flux, :class:`GridEvaluator`)."""
        super().__init__(problem)
        self.grid = grid
        if self.grid.n_cells > MAX_GRID_CELLS:
            raise ConfigError(f"grid.n = {grid.shape[0]} gives {self.grid.n_cells} cells; solver.method = 'jko' on a "
                              f"grid forms dense cell-to-cell plans and takes at most {MAX_GRID_CELLS}: lower grid.n")
        self.tau = self.dt = float(tau)
        self.inner_tol, self.inner_maxiter, self.outer_maxiter = inner_tol, inner_maxiter, outer_maxiter
        self.evaluator = evaluator or GridEvaluator(problem, grid)
        centres = self.grid.centres
        import ot  # on first use: POT loads its backends (PyTorch, if installed: seconds) at import

        self.cost = ot.dist(centres, centres, metric="sqeuclidean")
        self.epsilon = entropic_epsilon(epsilon, self.grid.width)
        self.epsilon_setting = float(epsilon)  # as set: 0 means the default h^2

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> GridJKO:
        s = cfg.solver
        grid = Grid.from_config(cfg.grid, problem.k)
        return cls(problem, grid, jko_tau(cfg), epsilon=s.epsilon, inner_tol=s.inner_tol,
                   inner_maxiter=s.inner_maxiter, outer_maxiter=s.outer_maxiter,
                   evaluator=GridEvaluator(problem, grid, s.scheme, s.limiter))  # the Wasserstein flow: gamma = 0

    def frame_attrs(self) -> dict[str, Any]:
        """The grid's attributes, and ``epsilon`` and ``implied_diffusion`` (eps / (4 tau)) of the steps."""
        return {**self.grid.frame_attrs(), "epsilon": self.epsilon,
                "implied_diffusion": self.epsilon / (4.0 * self.tau)}

    def evaluate(self, state: State) -> Any:  # type: ignore[override]
        """The finite-volume evaluation (energy E_h, risk, Phi at the centres, dissipation I_h), cached."""
        if state.evaluation is None:
            state.evaluation = self.evaluator(state.fields["density"])
        return state.evaluation

    def linearization(self, masses: np.ndarray) -> tuple[float, np.ndarray]:
        """``E_h`` and the potential ``V_j = Phi(x_j; rho)`` [M] at every cell centre, for cell masses [M]."""
        grid, problem = self.grid, self.problem
        occupied = masses > 0
        risk, G = problem.risk_and_features(grid.centres[occupied], masses[occupied])
        energy = risk + problem.confinement(grid.centres, masses) + entropy(grid, grid.density(masses), problem.beta)
        return energy, problem.phi_field(grid.centres, G)

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        grid = self.grid
        h = min(self.tau, dt_limit)
        energy0 = self.evaluate(state).energy
        q, outer, newton, products, residual, sol = self._solve(state, h, self.epsilon * h / self.tau)
        rho = grid.density(q)
        new = state.advanced({"density": rho}, h, dt=self.tau)
        return new, {"mass": grid.total_mass(rho), "min_density": float(np.min(rho)),
                     "outer_iterations": float(outer), "newton_iterations": float(newton),
                     "cg_iterations": float(products), "marginal_violation": sol.violation,
                     "linearization_residual": residual,
                     "energy_change": self.evaluate(new).energy - energy0, "transport_cost": sol.transport_cost}

    def _solve(self, state: State, h: float, eps: float) -> tuple[np.ndarray, int, int, int, float, Any]:
        """The step's cell masses q [M] from the state's with the plan's entropic ``eps``: ``(q, linearizations,
        Newton steps, CG products, the last linearization residual, the last entropic_prox solution)``."""
        grid, beta = self.grid, self.problem.beta
        p = grid.masses(state.fields["density"])
        where = f"JKO step {state.step + 1} (t = {state.t:.6g}, tau = {h:.3g})"
        V = self.linearization(p)[1]
        q, g = p, None
        newton = products = 0
        residual = np.inf
        anderson = Anderson(ANDERSON_DEPTH)
        for outer in range(1, self.outer_maxiter + 1):
            sol = entropic_prox(self.cost, p, V, eps, h, beta, grid.cell_volume, self.inner_tol, self.inner_maxiter, g)
            newton, products = newton + sol.iterations, products + sol.products
            if not sol.converged:
                raise SolverError(f"the Newton solve of the entropic transport in {where} stopped after "
                                  f"{sol.iterations} iterations with marginal violation {sol.violation:.3g} > "
                                  f"solver.inner_tol = {self.inner_tol:g}; raise solver.inner_maxiter or "
                                  f"solver.inner_tol, or reduce solver.tau")
            residual = float(np.sum(np.abs(sol.masses - q))) if outer > 1 else np.inf
            q, g = sol.masses, sol.potential
            if residual <= self.inner_tol:
                break
            # the fixed point V = Phi(x; S(V)), S the linearized step: Anderson-accelerated, the residual
            # weighted by the new masses (V matters only where there is mass to move)
            V = anderson.update(V, self.linearization(q)[1], np.sqrt(q))
        return q, outer, newton, products, residual, sol

    def defect_sources(self, old: State, new: State, residual: float) -> list[DefectSource]:
        """The entropic blur's share of the step's identity residual and the trial steps of other taus
        (:func:`~pdeflow.solvers.entropic_ot.blur_source`; the blur's diffusion ``eps / (4 tau)``)."""
        def trial(state: State, length: float, eps: float) -> tuple[float, float, float]:
            ev = self.evaluator(self.grid.density(self._solve(state, length, eps)[0]))
            return self.evaluate(state).energy, ev.energy, ev.dissipation

        energies = (self.evaluate(old).energy, self.evaluate(new).energy)
        return [blur_source(trial, old, self.known_initial_state(), energies, residual, new.t - old.t, self.tau,
                            self.epsilon,
                            blur_setting(self.epsilon_setting, self.grid.shape[0], len(self.grid.shape),
                                         MAX_GRID_CELLS))]
