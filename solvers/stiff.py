"""A stiff particle stepper: the linearly implicit Rosenbrock-W method ROS34PW2 with error control.

The particle system ``y' = f(y)``, ``y = omega`` [N, k], ``f(y)_i = -grad Phi(omega_i; rho_N)`` (masses fixed,
docs/model.md) stiffens as the heads sharpen: the largest eigenvalue of its Jacobian grows from ~3 to
> 100 on the quickstart while weight decay sets a slow scale ~1/lam. Explicit steppers are then held at
their stability bound; this one is L-stable, so its step follows the local error only.

Method
    ROS34PW2 of Rang & Angermann (BIT Numer. Math. 45, 2005): 4 stages, order 3 with an embedded order 2
    solution, L-stable, stiffly accurate, and a W-method (order 3 for any matrix W in place of the
    Jacobian, so an inexact Krylov solve or a difference Jacobian costs no order). Coefficients
    ``alpha, gamma, b, b_hat`` as published (checked against MATLODE's Coefficients_ROS34PW2.m); the step
    runs in the transformed variables of Hairer & Wanner (Solving ODEs II, IV.7, (7.25)-(7.27)):

        (1/(h g) I - J) U_i = f(y_n + sum_{j<i} a_ij U_j) + sum_{j<i} (c_ij / h) U_j,
        y_{n+1} = y_n + sum_i m_i U_i,      error  e = sum_i (m_i - m_hat_i) U_i,

    with ``Gamma = (gamma_ij)``, ``a = alpha Gamma^-1``, ``C = diag(1/g) - Gamma^-1``, ``m = b Gamma^-1``,
    ``m_hat = b_hat Gamma^-1`` (computed below from the published table). ``J = df/dy`` is taken at
    ``y_n`` and frozen over the step.

Linear systems
    ``J = -M^-1 Hess E`` with ``M = diag(m_i)`` per particle, so in ``v = M^{1/2} U`` the stage system
    is symmetric: ``(1/(h g) I + S) v = M^{1/2} r``, ``S = M^{1/2} (-J) M^{-1/2}``. MINRES (scipy) solves it
    matrix-free on whole-system Jacobian-vector products (:meth:`pdeflow.problem.Problem.system_jvp`:
    the particles and the measure move together, the interaction term included). MINRES is used rather
    than CG because ``Hess E`` can be indefinite away from minimizers. The solve stops when the residual
    is small against the error tolerance: with error weights ``w = 1/(atol + rtol |y_n|)``,
    ``|r_v| <= krylov_tol sqrt(n) / (h g rms(w / sqrt(m)))``, so the solution error it leaves
    (at most ``h g |r_v|`` where ``S >= 0``) is about ``krylov_tol`` in the error norm. The true residual
    is recomputed after every solve (one product); a solve that misses its tolerance within
    ``solver.krylov_maxiter`` iterations is a failed solve: the step is retried at a quarter of its size
    and counted in ``failed_solves``.

Error control
    ``err = rms(e / (atol + rtol max(|y_n|, |y_{n+1}|)))`` over all coordinates; a step is accepted when
    ``err <= 1`` and the next is ``h * clip(0.9 err^(-1/3), 0.2, max_growth)`` within ``[dt_min, dt_max]``;
    a step below ``solver.dt_min`` raises :class:`~pdeflow.solvers.base.SolverError` (the run exits 3, keeping
    its frames). The controller is memoryless: the next step size is all a checkpoint needs (in State).

Deflation (``solver.deflate = m > 0``)
    MINRES needs ~sqrt(1 + h g lambda_max) iterations; the spectrum of ``S`` has a few large outliers (on
    the quickstart at t = 56: 220, then 43, 38, 31, 18, and below 11 from the 6th on). With the ``m`` largest
    eigenpairs ``(lam, V)`` of ``S`` at ``y_n`` (ARPACK, once per step) the stage solves are preconditioned by
    ``P = (1/(h g)) I + V diag(lam) V^T`` (symmetric positive definite, exact on span V), which removes the
    outliers from the iteration count at the price of the eigensolve's products (counted in ``jvps``).

``/steps`` columns: ``rejected`` (error test failures), ``failed_solves``, ``krylov_iters`` (MINRES
iterations), ``jvps`` (Jacobian-vector products, the residual checks included) and ``gradient_evals``
(evaluations of grad Phi at all particles), summed over the tries of the step.

Not sharded: scipy's MINRES takes inner products of the local block only, so under MPI this stepper
runs on one rank (``sharded = False``).
"""
from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh, minres

