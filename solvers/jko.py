"""JKO (minimizing-movement) steppers: ``rho_{n+1} = argmin_rho E(rho) + W2^2(rho, rho_n) / (2 tau)``.

An implicit, variational time step of the Wasserstein gradient flow (docs/model.md): energy-decreasing at any
``tau`` (:func:`euler_stability_limit` measures the explicit limit it avoids), first order; ``tau = solver.tau``
(0: ``solver.dt``). :class:`ParticleJKO` moves the cloud ``Y`` [N, k] (masses and labels kept) to the minimizer of
``F(Y) = E(rho_Y) + (1/(2 tau)) sum_i m_i |y_i - omega_i|^2`` (L-BFGS-B, then Newton), checking the identity
coupling with POT. :class:`GridJKO` takes an entropic step over plans ``pi`` [M, M] between cell masses ``p`` and
``q`` [M] (at most :data:`MAX_GRID_CELLS` cells; Newton on the semi-dual; default eps :func:`grid_epsilon` = ``h^2``).
Details, with the ``/steps`` columns: docs/solvers.md, "Particle JKO steps" and "Grid JKO steps (entropic)".
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ot
from scipy.optimize import minimize
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, cg, eigsh, minres
from scipy.spatial.distance import cdist
from scipy.special import logsumexp

from pdeflow.config import Config, ConfigError
from pdeflow.measure import Grid, entropy
from pdeflow.problem import COMPLEX_STEP, Evaluation, Problem

from . import register
from .accuracy import particle_jacobian, velocity_jvp
from .base import SolverError, State, Stepper
from .finite_volume import GridEvaluator

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


def entropic_epsilon(epsilon: float, cell_widths) -> float:
    """The entropic regularization of a grid JKO step: ``epsilon``, or when it is 0 the default ``h^2`` with h the
    smallest of ``cell_widths`` [k] (module docstring, "Default eps")."""
    return epsilon if epsilon > 0 else float(np.min(cell_widths)) ** 2


def grid_epsilon(cfg: Config, cell_widths) -> float:
    """:func:`entropic_epsilon` of ``solver.epsilon``."""
    return entropic_epsilon(cfg.solver.epsilon, cell_widths)


def implied_diffusion(cfg: Config, cell_widths) -> float:
    """The diffusion ``eps / (4 tau)`` that the entropic plan adds to the flow's ``1/beta`` (module docstring)."""
    return grid_epsilon(cfg, cell_widths) / (4.0 * jko_tau(cfg))


def entropic_summary(traj: Any) -> str:
    """One line for ``pdeflow info`` on a grid JKO trajectory: eps and its implied diffusion ``eps / (4 tau)``
    against the physical ``1/beta`` (with beta = inf: how far it spreads mass by the last frame, in cells)."""
    from pdeflow.measure import Grid

    cfg, grid = traj.config, Grid.from_frame_attrs(traj.frame_attrs)
    eps = float(traj.frame_attrs.get("epsilon", grid_epsilon(cfg, grid.width)))
    diffusion = eps / (4.0 * jko_tau(cfg))
    beta = float(traj.model_attrs.get("beta", np.inf))
    line = (f"entropic    eps = {eps:.4g}{' (default h^2)' if cfg.solver.epsilon == 0 else ''}, "
            f"tau = {jko_tau(cfg):g}: "
            f"implied diffusion eps/(4 tau) = {diffusion:.3g}")
    if np.isfinite(beta):
        return line + f", {diffusion * beta:.3g} x the physical 1/beta = {1 / beta:.3g}"
    t = float(traj.time[-1]) if len(traj.time) else 0.0
    spread = np.sqrt(2 * diffusion * t) / float(np.min(grid.width))
    return line + f" (beta = inf: the flow has none; it spreads mass by {spread:.2g} cells by t = {t:g})"


