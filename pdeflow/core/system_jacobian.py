"""The particle system's Jacobian at one state, as counted products: the one construction of the mass-weighted
operator S, and what is made of it (the top pair, the deflation pairs, the complement's bound, ``dI/dt``).

``y = omega`` [N, k], ``f(y)_i = -grad Phi(omega_i; rho_N)`` (masses fixed, docs/model.md). ``-J u`` is the
directional derivative of grad Phi along ``u`` [N, k]: exact (forward mode, ``Problem.system_jvp``, about 2.5 grad
Phi) or a forward difference of grad Phi (one real evaluation, relative accuracy about sqrt(machine epsilon)); the
Problem counts each by its kind (:attr:`pdeflow.core.problem.Problem.counts`). ``S = M^{1/2} (-J) M^{-1/2}``
(``M = diag(m_i)``) is symmetric, so the spectrum of J is real: the Rayleigh-Ritz value of S on a small Krylov space
(:mod:`pdeflow.core.lanczos`) is a lower bound of its largest eigenvalue that the steppers guard with a margin; its
top few eigenpairs (ARPACK) are what the implicit steppers' deflation preconditioners are made of. A caller's
numerical policy (exact or difference products, seeds, warm or cold starts) is a parameter of
:class:`SystemJacobian`'s methods, never a copy of them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import LinearOperator

from .lanczos import EIGENPAIR_TOL, Product, StartPolicy, refine_top_eigenpairs, top_eigenpairs, warm_or_cold_top
from .problem import Problem

# forward-difference step relative to 1 + |y|: about sqrt(machine epsilon), balancing truncation and rounding
DIFFERENCE_STEP = 1.5e-8
KINDS = ("exact", "difference")


class SystemJacobian:
    """``-J`` and ``S = M^{1/2} (-J) M^{-1/2}`` at ``omega`` [N, k] with masses ``mass`` [N] > 0 (``grad`` [N, k]
    = grad Phi there: the base of a "difference" product and the direction of ``dI/dt``). ``kind``: "exact"
    (forward mode, :meth:`Problem.system_jvp`) or "difference", ``(grad Phi(y + eps u) - grad Phi(y)) / eps`` with
    ``eps = DIFFERENCE_STEP (1 + |y|) / |u|``. Each product is counted by the Problem, by its kind."""

    def __init__(self, problem: Problem, omega: np.ndarray, mass: np.ndarray, grad: np.ndarray | None = None,
                 kind: str = "exact") -> None:
        if kind not in KINDS:
            raise ValueError(f"SystemJacobian: kind {kind!r} is not one of {KINDS}")
        if kind == "difference" and grad is None:
            raise ValueError("SystemJacobian: a difference product needs grad Phi at the state")
        self.problem, self.omega, self.mass, self.grad, self.kind = problem, omega, mass, grad, kind
        self._size = 1.0 + float(np.linalg.norm(omega)) if kind == "difference" else 0.0
        self._root = np.sqrt(mass)[:, None]

    @property
    def n(self) -> int:
        """``N k``, the size of S."""
        return int(np.size(self.omega))

    def product(self, u: np.ndarray) -> np.ndarray:
        """``-J u`` [N, k] for ``u`` [N, k]: one product."""
        if self.kind == "exact":
            return self.problem.system_jvp(self.omega, self.mass, u)
        norm = float(np.linalg.norm(u))
        if norm == 0.0:
            return np.zeros_like(u)
        return self.problem.system_jvp_difference(self.omega, self.mass, u, self.grad,
                                                  DIFFERENCE_STEP * self._size / norm)

    def apply(self, v: np.ndarray) -> np.ndarray:
        """``S v`` [N k] for a flat ``v`` [N k]: ``M^{1/2} (-J) (M^{-1/2} v)``, one product."""
        root = self._root
        return (root * self.product(v.reshape((self.mass.size, -1)) / root)).ravel()

    def operator(self) -> LinearOperator:
        """S as a scipy LinearOperator [N k, N k]; a block [N k, b] is applied column by column."""
        def apply_block(x: np.ndarray) -> np.ndarray:
            return np.column_stack([self.apply(c) for c in x.T])

        return LinearOperator((self.n, self.n), matvec=self.apply, matmat=apply_block, dtype=float)

    def slope(self) -> float:
        """``dI/dt = -2 sum_i m_i f_i . (-J f)_i`` along the flow at the state, ``f = -grad Phi``,
        ``I = sum_i m_i |f_i|^2``: one product."""
        grad = self.grad
        return -2.0 * float(np.sum(self.mass[:, None] * grad * self.product(grad)))

    def top_pair(self, start: np.ndarray | None, policy: StartPolicy,
                 project: Callable[[np.ndarray], np.ndarray] | None = None, tol: float = 0.0,
                 max_products: int = 0) -> tuple[float, np.ndarray]:
        """``(theta, x)``: the top Ritz pair of ``Pi S Pi`` (``project`` = Pi, default the identity) warm from
        ``start`` [N k] or cold, by ``policy`` (:func:`pdeflow.core.lanczos.warm_or_cold_top`): a lower bound of
        its largest eigenvalue and its unit vector."""
        return warm_or_cold_top(self.apply, self.n, start, policy, project, tol, max_products)

    def top_eigenpairs(self, m: int, tol: float = EIGENPAIR_TOL) -> tuple[np.ndarray, np.ndarray]:
        """``(lam [m], V [N k, m])``: the ``m`` largest eigenpairs of S by ARPACK from a fixed start
        (:func:`pdeflow.core.lanczos.top_eigenpairs`)."""
        return top_eigenpairs(self.operator(), m, tol)

    def refine_pairs(self, V: np.ndarray, iterations: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
        """``(lam, V)``: the top eigenpairs of S refined from nearby ones ``V`` [N k, p] (carried from an earlier
        state) by ``iterations`` of LOBPCG (:func:`pdeflow.core.lanczos.refine_top_eigenpairs`)."""
        return refine_top_eigenpairs(self.operator(), V, iterations, tol)


def complement_projection(V: np.ndarray | None) -> Callable[[np.ndarray], np.ndarray]:
    """``Pi x = x - V V^T x`` [n] onto the orthogonal complement of the orthonormal columns of ``V`` [n, p] (the
    identity for None or p = 0): where a deflation leaves the rest of S's spectrum."""
    def project(x: np.ndarray) -> np.ndarray:
        return x if V is None or V.shape[1] == 0 else x - V @ (V.T @ x)
    return project