from . import register
from .base import SolverError, State, Stepper

# ROS34PW2 (Rang & Angermann 2005): alpha_ij, gamma_ij (i > j), the diagonal gamma, b and b_hat.
GAMMA = 0.435866521508459
ALPHA = np.array([[0.0, 0.0, 0.0, 0.0],
                  [0.87173304301691801, 0.0, 0.0, 0.0],
                  [0.84457060015369423, -0.11299064236484185, 0.0, 0.0],
                  [0.0, 0.0, 1.0, 0.0]])
GAMMA_TABLE = np.array([[GAMMA, 0.0, 0.0, 0.0],
                        [-0.87173304301691801, GAMMA, 0.0, 0.0],
                        [-0.90338057013044082, 0.054180672388095326, GAMMA, 0.0],
                        [0.24212380706095346, -1.2232505839045147, 0.54526025533510214, GAMMA]])
B = np.array([0.24212380706095346, -1.2232505839045147, 1.5452602553351020, 0.435866521508459])
B_HAT = np.array([0.37810903145819369, -0.096042292212423178, 0.5, 0.2179332607542295])
ORDER = 3  # of y_{n+1}; the embedded solution has order 2, so err ~ h^3

_GINV = np.linalg.inv(GAMMA_TABLE)
A_T = ALPHA @ _GINV                        # stage arguments in U
C_T = np.diag(1.0 / np.diag(GAMMA_TABLE)) - _GINV  # strictly lower triangular
M_T = B @ _GINV
E_T = (B - B_HAT) @ _GINV                  # y_{n+1} - y_hat_{n+1} = sum_i E_T[i] U_i


def stability_function(z: complex) -> complex:
    """``R(z)``: one step on ``y' = lambda y`` multiplies y by ``R(h lambda)``;
    ``R(z) = 1 + z b^T (I - z (alpha + Gamma))^-1 1``."""
    s = len(B)
    return complex(1.0 + z * B @ np.linalg.solve(np.eye(s) - z * (ALPHA + GAMMA_TABLE), np.ones(s)))


# relative residual below which a stage solve is not asked to go: rounding of the exact product, and the
# truncation error of the difference product (about sqrt(machine epsilon) relative)
FLOOR = {"exact": 1e-13, "difference": 1e-6}
# forward-difference step relative to 1 + |y|: about sqrt(machine epsilon), balancing truncation and rounding
DIFFERENCE_STEP = 1.5e-8


class _SolveFailed(Exception):
    """A stage system missed its tolerance within solver.krylov_maxiter iterations."""