# ---- the particle proximal step -------------------------------------------------------------------
@dataclass
class ProximalResult:
    """The outcome of one particle proximal step.

    ``omega`` [N, k] the new cloud, ``evaluation`` the Problem evaluation there, ``residual`` the
    Euler-Lagrange residual r (module docstring), ``iterations`` (L-BFGS-B iterations plus Newton steps),
    ``evaluations`` (gradient evaluations plus Hessian-vector products), ``converged`` whether
    ``residual <= tol``, ``message`` the optimizer's last status.
    """
    omega: np.ndarray
    evaluation: Evaluation
    residual: float
    iterations: int
    evaluations: int
    converged: bool
    message: str


class _Objective:
    """``F`` in the scaled variables ``z`` [n] (flattened [N', k]), its gradient and Hessian-vector products.

    ``energy(y) -> (value, grad, info)`` is the part of F besides ``|z|^2 / 2`` with its gradient
    divided by the masses (``grad Phi`` at the particles); ``jvp(y, u)`` is that gradient's derivative in
    the direction ``u``. ``scale`` [N', 1] holds ``sqrt(tau / m_i)`` (so ``y = omega + scale * z``),
    ``weight`` [N', 1] holds ``sqrt(tau m_i)`` (so ``dF/dz = weight * grad Phi + z``). The last point is cached.
    """

    def __init__(self, energy: Callable[[np.ndarray], tuple[float, np.ndarray, Any]],
                 jvp: Callable[[np.ndarray, np.ndarray], np.ndarray], omega: np.ndarray,
                 scale: np.ndarray, weight: np.ndarray) -> None:
        self.energy, self.jvp, self.omega, self.scale, self.weight = energy, jvp, omega, scale, weight
        self.key: bytes | None = None
        self.value = 0.0
        self.grad = np.zeros(omega.size)
        self.info: Any = None
        self.evaluations = 0

    def y(self, z: np.ndarray) -> np.ndarray:
        return self.omega + self.scale * z.reshape(self.omega.shape)

    def __call__(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        key = z.tobytes()
        if key != self.key:
            value, grad_phi, info = self.energy(self.y(z))
            self.value = value + 0.5 * float(z @ z)
            self.grad = (self.weight * grad_phi).ravel() + z
            self.key, self.info = key, info
            self.evaluations += 1
        return self.value, self.grad.copy()

    def hvp(self, z: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``Hess_z F @ v = v + weight * J(scale * v)``: symmetric, ``I + O(tau)``."""
        self.evaluations += 1
        u = self.scale * v.reshape(self.omega.shape)
        return (self.weight * self.jvp(self.y(z), u)).ravel() + v


def _minimize(objective: _Objective, z0: np.ndarray, tol_z: float, maxiter: int,
              magnitude: float) -> tuple[np.ndarray, int, str]:
    """Minimize ``objective`` from ``z0`` until ``|grad_z F| <= tol_z`` or ``maxiter`` iterations;
    ``magnitude`` is the size of the terms F is computed from (its rounding is ``eps * magnitude``).

    L-BFGS-B first. Its line search compares values of F, which stop resolving progress once
    ``tau r^2 / 2`` nears the rounding of E (``r ~ sqrt(eps |E| / tau)``, some 1e-8 to 1e-7); from there
    (or after an iteration that decreased F by no more than its rounding) Newton steps finish the solve:
    MINRES on Hessian-vector products, which need gradients only. Returns ``z``, iterations and the last status.
    """
    z, iterations, message = z0, 0, "converged"
    # progress of F below this is rounding: hand over to Newton
    resolution = 16 * np.finfo(float).eps * (magnitude + abs(objective(z0)[0]))
    last = [objective(z0)[0]]

    def gnorm(zz: np.ndarray) -> float:
        return float(np.linalg.norm(objective(zz)[1]))

    def callback(intermediate_result) -> None:
        stalled = last[0] - intermediate_result.fun <= resolution
        last[0] = intermediate_result.fun
        if stalled or gnorm(intermediate_result.x) <= tol_z:
            raise StopIteration

    if gnorm(z) > tol_z:
        res = minimize(objective, z, jac=True, method="L-BFGS-B", callback=callback,
                       options={"maxiter": maxiter, "maxfun": 20 * maxiter + 20, "ftol": 0.0, "gtol": 0.0,
                                "maxcor": 20})
        iterations, z = int(res.nit), res.x
        message = "L-BFGS-B: " + str(res.message).replace("`callback` raised `StopIteration`.", "stopped")
    while iterations < maxiter:
        g = objective(z)[1]
        norm = float(np.linalg.norm(g))
        if norm <= tol_z:
            break
        op = LinearOperator((z.size, z.size), matvec=lambda v: objective.hvp(z, v), dtype=float)
        step, _ = minres(op, -g, rtol=min(0.1, 0.1 * tol_z / norm), maxiter=max(20, min(z.size, 200)))
        iterations += 1
        if gnorm(z + step) >= norm:
            message += "; Newton polish made no progress"
            break
        z = z + step
        message = "Newton polish"
    objective(z)
    return z, iterations, message


def proximal_step(problem: Problem, omega: np.ndarray, mass: np.ndarray, tau: float, tol: float, maxiter: int,
                  start: Evaluation | None = None) -> ProximalResult:
    """One particle JKO step: ``argmin_Y E(rho_Y) + (1/(2 tau)) sum_i m_i |y_i - omega_i|^2``.

    ``omega`` [N, k], ``mass`` [N] (>= 0); ``start`` the evaluation at ``omega`` if known. The inner solve
    starts from the better (lower F) of ``omega`` and the explicit Euler predictor ``omega - tau grad Phi``
    and stops when the Euler-Lagrange residual r <= ``tol`` or after ``maxiter`` iterations (see the
    module docstring); the result says which.
    """
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    start = start if start is not None else problem.evaluate(omega, mass)
    heavy = mass > 0
    om_h, m_h = omega[heavy], mass[heavy]
    energy0 = start.energy

    def measure_energy(y: np.ndarray) -> tuple[float, np.ndarray, Evaluation]:
        # relative to the start, so that F is small and compared with its own rounding only
        ev = problem.evaluate(y, m_h)
        return ev.energy - energy0, ev.grad_phi, ev

    objective = _Objective(measure_energy, lambda y, u: velocity_jvp(problem, y, m_h, u), om_h,
                           np.sqrt(tau / m_h)[:, None], np.sqrt(tau * m_h)[:, None])
    # |grad_z F| = sqrt(tau) r
    tol_z = tol * np.sqrt(tau)
    zero = np.zeros(om_h.size)
    predictor = (-(start.grad_phi[heavy] * tau) / objective.scale).ravel()
    z0 = predictor if objective(predictor)[0] < objective(zero)[0] else zero
    z, iterations, message = _minimize(objective, z0, tol_z, maxiter, abs(energy0))
    residual = float(np.linalg.norm(objective.grad)) / np.sqrt(tau)
    evaluations = objective.evaluations
    y = omega.copy()
    y[heavy] = objective.y(z)
    evaluation = objective.info
    if not np.all(heavy):
        # tracers: independent proximal problems in the frozen field of the new measure
        G = problem.residual_features(y[heavy], m_h)
        om_t = omega[~heavy]

        def field(q: np.ndarray) -> tuple[float, np.ndarray, None]:
            phi, grad = problem.grad_phi_field(q, G)
            return float(phi.sum()), grad, None

        def field_jvp(q: np.ndarray, u: np.ndarray) -> np.ndarray:
            h = COMPLEX_STEP / max(float(np.linalg.norm(u)), 1e-300)
            return problem.grad_phi_field(q + 1j * h * u, G)[1].imag / h

        root = np.full((om_t.shape[0], 1), np.sqrt(tau))
        tracers = _Objective(field, field_jvp, om_t, root, root)
        # each tracer's residual counts with weight 1 besides r: the tolerance is on the sum of squares
        zt, it_t, msg_t = _minimize(tracers, np.zeros(om_t.size), tol_z, maxiter, 0.0)
        y[~heavy] = tracers.y(zt)
        residual = float(np.hypot(residual, np.linalg.norm(tracers.grad) / np.sqrt(tau)))
        iterations, evaluations = iterations + it_t, evaluations + tracers.evaluations
        message = f"{message}; tracers: {msg_t}"
        evaluation = problem.evaluate(y, mass)
    return ProximalResult(omega=y, evaluation=evaluation, residual=residual, iterations=iterations,
                          evaluations=evaluations, converged=residual <= tol, message=message)


def coupling_gap(old: np.ndarray, new: np.ndarray, mass: np.ndarray) -> float:
    """Relative excess of the identity coupling over the optimal one between two labelled clouds.

    ``(sum_i m_i |new_i - old_i|^2 - W2^2) / sum_i m_i |new_i - old_i|^2`` with ``W2^2 = ot.emd2(m, m, C)``,
    ``C_ij = |new_i - old_j|^2``: 0 when keeping the labels is an optimal transport (0 also for no motion).
    """
    sq = np.einsum("ik,ik->i", new - old, new - old)
    identity = float(np.dot(mass, sq))
    if identity == 0.0:
        return 0.0
    m = np.asarray(mass, dtype=np.float64)
    m = m / m.sum()
    # differences, not ot.dist's |x|^2 + |y|^2 - 2 x.y, whose cancellation swamps small displacements
    cost = cdist(new, old, metric="sqeuclidean")
    optimal = float(ot.emd2(m, m, cost, numItermax=max(100_000, 50 * m.size ** 2)))
    return max(0.0, (identity / mass.sum() - optimal) / (identity / mass.sum()))


def euler_stability_limit(problem: Problem, omega: np.ndarray, mass: np.ndarray, tol: float = 1e-4) -> float:
    """The explicit Euler stability limit ``2 / lambda_max`` of the particle system at a cloud.

    ``lambda_max`` is the largest eigenvalue of the Jacobian ``J = d grad Phi(omega_i; rho) / d omega_j``
    [N k, N k] of minus the particle velocity (measure moving with the particles), which is
    ``M^{-1} Hess E`` with ``M = diag(m_i)``; it is found (Lanczos, relative tolerance ``tol``) on the
    symmetric ``M^{1/2} J M^{-1/2}``, each product an exact forward-mode JVP of ``grad Phi``. Euler's
    amplification of that mode, ``|1 - dt lambda_max|``, exceeds 1 for ``dt > 2 / lambda_max``.
    Returns ``inf`` when no eigenvalue is positive. Costs some tens of products.
    """
    op = particle_jacobian(problem, omega, mass)
    n = op.shape[0]
    if n <= 2:
        dense = np.column_stack([op.matvec(e) for e in np.eye(n)])
        lam = float(np.max(np.linalg.eigvalsh(0.5 * (dense + dense.T))))
    else:
        v0 = np.random.default_rng(0).standard_normal(n)
        try:
            lam = float(eigsh(op, k=1, which="LA", tol=tol, v0=v0, return_eigenvectors=False)[0])
        except ArpackNoConvergence as exc:
            if len(exc.eigenvalues) == 0:
                raise
            lam = float(np.max(exc.eigenvalues))
    return 2.0 / lam if lam > 0 else np.inf


# ---- steppers -------------------------------------------------------------------------------------
@register
class JKO(Stepper):
    """``solver.method = "jko"``: :meth:`from_config` builds :class:`ParticleJKO` or :class:`GridJKO` after
    ``init.measure``."""
    name = "jko"
    measures = ("particles", "grid")
    # scheme, limiter: the flux of the grid evaluation (energy, dissipation) that grid JKO shares with fv
    reads = ("tau", "epsilon", "inner_tol", "inner_maxiter", "outer_maxiter", "scheme", "limiter")
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
        self.cost = ot.dist(centres, centres, metric="sqeuclidean")
        self.epsilon = entropic_epsilon(epsilon, self.grid.width)

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
        grid, beta = self.grid, self.problem.beta
        h = min(self.tau, dt_limit)
        eps = self.epsilon * h / self.tau
        energy0 = self.evaluate(state).energy
        p = grid.masses(state.fields["density"])
        where = f"JKO step {state.step + 1} (t = {state.t:.6g}, tau = {h:.3g})"
        V = self.linearization(p)[1]
        q, g = p, None
        newton = products = 0
        residual = np.inf
        anderson = _Anderson(ANDERSON_DEPTH)
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
        rho = grid.density(q)
        new = state.advanced({"density": rho}, h, dt=self.tau)
        return new, {"mass": grid.total_mass(rho), "min_density": float(np.min(rho)),
                     "outer_iterations": float(outer), "newton_iterations": float(newton),
                     "cg_iterations": float(products), "marginal_violation": sol.violation,
                     "linearization_residual": residual,
                     "energy_change": self.evaluate(new).energy - energy0, "transport_cost": sol.transport_cost}


# ---- the entropic proximal step on a grid ---------------------------------------------------------
class _Anderson:
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


@dataclass
class ProxSolution:
    """One linearized entropic JKO problem, solved: ``masses`` [M] (``pi^T 1``), the semi-dual ``potential``
    g [M] (:func:`entropic_plan` rebuilds pi from it), Newton ``iterations`` and the Hessian-vector
    ``products`` of their CG solves, ``violation`` ``|pi^T 1 - q(g)|_1``, ``transport_cost`` ``<C, pi>``,
    ``entropic_cost`` ``<C, pi> + eps sum pi (log pi - 1)`` and ``converged`` (violation <= tol)."""
    masses: np.ndarray
    potential: np.ndarray
    iterations: int
    products: int
    violation: float
    transport_cost: float
    entropic_cost: float
    converged: bool


def _conditional_plan(cost: np.ndarray, g: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``P_ij = softmax_j((g_j - C_ij) / eps)`` [rows, M] and the row log-normalizers [rows]."""
    L = (g[None, :] - cost) / eps
    lse = logsumexp(L, axis=1)
    return np.exp(L - lse[:, None]), lse


def entropic_plan(cost: np.ndarray, p: np.ndarray, potential: np.ndarray, eps: float) -> np.ndarray:
    """The plan ``pi_ij = p_i softmax_j((g_j - C_ij) / eps)`` [M, M] of a semi-dual potential g [M]."""
    p = np.asarray(p, dtype=float)
    return p[:, None] * _conditional_plan(cost, np.asarray(potential, dtype=float), eps)[0]


def entropic_prox(cost: np.ndarray, p: np.ndarray, potential: np.ndarray, eps: float, tau: float, beta: float,
                  volume: float, tol: float, maxiter: int, start: np.ndarray | None = None) -> ProxSolution:
    """``argmin_{pi 1 = p} <C, pi> + eps sum pi (log pi - 1) + 2 tau F(pi^T 1)`` with the linear-plus-entropy
    ``F(q) = <V, q> + (1/beta) sum_j q_j log(q_j / volume)`` (module docstring: Newton on the semi-dual).

    ``cost`` C [M, M], ``p`` [M] (>= 0), ``potential`` V [M], ``volume`` the cell volume; ``start`` a semi-dual
    potential to start from (default: the one giving ``q = p``). Stops at ``|pi^T 1 - q|_1 <= tol`` or after
    ``maxiter`` Newton steps. Newton starts from the better (lower -J) of ``start`` and the potential with
    ``q(g) = p`` (``q(g) = min p`` in empty cells).
    """
    p = np.asarray(p, dtype=float)
    V = np.asarray(potential, dtype=float)
    rows = p > 0
    pa, Ca = p[rows], cost[rows]

    def plan_of(g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _conditional_plan(Ca, g, eps)

    def solution(g: np.ndarray, P: np.ndarray, lse: np.ndarray, iterations: int, violation: float,
                 products: int = 0) -> ProxSolution:
        masses = pa @ P
        transport = float(pa @ np.einsum("ij,ij->i", P, Ca))
        # log pi_ij = log p_i + (g_j - C_ij) / eps - lse_i, so eps sum pi (log pi - 1) needs no [M, M] pass
        entropic = float(masses @ g) - eps * float(pa @ lse) + eps * float(pa @ (np.log(pa) - 1.0))
        masses *= p.sum() / masses.sum()
        return ProxSolution(masses=masses, potential=g, iterations=iterations, products=products,
                            violation=violation, transport_cost=transport, entropic_cost=entropic,
                            converged=violation <= tol)

    if not np.isfinite(beta):
        # F linear: the plan is explicit and the marginal condition has no second side
        g = -2.0 * tau * V
        return solution(g, *plan_of(g), 0, 0.0)
    s = 2.0 * tau / beta
    log_volume = np.log(volume)

    def q_of(g: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):
            return np.exp((-g - 2.0 * tau * V) / s - 1.0 + log_volume)

    def state(g: np.ndarray):
        P, lse = plan_of(g)
        q = q_of(g)
        m2 = pa @ P
        return eps * float(pa @ lse) + s * float(q.sum()), m2 - q, P, m2, q, lse

    # q(g) = p; empty cells start like the lightest occupied one (log 0 would make them absorb everything)
    g = -s * (np.log(np.maximum(p, pa.min()) / volume) + 1.0) - 2.0 * tau * V
    obj, grad, P, m2, q, lse = state(g)
    if start is not None:
        # a previous solution: a change of V between linearizations can make q(start) explode in
        # cells where pi^T 1 cannot follow, so it has to be better than q(g) = p to be used
        other = state(np.asarray(start, dtype=float))
        if other[0] < obj:
            g = np.asarray(start, dtype=float)
            obj, grad, P, m2, q, lse = other
    iterations, counter = 0, [0]
    while iterations < maxiter:
        norm = float(np.sum(np.abs(grad)))
        if norm <= tol:
            break
        # Newton-CG: the Hessian of -J, (diag(pi^T 1) - pi^T diag(1/p) pi) / eps + diag(q) / s, is positive
        # definite and diagonally dominant; with its diagonal as preconditioner CG needs few products
        # (each O(M^2)) when eps / s is not small, and cells of tiny mass do not spoil the conditioning
        diagonal = m2 / eps + q / s

        def hvp(v: np.ndarray, P=P, m2=m2, q=q) -> np.ndarray:
            return (m2 * v - (pa * (P @ v)) @ P) / eps + (q / s) * v

        op = LinearOperator((g.size, g.size), matvec=hvp, dtype=float)
        jacobi = LinearOperator((g.size, g.size), matvec=lambda r: r / diagonal, dtype=float)
        step, _ = cg(op, -grad, rtol=max(min(0.1, norm), 1e-12), maxiter=10 * g.size, M=jacobi,
                     callback=lambda _: counter.__setitem__(0, counter[0] + 1))
        iterations += 1
        slope = float(grad @ step)
        t = 1.0
        while True:
            trial = state(g + t * step)
            # Armijo on -J, or (where -J no longer resolves progress) a smaller marginal violation
            if trial[0] <= obj + 1e-4 * t * slope or float(np.sum(np.abs(trial[1]))) < norm:
                break
            t *= 0.5
            if t < 1e-12:
                return solution(g, P, lse, iterations, norm, counter[0])
        g = g + t * step
        obj, grad, P, m2, q, lse = trial
    return solution(g, P, lse, iterations, float(np.sum(np.abs(grad))), counter[0])