def deflation_inverse(r: np.ndarray, root: np.ndarray, lam: np.ndarray, V: np.ndarray, gamma: float) -> np.ndarray:
    """``P^-1 r`` [n] for ``P = M^{-1/2} (I + gamma V diag(lam) V^T) M^{1/2}``: the deflation preconditioner of a
    linearly implicit step ``I - gamma J`` with ``J = -M^{-1/2} S M^{1/2}`` whose stiff part is the top eigenpairs
    ``(lam, V)`` of S (``root`` [n] the flattened ``sqrt(m_i)``, ``V`` [n, p] orthonormal, ``lam > 0`` [p]): exact on
    span V, the identity off it, no product (cvode's preconditioner, eserk4's deflated stages)."""
    v = root * r
    v += V @ ((1.0 / (1.0 + gamma * lam) - 1.0) * (V.T @ v))
    return v / root


# Krylov dimensions of a lambda_max estimate: warm-started from a nearby estimate's vector, and cold (a fixed
# random start). Measured on full.toml (N = 128, k = 256), against the value converged to 1e-10: cold at t = 0
# 1.7e-6 low; warm from t = 0's vector after 1 and 10 RK4 steps of 0.2, 2.0e-3 and 6.9e-5 low with 6 products
# (4 products: 0.14 and 0.025 low, as scipy's LOBPCG with 2 iterations was)
LAMBDA_MAX_WARM = 6
LAMBDA_MAX_COLD = 12
LAMBDA_MAX_START = StartPolicy(warm=LAMBDA_MAX_WARM, cold=LAMBDA_MAX_COLD, seed=0)
# a converged lambda_max (``tol`` given) stops after this many products whatever its residual
LAMBDA_MAX_PRODUCTS = 500


@dataclass(frozen=True)
class TopPair:
    """A ``lambda_max`` estimate (a Rayleigh-Ritz value: never above the true one), its unit vector [n] and the
    Jacobian-vector products it cost."""
    value: float
    vector: np.ndarray
    products: int


def lambda_max(problem: Problem, omega: np.ndarray, mass: np.ndarray, start: np.ndarray | None = None,
               tol: float = 0.0) -> TopPair:
    """The largest eigenvalue of ``S = M^{1/2} (-J) M^{-1/2}`` [N k, N k] at the cloud ``omega`` [N, k] with
    masses ``mass`` [N] > 0 (``-J`` = ``M^{-1} Hess E``: the same eigenvalues), by :meth:`SystemJacobian.top_pair`
    on exact products (:meth:`Problem.system_jvp`, about 2.5 grad Phi each): :data:`LAMBDA_MAX_WARM` products from
    ``start`` [N k] (a nearby estimate's vector), :data:`LAMBDA_MAX_COLD` from a fixed random vector when
    ``start`` is None or of another size; ``tol > 0``: restarted until an eigenvalue lies within ``tol`` (relative)
    of the value (at most :data:`LAMBDA_MAX_PRODUCTS` products)."""
    mark = problem.mark()
    jacobian = SystemJacobian(problem, np.asarray(omega, dtype=float), np.asarray(mass, dtype=float))
    value, vector = jacobian.top_pair(start, LAMBDA_MAX_START, tol=tol, max_products=LAMBDA_MAX_PRODUCTS)
    return TopPair(value, vector, problem.products_since(mark))


def euler_stability_limit(problem: Problem, omega: np.ndarray, mass: np.ndarray, tol: float = 1e-4) -> float:
    """The explicit Euler stability limit ``2 / lambda_max`` of the particle system at a cloud.

    ``lambda_max`` is the largest eigenvalue of the Jacobian ``J = d grad Phi(omega_i; rho) / d omega_j``
    [N k, N k] of minus the particle velocity (measure moving with the particles), which is
    ``M^{-1} Hess E`` with ``M = diag(m_i)``: :func:`lambda_max` to relative accuracy ``tol``. Euler's
    amplification of that mode, ``|1 - dt lambda_max|``, exceeds 1 for ``dt > 2 / lambda_max``.
    Returns ``inf`` when no eigenvalue is positive. Costs some tens of products.
    """
    lam = lambda_max(problem, omega, mass, tol=tol).value
    return 2.0 / lam if lam > 0 else np.inf


__all__ = ["DIFFERENCE_STEP", "KINDS", "LAMBDA_MAX_COLD", "LAMBDA_MAX_PRODUCTS", "LAMBDA_MAX_START", "LAMBDA_MAX_WARM",
           "Product", "SystemJacobian", "TopPair", "complement_projection", "deflation_inverse",
           "euler_stability_limit", "lambda_max"]
