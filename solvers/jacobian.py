"""The particle system's Jacobian as products, and its top Ritz pair: what the stiff steppers know of it.

``y = omega`` [N, k], ``f(y)_i = -grad Phi(omega_i; rho_N)`` (masses fixed, docs/model.md). ``-J u`` is the
directional derivative of grad Phi along ``u`` [N, k]: exact (forward mode, ``Problem.system_jvp``, about 2.5 grad
Phi) or a forward difference of grad Phi (one real evaluation, relative accuracy about sqrt(machine epsilon)).
``S = M^{1/2} (-J) M^{-1/2}`` (``M = diag(m_i)``) is symmetric, so the spectrum of J is real: the Rayleigh-Ritz value
of S on a small Krylov space is a lower bound of its largest eigenvalue that the steppers guard with a margin; its
top few eigenpairs (ARPACK) are what the implicit steppers' deflation preconditioners are made of.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

from pdeflow.core.problem import Problem

from .parameters import Param

# forward-difference step relative to 1 + |y|: about sqrt(machine epsilon), balancing truncation and rounding
DIFFERENCE_STEP = 1.5e-8
# the [solver] key of the steppers that take Jacobian-vector products of a kind the user chooses (rosenbrock, cvode)
JACOBIAN = Param("jacobian", str, "exact", "Jacobian-vector products in forward mode (exact) or by a forward "
                 "difference of grad Phi (one real evaluation; the W-method keeps its order)",
                 choices=("exact", "difference"))

Product = Callable[[np.ndarray], np.ndarray]


def velocity_jacobian(problem: Problem, omega: np.ndarray, mass: np.ndarray, grad0: np.ndarray,
                      kind: str = "exact") -> Product:
    """``u -> -J u`` [N, k] at ``omega`` [N, k] (``grad0`` = grad Phi there, read only by "difference"): ``kind``
    "exact" (forward mode, :meth:`Problem.system_jvp`) or "difference", ``(grad Phi(y + eps u) - grad Phi(y)) /
    eps`` with ``eps = DIFFERENCE_STEP (1 + |y|) / |u|``. The one Jacobian-vector product of the steppers."""
    if kind == "exact":
        return lambda u: problem.system_jvp(omega, mass, u)
    size = 1.0 + float(np.linalg.norm(omega))

    def difference(u: np.ndarray) -> np.ndarray:
        norm = float(np.linalg.norm(u))
        if norm == 0.0:
            return np.zeros_like(u)
        return problem.system_jvp_difference(omega, mass, u, grad0, DIFFERENCE_STEP * size / norm)
    return difference


def dissipation_slope(grad: np.ndarray, mass: np.ndarray, product: Product) -> float:
    """``dI/dt = -2 sum_i m_i f_i . (-J f)_i`` along the flow, ``f = -grad Phi`` (``grad`` [N, k], ``mass`` [N]),
    ``I = sum_i m_i |f_i|^2``; ``product`` is ``u -> -J u`` (one product)."""
    return -2.0 * float(np.sum(mass[:, None] * grad * product(grad)))


def mass_weighted(product: Product, mass: np.ndarray, counter: Callable[[], None] | None = None) -> Product:
    """``v -> S v`` on flat vectors [N k]: ``S = M^{1/2} (-J) M^{-1/2}`` from ``product`` (``u -> -J u`` [N, k]);
    ``counter`` is called once per product."""
    root = np.sqrt(mass)[:, None]
    shape = (mass.size, -1)

    def apply(v: np.ndarray) -> np.ndarray:
        if counter is not None:
            counter()
        return (root * product(v.reshape(shape) / root)).ravel()
    return apply


def operator(apply: Product, n: int) -> LinearOperator:
    """``apply`` (a symmetric product on flat vectors [n], e.g. :func:`mass_weighted`) as a scipy LinearOperator;
    a block [n, b] is applied column by column."""
    def apply_block(x: np.ndarray) -> np.ndarray:
        return np.column_stack([apply(c) for c in x.T])

    return LinearOperator((n, n), matvec=apply, matmat=apply_block, dtype=float)


# relative accuracy of the eigenpairs a preconditioner is built from: a deflation needs the outliers' size and
# direction roughly, not to many digits
EIGENPAIR_TOL = 1e-2


def top_eigenpairs(op: LinearOperator, m: int, tol: float = EIGENPAIR_TOL) -> tuple[np.ndarray, np.ndarray]:
    """``(lam [m], V [n, m])``: the ``m`` largest (algebraic) eigenpairs of the symmetric ``op`` by ARPACK
    (``eigsh``, relative tolerance ``tol``) from a fixed start vector, so a function of the operator alone; the
    pairs that converged when ARPACK stops short."""
    v0 = np.random.default_rng(0).standard_normal(op.shape[0])
    try:
        lam, V = eigsh(op, k=m, which="LA", tol=tol, v0=v0)
    except ArpackNoConvergence as exc:
        lam, V = exc.eigenvalues, exc.eigenvectors
    return lam, V


@dataclass(frozen=True)
class RitzPairs:
    """Rayleigh-Ritz pairs of a symmetric operator C on an orthonormal basis: ``values`` [m] ascending, unit
    ``vectors`` [n, m] and ``residuals`` [m] = ``|C x_j - theta_j x_j|``. Each ``theta_j`` has an eigenvalue of C
    within ``residuals[j]``, and (Cauchy interlacing) the j-th lowest Ritz value is no lower than the j-th lowest
    eigenvalue, the j-th highest no higher than the j-th highest. ``last_row`` [m]: the last components ``y_(m,j)``
    of the eigenvectors of the Lanczos matrix T; the residual vectors are ``beta y_(m,j) q_(m+1)``, all along one
    vector, so their signs are those of ``last_row`` (what the residual of a function of C, such as the Krylov
    approximation of ``exp(-t C) x0``, needs)."""
    values: np.ndarray
    vectors: np.ndarray
    residuals: np.ndarray
    last_row: np.ndarray | None = None


def deflation_inverse(r: np.ndarray, root: np.ndarray, lam: np.ndarray, V: np.ndarray, gamma: float) -> np.ndarray:
    """``P^-1 r`` [n] for ``P = M^{-1/2} (I + gamma V diag(lam) V^T) M^{1/2}``: the deflation preconditioner of a
    linearly implicit step ``I - gamma J`` with ``J = -M^{-1/2} S M^{1/2}`` whose stiff part is the top eigenpairs
    ``(lam, V)`` of S (``root`` [n] the flattened ``sqrt(m_i)``, ``V`` [n, p] orthonormal, ``lam > 0`` [p]): exact on
    span V, the identity off it, no product (cvode's preconditioner, eserk4's deflated stages)."""
    v = root * r
    v += V @ ((1.0 / (1.0 + gamma * lam) - 1.0) * (V.T @ v))
    return v / root


def krylov_ritz(apply: Product, start: np.ndarray, dims: int,
                project: Callable[[np.ndarray], np.ndarray] | None = None, *, check_every: int = 0,
                enough: Callable[[RitzPairs], bool] | None = None) -> RitzPairs:
    """Rayleigh-Ritz of the symmetric operator ``C = Pi A Pi`` (``A`` = ``apply`` on flat vectors [n], ``Pi`` =
    ``project``, default the identity) on the Krylov space ``span{x0, C x0, ..., C^(d-1) x0}``, ``x0 = Pi start``,
    ``d = dims``: Lanczos with full reorthogonalisation (twice, Kahan-Parlett), d products of ``apply`` (fewer if
    the space is invariant; the caller's ``apply`` counts them). ``T = Q^T C Q`` from the stored images ``C Q``, so
    the residuals ``|C Q y - theta Q y|`` are computed, not estimated, and hold with rounding whatever the loss
    of orthogonality. With ``check_every > 0`` and ``enough``, the Ritz pairs of every ``check_every`` steps are
    offered to ``enough`` and the run ends with the first it accepts: one run grows until what the caller needs
    has converged, where a restart with more steps would repeat the products of the first. Memory: two [n, d]
    arrays. ValueError when ``Pi start`` is zero or not finite (no space)."""
    def op(x: np.ndarray) -> np.ndarray:
        return apply(x) if project is None else project(apply(x))

    x = np.asarray(start, dtype=float) if project is None else project(np.asarray(start, dtype=float))
    n = x.size
    dims = max(1, min(int(dims), n))
    basis, images = np.zeros((n, dims)), np.zeros((n, dims))
    start_norm = float(np.linalg.norm(x))
    if not (np.isfinite(start_norm) and start_norm > 0):
        raise ValueError("krylov_ritz: the start vector has no (finite) component in the range of the projection")
    q = x / start_norm
    size = 0
    for j in range(dims):
        basis[:, j] = q
        images[:, j] = op(q)
        size = j + 1
        if enough is not None and check_every > 0 and size % check_every == 0 and size < dims:
            pairs = _rayleigh_ritz(basis[:, :size], images[:, :size])
            if enough(pairs):
                return pairs
        w = images[:, j] - basis[:, :size] @ (basis[:, :size].T @ images[:, j])
        w -= basis[:, :size] @ (basis[:, :size].T @ w)  # twice is enough (Kahan-Parlett)
        norm = float(np.linalg.norm(w))
        if norm <= 1e-12 * float(np.linalg.norm(images[:, j])):
            break  # an invariant subspace: its Ritz values are exact
        if project is not None:
            # the rounding left in a small w is amplified by the normalisation: keep the basis in the range of Pi
            w = project(w)
            w -= basis[:, :size] @ (basis[:, :size].T @ w)
            norm = float(np.linalg.norm(w))
        q = w / norm
    return _rayleigh_ritz(basis[:, :size], images[:, :size])


def _rayleigh_ritz(Q: np.ndarray, CQ: np.ndarray) -> RitzPairs:
    """The Ritz pairs of C on the orthonormal basis ``Q`` [n, m] from its images ``CQ = C Q`` [n, m], with the
    residuals computed from the images."""
    T = Q.T @ CQ
    values, y = np.linalg.eigh(0.5 * (T + T.T))
    vectors = Q @ y
    residuals = np.linalg.norm(CQ @ y - vectors * values[None, :], axis=0)
    return RitzPairs(values=values, vectors=vectors, residuals=residuals, last_row=y[-1].copy())


def top_ritz(apply: Product, start: np.ndarray, dims: int,
             project: Callable[[np.ndarray], np.ndarray] | None = None, tol: float = 0.0,
             max_products: int = 0) -> tuple[float, np.ndarray]:
    """``(theta, x)``: the largest Ritz value of :func:`krylov_ritz` (the symmetric operator ``C = Pi A Pi`` on
    the Krylov space of ``dims`` vectors from ``Pi start``) and its unit Ritz vector [n]. ``theta`` never exceeds
    the largest eigenvalue of C and never falls below ``x0^T C x0 / |x0|^2``, so a start from the previous
    estimate's vector only improves on it. ``tol > 0``: the run is restarted from its Ritz vector until the
    residual ``|C x - theta x|`` is at most ``tol |theta|`` (then an eigenvalue of C lies within ``tol |theta|``
    of theta) or ``max_products`` products are spent. (scipy's LOBPCG is not used: with one or two iterations it
    may return its start vector, the iterate of smallest residual.)"""
    pairs = krylov_ritz(apply, start, dims, project)
    spent = pairs.values.size
    while (tol > 0.0 and pairs.residuals[-1] > tol * abs(pairs.values[-1]) and spent < max_products
           and pairs.values.size == min(dims, pairs.vectors.shape[0])):  # an invariant space is exact already
        pairs = krylov_ritz(apply, pairs.vectors[:, -1], dims, project)
        spent += pairs.values.size
    return float(pairs.values[-1]), pairs.vectors[:, -1]


# Krylov dimensions of a lambda_max estimate: warm-started from a nearby estimate's vector, and cold (a fixed
# random start). Measured on the quickstart (N = 128, k = 256), against the value converged to 1e-10: cold at t = 0
# 1.7e-6 low; warm from t = 0's vector after 1 and 10 RK4 steps of 0.2, 2.0e-3 and 6.9e-5 low with 6 products
# (4 products: 0.14 and 0.025 low, as scipy's LOBPCG with 2 iterations was)
LAMBDA_MAX_WARM = 6
LAMBDA_MAX_COLD = 12
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
    masses ``mass`` [N] > 0 (``-J`` = ``M^{-1} Hess E``: the same eigenvalues), by :func:`top_ritz` on exact
    products (:meth:`Problem.system_jvp`, about 2.5 grad Phi each): :data:`LAMBDA_MAX_WARM` products from
    ``start`` [N k] (a nearby estimate's vector), :data:`LAMBDA_MAX_COLD` from a fixed random vector when
    ``start`` is None or of another size; ``tol > 0``: restarted until an eigenvalue lies within ``tol`` (relative)
    of the value (at most :data:`LAMBDA_MAX_PRODUCTS` products)."""
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    count = [0]
    apply = mass_weighted(velocity_jacobian(problem, omega, mass, np.zeros_like(omega)), mass,
                          lambda: count.__setitem__(0, count[0] + 1))
    cold = start is None or start.size != omega.size
    x = np.random.default_rng(0).standard_normal(omega.size) if cold else np.asarray(start, dtype=float)
    value, vector = top_ritz(apply, x, LAMBDA_MAX_COLD if cold else LAMBDA_MAX_WARM, tol=tol,
                             max_products=LAMBDA_MAX_PRODUCTS)
    return TopPair(value, vector, count[0])


def euler_stability_limit(problem: Problem, omega: np.ndarray, mass: np.ndarray, tol: float = 1e-4) -> float:
    """The explicit Euler stability limit ``2 / lambda_max`` of the particle system at a cloud.

    ``lambda_max`` is the largest eigenvalue of the Jacobian ``J = d grad Phi(omega_i; rho) / d omega_j``
    [N k, N k] of minus the particle velocity (measure moving with the particles), which is
    ``M^{-1} Hess E`` with ``M = diag(m_i)``: :func:`pdeflow.solvers.jacobian.lambda_max` to relative accuracy
    ``tol``. Euler's amplification of that mode, ``|1 - dt lambda_max|``, exceeds 1 for ``dt > 2 / lambda_max``.
    Returns ``inf`` when no eigenvalue is positive. Costs some tens of products.
    """
    lam = lambda_max(problem, omega, mass, tol=tol).value
    return 2.0 / lam if lam > 0 else np.inf


__all__ = ["DIFFERENCE_STEP", "EIGENPAIR_TOL", "LAMBDA_MAX_COLD", "LAMBDA_MAX_PRODUCTS", "LAMBDA_MAX_WARM", "RitzPairs",
           "TopPair", "dissipation_slope", "euler_stability_limit", "krylov_ritz", "lambda_max", "mass_weighted",
           "operator", "top_eigenpairs", "top_ritz", "velocity_jacobian"]
