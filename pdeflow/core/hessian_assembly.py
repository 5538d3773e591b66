"""The mass-weighted Hessian S of a particle measure, assembled densely from its structure (issue 43).

For ``rho = sum_i m_i delta_{omega_i}`` (``omega`` [N, k], ``mass`` [N]) the energy is
``E = R(O) + (lam/2) sum_i m_i |omega_i|^2`` with the aggregate output ``O = sum_i m_i o(theta(omega_i))``
[B, T, d] and ``R`` the weighted cross-entropy of the logits ``z = O U^T`` (docs/model.md). Its gradient is
``dE/domega_i = m_i grad Phi(omega_i; rho)``, ``Phi(q; rho) = <G, o(theta(q))> + (lam/2)|q|^2``,
``G = dR/dO``; differentiating once more, with ``J_i = d o(theta(omega_i)) / d omega_i`` [B T d, k],

    ``S_ij = [M^(-1/2) Hess E M^(-1/2)]_ij = delta_ij H_i + sqrt(m_i m_j) J_i^T A J_j``,

- ``H_i = Hess_q Phi(omega_i; rho)`` [k, k] with G frozen (the weight decay's ``lam I`` included):
  :func:`frozen_blocks`, one forward-mode pass of the gradient per coordinate for every head at once
  (:func:`pdeflow.core.mean_field.grad_phi_data_jvp` with ``G' = 0``);
- ``A = d^2 R / dO^2``, per position ``(b, l)``: ``lw[b, l] U^T (diag p - p p^T) U`` with ``p = softmax z[b, l]``
  (``lw >= 0`` the loss weights). ``diag p - p p^T = F^T F`` with ``F = diag(sqrt p) - sqrt(p) p^T``, so
  ``A = sum_{b,l} (F U)^T lw (F U)`` and the Gauss-Newton part is ``W^T W`` with
  ``W[(b, l, v), (i, a)] = sqrt(lw m_i p_v) (z'_v - <p, z'>)`` for ``z' = (J_i e_a)[b, l] U^T``, the logit tangent
  of head i's coordinate a: :func:`gauss_newton_factor`, one forward-mode pass of the heads' outputs per coordinate
  for every head at once (:func:`pdeflow.core.mean_field.head_outputs_jvp`); rows of zero loss weight are dropped.

:func:`assemble_hessian` forms ``blockdiag(H_i) + W^T W`` on the chosen heads (one BLAS product ``W^T W``, which
numpy computes as a symmetric rank-R update, exactly symmetric); :func:`head_blocks` gives the diagonal blocks
``H_i + W_i^T W_i`` alone. The cost is ``2 k`` passes over the chosen heads plus the ``[R, n] x [n, n]`` product
(``n`` = heads x k, ``R`` = positions x V), against ``n`` whole-system products column by column
(:class:`pdeflow.analysis.hessian.spectrum.HessianOperator`); memory: S [n, n] and W [R, n]. Everything in float64
(:attr:`pdeflow.core.problem.Problem.data64`), serial (the measure whole on one rank). The GN part is exactly
symmetric; the blocks ``H_i`` are assembled column by column and their asymmetry is the forward mode's rounding
(not symmetrised, so that a certificate can measure it).
"""
from __future__ import annotations

import numpy as np

from . import mean_field
from .problem import Problem

BLOCKS_BYTES = 256 * 2**20  # head_blocks holds W for as many heads at a time as fit in this (at least one)


def _theta_directions(problem: Problem, count: int, a: int) -> np.ndarray:
    """The direction of coordinate ``a`` in theta for ``count`` heads: [count, p] (every row ``basis[:, a]``)."""
    basis = problem.coords.basis
    column = np.zeros(problem.p) if basis is None else np.asarray(basis[:, a], dtype=float)
    if basis is None:
        column[a] = 1.0
    return np.tile(column, (count, 1))


