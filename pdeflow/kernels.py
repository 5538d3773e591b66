"""Numba kernels: the causal T x T attention core of every head, forward and backward.

The Q/K/V/O projections of a chunk of heads are large matrix products and run in BLAS (see
:mod:`pdeflow.mean_field`); what is left per (head, sequence) pair is the causal softmax core, done here
row by row so that memory is O(T) per thread and never O(N B T T).

Layout: ``q, k, v, dc, c, dq, dk, dv`` are [B, T, n, dh] (sequence, position, head, head channel), the
layout the projection GEMM ``X [B T, d] @ W^T [d, n dh]`` produces without a copy.

The kernels are generic in the dtype: float64, float32, and complex128 (the complex-step
Hessian-vector product differentiates through them; the softmax shift uses the real part only, which
leaves the function analytic).
"""
from __future__ import annotations

import numpy as np

from .jit import jit, prange


@jit(parallel=True)
def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, c: np.ndarray,
                     n_threads: int) -> None:
    """Context ``c[b, l, i] = sum_{j<=l} a[l, j] v[b, j, i]`` with ``a[l] = softmax_j(scale <q_l, k_j>)``.

    q, k, v, c: [B, T, n, dh]; c is overwritten. Work is split into ``n_threads`` interleaved blocks
    of (head, sequence) units; each unit is independent, so results do not depend on the thread count.
    """
    B, T, n, dh = q.shape
    units = n * B
    nth = max(1, min(n_threads, units))
    for t in prange(nth):
        row = np.empty(T, dtype=q.dtype)
        for u in range(t, units, nth):
            i = u // B
            b = u - i * B
            for l in range(T):
                shift = -np.inf
                for j in range(l + 1):
                    acc = q[b, l, i, 0] * k[b, j, i, 0]
                    for h in range(1, dh):
                        acc += q[b, l, i, h] * k[b, j, i, h]
                    acc = acc * scale
                    row[j] = acc
                    if acc.real > shift:
                        shift = acc.real
                total = row[0] * 0.0
                for j in range(l + 1):
                    e = np.exp(row[j] - shift)
                    row[j] = e
                    total += e
                inv = 1.0 / total
                for h in range(dh):
                    c[b, l, i, h] = 0.0
                for j in range(l + 1):
                    a = row[j] * inv
                    for h in range(dh):
                        c[b, l, i, h] += a * v[b, j, i, h]


@jit(parallel=True)
def causal_attention_vjp(q: np.ndarray, k: np.ndarray, v: np.ndarray, dc: np.ndarray, scale: float,
                         c: np.ndarray, dq: np.ndarray, dk: np.ndarray, dv: np.ndarray, n_threads: int) -> None:
    """Forward context and its vector-Jacobian product, one row of the attention matrix at a time.

    Given the cotangent ``dc`` of the context, with ``a`` the causal softmax and ``s = scale q k^T``:
    ``dA[l, j] = <dc_l, v_j>``, ``dS = a * (dA - sum_j a dA)``, ``dq_l = scale sum_j dS[l, j] k_j``,
    ``dk_j = scale sum_l dS[l, j] q_l``, ``dv_j = sum_l a[l, j] dc_l``.
    All arrays [B, T, n, dh]; c, dq, dk, dv are overwritten.
    """
    B, T, n, dh = q.shape
    units = n * B
    nth = max(1, min(n_threads, units))
    for t in prange(nth):
        arow = np.empty(T, dtype=q.dtype)
        grow = np.empty(T, dtype=q.dtype)
        for u in range(t, units, nth):
            i = u // B
            b = u - i * B
            for j in range(T):
                for h in range(dh):
                    dk[b, j, i, h] = 0.0
                    dv[b, j, i, h] = 0.0
            for l in range(T):
                shift = -np.inf
                for j in range(l + 1):
                    acc = q[b, l, i, 0] * k[b, j, i, 0]
                    for h in range(1, dh):
                        acc += q[b, l, i, h] * k[b, j, i, h]
                    acc = acc * scale
                    arow[j] = acc
                    if acc.real > shift:
                        shift = acc.real
                total = arow[0] * 0.0
                for j in range(l + 1):
                    e = np.exp(arow[j] - shift)
                    arow[j] = e
                    total += e
                inv = 1.0 / total
                for h in range(dh):
                    c[b, l, i, h] = 0.0
                weighted = arow[0] * 0.0
                for j in range(l + 1):
                    a = arow[j] * inv
                    arow[j] = a
                    da = dc[b, l, i, 0] * v[b, j, i, 0]
                    for h in range(1, dh):
                        da += dc[b, l, i, h] * v[b, j, i, h]
                    grow[j] = da
                    weighted += a * da
                    for h in range(dh):
                        c[b, l, i, h] += a * v[b, j, i, h]
                        dv[b, j, i, h] += a * dc[b, l, i, h]
                for h in range(dh):
                    dq[b, l, i, h] = 0.0
                for j in range(l + 1):
                    ds = arow[j] * (grow[j] - weighted) * scale
                    for h in range(dh):
                        dq[b, l, i, h] += ds * k[b, j, i, h]
                        dk[b, j, i, h] += ds * q[b, l, i, h]
