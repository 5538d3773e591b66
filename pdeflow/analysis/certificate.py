"""Whether a stationary measure is a local minimum: the one rule that every verdict on the sign of S follows.

``S`` is the mass-weighted Hessian off the symmetry directions (:mod:`pdeflow.analysis.spectrum`). Two facts decide:

- **Index by interlacing.** The j-th lowest Ritz value of any Rayleigh-Ritz projection of S (a Lanczos block on the
  live heads, the dense block of the heads at the origin) is no lower than the j-th lowest eigenvalue (Cauchy
  interlacing), converged or not: every negative Ritz value of a block proves one more negative eigenvalue there
  (:attr:`pdeflow.analysis.spectrum.SpectrumEnds.morse_index_lower`). A negative lowest Ritz value of ANY block
  means index >= 1, whatever a converged value of another block says.
- **Positivity only by a proof.** A positive lowest Ritz value is an upper bound on ``lambda_min``: it proves
  nothing below it absent. :func:`certify` assembles ``C = B^T S B`` densely on the live heads (``B`` [n, n - r]
  an orthonormal basis of the complement of the heads' symmetry tangents, head by head; ``n`` products of the
  exact JVP) and takes ``numpy.linalg.eigh`` of its symmetric part ``A``. LAPACK's symmetric eigensolver is
  backward stable: the computed eigenvalues are exact for ``A + E`` with ``|E|_2 <= p(n) eps |A|_2``, so by Weyl
  each lies within ``delta = n eps |A|_F + |C - C^T|_F`` of an eigenvalue of ``A`` (``p(n) = n`` taken, the
  Frobenius norms bounding the 2-norms; the asymmetry of the assembled ``C`` is the measured part of the JVP's
  rounding, added as the estimate of the assembly error, which is not otherwise bounded). The heads exactly at the
  origin add the [k, k] block ``Hess Phi(0; rho)`` (:func:`pdeflow.analysis.spectrum.origin_block`), bounded the
  same way. ``lambda_min`` then lies in ``[lowest - delta, min(lowest, lowest Ritz value) + delta]``, and the point
  is a **certified** local minimum when that lower bound is positive.

Dense assembly stops at :data:`DENSE_LIMIT` unknowns on the live heads (``n`` products; S, C, its symmetric part,
the eigenvectors and LAPACK's workspace: measured 8.6 GB peak at n = 13,594, about ``6 n^2`` doubles;
``dense_limit`` raises it). Above, the verdict is what Lanczos shows: :data:`LANCZOS_VERDICT` ("no negative
eigenvalue found in m Lanczos steps from a random start"), never "certified".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..core.problem import Problem
from .spectrum import SpectrumEnds, head_symmetries, hessian_operator, origin_block, origin_is_stationary

DENSE_LIMIT = 4096      # unknowns on the live heads assembled densely at most: 4,096 products, ~6 n^2 doubles
BY_DENSE = "dense eigenvalue bound"          # the proof: eigh of the assembled C with the Weyl bound
BY_INTERLACING = "negative Ritz value"       # a saddle, proven by interlacing (no assembly needed)
BY_LANCZOS = "Lanczos only"                  # above the dense limit: no proof either way when no Ritz value < 0
LANCZOS_VERDICT = "no negative eigenvalue found in {m} Lanczos steps from a random start (not certified)"
N_PAIRS = 10            # the lowest dense eigenpairs kept


@dataclass(frozen=True)
class Certificate:
    """What is established about the sign of S at a measure (module docstring). ``kind``: :data:`BY_DENSE`,
    :data:`BY_INTERLACING` or :data:`BY_LANCZOS`; ``lower`` / ``upper``: bounds on ``lambda_min`` (``lower`` is
    -inf unless dense); ``index_lower``: negative eigenvalues proven; ``size``: the dense matrix's order (live
    complement plus k per origin block, 0 when not assembled); ``delta``: the eigenvalue error bound; ``products``:
    JVPs of the assembly; ``lanczos_steps``: of the spectrum it started from; ``values`` [a] and ``vectors``
    [N k, a]: the lowest dense eigenpairs (unit, v-coordinates; empty unless dense); ``dense_limit``: the limit in
    force."""
    kind: str
    lower: float
    upper: float
    index_lower: int
    size: int
    delta: float
    products: int
    lanczos_steps: int
    values: np.ndarray
    vectors: np.ndarray
    dense_limit: int = DENSE_LIMIT

    @property
    def proven_minimum(self) -> bool:
        """Every eigenvalue of S off the symmetry directions is positive, by the dense bound."""
        return bool(self.kind == BY_DENSE and self.lower > 0)

    def describe(self) -> str:
        """One line: the verdict on the sign of S and what establishes it."""
        if self.index_lower >= 1:
            how = ("a negative Ritz value (Cauchy interlacing)" if self.kind == BY_INTERLACING
                   else f"the dense eigenvalue bound (n = {self.size})")
            return f"index >= {self.index_lower}, proven by {how}; lambda_min <= {self.upper:.6g}"
        if self.kind == BY_LANCZOS:
            return (LANCZOS_VERDICT.format(m=self.lanczos_steps) + f": the live heads' {self.size} unknowns exceed "
                    f"the dense limit {self.dense_limit}; lambda_min <= {self.upper:.6g} (lowest Ritz value)")
        if self.proven_minimum:
            return (f"certified by the dense eigenvalue bound: lambda_min in [{self.lower:.6g}, {self.upper:.6g}] "
                    f"(eigh of S off the symmetry directions, n = {self.size}, delta = {self.delta:.1e})")
        return (f"not established: lambda_min in [{self.lower:.6g}, {self.upper:.6g}] contains 0 (dense, n = "
                f"{self.size}, delta = {self.delta:.1e})")


def complement_basis(tangents: np.ndarray, count: int) -> np.ndarray:
    """An orthonormal basis [k, k - count] of the complement of a head's first ``count`` tangents (``tangents`` [k,
    r_max], orthonormal columns): the trailing columns of a complete QR."""
    k = tangents.shape[0]
    if count == 0:
        return np.eye(k)
    q = np.linalg.qr(tangents[:, :count], mode="complete")[0]
    return q[:, count:]


def eigenvalue_bound(C: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """``eigh`` of the symmetric part ``A`` of an assembled ``C`` [n, n]: values [n] ascending, vectors [n, n] and
    ``delta = n eps |A|_F + |C - C^T|_F`` (module docstring): each eigenvalue of the exact matrix lies within delta
    of a computed one."""
    n = C.shape[0]
    asymmetry = float(np.linalg.norm(C - C.T)) if n else 0.0  # Frobenius: a bound on the 2-norm, no SVD
    A = 0.5 * (C + C.T)
    values, vectors = np.linalg.eigh(A)
    return values, vectors, n * np.finfo(float).eps * float(np.linalg.norm(A)) + asymmetry


def projected(S: np.ndarray, bases: list[np.ndarray], k: int) -> np.ndarray:
    """``C = B^T S B`` for ``S`` [n, n] (n = heads x k) and the block-diagonal ``B`` of per-head ``bases`` [k, c_i]
    (no dense B: two [n, n]-sized arrays at most besides S)."""
    SB = np.concatenate([S[:, i * k:(i + 1) * k] @ b for i, b in enumerate(bases)], axis=1)
    return np.concatenate([b.T @ SB[i * k:(i + 1) * k] for i, b in enumerate(bases)], axis=0)


def embedded(y: np.ndarray, bases: list[np.ndarray], k: int) -> np.ndarray:
    """``B y`` [n, a] for coordinates ``y`` [sum c_i, a] in the per-head ``bases`` [k, c_i]."""
    starts = np.cumsum([0] + [b.shape[1] for b in bases])
    return np.concatenate([b @ y[starts[i]:starts[i + 1]] for i, b in enumerate(bases)], axis=0)


def certify(problem: Problem, omega: np.ndarray, mass: np.ndarray, ends: SpectrumEnds, *,
            dense_limit: int = DENSE_LIMIT) -> Certificate:
    """The verdict on the sign of S at ``omega`` [N, k] (``mass`` [N]) from its Lanczos ends ``ends``
    (:func:`pdeflow.analysis.spectrum.spectrum_ends`) and, when no Ritz value is negative and the live heads have at
    most ``dense_limit`` unknowns, the dense bound (module docstring; heads exactly at the origin split off when the
    origin is stationary for every head)."""
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    N, k = omega.shape
    empty = np.zeros((N * k, 0))
    upper = float(ends.lowest_ritz)
    if ends.morse_index_lower >= 1:
        return Certificate(BY_INTERLACING, -math.inf, upper, ends.morse_index_lower, 0, math.nan, 0,
                           ends.lanczos_steps, np.zeros(0), empty, dense_limit)
    dead = np.all(omega == 0.0, axis=1)
    if not (dead.any() and not dead.all() and origin_is_stationary(problem, omega, mass)):
        dead = np.zeros(N, dtype=bool)
    live = ~dead
    n_live = int(live.sum()) * k
    if n_live > dense_limit:
        return Certificate(BY_LANCZOS, -math.inf, upper, 0, n_live, math.nan, 0, ends.lanczos_steps,
                           np.zeros(0), empty, dense_limit)
    sym = head_symmetries(problem, omega[live])
    B = [complement_basis(sym.blocks[i], int(sym.counts[i])) for i in range(int(live.sum()))]
    op = hessian_operator(problem, omega[live], mass[live], np.zeros((n_live, 0)))
    S = np.empty((n_live, n_live))
    unit = np.zeros(n_live)
    for j in range(n_live):
        unit[j] = 1.0
        S[:, j] = op.matvec(unit)
        unit[j] = 0.0
    C = projected(S, B, k)
    del S  # the dense matrices of a large certificate are what its memory is
    values, vectors, delta = eigenvalue_bound(C)
    del C
    vectors = embedded(vectors[:, :N_PAIRS], B, k)
    rows = np.repeat(live, k)
    full = np.zeros((N * k, vectors.shape[1]))
    full[rows] = vectors
    n_dead = int(dead.sum())
    index = int(np.sum(values < -delta))
    size = values.size
    values = values[:N_PAIRS]  # every eigenvalue counted in the index above; the lowest kept with their vectors
    if n_dead:
        o_values, o_vectors, _ = origin_block(problem, omega, mass)
        o_delta = k * np.finfo(float).eps * float(np.linalg.norm(o_values))
        first = int(np.flatnonzero(dead)[0])
        o_full = np.zeros((N * k, k))
        o_full[first * k:(first + 1) * k] = o_vectors  # one copy: the same block sits at every dead head
        values, full = np.concatenate([values, o_values]), np.concatenate([full, o_full], axis=1)
        index += n_dead * int(np.sum(o_values < -o_delta))
        delta, size = max(delta, o_delta), size + k
    order = np.argsort(values, kind="stable")[:N_PAIRS]
    lowest = float(values[order[0]])
    # the Ritz value is an upper bound in exact arithmetic; computed, it carries rounding of the order of delta
    return Certificate(BY_DENSE, lowest - delta, min(lowest, upper) + delta, index, size, float(delta),
                       op.products + (k if n_dead else 0), ends.lanczos_steps, values[order], full[:, order],
                       dense_limit)


__all__ = ["BY_DENSE", "BY_INTERLACING", "BY_LANCZOS", "DENSE_LIMIT", "LANCZOS_VERDICT", "Certificate", "certify",
           "complement_basis", "eigenvalue_bound", "embedded", "projected"]
