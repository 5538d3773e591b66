"""The local geometry of one head's point: the tangents of its symmetry orbit and the dense Hessian from a product.

A head's point ``w = (WQ, WK, WV, WO)`` [k] (full coordinates, ``k = 4 d dh``) computes the same output after a
change of basis of each of its (WQ, WK) and (WV, WO) pairs, ``(A WQ, A^-T WK)`` and ``(A WV, WO A^-1)``: orthogonal
``A`` (``O(dh)``) when the weight decay is positive, as it also leaves ``|w|`` unchanged, any invertible one
(``GL(dh)``) when it is zero (reduced coordinates have no such orbit). So E does not change along the orbit: its
tangents (:func:`symmetry_tangents`) are exact null directions of every Hessian of E at a stationary point, what the
spectra of :mod:`pdeflow.analysis.hessian.spectrum`, :mod:`pdeflow.analysis.certificate.certificate` and
:mod:`pdeflow.analysis.dirac.stability` project out. :func:`dense_hessian` assembles a small symmetric [k, k] Hessian
column by column from its product, the dense reference of those spectra.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...core.model import split_theta
from ...core.problem import Problem


def dense_hessian(hvp: Callable[[np.ndarray], np.ndarray], k: int) -> np.ndarray:
    """The symmetric part ``(H + H^T)/2`` of the [k, k] matrix whose columns are ``hvp(e_j)``."""
    H = np.empty((k, k))
    for j in range(k):
        e = np.zeros(k)
        e[j] = 1.0
        H[:, j] = hvp(e)
    return 0.5 * (H + H.T)


def symmetry_tangents(problem: Problem, point: np.ndarray) -> np.ndarray:
    """An orthonormal basis [k, r] of the tangent space at ``point`` of its symmetry orbit (module docstring).

    Full coordinates only (``r = 0``, shape [k, 0], in reduced coordinates). Generators: antisymmetric
    ``A`` (``O(dh)``) when the weight decay is positive, every ``A`` (``GL(dh)``) when it is zero.
    """
    k = problem.k
    if problem.coords.basis is not None:
        return np.zeros((k, 0))
    d, dh = problem.d, problem.head_dim
    wq, wk, wv, wo = (w[0] for w in split_theta(np.asarray(point, dtype=float)[None, :], d, dh))
    gens = []
    for a in range(dh):
        for b in range(dh):
            if problem.weight_decay > 0 and b <= a:
                continue
            A = np.zeros((dh, dh))
            A[a, b] = 1.0
            if problem.weight_decay > 0:
                A[b, a] = -1.0
            z_in, z_out = np.zeros((dh, d)), np.zeros((d, dh))
            gens.append(np.concatenate([(A @ wq).ravel(), (-A.T @ wk).ravel(), z_in.ravel(), z_out.ravel()]))
            gens.append(np.concatenate([z_in.ravel(), z_in.ravel(), (A @ wv).ravel(), (-wo @ A).ravel()]))
    if not gens:
        return np.zeros((k, 0))
    U, s, _ = np.linalg.svd(np.stack(gens, axis=1), full_matrices=False)
    scale = max(1.0, float(np.linalg.norm(point)))
    return U[:, s > 1e-10 * scale]


__all__ = ["dense_hessian", "symmetry_tangents"]
