"""Numba kernels: the causal T x T attention core of a chunk of heads, forward and backward.

The Q/K/V/O projections of a chunk of ``n`` heads are large matrix products and run in BLAS (see
:mod:`pdeflow.mean_field`); what is left is the causal softmax core of every (head, sequence) pair,
done here row by row so that memory is O(T) per head and thread and never O(N B T T).

Layout: heads are the innermost (contiguous) axis. ``qkv`` is [B, T, 3, dh, n] (sequence, position,
which of q/k/v, head channel, head), ``c, dc`` are [B, T, dh, n]; the projection GEMM
``X [B T, d] @ Wcat [d, 3 dh n]`` produces ``qkv`` without a copy when the columns of ``Wcat`` are
ordered (which, channel, head). With heads innermost every operation of the core - scores, softmax,
context and their vector-Jacobian product - is elementwise across heads: the loops over a tile of
heads are axpy-style loops over contiguous memory that LLVM vectorizes (SIMD) without reassociating
anything, so no ``fastmath`` is needed and the summation order over ``j`` and ``h`` is the textbook
one. A work unit is (sequence ``b``, tile of up to ``tile`` consecutive heads); units are independent,
so results do not depend on the thread count.

``exp`` of the softmax is :func:`vexp`, a branch-free exponential (Cody-Waite reduction, Taylor
polynomial, exponent bits) that vectorizes where a libm call does not; it is accurate to about 1 ulp
(float64: relative error < 3e-16, float32: < 2e-7). Complex arguments (the complex-step Hessian-vector
product differentiates through the kernels) use ``np.exp``; the softmax shift uses the real part only,
which leaves the function analytic.

The kernels are generic in the dtype: float64, float32, and complex128. Arithmetic stays in the
array dtype (constants are cast to it), so float32 runs at float32 SIMD width.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from .jit import jit, prange

DEFAULT_TILE = 16  # heads per work unit (SIMD lanes of the inner loops)


# ---- a vectorizable exponential ------------------------------------------------------------------

@intrinsic
def _f64_from_bits(typingctx, bits):
    """Reinterpret an int64 as a float64 (an LLVM bitcast; vectorizes)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


