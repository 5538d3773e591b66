"""The flow near a minimum by a linearly implicit W-method whose matrix is S frozen at the minimum.

Near a stationary measure ``(omega*, m)`` the flow in mass-weighted coordinates ``v = M^(1/2) (omega - omega*)`` is
``dv/dt = F(v) = -M^(1/2) grad Phi(omega* + M^(-1/2) v)``, with Jacobian ``-S`` at ``v = 0``
(:mod:`pdeflow.analysis.hessian.spectrum`). ROS2 (Verwer, Spee, Blom, Hundsdorfer, SIAM J. Sci. Comput. 20 (1999)
1456) takes
a step h from ``v_n`` with one matrix ``K = I + gamma h A``:

    ``K k1 = F(v_n)``,   ``K k2 = F(v_n + h k1) - 2 k1``,   ``v_(n+1) = v_n + (3/2) h k1 + (1/2) h k2``,

second order for ANY A (a W-method: the matrix only decides stability), L-stable for ``A = S`` and ``gamma = 1 +
1/sqrt(2)`` (stability function ``R(z) -> 0`` as ``z -> -inf``). With ``A = S*``, S at the minimum, the right-hand
side evaluated exactly (two gradients a step), the fast modes are damped in one step and the step is set by the
accuracy of the modes that are measured: a mode ``lambda`` is propagated with a relative rate error ``~ -1.0
(lambda h)^2``, so a component's content at time t is off by at most ``~1.3 (h / t)^2`` of its start, whatever the
spectrum (:data:`STEP_FRACTION`).

``K`` is factorised once (Cholesky), block by block as S decouples: the live heads' block ``I + c S_live`` (``c =
gamma h``), dense in float32 (``n^2`` 4-byte entries: 0.76 GB at n = 13,824; the W-method's order does not depend on
A, so the factor's rounding ~1e-7 relative only perturbs its stability, not its accuracy), and for the heads exactly at
the origin (where the origin is stationary for every head,
:func:`pdeflow.analysis.hessian.spectrum.origin_is_stationary`)
the one [k, k] block ``I + c Hess Phi(0; rho)`` by its eigendecomposition. S on the live heads comes from its
structure (:mod:`pdeflow.core.hessian_assembly`: head blocks plus a Gauss-Newton part ``W^T W``, assembled in head
panels through a scratch file so that ``W`` and S are never both in memory) or, where that module is absent, from
exact products column by column (``n`` JVPs: small problems).
"""
from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.linalg.lapack

from ...core.problem import Problem
from .spectrum import hessian_operator, origin_block, origin_is_stationary

GAMMA = 1.0 + 1.0 / math.sqrt(2.0)   # ROS2's L-stable choice
# h = STEP_FRACTION x the earliest fitted time: a mode's content there is off by <= ~1.3 STEP_FRACTION^2 of its start
# (ROS2's R(-z)^(t/h) against e^(-lambda t), maximised over lambda: 0.32 % at 0.05)
STEP_FRACTION = 0.05
PANEL_HEADS = 6                      # heads per panel of the Gauss-Newton factor during the assembly