def _select(problem: Problem, omega: np.ndarray, mass: np.ndarray,
            heads: np.ndarray | list[int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The measure in float64 and the chosen heads' indices [h] (all when ``heads`` is None)."""
    if problem.comm.size > 1:
        raise ValueError("the structured Hessian needs the whole measure on one rank (serial problem)")
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    index = np.arange(len(omega)) if heads is None else np.asarray(heads, dtype=np.int64).ravel()
    return omega, mass, index


def _logits(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """``z = O U^T`` [B, T, V] in float64."""
    data = problem.data64
    return mean_field.aggregate_output(np.asarray(problem.coords.theta(omega), dtype=float), mass, data) @ \
        data.unembedding.T


def frozen_blocks(problem: Problem, omega: np.ndarray, mass: np.ndarray,
                  heads: np.ndarray | list[int] | None = None) -> np.ndarray:
    """``H_i = Hess_q Phi(omega_i; rho)`` [h, k, k] for the chosen heads (module docstring; all when None): column
    ``a`` of every block from one forward-mode pass of the gradient with the residual features G frozen, plus
    ``lam e_a``. Not symmetrised. The k passes are counted by the Problem as k exact products."""
    omega, mass, index = _select(problem, omega, mass, heads)
    data = problem.data64
    k = problem.k
    problem.count("jvp_exact", k)
    G = mean_field.cross_entropy(_logits(problem, omega, mass), data)[1]
    zero = np.zeros_like(G)
    theta = np.asarray(problem.coords.theta(omega[index]), dtype=float)
    blocks = np.empty((len(index), k, k))
    for a in range(k):
        dtheta = _theta_directions(problem, len(index), a)
        blocks[:, :, a] = problem.coords.pullback(mean_field.grad_phi_data_jvp(theta, dtheta, G, zero, data))
        blocks[:, a, a] += problem.weight_decay
    return blocks


def gauss_newton_factor(problem: Problem, omega: np.ndarray, mass: np.ndarray,
                        heads: np.ndarray | list[int] | None = None) -> np.ndarray:
    """``W`` [R, h, k] (module docstring) for the chosen heads: ``W.reshape(R, h k)^T W.reshape(R, h k)`` is the
    Gauss-Newton part ``sqrt(m_i m_j) J_i^T A J_j`` of S on them, head-major columns like S's. ``R`` = (positions
    of positive loss weight) x V. Raises ValueError on a negative loss weight (A is then not a Gram matrix). The k
    forward passes are counted by the Problem as k exact products."""
    omega, mass, index = _select(problem, omega, mass, heads)
    data = problem.data64
    k = problem.k
    lw = data.loss_weights
    if np.any(lw < 0):
        raise ValueError("negative loss weights: the cross-entropy's Hessian is no Gram matrix")
    problem.count("jvp_exact", k)
    keep = (lw > 0).ravel()
    z = _logits(problem, omega, mass).reshape(-1, data.unembedding.shape[0])[keep]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)  # [P, V]
    scale = np.sqrt(lw.ravel()[keep][:, None] * p)  # sqrt(lw p_v) [P, V]
    theta = np.asarray(problem.coords.theta(omega[index]), dtype=float)
    root = np.sqrt(mass[index])
    h = len(index)
    W = np.empty((z.size, h, k))
    for a in range(k):
        dtheta = _theta_directions(problem, h, a)
        do = mean_field.head_outputs_jvp(theta, dtheta, data).reshape(h, -1, data.shape[2])[:, keep]  # [h, P, d]
        dz = do @ data.unembedding.T  # [h, P, V]
        dz -= np.einsum("hpv,pv->hp", dz, p)[:, :, None]
        dz *= scale[None]
        W[:, :, a] = (dz * root[:, None, None]).reshape(h, -1).T
    return W


def head_blocks(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """The diagonal blocks of S, ``H_i + m_i J_i^T A J_i`` [N, k, k] (module docstring), for every head: ``2 k``
    forward-mode passes over the heads and one batched product, no [n, n] matrix; W is formed for groups of heads
    of at most :data:`BLOCKS_BYTES` (so ``k`` passes per group)."""
    omega = np.asarray(omega, dtype=float)
    N, k = omega.shape
    blocks = frozen_blocks(problem, omega, mass)
    data = problem.data64
    rows = int(np.sum(data.loss_weights > 0)) * data.unembedding.shape[0]
    group = int(max(1, BLOCKS_BYTES // max(1, rows * k * 8)))
    for start in range(0, N, group):
        heads = np.arange(start, min(N, start + group))
        W = gauss_newton_factor(problem, omega, mass, heads)
        blocks[heads] += np.matmul(W.transpose(1, 2, 0), W.transpose(1, 0, 2))
    return blocks


def assemble_hessian(problem: Problem, omega: np.ndarray, mass: np.ndarray,
                     heads: np.ndarray | list[int] | None = None,
                     bases: list[np.ndarray] | None = None) -> np.ndarray:
    """S restricted to the chosen heads (all when None; indices into ``omega`` [N, k]), dense [n, n] with
    ``n = len(heads) k``, head-major (row ``i k + a`` is coordinate a of the i-th chosen head): ``blockdiag(H_i)
    + W^T W`` (module docstring), the measure being all of ``omega``, ``mass`` [N]. With per-head ``bases``
    (one [k, c_i] per chosen head) it is ``B^T S B`` [sum c_i, sum c_i] for the block-diagonal ``B`` instead,
    formed as ``blockdiag(B_i^T H_i B_i) + (W B)^T (W B)`` without S."""
    W = gauss_newton_factor(problem, omega, mass, heads)
    R, h, k = W.shape
    if bases is None:
        bases = [None] * h
    elif len(bases) != h:
        raise ValueError(f"{len(bases)} bases for {h} heads")
    widths = [k if b is None else b.shape[1] for b in bases]
    starts = np.concatenate([[0], np.cumsum(widths)]).astype(int)
    if all(b is None for b in bases):
        WB = W.reshape(R, h * k)
    else:
        WB = np.empty((R, int(starts[-1])))
        for i, b in enumerate(bases):
            WB[:, starts[i]:starts[i + 1]] = W[:, i] if b is None else W[:, i] @ b
    del W
    S = WB.T @ WB  # one symmetric rank-R update (numpy calls syrk for a product with its own transpose)
    del WB
    blocks = frozen_blocks(problem, omega, mass, heads)
    for i, b in enumerate(bases):
        rows = slice(starts[i], starts[i + 1])
        S[rows, rows] += blocks[i] if b is None else b.T @ blocks[i] @ b
    return S


__all__ = ["assemble_hessian", "frozen_blocks", "gauss_newton_factor", "head_blocks"]