@intrinsic
def _f32_from_bits(typingctx, bits):
    """Reinterpret the low 32 bits of an integer as a float32 (truncation and LLVM bitcast; vectorizes)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())
    return types.float32(bits), codegen


_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that n * _LN2_HI is exact for |n| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_LN2_HI32 = np.float32(0.693359375)  # 8 significant bits: n * _LN2_HI32 exact in float32 for |n| < 2**15
_LN2_LO32 = np.float32(-2.12194440e-4)


def vexp(x):  # pragma: no cover - typed by the overload below
    """``exp(x)``, vectorizable: float64, float32 (own implementation) and complex (``np.exp``)."""
    return np.exp(x)


@overload(vexp, jit_options={"fastmath": False})
def _vexp_overload(x):
    if isinstance(x, types.Float) and x.bitwidth == 64:
        def exp64(x):
            # clamp (NaN passes through the comparisons unchanged and propagates through r)
            y = x
            if y < -746.0:
                y = -746.0
            if y > 710.0:
                y = 710.0
            nf = np.floor(y * _LOG2E + 0.5)
            r = (y - nf * _LN2_HI) - nf * _LN2_LO          # |r| <= ln2/2 (+ rounding)
            if not (nf >= -1080.0):                          # NaN: any finite exponent, the result is NaN
                nf = -1080.0
            # Taylor polynomial of degree 13 (truncation < 3e-18 on |r| <= 0.347), Horner form
            p = 1.0 / 6227020800.0
            p = p * r + 1.0 / 479001600.0
            p = p * r + 1.0 / 39916800.0
            p = p * r + 1.0 / 3628800.0
            p = p * r + 1.0 / 362880.0
            p = p * r + 1.0 / 40320.0
            p = p * r + 1.0 / 5040.0
            p = p * r + 1.0 / 720.0
            p = p * r + 1.0 / 120.0
            p = p * r + 1.0 / 24.0
            p = p * r + 1.0 / 6.0
            p = p * r + 0.5
            p = p * r + 1.0
            p = p * r + 1.0
            # 2^n as two factors 2^n1 2^n2 (each a normal number) so that subnormal results and
            # overflow to inf come out of the multiplication, without branches
            n = np.int64(nf)
            n1 = n >> 1
            n2 = n - n1
            return p * _f64_from_bits((n1 + 1023) << 52) * _f64_from_bits((n2 + 1023) << 52)
        return exp64
    if isinstance(x, types.Float) and x.bitwidth == 32:
        log2e = np.float32(_LOG2E)
        hi, lo = _LN2_HI32, _LN2_LO32
        c = [np.float32(1.0 / f) for f in (5040.0, 720.0, 120.0, 24.0, 6.0, 2.0, 1.0, 1.0)]
        c7, c6, c5, c4, c3, c2, c1, c0 = c
        lo_clamp, hi_clamp, half, nan_n = np.float32(-104.0), np.float32(89.0), np.float32(0.5), np.float32(-160.0)

        def exp32(x):
            y = x
            if y < lo_clamp:
                y = lo_clamp
            if y > hi_clamp:
                y = hi_clamp
            nf = np.floor(y * log2e + half)
            r = (y - nf * hi) - nf * lo
            if not (nf >= nan_n):
                nf = nan_n
            # degree 7 (truncation < 5e-9 on |r| <= 0.347)
            p = c7
            p = p * r + c6
            p = p * r + c5
            p = p * r + c4
            p = p * r + c3
            p = p * r + c2
            p = p * r + c1
            p = p * r + c0
            n = np.int32(nf)
            n1 = n >> 1
            n2 = n - n1
            return p * _f32_from_bits((n1 + 127) << 23) * _f32_from_bits((n2 + 127) << 23)
        return exp32
    if isinstance(x, types.Complex):
        return lambda x: np.exp(x)
    return None


@jit(parallel=False)
def exp_array(x: np.ndarray, out: np.ndarray) -> None:
    """``out = vexp(x)`` elementwise (1-d arrays); exposed for tests of :func:`vexp`."""
    for i in range(x.shape[0]):
        out[i] = vexp(x[i])


# ---- the causal core ------------------------------------------------------------------------------

TILE = 128  # largest number of heads per work unit: the length of every vectorized inner loop


@jit(parallel=False)
def _unit_range(units: int, nth: int, t: int) -> tuple[int, int]:
    return (units * t) // nth, (units * (t + 1)) // nth


@jit(parallel=False)
def _softmax_rows(qkv: np.ndarray, b: int, l: int, i0: int, w: int, sc, one, s: np.ndarray,
                  shift: np.ndarray, inv: np.ndarray) -> None:
    """s[j, :w] = softmax_j(sc <q_l, k_j>) for j <= l and the w heads i0.. of sequence b.

    Every loop is elementwise over heads (contiguous), so it vectorizes; sums over the head channel h
    and over j run in increasing order.
    """
    dh = qkv.shape[3]
    i1 = i0 + w
    for ii in range(w):
        shift[ii] = -np.inf
    for j in range(l + 1):
        sj = s[j]
        q0 = qkv[b, l, 0, 0, i0:i1]
        k0 = qkv[b, j, 1, 0, i0:i1]
        for ii in range(w):
            sj[ii] = q0[ii] * k0[ii]
        for h in range(1, dh):
            qh = qkv[b, l, 0, h, i0:i1]
            kh = qkv[b, j, 1, h, i0:i1]
            for ii in range(w):
                sj[ii] += qh[ii] * kh[ii]
        for ii in range(w):
            x = sj[ii] * sc
            sj[ii] = x
            cur = shift[ii]
            shift[ii] = x.real if x.real > cur else cur
    for ii in range(w):
        inv[ii] = 0.0
    for j in range(l + 1):
        sj = s[j]
        for ii in range(w):
            e = vexp(sj[ii] - shift[ii])
            sj[ii] = e
            inv[ii] += e
    for ii in range(w):
        inv[ii] = one / inv[ii]
    for j in range(l + 1):
        sj = s[j]
        for ii in range(w):
            sj[ii] = sj[ii] * inv[ii]


@jit(parallel=False)
def _context_row(qkv: np.ndarray, b: int, l: int, i0: int, w: int, s: np.ndarray, c: np.ndarray) -> None:
    """c[b, l, h, i0:i0+w] = sum_{j<=l} s[j] v[b, j, h] (sum over j in increasing order)."""
    dh = qkv.shape[3]
    i1 = i0 + w
    for h in range(dh):
        ch = c[b, l, h, i0:i1]
        s0 = s[0]
        v0 = qkv[b, 0, 2, h, i0:i1]
        for ii in range(w):
            ch[ii] = s0[ii] * v0[ii]
        for j in range(1, l + 1):
            sj = s[j]
            vh = qkv[b, j, 2, h, i0:i1]
            for ii in range(w):
                ch[ii] += sj[ii] * vh[ii]


@jit(parallel=True)
def causal_attention(qkv: np.ndarray, scale: float, c: np.ndarray, n_threads: int) -> None:
    """Context ``c[b, l, :, i] = sum_{j<=l} a[l, j] v[b, j, :, i]``, ``a[l] = softmax_j(scale <q_l, k_j>)``.

    qkv [B, T, 3, dh, n] (q, k, v of head i at ``qkv[b, l, 0|1|2, :, i]``), c [B, T, dh, n] is overwritten.
    Work units (sequence, tile of up to TILE heads) are split into ``n_threads`` contiguous ranges.
    """
    B, T, _, dh, n = qkv.shape
    nblk = (n + TILE - 1) // TILE
    tile = (n + nblk - 1) // nblk
    units = B * nblk
    nth = max(1, min(n_threads, units))
    for t in prange(nth):
        s = np.empty((T, tile), dtype=qkv.dtype)
        consts = np.ones(2, dtype=qkv.dtype)
        consts[1] = scale
        shift = np.empty(tile, dtype=s.real.dtype)
        inv = np.empty(tile, dtype=qkv.dtype)
        lo, hi = _unit_range(units, nth, t)
        for u in range(lo, hi):
            b = u // nblk
            i0 = (u - b * nblk) * tile
            w = min(tile, n - i0)
            for l in range(T):
                _softmax_rows(qkv, b, l, i0, w, consts[1], consts[0], s, shift, inv)
                _context_row(qkv, b, l, i0, w, s, c)


@jit(parallel=True)
def causal_attention_vjp(qkv: np.ndarray, dc: np.ndarray, scale: float, c: np.ndarray, dqkv: np.ndarray,
                         n_threads: int) -> None:
    """Forward context and its vector-Jacobian product, one row of the attention matrix at a time.

    Given the cotangent ``dc`` of the context, with ``a`` the causal softmax and ``s = scale q k^T``:
    ``dA[l, j] = <dc_l, v_j>``, ``dS = a * (dA - sum_j a dA)``, ``dq_l = scale sum_j dS[l, j] k_j``,
    ``dk_j = scale sum_l dS[l, j] q_l``, ``dv_j = sum_l a[l, j] dc_l`` (every sum over j or l in
    increasing order). qkv, dqkv [B, T, 3, dh, n]; dc, c [B, T, dh, n]; c and dqkv are overwritten.
    """
    B, T, _, dh, n = qkv.shape
    nblk = (n + TILE - 1) // TILE
    tile = (n + nblk - 1) // nblk
    units = B * nblk
    nth = max(1, min(n_threads, units))
    for t in prange(nth):
        s = np.empty((T, tile), dtype=qkv.dtype)
        g = np.empty((T, tile), dtype=qkv.dtype)
        consts = np.ones(2, dtype=qkv.dtype)
        consts[1] = scale
        sc = consts[1]
        shift = np.empty(tile, dtype=s.real.dtype)
        inv = np.empty(tile, dtype=qkv.dtype)
        wsum = np.empty(tile, dtype=qkv.dtype)
        lo, hi = _unit_range(units, nth, t)
        for u in range(lo, hi):
            b = u // nblk
            i0 = (u - b * nblk) * tile
            w = min(tile, n - i0)
            i1 = i0 + w
            for j in range(T):
                for h in range(dh):
                    dkh = dqkv[b, j, 1, h, i0:i1]
                    dvh = dqkv[b, j, 2, h, i0:i1]
                    for ii in range(w):
                        dkh[ii] = 0.0
                    for ii in range(w):
                        dvh[ii] = 0.0
            for l in range(T):
                _softmax_rows(qkv, b, l, i0, w, sc, consts[0], s, shift, inv)
                _context_row(qkv, b, l, i0, w, s, c)
                # g[j] = <dc_l, v_j>, wsum = sum_j a[j] g[j]
                for ii in range(w):
                    wsum[ii] = 0.0
                for j in range(l + 1):
                    sj = s[j]
                    gj = g[j]
                    d0 = dc[b, l, 0, i0:i1]
                    v0 = qkv[b, j, 2, 0, i0:i1]
                    for ii in range(w):
                        gj[ii] = d0[ii] * v0[ii]
                    for h in range(1, dh):
                        dch = dc[b, l, h, i0:i1]
                        vh = qkv[b, j, 2, h, i0:i1]
                        for ii in range(w):
                            gj[ii] += dch[ii] * vh[ii]
                    for ii in range(w):
                        wsum[ii] += sj[ii] * gj[ii]
                # dv_j += a[j] dc_l; dS[j] = a[j] (g[j] - wsum) scale; dk_j += dS[j] q_l
                for j in range(l + 1):
                    sj = s[j]
                    gj = g[j]
                    for h in range(dh):
                        dvh = dqkv[b, j, 2, h, i0:i1]
                        dch = dc[b, l, h, i0:i1]
                        for ii in range(w):
                            dvh[ii] += sj[ii] * dch[ii]
                    for ii in range(w):
                        gj[ii] = sj[ii] * (gj[ii] - wsum[ii]) * sc
                    for h in range(dh):
                        dkh = dqkv[b, j, 1, h, i0:i1]
                        qh = qkv[b, l, 0, h, i0:i1]
                        for ii in range(w):
                            dkh[ii] += gj[ii] * qh[ii]
                # dq_l = sum_j dS[j] k_j
                for h in range(dh):
                    dqh = dqkv[b, l, 0, h, i0:i1]
                    g0 = g[0]
                    k0 = qkv[b, 0, 1, h, i0:i1]
                    for ii in range(w):
                        dqh[ii] = g0[ii] * k0[ii]
                    for j in range(1, l + 1):
                        gj = g[j]
                        kh = qkv[b, j, 1, h, i0:i1]
                        for ii in range(w):
                            dqh[ii] += gj[ii] * kh[ii]
