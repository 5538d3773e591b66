"""Whether a stationary measure is a local minimum: the one rule that every verdict on the sign of S follows.

``S`` is the mass-weighted Hessian off the symmetry directions (:mod:`pdeflow.analysis.hessian.spectrum`). Two facts
decide:

- **Index by interlacing.** The j-th lowest Ritz value of any Rayleigh-Ritz projection of S (a Lanczos block on the
  live heads, the dense block of the heads at the origin) is no lower than the j-th lowest eigenvalue (Cauchy
  interlacing), converged or not: every negative Ritz value of a block proves one more negative eigenvalue there
  (:attr:`pdeflow.analysis.hessian.spectrum.SpectrumEnds.morse_index_lower`). A negative lowest Ritz value of ANY block
  means index >= 1, whatever a converged value of another block says.
- **Positivity only by a proof.** A positive lowest Ritz value is an upper bound on ``lambda_min``: it proves
  nothing below it absent. :func:`certify` assembles ``C = B^T S B`` densely on the live heads (``B`` [n, n - r]
  an orthonormal basis of the complement of the heads' symmetry tangents, head by head; ``n`` products of the
  exact JVP) and takes ``numpy.linalg.eigh`` of its symmetric part ``A``. LAPACK's symmetric eigensolver is
  backward stable: the computed eigenvalues are exact for ``A + E`` with ``|E|_2 <= p(n) eps |A|_2``, so by Weyl
  each lies within ``delta = n eps |A|_F + |C - C^T|_F`` of an eigenvalue of ``A`` (``p(n) = n`` taken, the
  Frobenius norms bounding the 2-norms; the asymmetry of the assembled ``C`` is the measured part of the JVP's
  rounding, added as the estimate of the assembly error, which is not otherwise bounded). The heads exactly at the
  origin add the [k, k] block ``Hess Phi(0; rho)`` (:func:`pdeflow.analysis.hessian.spectrum.origin_block`), bounded the
  same way. ``lambda_min`` then lies in ``[lowest - delta, min(lowest, lowest Ritz value) + delta]``, and the point
  is a **certified** local minimum when that lower bound is positive.

**By Cholesky** (:data:`BY_CHOLESKY`, the default where it applies: ``method="auto"``): ``C`` is assembled from
S's structure (:func:`pdeflow.core.hessian_assembly.assemble_hessian` with the bases: ``2 k`` forward passes over
the live heads and one symmetric rank update, no ``n`` products) and :func:`cholesky_bound` brackets the lowest
eigenvalue of its symmetric part ``A``. Upper: the Rayleigh quotient ``theta`` of the vector that shift-invert
Lanczos (``scipy.sparse.linalg.eigsh`` with ``sigma = 0``, the solves by the Cholesky factor of ``A``) returns, plus
the rounding of its evaluation, ``gamma_{n+1} |x|^T |A| |x|`` (``gamma_m = m u / (1 - m u)``, ``u = 2^-53``; Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., Lemma 3.4 / (3.11)). Lower: Rump's verified positive
definiteness (S. M. Rump, "Verification of positive definiteness", BIT 46 (2006) 433-452; the theorem behind it is
Demmel's, Higham Theorem 10.5): if the floating-point Cholesky factorisation of ``Ã = fl(A - s I)`` runs to
completion, its factor R satisfies ``R^T R = Ã + Delta`` with ``|Delta| <= gamma_{n+1} |R^T| |R|`` (any order of
the inner products, so blocked LAPACK potrf too), hence ``|Delta|_2 <= gamma_{n+1} / (1 - gamma_{n+1}) tr(Ã)``
and, ``R^T R`` being positive semidefinite,

    ``lambda_min(A) >= s - r(s)``,  ``r(s) = gamma_{n+1} / (1 - gamma_{n+1}) tr(Ã) + u max_i |ã_ii| + u |A|_F``

(the second term the rounding of the shift, the third that of forming the symmetric part; underflow does not
occur at these magnitudes: every diagonal entry of ``Ã`` is checked to be a normal number). Sharper and as
rigorous: ``|Delta|_2 <= gamma_{n+1} rho(|R|^T |R|)`` (``|Delta|`` is entrywise below that nonnegative matrix), and
the Collatz-Wielandt bound ``rho(M) <= max_i (M x)_i / x_i`` for any positive x (:func:`perron_bound`, a few power
steps) is used in place of the trace when smaller (at the long run's minimum ~10x: it is at least ``lambda_max``,
the trace the sum of all eigenvalues). The shift starts at ``s = theta (1 - 1e-7)`` and, while the factorisation
fails, moves down (the margin doubled, at most :data:`SHIFT_TRIES` times); the certificate is ``lambda_min in
[s - r(s) - |C - C^T|_F, upper + |C - C^T|_F]`` (the asymmetry the estimate of the assembly's error, as for the
dense bound). When ``A`` itself has no Cholesky factor, or the lower bound is not positive, the dense eigenvalue
bound above is taken on the same ``C`` instead (it counts the negative eigenvalues): a saddle or a nearly singular
minimum is never certified by Cholesky. When the Lanczos run has resolved the live block's lowest value to 1e-7,
that value is the shift's estimate and one factorisation does both: Rump's test at ``estimate (1 - 1e-7)``, and
inverse iteration with its factor for the Rayleigh vector (:func:`cholesky_bound`, ``estimate``; a wrong estimate
falls back to the two factorisations).

**At the point, and about the minimum.** Both brackets bound lambda_min of S at the point given, which a search
leaves with ``I > 0``, off the minimum it approximates. At a proven minimum :func:`certify` also estimates how far
lambda_min can move to that minimum (:mod:`pdeflow.analysis.certificate.about_minimum`: the distance ``sqrt(I) /
lower`` times the measured slope of the lowest Rayleigh quotient) and widens the bracket into
:attr:`Certificate.minimum_bracket`; :meth:`Certificate.describe` states both, labelled.

Dense assembly stops at :data:`DENSE_LIMIT` unknowns on the live heads (``n`` products; S, C, its symmetric part,
the eigenvectors and LAPACK's workspace: measured 8.6 GB peak at n = 13,594, about ``6 n^2`` doubles;
``dense_limit`` raises it). Above, the verdict is what Lanczos shows: :data:`LANCZOS_VERDICT` ("no negative
eigenvalue found in m Lanczos steps from a random start"), never "certified".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
import scipy.linalg
import scipy.sparse.linalg

from ...core.hessian_assembly import assemble_hessian
from ...core.lanczos import lowest_eigenvector_shift_invert
from ...core.problem import Problem
from ..hessian.spectrum import SpectrumEnds, head_symmetries, hessian_operator, origin_block, origin_is_stationary
from .about_minimum import drift_to_minimum

DENSE_LIMIT = 4096      # unknowns on the live heads assembled densely at most: 4,096 products, ~6 n^2 doubles
BY_DENSE = "dense eigenvalue bound"          # the proof: eigh of the assembled C with the Weyl bound
BY_CHOLESKY = "Cholesky bound"               # the proof: Rump's test on C assembled from S's structure
PROOFS = (BY_DENSE, BY_CHOLESKY)             # the kinds that prove a minimum when their lower bound is positive
METHODS = ("auto", "cholesky", "dense")      # certify's routes: auto = Cholesky where S's structure is known
SHIFT_TRIES = 12        # shifted factorisations tried below theta, the margin doubled each time
SHIFT_MARGIN = 1e-7     # the first shift's distance below theta, relative
UNIT_ROUNDOFF = 2.0 ** -53
CHOLESKY_SEED = 20261   # the fixed start vector of the shift-invert Lanczos run
PERRON_STEPS = 8        # power steps before the Collatz-Wielandt bound on the rounding of the factorisation
INVERSE_STEPS = 3       # inverse-iteration steps with the factor shifted to just below an estimate of lambda_min
ESTIMATE_SLACK = 10.0   # an estimate's bracket is kept when theta - shift <= this x the first shift's margin
BY_INTERLACING = "negative Ritz value"       # a saddle, proven by interlacing (no assembly needed)
BY_LANCZOS = "Lanczos only"                  # above the dense limit: no proof either way when no Ritz value < 0
NOT_STATIONARY = "none: not stationary"      # a search stopped short of I <= target: the sign of S decides nothing
LANCZOS_VERDICT = "no negative eigenvalue found in {m} Lanczos steps from a random start (not certified)"
N_PAIRS = 10            # the lowest dense eigenpairs kept


@dataclass(frozen=True)
class Certificate:
    """What is established about the sign of S at a measure (module docstring). ``kind``: :data:`BY_DENSE`,
    :data:`BY_CHOLESKY`, :data:`BY_INTERLACING`, :data:`BY_LANCZOS` or :data:`NOT_STATIONARY`
    (:func:`not_stationary`); ``lower`` / ``upper``: bounds on ``lambda_min`` (``lower`` is -inf unless dense or
    Cholesky); ``index_lower``: negative eigenvalues proven; ``size``: the dense matrix's order (live complement
    plus k per origin block, 0 when not assembled); ``delta``: the eigenvalue error bound (Cholesky: the rounding
    bound r of the shifted factorisation plus the asymmetry); ``products``: the assembly's Jacobian-vector products,
    the Problem's count (Cholesky: its 2 k forward passes over the live heads, k more per further group of heads;
    the origin block's k complex-step columns are gradients to the Problem, not products); ``lanczos_steps``: of the
    spectrum it started from; ``values`` [a] and ``vectors`` [N k, a]: the lowest dense eigenpairs (unit,
    v-coordinates; empty unless dense; Cholesky: the Rayleigh pair and the origin block's); ``dense_limit``: the
    limit in force. ``[lower, upper]`` bounds lambda_min of S *at the point certified*; at a proven minimum
    :func:`certify` also estimates how far it can move to the minimum the point approximates
    (:mod:`pdeflow.analysis.certificate.about_minimum`): ``distance`` (``sqrt(I) / lower``, mass-weighted),
    ``drift`` (the bracket's widening; NaN when not estimated) and the ``drift_products`` it cost (not in
    ``products``)."""
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
    distance: float = math.nan
    drift: float = math.nan
    drift_products: int = 0

    @property
    def estimate(self) -> float:
        """The value of ``lambda_min`` this certificate computed (NaN when it computed none): the lowest dense
        eigenvalue (:data:`BY_DENSE`), or the Rayleigh quotient ``theta`` of the shift-invert vector, or the origin
        block's lowest when lower (:data:`BY_CHOLESKY`), kept inside the bracket ``[lower, upper]`` (a converged
        Ritz value below theta sets the upper end). A Lanczos run's converged Ritz values need not include it: a
        short run on the live heads may resolve only higher ones."""
        if self.kind not in PROOFS or not self.values.size:
            return math.nan
        return min(max(float(self.values[0]), self.lower), self.upper)

    @property
    def minimum_bracket(self) -> tuple[float, float]:
        """``[lower - drift, upper + drift]``: lambda_min at the minimum the point approximates, an estimate (first
        order in ``distance``); NaN when the drift was not estimated."""
        return self.lower - self.drift, self.upper + self.drift

    def about_minimum(self) -> str:
        """What the certificate says of the minimum the point approximates (empty when nothing was estimated)."""
        if not math.isfinite(self.drift):
            return ""
        low, high = self.minimum_bracket
        if self.drift == 0.0:
            return "; the point is stationary to rounding (I = 0): the bracket is the minimum's"
        resolved = "" if low > 0 else ", not resolved from 0 at this distance (polish the point)"
        return (f"; at the minimum it approximates (within sqrt(I) / lambda_min = {self.distance:.2g}) lambda_min "
                f"in [{low:.6g}, {high:.6g}] (estimate, first order in that distance{resolved})")

    @property
    def proven_minimum(self) -> bool:
        """Every eigenvalue of S off the symmetry directions is positive, by the dense or the Cholesky bound."""
        return bool(self.kind in PROOFS and self.lower > 0)

    def describe(self) -> str:
        """One line: the verdict on the sign of S and what establishes it."""
        if self.kind == NOT_STATIONARY:
            bound = f"; lambda_min <= {self.upper:.6g} there (lowest Ritz value)" if math.isfinite(self.upper) else ""
            return ("none: the point is not stationary (I above the target), so the sign of S there proves nothing "
                    f"about a minimum and no dense certificate is computed{bound}")
        if self.index_lower >= 1:
            how = ("a negative Ritz value (Cauchy interlacing)" if self.kind == BY_INTERLACING
                   else f"the dense eigenvalue bound (n = {self.size})")
            return f"index >= {self.index_lower}, proven by {how}; lambda_min <= {self.upper:.6g}"
        if self.kind == BY_LANCZOS:
            return (LANCZOS_VERDICT.format(m=self.lanczos_steps) + f": the live heads' {self.size} unknowns exceed "
                    f"the dense limit {self.dense_limit}; lambda_min <= {self.upper:.6g} (lowest Ritz value)")
        if self.proven_minimum and self.kind == BY_CHOLESKY:
            return (f"certified by the Cholesky bound: lambda_min in [{self.lower:.6g}, {self.upper:.6g}] at this "
                    f"point (Rump's test on S off the symmetry directions, n = {self.size}, delta = "
                    f"{self.delta:.1e}){self.about_minimum()}")
        if self.proven_minimum:
            return (f"certified by the dense eigenvalue bound: lambda_min in [{self.lower:.6g}, {self.upper:.6g}] "
                    f"at this point (eigh of S off the symmetry directions, n = {self.size}, delta = "
                    f"{self.delta:.1e}){self.about_minimum()}")
        return (f"not established: lambda_min in [{self.lower:.6g}, {self.upper:.6g}] contains 0 (dense, n = "
                f"{self.size}, delta = {self.delta:.1e})")


def not_stationary(ends: SpectrumEnds | None, n: int, dense_limit: int = DENSE_LIMIT) -> Certificate:
    """The certificate of a point a search stopped at before ``I <= target`` (``n`` unknowns in all): none
    (:data:`NOT_STATIONARY`). The lowest Ritz value of its spectrum ``ends``, when one was computed, stays an upper
    bound on ``lambda_min`` there; no dense matrix is assembled (on 10^4 live unknowns that takes minutes and
    gigabytes, for a verdict the dissipation has already given: not converged)."""
    upper = math.inf if ends is None else float(ends.lowest_ritz)
    return Certificate(NOT_STATIONARY, -math.inf, upper, 0, 0, math.nan, 0, 0 if ends is None else ends.lanczos_steps,
                       np.zeros(0), np.zeros((n, 0)), dense_limit)


def stored_lambda_min(result: dict) -> tuple[float, bool]:
    """``lambda_min`` of a stationary result (:func:`pdeflow.analysis.stationary.stationary.read_stationary`'s dict) and
    whether it had to be taken from the certificate: the stored value when it lies in the certificate's bracket
    ``[lambda_min_lower, lambda_min_upper]`` (or there is no finite bracket), else the bracket's upper end, the
    certificate's Rayleigh value. Files written before the certificate's value was stored as ``lambda_min`` hold
    the lowest *converged* Ritz value there, which a short Lanczos run can leave far above lambda_min."""
    lam = float(result.get("lambda_min", math.nan))
    lower, upper = float(result.get("lambda_min_lower", math.nan)), float(result.get("lambda_min_upper", math.nan))
    if math.isfinite(lower) and math.isfinite(upper) and not lower <= lam <= upper:
        return upper, True
    return lam, False


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


def symmetric_part(C: np.ndarray, block: int = 512) -> float:
    """Replace ``C`` [n, n] by ``(C + C^T) / 2`` in place, block by block (no second [n, n] array), and return the
    asymmetry ``|C - C^T|_F`` it had."""
    n = C.shape[0]
    squares = 0.0
    for i in range(0, n, block):
        for j in range(i, n, block):
            upper, lower = C[i:i + block, j:j + block], C[j:j + block, i:i + block].T
            diff = upper - lower
            squares += (1.0 if i == j else 2.0) * float(np.sum(diff * diff))  # the mirrored block counts too
            mean = 0.5 * (upper + lower)
            C[i:i + block, j:j + block] = mean
            C[j:j + block, i:i + block] = mean.T
    return math.sqrt(squares)


def _gamma(m: int) -> float:
    """``gamma_m = m u / (1 - m u)`` (Higham's constant of m roundings)."""
    return m * UNIT_ROUNDOFF / (1.0 - m * UNIT_ROUNDOFF)


def shifted_cholesky_bound(A: np.ndarray, shift: float, work: np.ndarray) -> float | None:
    """Rump's test (module docstring): ``shift - r(shift)``, a proven lower bound on ``lambda_min(A)`` for the
    symmetric ``A`` [n, n], when the floating-point Cholesky factorisation of ``fl(A - shift I)`` runs to
    completion; None when it does not (or a diagonal entry of the shifted matrix is not a positive normal
    number). ``work`` [n, n] is overwritten (the shifted matrix, then its factor)."""
    found = _shifted_factor(A, shift, work)
    return None if found is None else found[0]


def _shifted_factor(A: np.ndarray, shift: float, work: np.ndarray) -> tuple[float, np.ndarray] | None:
    """:func:`shifted_cholesky_bound` and the upper factor R [n, n] (a view of ``work``)."""
    n = A.shape[0]
    np.copyto(work, A)
    work.flat[::n + 1] -= shift
    diagonal = work.diagonal()
    if not np.all(diagonal >= np.finfo(float).tiny):
        return None
    g = _gamma(n + 1)
    # |Delta|_2 <= gamma_{n+1} rho(|R^T| |R|), bounded by the trace (Rump) or, sharper, by Collatz-Wielandt below;
    # each computed sum rounded up by its own gamma
    trace = g / (1.0 - g) * float(np.sum(diagonal)) * (1.0 + _gamma(n))
    rest = (UNIT_ROUNDOFF * float(np.max(diagonal))
            + UNIT_ROUNDOFF * float(np.linalg.norm(A)) * (1.0 + _gamma(n * n)))
    try:
        # the transpose of a C-ordered symmetric matrix is the same matrix in Fortran order: factorised in place
        R = scipy.linalg.cholesky(work if work.flags.f_contiguous else work.T, lower=False, overwrite_a=True,
                                  check_finite=False)
    except np.linalg.LinAlgError:
        return None
    return shift - min(trace, g * perron_bound(R)) - rest, R


def perron_bound(R: np.ndarray, iterations: int = PERRON_STEPS, block: int = 1024) -> float:
    """A proven upper bound on the Perron root of ``M = |R|^T |R|`` (``R`` [n, n] upper triangular, a Cholesky
    factor: what lies left of a block's diagonal is not read): the Collatz-Wielandt bound
    ``rho(M) <= max_i (M x)_i / x_i`` for any ``x > 0`` (M is nonnegative), at ``x`` after ``iterations`` power
    steps from ones, each computed (nonnegative) sum rounded up by ``1 / (1 - gamma_{2n+2})``; inf when some
    ``x_i`` is not positive. ``|R|`` is taken block by block of rows (no second [n, n] array), each from its
    diagonal on: half the reads of whole rows."""
    n = R.shape[0]

    def product(x: np.ndarray) -> np.ndarray:
        z = np.zeros(n)
        for i in range(0, n, block):
            rows = np.abs(R[i:i + block, i:])
            z[i:] += rows.T @ (rows @ x[i:])
        return z

    x = np.ones(n)
    for _ in range(iterations):
        z = product(x)
        x = z / float(np.max(z))
    if not np.all(x > 0):
        return math.inf
    return float(np.max(product(x) / x)) / (1.0 - _gamma(2 * n + 2))


@dataclass(frozen=True)
class CholeskyBound:
    """:func:`cholesky_bound`'s bracket of ``lambda_min(A)``: ``lower`` (-inf when no shifted factorisation
    succeeded), ``upper``, the Rayleigh quotient ``theta`` of the unit ``vector`` [n], the ``shift`` of the
    successful factorisation, its rounding bound ``rounding`` (``shift - lower``), the factorisations ``tries``
    and ``walls``: seconds spent in the factorisation of A (``factor``), the shift-invert run (``eigsh``) and the
    shifted factorisations with their bounds (``shifted``)."""
    lower: float
    upper: float
    theta: float
    vector: np.ndarray
    shift: float
    rounding: float
    tries: int
    walls: dict[str, float] = field(default_factory=dict)


def _rayleigh(A: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """The Rayleigh quotient ``theta`` of ``x`` [n] and the proven upper bound ``theta + gamma_{n+3} |x|^T |A| |x| /
    x^T x`` on ``lambda_min(A)`` (the rounding of its evaluation; ``|A|`` block by block)."""
    n = A.shape[0]
    xx = float(x @ x)
    theta = float(x @ (A @ x)) / xx
    ax = np.abs(x)
    absolute = sum(float(ax[i:i + 1024] @ (np.abs(A[i:i + 1024]) @ ax)) for i in range(0, n, 1024))
    return theta, theta + _gamma(n + 3) * absolute / xx * (1.0 + _gamma(n + 3))


def _bound_from_estimate(A: np.ndarray, estimate: float) -> CholeskyBound | None:
    """One factorisation instead of two when ``estimate`` is ``lambda_min`` to ~1e-7: Rump's test at ``s =
    estimate (1 - 1e-7)``; on success a few steps of inverse iteration with that factor (the shift is next to
    lambda_min, so each step gains the ratio (lambda_1 - s) / (lambda_2 - s)) give the Rayleigh vector. None when
    the factorisation fails (the estimate is above lambda_min) or the Rayleigh quotient lies more than
    :data:`ESTIMATE_SLACK` x 1e-7 above the shift (the estimate was too low to make the bracket tight)."""
    n = A.shape[0]
    shift = estimate * (1.0 - SHIFT_MARGIN)
    t0 = time.perf_counter()
    found = _shifted_factor(A, shift, np.empty((n, n)))
    if found is None:
        return None
    lower, R = found
    walls = {"shifted": time.perf_counter() - t0}
    t0 = time.perf_counter()
    x = np.random.default_rng(CHOLESKY_SEED).standard_normal(n)
    for _ in range(INVERSE_STEPS):
        x = scipy.linalg.cho_solve((R, False), x, check_finite=False)
        x /= np.linalg.norm(x)
    theta, upper = _rayleigh(A, x)
    walls["inverse"] = time.perf_counter() - t0
    if theta - shift > ESTIMATE_SLACK * SHIFT_MARGIN * abs(theta):
        return None
    return CholeskyBound(lower, upper, theta, x, shift, shift - lower, 1, walls)


def cholesky_bound(A: np.ndarray, estimate: float | None = None) -> CholeskyBound | None:
    """``lambda_min`` of the symmetric ``A`` [n, n] bracketed by a Rayleigh quotient and Rump's test (module
    docstring); None when ``A`` has no floating-point Cholesky factor (the dense bound decides then). Memory: two
    [n, n] arrays besides ``A``. ``estimate``: a value of lambda_min to ~1e-7 (a converged Lanczos value): tried
    first, one factorisation at ``estimate (1 - 1e-7)`` then proves the lower bound and gives the vector
    (:func:`_bound_from_estimate`); else, or when that fails, the factorisation of A, shift-invert Lanczos for theta
    and the shifted factorisations."""
    if estimate is not None and estimate > 0:
        bound = _bound_from_estimate(A, estimate)
        if bound is not None:
            return bound
    n = A.shape[0]
    t0 = time.perf_counter()
    try:
        factor = scipy.linalg.cho_factor(A, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    walls = {"factor": time.perf_counter() - t0}
    t0 = time.perf_counter()
    solve = scipy.sparse.linalg.LinearOperator(
        (n, n), matvec=lambda x: scipy.linalg.cho_solve(factor, x, check_finite=False), dtype=float)
    start = np.random.default_rng(CHOLESKY_SEED).standard_normal(n)
    x = lowest_eigenvector_shift_invert(A, solve, start)
    x = x / np.linalg.norm(x)
    theta, upper = _rayleigh(A, x)
    work = factor[0]  # the factor's memory, no longer needed
    walls["eigsh"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # the first shift 1e-7 below theta: a factorisation's actual rounding is far below its bound r
    margin = max(SHIFT_MARGIN * abs(theta), np.finfo(float).tiny)
    for tries in range(1, SHIFT_TRIES + 1):
        shift = theta - margin
        lower = shifted_cholesky_bound(A, shift, work)
        if lower is not None:
            walls["shifted"] = time.perf_counter() - t0
            return CholeskyBound(lower, upper, theta, x, shift, shift - lower, tries, walls)
        margin *= 2.0
    walls["shifted"] = time.perf_counter() - t0
    return CholeskyBound(-math.inf, upper, theta, x, math.nan, math.nan, SHIFT_TRIES, walls)


def certify(problem: Problem, omega: np.ndarray, mass: np.ndarray, ends: SpectrumEnds, *,
            dense_limit: int = DENSE_LIMIT, method: str = "auto", about_minimum: bool = True) -> Certificate:
    """:func:`sign_of_s` (the verdict at the point) and, for a proven minimum with ``about_minimum``, how far its
    lambda_min can move to the minimum the point approximates
    (:func:`pdeflow.analysis.certificate.about_minimum.drift_to_minimum`: five JVPs and a gradient, counted in
    ``drift_products``), which widens the bracket into :attr:`Certificate.minimum_bracket`."""
    cert = sign_of_s(problem, omega, mass, ends, dense_limit=dense_limit, method=method)
    if not (about_minimum and cert.proven_minimum and cert.vectors.shape[1]):
        return cert
    drift = drift_to_minimum(problem, omega, mass, cert.lower, cert.vectors[:, 0])
    return replace(cert, distance=drift.distance, drift=drift.change, drift_products=drift.products)


def sign_of_s(problem: Problem, omega: np.ndarray, mass: np.ndarray, ends: SpectrumEnds, *,
              dense_limit: int = DENSE_LIMIT, method: str = "auto") -> Certificate:
    """The verdict on the sign of S at ``omega`` [N, k] (``mass`` [N]) from its Lanczos ends ``ends``
    (:func:`pdeflow.analysis.hessian.spectrum.spectrum_ends`) and, when no Ritz value is negative and the live heads
    have at
    most ``dense_limit`` unknowns, a bound from the assembled ``C`` (module docstring; heads exactly at the origin
    split off when the origin is stationary for every head). ``method`` (:data:`METHODS`): ``"dense"`` assembles C
    from ``n`` exact products and takes the dense eigenvalue bound; ``"cholesky"`` assembles C from S's structure
    (:func:`pdeflow.core.hessian_assembly.assemble_hessian`) and proves by Cholesky, falling back to the dense bound
    on the same C when that proves nothing; ``"auto"`` is ``"cholesky"`` for a serial problem (S's structure is
    known for every particle measure of the attention model), else ``"dense"``."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "auto":
        method = "cholesky" if problem.comm.size == 1 else "dense"
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
    mark = problem.mark()
    if method == "cholesky":
        C = assemble_hessian(problem, omega, mass, heads=np.flatnonzero(live), bases=B)
    else:
        op = hessian_operator(problem, omega[live], mass[live], np.zeros((n_live, 0)))
        S = np.empty((n_live, n_live))
        unit = np.zeros(n_live)
        for j in range(n_live):
            unit[j] = 1.0
            S[:, j] = op.matvec(unit)
            unit[j] = 0.0
        C = projected(S, B, k)
        del S  # the dense matrices of a large certificate are what its memory is
    n_dead = int(dead.sum())
    if n_dead:
        o_values, o_vectors, _ = origin_block(problem, omega, mass)
        o_delta = k * np.finfo(float).eps * float(np.linalg.norm(o_values))
    products = problem.products_since(mark)
    asymmetry = 0.0  # of C as assembled, when symmetrised before eigenvalue_bound sees it
    if method == "cholesky":
        asymmetry = symmetric_part(C)
        # a Lanczos value converged to 1e-7 saves a factorisation, unless it is the origin block's
        resolved = ends.lowest_ritz_residual <= SHIFT_MARGIN * ends.lowest_ritz
        estimate = ends.lowest_ritz if resolved and (not n_dead or o_values[0] > ends.lowest_ritz) else None
        bound = cholesky_bound(C, estimate)
        origin_lower = float(o_values[0]) - o_delta if n_dead else math.inf
        if bound is not None and min(bound.lower - asymmetry, origin_lower) > 0:
            return _cholesky_certificate(bound, asymmetry, C.shape[0], live, dead, B, k, upper, products,
                                         ends.lanczos_steps, dense_limit,
                                         (o_values, o_vectors, o_delta) if n_dead else None)
        # else the dense bound decides, on the same (now symmetric) C
    values, vectors, delta = eigenvalue_bound(C)
    delta += asymmetry
    del C
    vectors = embedded(vectors[:, :N_PAIRS], B, k)
    rows = np.repeat(live, k)
    full = np.zeros((N * k, vectors.shape[1]))
    full[rows] = vectors
    index = int(np.sum(values < -delta))
    size = values.size
    values = values[:N_PAIRS]  # every eigenvalue counted in the index above; the lowest kept with their vectors
    if n_dead:
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
                       products, ends.lanczos_steps, values[order], full[:, order], dense_limit)


def _cholesky_certificate(bound: CholeskyBound, asymmetry: float, size: int, live: np.ndarray, dead: np.ndarray,
                          B: list[np.ndarray], k: int, ritz: float, products: int, lanczos_steps: int,
                          dense_limit: int, origin: tuple[np.ndarray, np.ndarray, float] | None) -> Certificate:
    """The :data:`BY_CHOLESKY` certificate from the live heads' bound and the origin block's eigenpairs."""
    N = live.size
    full = np.zeros((N * k, 1))
    full[np.repeat(live, k)] = embedded(bound.vector[:, None], B, k)
    values = np.array([bound.theta])
    lower, upper = bound.lower - asymmetry, min(bound.upper, ritz + bound.rounding) + asymmetry
    delta = bound.rounding + asymmetry
    if origin is not None:
        o_values, o_vectors, o_delta = origin
        first = int(np.flatnonzero(dead)[0])
        o_full = np.zeros((N * k, k))
        o_full[first * k:(first + 1) * k] = o_vectors
        values, full = np.concatenate([values, o_values]), np.concatenate([full, o_full], axis=1)
        lower, upper = min(lower, float(o_values[0]) - o_delta), min(upper, float(o_values[0]) + o_delta)
        size += k
    order = np.argsort(values, kind="stable")[:N_PAIRS]
    return Certificate(BY_CHOLESKY, lower, upper, 0, size, float(delta), products, lanczos_steps, values[order],
                       full[:, order], dense_limit)


__all__ = ["BY_CHOLESKY", "BY_DENSE", "BY_INTERLACING", "BY_LANCZOS", "DENSE_LIMIT", "LANCZOS_VERDICT", "METHODS",
           "NOT_STATIONARY", "PROOFS", "Certificate", "CholeskyBound", "certify", "cholesky_bound", "complement_basis",
           "eigenvalue_bound", "embedded", "not_stationary", "perron_bound", "projected", "shifted_cholesky_bound",
           "sign_of_s", "stored_lambda_min", "symmetric_part"]
