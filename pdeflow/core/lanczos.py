"""Symmetric eigen-solvers on products: the one Lanczos (Rayleigh-Ritz on a Krylov space), its top pair, and the top
eigenpairs by ARPACK.

An operator is a function ``apply`` on flat vectors [n] (a symmetric matrix given by its products, such as the
mass-weighted system Jacobian S of :mod:`pdeflow.core.system_jacobian`), optionally sandwiched by an orthogonal
projection ``Pi`` (``C = Pi A Pi``). :func:`krylov_ritz` is the one Lanczos loop of pdeflow (full
reorthogonalisation, residuals computed from the stored images); :func:`top_ritz` its largest pair, restarted to a
tolerance; :func:`warm_or_cold_top` the top pair warm from a nearby estimate's vector or cold from a fixed random
one, the policy every spectral-radius estimate uses; :func:`top_eigenpairs` the ``m`` largest pairs by ARPACK,
:func:`refine_top_eigenpairs` nearby ones refined by LOBPCG.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh, lobpcg

Product = Callable[[np.ndarray], np.ndarray]

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


def lowest_eigenvector_shift_invert(A: np.ndarray, solve: LinearOperator, start: np.ndarray) -> np.ndarray:
    """The eigenvector [n] of the symmetric positive definite ``A`` [n, n] of least eigenvalue, by shift-invert
    Lanczos (ARPACK, ``sigma = 0``: the largest eigenvalue of ``A^-1``, applied by ``solve``, e.g. a Cholesky
    factor's solves) from ``start`` [n]; a dense eigh below n = 3, where ARPACK does not run."""
    if A.shape[0] > 2:
        return eigsh(A, k=1, sigma=0.0, which="LM", OPinv=solve, v0=start)[1][:, 0]
    return np.linalg.eigh(A)[1][:, 0]


def refine_top_eigenpairs(op: LinearOperator, V: np.ndarray, iterations: int,
                          tol: float) -> tuple[np.ndarray, np.ndarray]:
    """``(lam [p], V [n, p])``: approximate top eigenpairs of the symmetric ``op`` refined from nearby ones ``V``
    [n, p] by ``iterations`` of LOBPCG (scipy's, largest, tolerance ``tol``); a few iterations are the design, so
    its "did not converge" warning is silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lam, W = lobpcg(op, V, maxiter=iterations, largest=True, tol=tol)
    return np.asarray(lam, dtype=float), np.asarray(W, dtype=float)


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


@dataclass(frozen=True)
class StartPolicy:
    """How a top-pair estimate starts: ``warm`` Krylov vectors from a nearby estimate's vector, ``cold`` from the
    fixed random vector of seed ``seed`` (no vector, one of another size, or, with ``fall_back``, one with nothing
    left after the projection). Each caller's policy is data, the loop is :func:`warm_or_cold_top`."""
    warm: int
    cold: int
    seed: int
    fall_back: bool = False


def warm_or_cold_top(apply: Product, n: int, start: np.ndarray | None, policy: StartPolicy,
                     project: Callable[[np.ndarray], np.ndarray] | None = None, tol: float = 0.0,
                     max_products: int = 0) -> tuple[float, np.ndarray]:
    """``(theta, x)``: :func:`top_ritz` of ``C = Pi A Pi`` on flat vectors [n] with ``policy.warm`` vectors from
    ``start`` [n] or ``policy.cold`` from ``default_rng(policy.seed).standard_normal(n)`` (:class:`StartPolicy`);
    ``tol``, ``max_products`` as for :func:`top_ritz`."""
    if start is not None and np.size(start) == n:
        try:
            return top_ritz(apply, np.asarray(start, dtype=float), policy.warm, project, tol, max_products)
        except ValueError:
            if not policy.fall_back:
                raise
    x = np.random.default_rng(policy.seed).standard_normal(n)
    return top_ritz(apply, x, policy.cold, project, tol, max_products)


__all__ = ["EIGENPAIR_TOL", "Product", "RitzPairs", "StartPolicy", "krylov_ritz", "lowest_eigenvector_shift_invert",
           "refine_top_eigenpairs",
           "top_eigenpairs", "top_ritz", "warm_or_cold_top"]
