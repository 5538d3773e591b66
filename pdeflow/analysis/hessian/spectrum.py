"""The spectrum of the flow's linearisation at a particle measure, its continuous symmetries projected out.

For ``rho = sum_i m_i delta_{omega_i}`` (``omega`` [N, k], ``mass`` [N]) the flow's velocity is ``-grad Phi`` and its
Jacobian is ``-M^-1 Hess E`` (``M = diag(m_i)`` on each head's k coordinates, :meth:`pdeflow.Problem.system_jvp`).
In the mass-weighted coordinates ``v = M^(1/2) u`` the linearisation is the symmetric operator

    ``S = M^(1/2) (M^-1 Hess E) M^(-1/2) = M^(-1/2) Hess E M^(-1/2)``  on flat [N k] vectors,

whose eigenvalues are the rates of the linearised flow (``dv/dt = -S v``): a negative one is an unstable
direction, and at a stationary measure their count is the Morse index of E.

E is invariant under a change of basis of each head's (WQ, WK) and (WV, WO) pairs that leaves the head's output
unchanged (orthogonal changes when the weight decay is positive, as it also leaves ``|omega_i|`` unchanged; any
invertible one when it is zero): per head the tangents of that orbit
(:func:`pdeflow.analysis.hessian.local_geometry.symmetry_tangents`, ``dh (dh - 1)`` or ``2 dh^2`` of them, fewer at
degenerate heads, none in reduced coordinates) are directions along which E does not change, exact null vectors of S
at a stationary measure. :func:`symmetry_basis` collects them head by head (:class:`Symmetry`);
:func:`hessian_operator` is ``Pi S Pi``, ``Pi = I - Q Q^T``, and :func:`spectrum_ends` the two ends of its spectrum
by one reorthogonalised Lanczos run (:func:`pdeflow.core.lanczos.krylov_ritz`), reporting the converged Ritz values,
and the index proven by interlacing from all of them (:func:`negative_ritz_count`, converged or not). Whether the
point is a minimum is :mod:`pdeflow.analysis.certificate.certificate`'s to say: Lanczos alone proves a negative
eigenvalue,
never positivity.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse.linalg

from ...core.lanczos import RitzPairs, krylov_ritz
from ...core.problem import Problem
from ...core.system_jacobian import SystemJacobian
from .local_geometry import dense_hessian, symmetry_tangents

KRYLOV_DIM = 300        # Lanczos steps of spectrum_ends: the products of one spectral record
N_ENDS = 10             # Ritz values reported at each end (the converged ones among them)
ORBIT_FLOOR = 1e-6      # heads below this share of the largest head's norm have no symmetry orbit (at the origin)
ORIGIN_SPLIT = 2.0      # measured: a product on the long run's 55 live heads costs ~1/2 of one on all 128
RESOLVED = 0.1         # spectrum_ends(max_dim=...) grows until the lowest Ritz value's residual is this share of it
RITZ_TOL = 1e-6         # converged: residual <= RITZ_TOL * max(|lambda_max|, |lambda_min|)
START_SEED = 20260      # the fixed random part of the Lanczos start vector
# a Ritz value counts as negative below -RITZ_ROUNDING x the largest |Ritz value|: a Rayleigh quotient of a computed
# unit vector carries rounding ~ n eps |S| (a null direction's 0 comes out +-1e-16 |S|), far below this
RITZ_ROUNDING = 1e-12


@dataclass(frozen=True)
class Symmetry:
    """The symmetry tangents of a particle measure, head by head: ``blocks`` [N, k, r_max] (head i's orthonormal
    tangents in its first ``counts[i]`` columns, zeros after) and ``counts`` [N]. In the mass-weighted coordinates
    the tangent of head i is ``e_i (x) t``: the blocks are orthonormal in both u and v coordinates."""
    blocks: np.ndarray
    counts: np.ndarray

    @property
    def size(self) -> int:
        """r, the number of symmetry directions."""
        return int(np.sum(self.counts))

    def project(self, v: np.ndarray) -> np.ndarray:
        """``Pi v = v - Q Q^T v`` for a flat [N k] vector (head by head: no [N k, r] matrix)."""
        if self.size == 0:
            return v
        V = v.reshape(self.blocks.shape[0], -1)
        coeffs = np.einsum("nkr,nk->nr", self.blocks, V)
        return (V - np.einsum("nkr,nr->nk", self.blocks, coeffs)).ravel()

    def dense(self) -> np.ndarray:
        """Q [N k, r]: the tangents as columns, head 0's first."""
        N, k, _ = self.blocks.shape
        cols = []
        for i in range(N):
            for j in range(int(self.counts[i])):
                col = np.zeros((N, k))
                col[i] = self.blocks[i, :, j]
                cols.append(col.ravel())
        return np.stack(cols, axis=1) if cols else np.zeros((N * k, 0))


