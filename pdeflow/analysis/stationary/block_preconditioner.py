"""The per-head block preconditioner of the mass-weighted Hessian S: ``P = blockdiag(|H_ii|_floor)``.

S's diagonal blocks ``S_ii`` [k, k] (:func:`pdeflow.core.hessian_assembly.head_blocks`: the head's own curvature
with the residual features frozen plus its Gauss-Newton block) carry what makes one head stiff or slow: a head
sharpening (``lambda_max`` ~ 170 on longtime.toml) and a head sinking to the origin (curvature ~ the weight decay,
1e-3) sit in different blocks, so a block-diagonal ``P`` takes out the spread between heads that an identity
``H_0`` of L-BFGS cannot. A block need not be positive definite (a head at a saddle of its own Phi); ``P`` replaces
each block's eigenvalues ``mu`` by ``max(|mu|, floor)`` (eigenvalue modification: Nocedal & Wright, section 3.4),
``floor = FLOOR x`` the largest ``|mu|`` of all blocks, so ``P`` is symmetric positive definite and a direction of
negative curvature of a block is scaled as a positive one of the same size. The symmetry tangents of a head are null
vectors of its block; their ``mu`` is raised to the floor, which leaves them harmless (the gradient has no component
along them).

Application: ``P^-1 x = V_i diag(1 / mu_i) V_i^T x_i`` head by head, ``4 h k^2`` flops; building: ``h`` symmetric
eigendecompositions of order k.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOOR = 1e-6   # the smallest modified eigenvalue, relative to the largest |eigenvalue| of all blocks


@dataclass(frozen=True)
class BlockPreconditioner:
    """``P`` (module docstring) from blocks [h, k, k]: ``vectors`` [h, k, k] (columns the blocks' unit
    eigenvectors), ``inverse_values`` [h, k] (``1 / max(|mu|, floor)``) and ``negative`` (how many block eigenvalues
    were below ``-floor``: the blocks' own indefiniteness, which ``P`` hides)."""
    vectors: np.ndarray
    inverse_values: np.ndarray
    negative: int

    @classmethod
    def from_blocks(cls, blocks: np.ndarray, floor: float = FLOOR) -> BlockPreconditioner:
        """``P`` of the diagonal blocks ``blocks`` [h, k, k] (symmetrised: the assembled blocks carry the forward
        mode's rounding), eigenvalues modified to ``max(|mu|, floor max |mu|)``."""
        blocks = np.asarray(blocks, dtype=float)
        values, vectors = np.linalg.eigh(0.5 * (blocks + blocks.transpose(0, 2, 1)))
        scale = float(np.max(np.abs(values))) if values.size else 1.0
        least = max(floor * scale, np.finfo(float).tiny)
        return cls(vectors=vectors, inverse_values=1.0 / np.maximum(np.abs(values), least),
                   negative=int(np.sum(values < -least)))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """``P^-1 x`` for a flat [h k] vector (head-major, as S's rows)."""
        h, k, _ = self.vectors.shape
        X = np.asarray(x, dtype=float).reshape(h, k)
        coefficients = np.einsum("hka,hk->ha", self.vectors, X) * self.inverse_values
        return np.einsum("hka,ha->hk", self.vectors, coefficients).ravel()


__all__ = ["FLOOR", "BlockPreconditioner"]