@register
class Rosenbrock(Stepper):
    """``solver.method = "rosenbrock"``: ROS34PW2 with MINRES stage solves (see the module docstring)."""
    name = "rosenbrock"
    sharded = False
    order: ClassVar[int] = ORDER
    step_columns = ("rejected", "failed_solves", "krylov_iters", "jvps", "gradient_evals")

    def _velocity(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        return -self.problem.grad_phi(omega, omega, mass)

    def _solve(self, jvp, root: np.ndarray, shift: float, rhs: np.ndarray, target: float,
               counts: dict[str, float], tighten: list[float],
               basis: list[tuple[np.ndarray, np.ndarray]], precond: LinearOperator | None = None) -> np.ndarray:
        """``U`` [N, k] with ``(shift I - J) U = rhs``, ``jvp(u) = -J u``: true residual (in ``v = M^{1/2} U``)
        <= target.

        The step's earlier solutions ``v_j`` and their images ``A v_j`` (``basis``, extended here) give the start
        ``v0 = V c``, ``c`` minimizing ``|b - (A V) c|``: the stage right-hand sides share the part ``f(y_n) + O(h)``,
        so later stages start from a smaller residual at no extra product.

        MINRES stops on a backward error ``|r| / (|A| |v| + |b|)``, which lets ``|r|`` exceed ``rtol |b|`` by up
        to ``1 + h g lambda_max``: a solve whose true residual misses the target restarts from its result
        with ``rtol`` tightened by the miss, and ``tighten[0]`` carries that factor to the step's later solves.
        """
        shape, n = rhs.shape, rhs.size

        def apply(v: np.ndarray) -> np.ndarray:
            counts["jvps"] += 1
            # the shift inside the operator: scipy's minres(shift=) leaves it out of the residual of x0
            return shift * v + (root * jvp(v.reshape(shape) / root)).ravel()

        op = LinearOperator((n, n), matvec=apply, dtype=float)
        b = (root * rhs).ravel()
        norm_b = float(np.linalg.norm(b))
        if norm_b == 0.0:
            return np.zeros(shape)
        floor = FLOOR[self.cfg.solver.jacobian]
        target = max(target, floor * norm_b)
        budget = self.cfg.solver.krylov_maxiter
        v, previous = None, np.inf
        if basis:
            V = np.column_stack([p[0] for p in basis])
            AV = np.column_stack([p[1] for p in basis])
            c = np.linalg.lstsq(AV, b, rcond=None)[0]
            if float(np.linalg.norm(b - AV @ c)) < norm_b:
                v = V @ c
        while True:
            iterations = [0]
            rtol = max(min(0.1, target / norm_b) / tighten[0], FLOOR["exact"])
            v, _ = minres(op, b, x0=v, rtol=rtol, maxiter=budget, M=precond,
                          callback=lambda _: iterations.__setitem__(0, iterations[0] + 1))
            counts["krylov_iters"] += iterations[0]
            budget -= iterations[0]
            image = apply(v)
            residual = float(np.linalg.norm(b - image))
            if residual <= target:
                basis.append((v, image))
                return v.reshape(shape) / root
            # out of iterations, at MINRES's own floor, or a restart that no longer halves the residual
            if budget <= 0 or rtol <= FLOOR["exact"] or residual > 0.5 * previous:
                raise _SolveFailed(f"MINRES residual {residual:.3g} > {target:.3g} after "
                                   f"{self.cfg.solver.krylov_maxiter - budget} iterations")
            tighten[0] *= 2.0 * residual / target
            previous = residual

    def _jvp(self, omega: np.ndarray, mass: np.ndarray, grad0: np.ndarray):
        """``u -> -J u`` [N, k] at ``omega`` (grad Phi there: ``grad0``): exact (complex step) or a forward
        difference of grad Phi, ``(grad Phi(y + eps u) - grad Phi(y)) / eps``."""
        problem = self.problem
        if self.cfg.solver.jacobian == "exact":
            return lambda u: problem.system_jvp(omega, mass, u)
        size = 1.0 + float(np.linalg.norm(omega))

        def difference(u: np.ndarray) -> np.ndarray:
            norm = float(np.linalg.norm(u))
            if norm == 0.0:
                return np.zeros_like(u)
            eps = DIFFERENCE_STEP * size / norm
            y = omega + eps * u
            return (problem.grad_phi(y, y, mass) - grad0) / eps
        return difference

    def _attempt(self, state: State, h: float, counts: dict[str, float],
                 pairs: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One ROS34PW2 step of size h from ``state``: (y_{n+1}, error vector); ``pairs`` the deflated
        eigenpairs of ``S`` at ``y_n`` (:meth:`_eigenpairs`) or None."""
        s = self.cfg.solver
        omega, mass = state.fields["omega"], state.fields["mass"]
        root = np.sqrt(mass)[:, None]
        shift = 1.0 / (h * GAMMA)
        weights = 1.0 / (s.atol + s.rtol * np.abs(omega))
        # solution error about krylov_tol in the error norm (module docstring)
        rms = float(np.sqrt(np.mean((weights / root) ** 2)))
        target = s.krylov_tol * math.sqrt(omega.size) / (h * GAMMA * rms)
        U: list[np.ndarray] = []
        jvp = self._jvp(omega, mass, self.evaluate(state).grad_phi)
        precond = None
        if pairs is not None:
            lam, V = pairs

            def apply_inverse(x: np.ndarray) -> np.ndarray:
                # P^-1 = (I - V V^T) / shift + V diag(1 / (shift + lam)) V^T, P = shift I + V diag(lam) V^T
                return x / shift + V @ ((1.0 / (shift + lam) - 1.0 / shift) * (V.T @ x))

            precond = LinearOperator((omega.size, omega.size), matvec=apply_inverse, dtype=float)
        tighten = [1.0]
        basis: list[tuple[np.ndarray, np.ndarray]] = []
        for i in range(len(B)):
            if i == 0:
                f = -self.evaluate(state).grad_phi
            else:
                y = omega.copy()
                for j in range(i):
                    if A_T[i, j] != 0.0:
                        y += A_T[i, j] * U[j]
                f = self._velocity(y, mass)
                counts["gradient_evals"] += 1
            rhs = f.copy()
            for j in range(i):
                rhs += (C_T[i, j] / h) * U[j]
            U.append(self._solve(jvp, root, shift, rhs, target, counts, tighten, basis, precond))
        y_new, err = omega.copy(), np.zeros_like(omega)
        for i in range(len(B)):
            y_new += M_T[i] * U[i]
            err += E_T[i] * U[i]
        return y_new, err

    def _eigenpairs(self, state: State, counts: dict[str, float]) -> tuple[np.ndarray, np.ndarray] | None:
        """The ``solver.deflate`` largest eigenpairs (positive ones only) of ``S = M^{1/2} (-J) M^{-1/2}`` at the
        state (ARPACK, relative tolerance 1e-2, a fixed start vector: a function of the state alone, so resume
        stays exact): ``(lam [m], V [n, m])``, or None when deflation is off or nothing positive was found."""
        m = self.cfg.solver.deflate
        omega, mass = state.fields["omega"], state.fields["mass"]
        n = omega.size
        if m == 0 or m >= n - 1:
            return None
        root = np.sqrt(mass)[:, None]
        jvp = self._jvp(omega, mass, self.evaluate(state).grad_phi)

        def apply(v: np.ndarray) -> np.ndarray:
            counts["jvps"] += 1
            return (root * jvp(v.reshape(omega.shape) / root)).ravel()

        v0 = np.random.default_rng(0).standard_normal(n)
        try:
            lam, V = eigsh(LinearOperator((n, n), matvec=apply, dtype=float), k=m, which="LA", tol=1e-2, v0=v0)
        except ArpackNoConvergence as exc:
            lam, V = exc.eigenvalues, exc.eigenvectors
        keep = lam > 0
        return (lam[keep], V[:, keep]) if np.any(keep) else None

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        s = self.cfg.solver
        omega, mass = state.fields["omega"], state.fields["mass"]
        if not np.all(mass > 0):
            raise SolverError("solver.method = 'rosenbrock' needs positive masses (its stage systems are "
                              "symmetrized with sqrt(m_i)); use 'adaptive' for zero-mass tracers")
        counts = {"rejected": 0.0, "failed_solves": 0.0, "krylov_iters": 0.0, "jvps": 0.0, "gradient_evals": 0.0}
        dt = min(state.dt, s.dt_max)
        pairs = self._eigenpairs(state, counts)
        while True:
            h = min(dt, dt_limit)
            try:
                y_new, err_vec = self._attempt(state, h, counts, pairs)
            except _SolveFailed as exc:
                counts["failed_solves"] += 1
                dt = 0.25 * h
                if dt < s.dt_min:
                    raise SolverError(f"a stage solve failed ({exc}) and the step fell below solver.dt_min = "
                                      f"{s.dt_min:g} at t = {state.t:.6g}; raise solver.krylov_maxiter or "
                                      f"solver.krylov_tol") from None
                continue
            new = state.advanced({"omega": y_new, "mass": mass}, h)
            scale = s.atol + s.rtol * np.maximum(np.abs(omega), np.abs(y_new))
            err = math.sqrt(float(np.mean((err_vec / scale) ** 2)))
            if not np.isfinite(err):
                err = np.inf
            factor = s.max_growth if err == 0.0 else min(s.max_growth, max(0.2, 0.9 * err ** (-1.0 / ORDER)))
            if err <= 1.0:
                self.evaluate(new)  # the next step's first stage and the step's diagnostics
                counts["gradient_evals"] += 1
                # a step cut short by a frame time does not shrink the controller's proposal
                proposal = dt * factor if h >= dt else max(dt, h * factor)
                new.dt = float(np.clip(proposal, s.dt_min, s.dt_max))
                return new, counts
            counts["rejected"] += 1
            dt = h * factor
            if dt < s.dt_min:
                raise SolverError(f"rosenbrock step size fell below solver.dt_min = {s.dt_min:g} at "
                                  f"t = {state.t:.6g} (error estimate {err:.3g}); loosen solver.rtol/atol "
                                  f"or lower solver.dt_min")

    def likely_cause(self, state: State) -> str:
        return (f"the rosenbrock stepper's tolerances (solver.rtol = {self.cfg.solver.rtol:g}, "
                f"solver.atol = {self.cfg.solver.atol:g}) are too loose for this problem; tighten them")