def head_symmetries(problem: Problem, omega: np.ndarray) -> Symmetry:
    """The orbit tangents of every head (:func:`pdeflow.analysis.hessian.local_geometry.symmetry_tangents` at
    ``omega_i``), as
    blocks; none for a head with ``|omega_i| <= ORBIT_FLOOR max_j |omega_j|``. Such a head is a dead head left a
    rounding-size distance off the origin (by a Newton step, say), where a stationary point has it exactly at 0 and
    no orbit: its tangents are not null vectors of S there but directions of the origin's curvature block
    (``lambda`` plus the residual's coupling), and projecting them out would hide that block's lowest
    eigenvalues from the verdict."""
    omega = np.asarray(omega, dtype=float)
    norms = np.linalg.norm(omega, axis=1)
    floor = ORBIT_FLOOR * float(norms.max()) if norms.size else 0.0
    tangents = [symmetry_tangents(problem, w) if n > floor else np.zeros((problem.k, 0))
                for w, n in zip(omega, norms)]
    counts = np.array([t.shape[1] for t in tangents], dtype=np.int64)
    blocks = np.zeros((omega.shape[0], problem.k, int(counts.max()) if counts.size else 0))
    for i, t in enumerate(tangents):
        blocks[i, :, :t.shape[1]] = t
    return Symmetry(blocks=blocks, counts=counts)