def live_heads(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """[N] bool: the heads whose block of S is assembled; the others sit exactly at the origin where it is stationary
    for every head, so S has no block coupling them to any head and each has the block ``Hess Phi(0; rho)``."""
    omega = np.asarray(omega, dtype=float)
    dead = np.all(omega == 0.0, axis=1)
    if dead.any() and not dead.all() and origin_is_stationary(problem, omega, mass):
        return ~dead
    return np.ones(len(omega), dtype=bool)


def hessian_by_products(problem: Problem, omega: np.ndarray, mass: np.ndarray, dtype=np.float64) -> np.ndarray:
    """S [n, n] (``n = N k``, no projection) from ``n`` exact products (:func:`pdeflow.analysis.hessian.spectrum.
    hessian_operator`), symmetrised: the stand-in where the structured assembly is absent."""
    op = hessian_operator(problem, omega, mass, np.zeros((np.size(omega), 0)))
    n = np.size(omega)
    S = np.empty((n, n), dtype=dtype)
    unit = np.zeros(n)
    for j in range(n):
        unit[j] = 1.0
        S[:, j] = op.matvec(unit)
        unit[j] = 0.0
    S += S.T
    S *= 0.5
    return S


def _structured_assembly():
    """The structured assembly's (``gauss_newton_factor``, ``frozen_blocks``), or None where the module is absent."""
    try:
        from ...core.hessian_assembly import frozen_blocks, gauss_newton_factor
    except ImportError:
        return None
    return gauss_newton_factor, frozen_blocks


def _put_packed(packed: np.ndarray, r0: int, c0: int, block: np.ndarray) -> None:
    """Write the upper part (columns >= rows) of ``block``, the entries ``A[r0:, c0:]`` of a symmetric A [n, n] with
    ``r0 <= c0``, into its rectangular full packed form (LAPACK's RFP, ``TRANSR='N'``, ``UPLO='L'``, n even, ``h =
    n / 2``): ``packed`` [n + 1, h] (Fortran order) holds ``A[c, r]`` (c >= r, r < h) at ``[1 + c, r]`` and ``A[r,
    c]`` (c >= r >= h) at ``[r - h, c - h]``."""
    h = packed.shape[1]
    width = block.shape[1]
    for i in range(block.shape[0]):
        r = r0 + i
        lo = max(r, c0)
        if lo >= c0 + width:
            continue
        values = block[i, lo - c0:]
        if r < h:
            packed[1 + lo:1 + c0 + width, r] = values
        else:
            packed[r - h, lo - h:c0 + width - h] = values


def packed_from_full(K: np.ndarray) -> np.ndarray:
    """The RFP form [n (n + 1) / 2] (:func:`_put_packed`) of a symmetric ``K`` [n, n], n even."""
    n = K.shape[0]
    flat = np.empty(n * (n + 1) // 2, dtype=K.dtype)
    _put_packed(flat.reshape((n + 1, n // 2), order="F"), 0, 0, K)
    return flat


def shifted_hessian(problem: Problem, omega: np.ndarray, mass: np.ndarray, c: float, *,
                    dtype=np.float32, structured: bool | None = None, packed: bool = False) -> np.ndarray:
    """``K = I + c S`` for the measure ``omega`` [N, k], ``mass`` [N] (all of it: pass the live heads), head-major,
    in ``dtype``: dense [n, n] (``n = N k``), or with ``packed`` (n even) its RFP form [n (n + 1) / 2]
    (:func:`_put_packed`: half the memory, what LAPACK's ``?pftrf`` factorises). ``structured`` (None: when
    available): S from ``blockdiag(H_i) + W^T W``, W computed in panels of :data:`PANEL_HEADS` heads, each written
    once to a scratch file in ``dtype``, then ``c W_I^T W_J`` panel pair by panel pair (I <= J; peak: K plus two
    panels); otherwise :func:`hessian_by_products`."""
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    N, k = omega.shape
    n = N * k
    if packed and n % 2:
        raise ValueError(f"the packed form needs an even order, got {n}")
    parts = _structured_assembly() if structured in (None, True) else None
    if structured and parts is None:
        raise ImportError("pdeflow.core.hessian_assembly is not available")
    if parts is None:
        K = hessian_by_products(problem, omega, mass, dtype=dtype)
        K *= c
        K[np.diag_indices(n)] += 1.0
        return packed_from_full(K) if packed else K
    gauss_newton_factor, frozen_blocks = parts
    blocks = frozen_blocks(problem, omega, mass, None)
    blocks = 0.5 * (blocks + blocks.transpose(0, 2, 1))  # the forward mode's rounding asymmetry, not S's
    panels = [np.arange(s, min(s + PANEL_HEADS, N)) for s in range(0, N, PANEL_HEADS)]
    flat = np.empty(n * (n + 1) // 2, dtype=dtype) if packed else None
    K = flat.reshape((n + 1, n // 2), order="F") if packed else np.empty((n, n), dtype=dtype)
    with tempfile.TemporaryDirectory(prefix="pdeflow-hessian-") as scratch:
        shapes = []
        for p, heads in enumerate(panels):
            W = gauss_newton_factor(problem, omega, mass, heads)
            shapes.append((W.shape[0], W.shape[1] * W.shape[2]))
            W.reshape(shapes[-1]).astype(dtype).tofile(os.path.join(scratch, f"w{p}"))
            del W

        def panel(p: int) -> np.ndarray:
            return np.fromfile(os.path.join(scratch, f"w{p}"), dtype=dtype).reshape(shapes[p])

        for p, rows in enumerate(panels):
            A = panel(p)
            r0 = int(rows[0]) * k
            for q in range(p, len(panels)):
                B = A if q == p else panel(q)
                c0 = int(panels[q][0]) * k
                block = (A.T @ B).astype(dtype, copy=False)
                block *= c
                if q == p:
                    for i, head in enumerate(rows):
                        block[i * k:(i + 1) * k, i * k:(i + 1) * k] += (c * blocks[head]).astype(dtype)
                    block[np.diag_indices(block.shape[0])] += 1.0
                if packed:
                    _put_packed(K, r0, c0, block)
                else:
                    K[r0:r0 + block.shape[0], c0:c0 + block.shape[1]] = block
                    K[c0:c0 + block.shape[1], r0:r0 + block.shape[0]] = block.T
                del B
            del A
    return flat if packed else K


@dataclass
class FrozenSolver:
    """``(I + c S)^(-1)`` on mass-weighted vectors [N k] or batches [N k, r]: the Cholesky factor ``factor`` of the
    live heads' block (float32 or float64; RFP [n (n + 1) / 2] from ``?pftrf``, or upper [n, n] in Fortran order
    where n is odd), and for the heads at the origin (``live`` [N] false) the origin block's eigenpairs
    ``origin_values`` [k], ``origin_vectors`` [k, k]."""
    factor: np.ndarray
    live: np.ndarray
    k: int
    c: float
    origin_values: np.ndarray
    origin_vectors: np.ndarray

    def _solve_live(self, B: np.ndarray) -> np.ndarray:
        B = B.astype(self.factor.dtype)
        if self.factor.ndim == 2:
            return scipy.linalg.cho_solve((self.factor, False), B, check_finite=False)
        solve = scipy.linalg.lapack.get_lapack_funcs("pftrs", dtype=self.factor.dtype)
        X, info = solve(B.shape[0], self.factor, np.asfortranarray(B), transr="N", uplo="L")
        if info != 0:
            raise ValueError(f"?pftrs failed (info {info})")
        return X

    def solve(self, B: np.ndarray) -> np.ndarray:
        """``(I + c S)^(-1) B`` for B [N k] or [N k, r] (float64 in, float64 out)."""
        one = B.ndim == 1
        X = np.asarray(B, dtype=float).reshape(len(self.live), self.k, -1)
        out = np.empty_like(X)
        solved = self._solve_live(X[self.live].reshape(-1, X.shape[2]))
        out[self.live] = solved.astype(float).reshape(-1, self.k, X.shape[2])
        if not self.live.all():
            dead = X[~self.live]                                 # [d, k, r]
            scale = 1.0 / (1.0 + self.c * self.origin_values)    # [k]
            coeffs = np.einsum("ka,dkr->dar", self.origin_vectors, dead) * scale[None, :, None]
            out[~self.live] = np.einsum("ka,dar->dkr", self.origin_vectors, coeffs)
        out = out.reshape(B.shape[0], -1)
        return out[:, 0] if one else out


def frozen_solver(problem: Problem, omega: np.ndarray, mass: np.ndarray, c: float, *, dtype=np.float32,
                  structured: bool | None = None,
                  origin: tuple[np.ndarray, np.ndarray] | None = None) -> FrozenSolver:
    """The factorised ``I + c S`` at the measure (``omega`` [N, k], ``mass`` [N]; S at this point frozen): the live
    heads' block by :func:`shifted_hessian` (packed where its order is even) and a Cholesky in place, the origin
    block by its eigendecomposition (``origin``: its (values [k], vectors [k, k]) when already computed,
    :func:`pdeflow.analysis.hessian.spectrum.origin_block`). ValueError when ``I + c S`` is not positive definite (a
    saddle,
    or c past a negative eigenvalue's reach)."""
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    live = live_heads(problem, omega, mass)
    k = omega.shape[1]
    n = int(live.sum()) * k
    packed = n % 2 == 0
    K = shifted_hessian(problem, omega[live], mass[live], c, dtype=dtype, structured=structured, packed=packed)
    if packed:
        factorise = scipy.linalg.lapack.get_lapack_funcs("pftrf", dtype=K.dtype)
        factor, info = factorise(n, K, transr="N", uplo="L", overwrite_a=1)
        if info != 0:
            raise ValueError(f"I + c S is not positive definite at c = {c:g} (?pftrf info {info})")
    else:
        try:
            # K is symmetric: its C-order buffer is K^T in Fortran order, factorised in place
            factor = scipy.linalg.cho_factor(K.T, lower=False, overwrite_a=True, check_finite=False)[0]
        except np.linalg.LinAlgError as exc:
            raise ValueError(f"I + c S is not positive definite at c = {c:g} ({exc})") from None
    if live.all():
        values, vectors = np.zeros(k), np.eye(k)
    else:
        values, vectors = origin if origin is not None else origin_block(problem, omega, mass)[:2]
        if np.any(1.0 + c * values <= 0):
            raise ValueError(f"I + c Hess Phi(0; rho) is not positive definite at c = {c:g}")
    return FrozenSolver(factor=factor, live=live, k=k, c=float(c), origin_values=values, origin_vectors=vectors)


def mass_weighted_field(problem: Problem, omega_star: np.ndarray, mass: np.ndarray) -> Callable[[np.ndarray],
                                                                                                  np.ndarray]:
    """``F(v) = -M^(1/2) grad Phi(omega* + M^(-1/2) v; rho)`` on flat [N k] vectors. Where the origin is stationary
    for every head, heads exactly at the origin in the evaluated state are left out of the evaluation (their
    features and weight-decay terms vanish, their gradient is 0), so a run that does not move them costs a
    gradient on the live heads only."""
    omega_star = np.asarray(omega_star, dtype=float)
    mass = np.asarray(mass, dtype=float)
    root = np.sqrt(mass)[:, None]
    hold = origin_is_stationary(problem, omega_star, mass)

    def field(v: np.ndarray) -> np.ndarray:
        omega = omega_star + v.reshape(omega_star.shape) / root
        moving = ~np.all(omega == 0.0, axis=1) if hold else np.ones(len(omega), dtype=bool)
        out = np.zeros_like(omega)
        if moving.any():
            sub = omega[moving]
            out[moving] = -root[moving] * problem.grad_phi(sub, sub, mass[moving])
        return out.ravel()

    return field


@dataclass
class WPaths:
    """The runs of :func:`ros2_paths`: ``samples`` [r, F, n] at the sample times, ``steps`` per run and
    ``error_estimate`` [r]: the largest ``|v_(n+1) - (v_n + h k1)| / |v_n|`` over the steps (the embedded
    first-order solution: a local error estimate, reported, not controlled). A step is two evaluations of the field
    per run and two batched solves (the method's; a field of the Problem's is counted by the Problem)."""
    samples: np.ndarray
    steps: int
    error_estimate: np.ndarray


def ros2_paths(field: Callable[[np.ndarray], np.ndarray], solve: Callable[[np.ndarray], np.ndarray],
               starts: np.ndarray, times: np.ndarray, h: float) -> WPaths:
    """ROS2 (module docstring) from each of ``starts`` [r, n] at once, the solves batched (``solve``: ``(I + gamma h
    A)^(-1)`` on [n, r], gamma = :data:`GAMMA`: the method's only use of gamma), ``field`` F on [n] per run, with
    steps ``h`` landing on every sample time ``times`` [F] (``times[0]`` the start). ValueError unless every
    sample interval is a whole number of steps h."""
    V = np.array(starts, dtype=float, copy=True)
    r = V.shape[0]
    out = np.empty((r, len(times), V.shape[1]))
    out[:, 0] = V
    steps = 0
    worst = np.zeros(r)
    for f in range(1, len(times)):
        interval = float(times[f] - times[f - 1])
        m = max(1, int(math.ceil(interval / h * (1 - 1e-12))))
        dt = interval / m
        if abs(dt - h) > 1e-9 * h:
            raise ValueError(f"the sample spacing {interval:g} is not a multiple of the step {h:g}")
        for _ in range(m):
            F0 = np.stack([field(v) for v in V], axis=1)                     # [n, r]
            k1 = solve(F0)
            F1 = np.stack([field(V[j] + dt * k1[:, j]) for j in range(r)], axis=1)
            k2 = solve(F1 - 2.0 * k1)
            step = dt * (1.5 * k1 + 0.5 * k2)
            error = 0.5 * dt * np.linalg.norm(k1 + k2, axis=0)
            norms = np.linalg.norm(V, axis=1)
            worst = np.maximum(worst, np.where(norms > 0, error / np.where(norms > 0, norms, 1.0), 0.0))
            V += step.T
            steps += 1
        out[:, f] = V
    return WPaths(samples=out, steps=steps, error_estimate=worst)


__all__ = ["GAMMA", "PANEL_HEADS", "STEP_FRACTION", "FrozenSolver", "WPaths", "frozen_solver", "hessian_by_products",
           "live_heads", "mass_weighted_field", "packed_from_full", "ros2_paths", "shifted_hessian"]
