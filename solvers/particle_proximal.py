"""The particle proximal step of JKO: ``argmin_Y E(rho_Y) + (1/(2 tau)) sum_i m_i |y_i - omega_i|^2`` for a cloud
``omega`` [N, k] with masses and labels kept (L-BFGS-B, then Newton on exact Hessian-vector products), and
:func:`coupling_gap`, the check that keeping the labels is an optimal transport (POT). The stepper is
:class:`pdeflow.solvers.jko.ParticleJKO`; docs/solvers.md, "Particle JKO steps".
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, minres
from scipy.spatial.distance import cdist

from pdeflow.core.problem import COMPLEX_STEP, Evaluation, Problem


# ---- the particle proximal step -------------------------------------------------------------------
@dataclass
class ProximalResult:
    """The outcome of one particle proximal step.

    ``omega`` [N, k] the new cloud, ``evaluation`` the Problem evaluation there, ``residual`` the
    Euler-Lagrange residual r (module docstring), ``iterations`` (L-BFGS-B iterations plus Newton steps),
    ``evaluations`` (the inner solves' gradient evaluations plus Hessian-vector products, as the Problem counted
    them), ``converged`` whether
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
    ``weight`` [N', 1] holds ``sqrt(tau m_i)`` (so ``dF/dz = weight * grad Phi + z``). The last point is cached
    (a repeated point costs no evaluation).
    """

    def __init__(self, energy: Callable[[np.ndarray], tuple[float, np.ndarray, Any]],
                 jvp: Callable[[np.ndarray, np.ndarray], np.ndarray], omega: np.ndarray,
                 scale: np.ndarray, weight: np.ndarray) -> None:
        self.energy, self.jvp, self.omega, self.scale, self.weight = energy, jvp, omega, scale, weight
        self.key: bytes | None = None
        self.value = 0.0
        self.grad = np.zeros(omega.size)
        self.info: Any = None

    def y(self, z: np.ndarray) -> np.ndarray:
        return self.omega + self.scale * z.reshape(self.omega.shape)

    def __call__(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        key = z.tobytes()
        if key != self.key:
            value, grad_phi, info = self.energy(self.y(z))
            self.value = value + 0.5 * float(z @ z)
            self.grad = (self.weight * grad_phi).ravel() + z
            self.key, self.info = key, info
        return self.value, self.grad.copy()

    def hvp(self, z: np.ndarray, v: np.ndarray) -> np.ndarray:
        """``Hess_z F @ v = v + weight * J(scale * v)``: symmetric, ``I + O(tau)``."""
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
    # the inner solves' cost: each evaluation of an objective or its Hessian-vector product is one Problem call
    # (a gradient, or an exact product; a tracer's complex-step product is a gradient)
    mark = problem.mark()
    heavy = mass > 0
    om_h, m_h = omega[heavy], mass[heavy]
    energy0 = start.energy

    def measure_energy(y: np.ndarray) -> tuple[float, np.ndarray, Evaluation]:
        # relative to the start, so that F is small and compared with its own rounding only
        ev = problem.evaluate(y, m_h)
        return ev.energy - energy0, ev.grad_phi, ev

    objective = _Objective(measure_energy, lambda y, u: problem.system_jvp(y, m_h, u), om_h,
                           np.sqrt(tau / m_h)[:, None], np.sqrt(tau * m_h)[:, None])
    # |grad_z F| = sqrt(tau) r
    tol_z = tol * np.sqrt(tau)
    zero = np.zeros(om_h.size)
    predictor = (-(start.grad_phi[heavy] * tau) / objective.scale).ravel()
    z0 = predictor if objective(predictor)[0] < objective(zero)[0] else zero
    z, iterations, message = _minimize(objective, z0, tol_z, maxiter, abs(energy0))
    residual = float(np.linalg.norm(objective.grad)) / np.sqrt(tau)
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
        iterations += it_t
        message = f"{message}; tracers: {msg_t}"
    calls = problem.since(mark)
    evaluations = calls["gradient"] + calls["jvp_exact"]
    if not np.all(heavy):
        evaluation = problem.evaluate(y, mass)  # the new measure's, not an inner solve's
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
    import ot  # on first use: importing POT costs every `pdeflow` command a second or more (its backends)

    optimal = float(ot.emd2(m, m, cost, numItermax=max(100_000, 50 * m.size ** 2)))
    return max(0.0, (identity / mass.sum() - optimal) / (identity / mass.sum()))