def symmetry_basis(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """Q [N k, r]: an orthonormal basis, in the mass-weighted coordinates ``v = M^(1/2) u``, of the tangent space
    at the measure of its continuous-symmetry orbit (module docstring): head i's tangents in head i's block.
    ``r = sum_i r_i`` (``dh (dh - 1)`` per head with weight decay, ``2 dh^2`` without, minus degeneracies; 0 in
    reduced coordinates). ``mass`` [N] does not enter: a direction within one head's block is the same direction
    in both coordinates."""
    del mass
    return head_symmetries(problem, omega).dense()


@dataclass(frozen=True)
class DenseSymmetry:
    """Directions given as an orthonormal basis ``Q`` [n, r] (what :func:`symmetry_basis` returns), with the
    interface of :class:`Symmetry`."""
    basis: np.ndarray

    @property
    def size(self) -> int:
        return int(self.basis.shape[1])

    def project(self, v: np.ndarray) -> np.ndarray:
        return v - self.basis @ (self.basis.T @ v) if self.size else v

    def dense(self) -> np.ndarray:
        return self.basis


def _as_symmetry(problem: Problem, omega: np.ndarray,
                 symmetry: Symmetry | DenseSymmetry | np.ndarray | None) -> Symmetry | DenseSymmetry:
    if symmetry is None:
        return head_symmetries(problem, omega)
    if isinstance(symmetry, Symmetry | DenseSymmetry):
        return symmetry
    return DenseSymmetry(np.asarray(symmetry, dtype=float).reshape(np.size(omega), -1))


class HessianOperator(scipy.sparse.linalg.LinearOperator):
    """``Pi S Pi`` on flat [N k] vectors (:func:`hessian_operator`); ``symmetry`` holds the projected directions.
    Its products are the Problem's to count (``problem``)."""

    def __init__(self, problem: Problem, omega: np.ndarray, mass: np.ndarray,
                 symmetry: Symmetry | DenseSymmetry) -> None:
        omega = np.asarray(omega, dtype=float)
        mass = np.asarray(mass, dtype=float)
        n = omega.size
        super().__init__(dtype=np.float64, shape=(n, n))
        self.symmetry, self.problem = symmetry, problem
        self._apply = SystemJacobian(problem, omega, mass, kind="exact").apply

    def _matvec(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=float).ravel()
        return self.symmetry.project(self._apply(self.symmetry.project(v)))

    def _rmatvec(self, v: np.ndarray) -> np.ndarray:
        return self._matvec(v)  # symmetric


def hessian_operator(problem: Problem, omega: np.ndarray, mass: np.ndarray,
                     symmetry: Symmetry | DenseSymmetry | np.ndarray | None = None) -> HessianOperator:
    """``Pi S Pi`` (module docstring) as a scipy LinearOperator on flat [N k] vectors: ``S v`` is one exact
    :meth:`pdeflow.Problem.system_jvp` (``M^-1 Hess E u`` at ``u = M^(-1/2) v``, scaled by ``M^(1/2)``), counted by
    the Problem. ``symmetry``: the directions to project out, a :class:`Symmetry`, a basis [N k, r] (as
    :func:`symmetry_basis` returns; [N k, 0] projects nothing) or None (the measure's own symmetries)."""
    omega = np.asarray(omega, dtype=float)
    return HessianOperator(problem, omega, mass, _as_symmetry(problem, omega, symmetry))


@dataclass
class SpectrumEnds:
    """The converged ends of the spectrum of ``Pi S Pi`` (:func:`spectrum_ends`).

    ``lowest`` / ``highest``: converged Ritz values at the low / high end, ascending, with their residuals
    ``|C x - theta x|`` (an eigenvalue lies within the residual of each); ``morse_index_lower``: the negative
    eigenvalues proven by Cauchy interlacing, :func:`negative_ritz_count` of every block's Ritz values, converged or
    not (the j-th lowest Ritz value is no lower than the j-th lowest eigenvalue); ``n_symmetry`` symmetry
    directions removed; ``products`` the Jacobian-vector products spent (the Problem's count: the origin
    block's complex-step columns are gradients to it); ``lowest_vectors`` [N k, len(lowest)] their unit Ritz vectors in
    v-coordinates; ``lowest_ritz`` and ``lowest_ritz_residual``: the lowest Ritz value of any block, converged or
    not, an upper bound on the lowest eigenvalue, and its residual; ``lowest_ritz_vector`` [N k] its unit vector
    (a direction of curvature ``lowest_ritz``: of negative curvature when that is negative, converged or not);
    ``lanczos_steps``: the Lanczos run's length (on the live heads when the origin is split off);
    ``unresolved_blocks``: blocks whose lowest Ritz value has not converged (a converged value of one block does
    not stand for another's)."""
    lowest: np.ndarray
    lowest_residual: np.ndarray
    highest: np.ndarray
    highest_residual: np.ndarray
    morse_index_lower: int
    n_symmetry: int
    products: int
    lowest_vectors: np.ndarray
    lowest_ritz: float = float("nan")
    lowest_ritz_residual: float = float("nan")

    lowest_ritz_vector: np.ndarray | None = None
    lanczos_steps: int = 0
    unresolved_blocks: int = 0

    @property
    def no_negative_found(self) -> bool:
        """No Ritz value of any block is negative, every block's lowest converged, and the lowest positive beyond
        its residual: what Lanczos can show for a minimum. Evidence, not a proof
        (:mod:`pdeflow.analysis.certificate.certificate`)."""
        return bool(self.morse_index_lower == 0 and self.unresolved_blocks == 0 and self.lowest.size
                    and self.lowest[0] == self.lowest_ritz and self.lowest_ritz - self.lowest_ritz_residual > 0)

    @property
    def lambda_min(self) -> float:
        """The lowest converged eigenvalue (NaN when none converged)."""
        return float(self.lowest[0]) if self.lowest.size else float("nan")

    @property
    def lambda_max(self) -> float:
        """The highest converged eigenvalue (NaN when none converged)."""
        return float(self.highest[-1]) if self.highest.size else float("nan")


def start_vector(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """The Lanczos start [N k], a function of the state: the unit mass-weighted gradient ``M^(1/2) grad Phi``
    (the flow's own direction; the flow's velocity is ``-M^(-1/2) v``) plus a fixed-seed unit random vector, so
    that no eigenvector is missed at a stationary measure."""
    omega = np.asarray(omega, dtype=float)
    rng = np.random.default_rng(START_SEED)
    x = rng.standard_normal(omega.size)
    x /= np.linalg.norm(x)
    g = (np.sqrt(np.asarray(mass, dtype=float))[:, None] * problem.grad_phi(omega, omega, mass)).ravel()
    norm = float(np.linalg.norm(g))
    if not (norm > 0 and np.isfinite(norm)):
        return x
    start = x + g / norm
    # two unit vectors cancel only when opposite (half the time when N k = 1): then the random part alone
    return start if np.linalg.norm(start) > 1e-8 else x


def spectrum_ends(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, krylov_dim: int = KRYLOV_DIM,
                  n_ends: int = N_ENDS, tol: float = RITZ_TOL,
                  symmetry: Symmetry | DenseSymmetry | np.ndarray | None = None,
                  max_dim: int = 0, split_origin: bool = False) -> SpectrumEnds:
    """Both ends of the spectrum of ``Pi S Pi`` at the measure (``omega`` [N, k], ``mass`` [N]) from one Lanczos
    run of ``krylov_dim`` steps with full reorthogonalisation (:func:`pdeflow.core.lanczos.krylov_ritz`) from
    :func:`start_vector`: ``krylov_dim`` products (capped at ``N k - r``) and one gradient (k more with the origin split
    off, its block's columns). A Ritz value counts
    as converged when its residual is at most ``tol * max(|theta_max|, |theta_min|)``; only converged values
    among the ``n_ends`` lowest and the ``n_ends`` highest are reported (:class:`SpectrumEnds`). With ``max_dim >
    krylov_dim`` the same run goes on, ``krylov_dim`` steps at a time, up to ``max_dim`` steps until the lowest Ritz
    value has converged with a residual at most :data:`RESOLVED` times its size (near a minimum the lowest
    eigenvalues converge last, and the verdict rests on the sign of the lowest).

    ``split_origin``: heads exactly at the origin, where it is a stationary point of every head
    (:func:`origin_is_stationary`), are split off. ``dE/domega_i = m_i grad Phi(omega_i; rho)`` vanishes at
    ``omega_i = 0`` for every rho, so S has no block coupling such a head to any other, and its own block is
    ``Hess Phi(0; rho)`` (the head's feature is quadratic at 0: the risk's second-order term drops). So the
    spectrum is that of the live heads' S (Lanczos on the measure without the dead heads, :data:`ORIGIN_SPLIT`
    x cheaper per product on the long run's minimum) together with the eigenvalues of the dense [k, k]
    ``Hess Phi(0; rho)`` (:func:`origin_block`), each ``n_dead`` times: exact where Lanczos sees one copy of a
    repeated eigenvalue."""
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    dead = np.all(omega == 0.0, axis=1) if split_origin else np.zeros(len(omega), dtype=bool)
    if not dead.any() or dead.all() or symmetry is not None or not origin_is_stationary(problem, omega, mass):
        return _lanczos_ends(problem, omega, mass, krylov_dim=krylov_dim, n_ends=n_ends, tol=tol,
                             symmetry=symmetry, max_dim=max_dim)
    live = _lanczos_ends(problem, omega[~dead], mass[~dead], krylov_dim=krylov_dim, n_ends=n_ends, tol=tol,
                         symmetry=None, max_dim=max_dim)
    values, vectors, residuals = origin_block(problem, omega, mass)
    n, k = omega.shape
    rows = np.repeat(~dead, k)
    live_vectors = np.zeros((n * k, live.lowest.size))
    live_vectors[rows] = live.lowest_vectors
    first = int(np.flatnonzero(dead)[0])
    dead_vectors = np.zeros((n * k, values.size))
    dead_vectors[first * k:(first + 1) * k] = vectors  # one copy: the same block sits at every dead head
    low_values = np.concatenate([live.lowest, values])
    low_residuals = np.concatenate([live.lowest_residual, residuals])
    low_vectors = np.concatenate([live_vectors, dead_vectors], axis=1)
    order = np.argsort(low_values, kind="stable")[:n_ends]
    high_values = np.concatenate([live.highest, values])
    high_residuals = np.concatenate([live.highest_residual, residuals])
    top = np.argsort(high_values, kind="stable")[-n_ends:]
    # each block bounds lambda_min from above: the lower of the two is the bound, whichever converged
    if values[0] < live.lowest_ritz:
        lowest_ritz, lowest_ritz_residual = float(values[0]), float(residuals[0])
        lowest_ritz_vector = dead_vectors[:, 0]
    else:
        lowest_ritz, lowest_ritz_residual = live.lowest_ritz, live.lowest_ritz_residual
        lowest_ritz_vector = np.zeros(n * k)
        lowest_ritz_vector[rows] = live.lowest_ritz_vector
    index = live.morse_index_lower + int(np.sum(dead)) * negative_ritz_count(values)
    return SpectrumEnds(lowest=low_values[order], lowest_residual=low_residuals[order], highest=high_values[top],
                        highest_residual=high_residuals[top], morse_index_lower=index, n_symmetry=live.n_symmetry,
                        products=live.products, lowest_vectors=low_vectors[:, order], lowest_ritz=lowest_ritz,
                        lowest_ritz_residual=lowest_ritz_residual, lowest_ritz_vector=lowest_ritz_vector,
                        lanczos_steps=live.lanczos_steps, unresolved_blocks=live.unresolved_blocks)


def origin_is_stationary(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> bool:
    """Whether ``grad Phi(0; rho) = 0`` exactly at the measure (``omega`` [N, k], ``mass`` [N]): true in full
    coordinates, where a head's feature is bilinear in ``(WV, WO)`` and the weight decay's gradient vanishes at 0,
    so a head at the origin stays there; not in general for reduced coordinates ``theta0 + B omega``."""
    return not np.any(problem.grad_phi(np.zeros((1, np.shape(omega)[1])), omega, mass))


def origin_block(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The block of S at a head at the origin, ``Hess Phi(0; rho)`` [k, k], built column by column from the exact
    Hessian-vector product (:meth:`pdeflow.core.problem.Problem.hvp`: k complex-step grad Phi evaluations at one
    point, which the Problem counts as gradients), and its eigendecomposition:
    eigenvalues [k] ascending, unit vectors [k, k] and residuals ``|H x - lambda x|`` [k]."""
    k = np.shape(omega)[1]
    origin = np.zeros(k)
    H = dense_hessian(lambda u: problem.hvp(origin, u, omega, mass), k)
    values, vectors = np.linalg.eigh(H)
    residuals = np.linalg.norm(H @ vectors - vectors * values[None, :], axis=0)
    return values, vectors, residuals


def _lanczos_ends(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, krylov_dim: int, n_ends: int,
                  tol: float, symmetry: Symmetry | DenseSymmetry | np.ndarray | None, max_dim: int) -> SpectrumEnds:
    """:func:`spectrum_ends` without the split: one Lanczos run on the whole measure (its docstring)."""
    omega = np.asarray(omega, dtype=float)
    mark = problem.mark()
    op = hessian_operator(problem, omega, mass, symmetry)
    sym = op.symmetry
    room = omega.size - sym.size
    dims = min(int(krylov_dim), room)
    longest = min(max(int(max_dim), dims), room)

    def lowest_resolved(pairs: RitzPairs) -> bool:
        return bool(_converged(pairs, tol)[0] and pairs.residuals[0] <= RESOLVED * abs(float(pairs.values[0])))

    pairs = krylov_ritz(op.matvec, start_vector(problem, omega, mass), longest, sym.project,
                        check_every=dims if longest > dims else 0, enough=lowest_resolved)
    values, residuals = pairs.values, pairs.residuals
    converged = _converged(pairs, tol)
    m = values.size
    low = np.arange(min(n_ends, m))
    low = low[converged[low]]
    high = np.arange(max(m - n_ends, 0), m)
    high = high[converged[high]]
    return SpectrumEnds(lowest=values[low], lowest_residual=residuals[low], highest=values[high],
                        highest_residual=residuals[high], morse_index_lower=negative_ritz_count(values),
                        n_symmetry=sym.size, products=problem.products_since(mark),
                        lowest_vectors=pairs.vectors[:, low],
                        lowest_ritz=float(values[0]), lowest_ritz_residual=float(residuals[0]),
                        lowest_ritz_vector=pairs.vectors[:, 0], lanczos_steps=int(values.size),
                        unresolved_blocks=int(not converged[0]))


def negative_ritz_count(values: np.ndarray) -> int:
    """The negative eigenvalues that Ritz values ``values`` [m] of one block of S prove (Cauchy interlacing: the
    j-th lowest Ritz value is no lower than the j-th lowest eigenvalue, converged or not): those below
    ``-RITZ_ROUNDING`` times the largest ``|value|`` (:data:`RITZ_ROUNDING`). The one rule for the index."""
    values = np.asarray(values, dtype=float)
    if not values.size:
        return 0
    return int(np.sum(values < -RITZ_ROUNDING * float(np.max(np.abs(values)))))


def _converged(pairs: RitzPairs, tol: float) -> np.ndarray:
    """Which Ritz values [m] have converged: residual <= ``tol`` times the larger end's magnitude."""
    scale = max(abs(float(pairs.values[-1])), abs(float(pairs.values[0])), np.finfo(float).tiny)
    return pairs.residuals <= tol * scale


__all__ = ["KRYLOV_DIM", "N_ENDS", "RESOLVED", "RITZ_ROUNDING", "RITZ_TOL", "DenseSymmetry", "HessianOperator",
           "SpectrumEnds", "Symmetry", "head_symmetries", "origin_block", "origin_is_stationary", "hessian_operator",
           "negative_ritz_count", "spectrum_ends", "start_vector", "symmetry_basis"]
