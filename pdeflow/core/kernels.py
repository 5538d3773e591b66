"""Numba kernels: the causal T x T attention core of a chunk of heads, forward and backward.

The Q/K/V/O projections run in BLAS (:mod:`pdeflow.core.mean_field`); here is the causal softmax core of every
(head, sequence) pair, row by row, memory O(T) per head and thread. Heads are the innermost (contiguous) axis:
q, k, v of position l of sequence b are ``rows[tok[b, l]] + table[l]``, rows [R, 3, dh, n], table [T, 3, dh, n];
``c, dc`` [B, T, dh, n], cotangents ``dqkv`` [B, T, 3, dh, n]. A work unit is (sequence, tile of heads), so results
do not depend on the thread count. ``exp`` is :func:`vexp` (branch-free, about 1 ulp) for real dtypes, ``np.exp``
for complex; generic in float64, float32 and complex128. Details: docs/design.md, "The causal attention kernels".
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.arrayobj import _empty_nd_impl

from .jit import jit
from .workers import for_each_range

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
def _i64_from_bits(typingctx, x):
    """Reinterpret a float64 as an int64 (an LLVM bitcast; vectorizes)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


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


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` with one rounding (``llvm.fma``; an explicit fused operation, not a compiler choice)."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = builder.module.declare_intrinsic("llvm.fma", [ty], ir.FunctionType(ty, [ty, ty, ty]))
        return builder.call(fn, args)
    return a(a, a, a), codegen


_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that n * _LN2_HI is exact for |n| < 2**20
_LN2_LO = 1.90821492927058770002e-10
_SHIFTER = 6755399441055744.0  # 1.5 2^52: y + _SHIFTER rounds y to an integer, held in the last bits
_SHIFTER_BITS_LESS_2046 = int(np.float64(_SHIFTER).view(np.int64)) - 2046
_LN2_HI32 = np.float32(0.693359375)  # 8 significant bits: n * _LN2_HI32 exact in float32 for |n| < 2**15
_LN2_LO32 = np.float32(-2.12194440e-4)


def vexp(x):  # pragma: no cover - typed by the overload below
    """``exp(x)``, vectorizable: float64, float32 (own implementation) and complex (``np.exp``)."""
    return np.exp(x)


@overload(vexp, jit_options={"fastmath": False})
def _vexp_overload(x):
    if isinstance(x, types.Float) and x.bitwidth == 64:
        def exp64(x):
            # clamp (NaN passes through the comparisons unchanged and propagates through r and p)
            y = x
            if y < -746.0:
                y = -746.0
            if y > 710.0:
                y = 710.0
            # n = y / ln 2 rounded to the nearest integer by adding 1.5 2^52: the sum's last bits are n
            # (|n| < 2^51). No float -> int conversion, which AVX2 has no packed instruction for (LLVM
            # made four scalar ones of it per ymm register), and no floor.
            t = y * _LOG2E + _SHIFTER
            nf = t - _SHIFTER
            r = _fma(-nf, _LN2_LO, _fma(-nf, _LN2_HI, y))  # |r| <= ln2/2 (+ rounding)
            # Taylor polynomial of degree 13 (truncation < 3e-18 on |r| <= 0.347), Horner form
            p = _fma(1.0 / 6227020800.0, r, 1.0 / 479001600.0)
            p = _fma(p, r, 1.0 / 39916800.0)
            p = _fma(p, r, 1.0 / 3628800.0)
            p = _fma(p, r, 1.0 / 362880.0)
            p = _fma(p, r, 1.0 / 40320.0)
            p = _fma(p, r, 1.0 / 5040.0)
            p = _fma(p, r, 1.0 / 720.0)
            p = _fma(p, r, 1.0 / 120.0)
            p = _fma(p, r, 1.0 / 24.0)
            p = _fma(p, r, 1.0 / 6.0)
            p = _fma(p, r, 0.5)
            p = _fma(p, r, 1.0)
            p = _fma(p, r, 1.0)
            # 2^n as two factors 2^n1 2^n2, n1 = floor(n / 2), n2 = n - n1 (each a normal number), so that
            # subnormal results and overflow to inf come out of the multiplication, without branches. Their
            # biased exponents n1 + 1023 and n2 + 1023 are the halves of m = n + 2046 >= 0 (n >= -1077 after
            # the clamp), so only logical shifts are needed (AVX2 has no packed arithmetic 64-bit shift). A NaN
            # gives arbitrary bits here, and NaN times anything is NaN.
            m = _i64_from_bits(t) - _SHIFTER_BITS_LESS_2046
            m1 = m >> 1
            m2 = m - m1
            return p * _f64_from_bits(m1 << 52) * _f64_from_bits(m2 << 52)
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
            r = _fma(-nf, lo, _fma(-nf, hi, y))
            if not (nf >= nan_n):
                nf = nan_n
            # degree 7 (truncation < 5e-9 on |r| <= 0.347)
            p = _fma(c7, r, c6)
            p = _fma(p, r, c5)
            p = _fma(p, r, c4)
            p = _fma(p, r, c3)
            p = _fma(p, r, c2)
            p = _fma(p, r, c1)
            p = _fma(p, r, c0)
            n = np.int32(nf)
            n1 = n >> 1
            n2 = n - n1
            return p * _f32_from_bits((n1 + 127) << 23) * _f32_from_bits((n2 + 127) << 23)
        return exp32
    if isinstance(x, types.Complex):
        return lambda x: np.exp(x)
    return None


def madd(a, b, c):  # pragma: no cover - typed by the overload below
    """``a * b + c``: one fused multiply-add for real floats (``llvm.fma``, one rounding), ``a * b + c`` for
    complex numbers."""
    return a * b + c


@overload(madd, jit_options={"fastmath": False})
def _madd_overload(a, b, c):
    if isinstance(a, types.Float) and a == b == c:
        return lambda a, b, c: _fma(a, b, c)
    if isinstance(a, types.Complex):
        return lambda a, b, c: a * b + c
    return None


@jit()
def exp_array(x: np.ndarray, out: np.ndarray) -> None:
    """``out = vexp(x)`` elementwise (1-d arrays); exposed for tests of :func:`vexp`."""
    for i in range(x.shape[0]):
        out[i] = vexp(x[i])


# ---- scratch arrays at cache-line boundaries -------------------------------------------------------

CACHE_LINE = 64  # bytes: the alignment of the kernels' scratch arrays


class _CacheLineAligned:
    """numba's target context, except that the arrays it allocates start at a CACHE_LINE boundary."""

    def __init__(self, context) -> None:
        self._context = context

    def __getattr__(self, name: str):
        return getattr(self._context, name)

    def get_preferred_array_alignment(self, ty) -> int:
        return CACHE_LINE


@intrinsic
def empty_aligned(typingctx, shape, like):
    """``np.empty(shape, like.dtype)`` (C order) starting at a 64-byte boundary.

    numba's ``np.empty`` aligns to 32 bytes, so a 64-byte (zmm) load of a row that is a whole number of cache
    lines long straddles two lines whenever the array starts at 32 mod 64 - two loads for one on cores
    that split such loads (Intel's). The allocation is numba's own (``_empty_nd_impl``, its allocator and
    reference counting) with the alignment raised.
    """
    if not (isinstance(shape, types.UniTuple) and isinstance(shape.dtype, types.Integer)
            and isinstance(like, types.Array)):
        return None
    arrty = types.Array(like.dtype, shape.count, "C")

    def codegen(context, builder, signature, args):
        dims = [context.cast(builder, v, shape.dtype, types.intp) for v in cgutils.unpack_tuple(builder, args[0])]
        return _empty_nd_impl(_CacheLineAligned(context), builder, arrty, dims)._getvalue()
    return arrty(shape, like), codegen


@jit()
def _aligned_addresses(n: int, like: np.ndarray) -> np.ndarray:
    """Start addresses modulo CACHE_LINE of arrays of 1..n elements from :func:`empty_aligned` (for tests)."""
    out = np.empty(n, dtype=np.int64)
    for k in range(n):
        a = empty_aligned((k + 1, 3), like)
        out[k] = a.ctypes.data % CACHE_LINE
    return out


# ---- the causal core ------------------------------------------------------------------------------
#
# A work unit is one sequence b and a tile of up to ``tile`` consecutive heads. Its q, k, v, dc slices
# are copied into per-thread C-contiguous scratch arrays [T, dh, tile] (heads innermost), the results are
# computed there and copied out. Every inner loop runs over the heads of the tile (``for ii in range(w)``)
# on contiguous memory: LLVM vectorizes them. Sums over the head channel h, over key positions j and over
# query rows l are written out in blocks of 8 terms, each block a chain of explicit fused multiply-adds
# (:func:`madd`) in increasing index order, so that each loaded/stored accumulator carries 8 products
# instead of 1: without fastmath LLVM would never reassociate or fuse a sum by itself (and numba does not
# run the SLP vectorizer), so the order of every operation is the one written here, on every machine.

ROWS = 8  # query rows per block of the backward pass (the row sums of dk and dv are blocked by ROWS)


def scratch_bytes(T: int, dh: int, tile: int, itemsize: int) -> tuple[int, int]:
    """Bytes of the per-call scratch arrays of :func:`_attention_units` and :func:`_attention_vjp_units`
    (forward, backward) for a tile of ``tile`` heads: the working set of one work unit, to compare with
    the caches (``pdeflow bench`` records it). Forward: q, k, v, c [T, dh, tile], s [T, tile], two [tile];
    backward: q, k, v, dc, c, dq, dk, dv [T, dh, tile], a, g [ROWS, T, tile], three [tile]."""
    forward = (4 * T * dh + T + 2) * tile * itemsize
    backward = (8 * T * dh + 2 * ROWS * T + 3) * tile * itemsize
    return forward, backward


@jit()
def _scores(qs: np.ndarray, ks: np.ndarray, l: int, w: int, s: np.ndarray) -> None:
    """s[j, ii] = sum_h q[l, h, ii] k[j, h, ii] for j <= l, ii < w.

    Channels in blocks of 8 (then 4, then 1), each block one chain of fused multiply-adds in increasing h;
    the block loop is the outer loop so that the vectorized (j, ii) loops see a loop-invariant offset.
    """
    dh = qs.shape[1]
    h = 0
    while h + 8 <= dh:
        for j in range(l + 1):
            if h == 0:
                for ii in range(w):
                    s[j, ii] = madd(qs[l, h + 7, ii], ks[j, h + 7, ii], madd(qs[l, h + 6, ii], ks[j, h + 6, ii],
                            madd(qs[l, h + 5, ii], ks[j, h + 5, ii], madd(qs[l, h + 4, ii], ks[j, h + 4, ii],
                            madd(qs[l, h + 3, ii], ks[j, h + 3, ii], madd(qs[l, h + 2, ii], ks[j, h + 2, ii],
                            madd(qs[l, h + 1, ii], ks[j, h + 1, ii], qs[l, h, ii] * ks[j, h, ii])))))))
            else:
                for ii in range(w):
                    s[j, ii] = madd(qs[l, h + 7, ii], ks[j, h + 7, ii], madd(qs[l, h + 6, ii], ks[j, h + 6, ii],
                            madd(qs[l, h + 5, ii], ks[j, h + 5, ii], madd(qs[l, h + 4, ii], ks[j, h + 4, ii],
                            madd(qs[l, h + 3, ii], ks[j, h + 3, ii], madd(qs[l, h + 2, ii], ks[j, h + 2, ii],
                            madd(qs[l, h + 1, ii], ks[j, h + 1, ii], madd(qs[l, h, ii], ks[j, h, ii], s[j, ii]))))))))
        h += 8
    while h + 4 <= dh:
        for j in range(l + 1):
            if h == 0:
                for ii in range(w):
                    s[j, ii] = madd(qs[l, h + 3, ii], ks[j, h + 3, ii], madd(qs[l, h + 2, ii], ks[j, h + 2, ii],
                            madd(qs[l, h + 1, ii], ks[j, h + 1, ii], qs[l, h, ii] * ks[j, h, ii])))
            else:
                for ii in range(w):
                    s[j, ii] = madd(qs[l, h + 3, ii], ks[j, h + 3, ii], madd(qs[l, h + 2, ii], ks[j, h + 2, ii],
                            madd(qs[l, h + 1, ii], ks[j, h + 1, ii], madd(qs[l, h, ii], ks[j, h, ii], s[j, ii]))))
        h += 4
    while h < dh:
        for j in range(l + 1):
            if h == 0:
                for ii in range(w):
                    s[j, ii] = qs[l, h, ii] * ks[j, h, ii]
            else:
                for ii in range(w):
                    s[j, ii] = madd(qs[l, h, ii], ks[j, h, ii], s[j, ii])
        h += 1


@jit()
def _row_products(s: np.ndarray, v: np.ndarray, l: int, w: int, out: np.ndarray) -> None:
    """out[l, h, ii] = sum_{j<=l} s[j, ii] v[j, h, ii] for every h, ii < w.

    Positions in blocks of 8, each block one chain of fused multiply-adds in increasing j; the block loop
    is the outer loop.
    """
    dh = v.shape[1]
    n = l + 1
    j = 0
    while j + 8 <= n:
        for h in range(dh):
            if j == 0:
                for ii in range(w):
                    out[l, h, ii] = madd(s[j + 7, ii], v[j + 7, h, ii], madd(s[j + 6, ii], v[j + 6, h, ii],
                            madd(s[j + 5, ii], v[j + 5, h, ii], madd(s[j + 4, ii], v[j + 4, h, ii],
                            madd(s[j + 3, ii], v[j + 3, h, ii], madd(s[j + 2, ii], v[j + 2, h, ii],
                            madd(s[j + 1, ii], v[j + 1, h, ii], s[j, ii] * v[j, h, ii])))))))
            else:
                for ii in range(w):
                    out[l, h, ii] = madd(s[j + 7, ii], v[j + 7, h, ii], madd(s[j + 6, ii], v[j + 6, h, ii],
                            madd(s[j + 5, ii], v[j + 5, h, ii], madd(s[j + 4, ii], v[j + 4, h, ii],
                            madd(s[j + 3, ii], v[j + 3, h, ii], madd(s[j + 2, ii], v[j + 2, h, ii],
                            madd(s[j + 1, ii], v[j + 1, h, ii], madd(s[j, ii], v[j, h, ii], out[l, h, ii]))))))))
        j += 8
    while j < n:
        for h in range(dh):
            if j == 0:
                for ii in range(w):
                    out[l, h, ii] = s[j, ii] * v[j, h, ii]
            else:
                for ii in range(w):
                    out[l, h, ii] = madd(s[j, ii], v[j, h, ii], out[l, h, ii])
        j += 1


@jit()
def _rows_dot(c: np.ndarray, j: int, x: np.ndarray, l0: int, h: int, ii: int, acc):
    """``acc + sum_{r < ROWS} c[r, j, ii] x[l0 + r, h, ii]``: one chain of fused multiply-adds in increasing r
    (ROWS = 8 written out, so that the chain stays in registers)."""
    acc = madd(c[0, j, ii], x[l0, h, ii], acc)
    acc = madd(c[1, j, ii], x[l0 + 1, h, ii], acc)
    acc = madd(c[2, j, ii], x[l0 + 2, h, ii], acc)
    acc = madd(c[3, j, ii], x[l0 + 3, h, ii], acc)
    acc = madd(c[4, j, ii], x[l0 + 4, h, ii], acc)
    acc = madd(c[5, j, ii], x[l0 + 5, h, ii], acc)
    acc = madd(c[6, j, ii], x[l0 + 6, h, ii], acc)
    return madd(c[7, j, ii], x[l0 + 7, h, ii], acc)


@jit()
def _softmax_row(qs: np.ndarray, ks: np.ndarray, l: int, w: int, sc, one, s: np.ndarray, shift: np.ndarray,
                 inv: np.ndarray) -> None:
    """s[j, :w] = softmax_j(sc <q_l, k_j>) for j <= l (scratch [T, dh, tile] inputs)."""
    _scores(qs, ks, l, w, s)
    softmax_scores(l, w, sc, one, s, shift, inv)


@jit()
def softmax_scores(l: int, w: int, sc, one, s: np.ndarray, shift: np.ndarray, inv: np.ndarray) -> None:
    """s[j, :w] <- softmax_j(sc s[j, :w]) for j <= l, in place (shift by the largest real part, :func:`vexp`);
    leaves ``inv`` = 1 / the sum of the exponentials."""
    for ii in range(w):
        shift[ii] = -np.inf
    for j in range(l + 1):
        for ii in range(w):
            x = s[j, ii] * sc
            s[j, ii] = x
            cur = shift[ii]
            shift[ii] = x.real if x.real > cur else cur
    for ii in range(w):
        inv[ii] = 0.0
    # four positions per vector iteration (then two, then one for the rest): the exponential's constants
    # (more than the 16 vector registers hold with its working values, so LLVM reloads them) are then loaded
    # once for four exponentials; the sum still adds the positions in increasing order
    j = 0
    while j + 4 <= l + 1:
        for ii in range(w):
            e0 = vexp(s[j, ii] - shift[ii])
            e1 = vexp(s[j + 1, ii] - shift[ii])
            e2 = vexp(s[j + 2, ii] - shift[ii])
            e3 = vexp(s[j + 3, ii] - shift[ii])
            s[j, ii] = e0
            s[j + 1, ii] = e1
            s[j + 2, ii] = e2
            s[j + 3, ii] = e3
            inv[ii] = (((inv[ii] + e0) + e1) + e2) + e3
        j += 4
    while j + 2 <= l + 1:
        for ii in range(w):
            e0 = vexp(s[j, ii] - shift[ii])
            e1 = vexp(s[j + 1, ii] - shift[ii])
            s[j, ii] = e0
            s[j + 1, ii] = e1
            inv[ii] = (inv[ii] + e0) + e1
        j += 2
    if j <= l:
        for ii in range(w):
            e = vexp(s[j, ii] - shift[ii])
            s[j, ii] = e
            inv[ii] += e
    for ii in range(w):
        inv[ii] = one / inv[ii]
    for j in range(l + 1):
        for ii in range(w):
            s[j, ii] = s[j, ii] * inv[ii]


@jit()
def _load(src: np.ndarray, b: int, which: int, i0: int, w: int, dst: np.ndarray) -> None:
    """dst[l, h, :w] = src[b, l, which, h, i0:i0 + w]."""
    T, dh = dst.shape[0], dst.shape[1]
    for l in range(T):
        for h in range(dh):
            for ii in range(w):
                dst[l, h, ii] = src[b, l, which, h, i0 + ii]


@jit()
def _store(src: np.ndarray, b: int, which: int, i0: int, w: int, dst: np.ndarray) -> None:
    """dst[b, l, which, h, i0:i0 + w] = src[l, h, :w]."""
    T, dh = src.shape[0], src.shape[1]
    for l in range(T):
        for h in range(dh):
            for ii in range(w):
                dst[b, l, which, h, i0 + ii] = src[l, h, ii]


@jit()
def _put_unit(dqs: np.ndarray, dks: np.ndarray, dvs: np.ndarray, b: int, i0: int, w: int, tok: np.ndarray,
              grows: np.ndarray, gtable: np.ndarray, accumulate: bool) -> None:
    """The cotangents of q, k, v of a work unit: stored, ``grows[b T + l, 0|1|2, :, i0:i0 + w] = dq|dk|dv[l]``,
    or accumulated through the transpose of the gather in :func:`_load_unit`,
    ``grows[tok[b, l], ...] += ...`` and ``gtable[l, ...] += ...``."""
    T, dh = dqs.shape[0], dqs.shape[1]
    for l in range(T):
        r = tok[b, l] if accumulate else b * T + l
        for h in range(dh):
            if accumulate:
                for ii in range(w):
                    grows[r, 0, h, i0 + ii] += dqs[l, h, ii]
                    gtable[l, 0, h, i0 + ii] += dqs[l, h, ii]
                for ii in range(w):
                    grows[r, 1, h, i0 + ii] += dks[l, h, ii]
                    gtable[l, 1, h, i0 + ii] += dks[l, h, ii]
                for ii in range(w):
                    grows[r, 2, h, i0 + ii] += dvs[l, h, ii]
                    gtable[l, 2, h, i0 + ii] += dvs[l, h, ii]
            else:
                for ii in range(w):
                    grows[r, 0, h, i0 + ii] = dqs[l, h, ii]
                for ii in range(w):
                    grows[r, 1, h, i0 + ii] = dks[l, h, ii]
                for ii in range(w):
                    grows[r, 2, h, i0 + ii] = dvs[l, h, ii]


@jit()
def _load_unit(rows: np.ndarray, table: np.ndarray, tok: np.ndarray, u: int, tile: int, qs: np.ndarray,
               ks: np.ndarray, vs: np.ndarray):
    """q, k, v of work unit ``u`` (sequence ``b = u // nblk``, heads ``i0 = (u % nblk) tile`` to ``i0 + w``)
    into the scratch arrays: ``qs[l, h, :w] = rows[tok[b, l], 0, h, i0:i0 + w] + table[l, 0, h, i0:i0 + w]``
    (k, v: 1, 2); returns (b, i0, w)."""
    T, dh, n = tok.shape[1], rows.shape[2], rows.shape[3]
    nblk = (n + tile - 1) // tile
    b = u // nblk
    i0 = (u - b * nblk) * tile
    w = min(tile, n - i0)
    for l in range(T):
        r = tok[b, l]
        for h in range(dh):
            for ii in range(w):
                qs[l, h, ii] = rows[r, 0, h, i0 + ii] + table[l, 0, h, i0 + ii]
            for ii in range(w):
                ks[l, h, ii] = rows[r, 1, h, i0 + ii] + table[l, 1, h, i0 + ii]
            for ii in range(w):
                vs[l, h, ii] = rows[r, 2, h, i0 + ii] + table[l, 2, h, i0 + ii]
    return b, i0, w


@jit()
def _attention_units(rows: np.ndarray, table: np.ndarray, tok: np.ndarray, scale: float, c5: np.ndarray, tile: int,
                     lo: int, hi: int) -> None:
    """Forward core of work units ``lo <= u < hi`` (sequence ``u // nblk``, tile ``u % nblk``); c5 is
    c reshaped [B, T, 1, dh, n].

    The scratch arrays are allocated here, once per call, on purpose: separate allocations are known to
    LLVM not to alias, which keeps the inner loops free of run-time overlap checks. Carving them out of one
    buffer passed by the caller made the backward kernel 34 % slower (4.57 ms against 3.41 ms for 8
    sequences x 64 heads), while the allocations cost 26 us per call (under 1 %)."""
    T, dh = tok.shape[1], rows.shape[2]
    qs = empty_aligned((T, dh, tile), rows)
    ks = empty_aligned((T, dh, tile), rows)
    vs = empty_aligned((T, dh, tile), rows)
    cs = empty_aligned((T, dh, tile), rows)
    s = empty_aligned((T, tile), rows)
    consts = np.ones(2, dtype=rows.dtype)
    consts[1] = scale
    shift = np.empty(tile, dtype=s.real.dtype)
    inv = empty_aligned((tile,), rows)
    for u in range(lo, hi):
        b, i0, w = _load_unit(rows, table, tok, u, tile, qs, ks, vs)
        for l in range(T):
            _softmax_row(qs, ks, l, w, consts[1], consts[0], s, shift, inv)
            _row_products(s, vs, l, w, cs)
        _store(cs, b, 0, i0, w, c5)


def work_units(B: int, n: int, tile: int) -> int:
    """Number of work units (sequence, tile of ``tile`` heads) of ``B`` sequences and ``n`` heads: the items the
    kernels' threads share, ``B ceil(n / tile)``, in contiguous ranges (:func:`pdeflow.core.workers.for_each_range`)."""
    return B * ((n + tile - 1) // tile)


def read_only(tok: np.ndarray) -> np.ndarray:
    """``tok`` as a read-only array (a view where it is writable): numba types read-only and writable arrays
    apart, so the kernels see one kind and compile one signature per dtype, whichever the caller passes (pdeflow's
    own token and row-number arrays are read-only)."""
    if not tok.flags.writeable:
        return tok
    view = tok.view()
    view.flags.writeable = False
    return view


def causal_attention(rows: np.ndarray, table: np.ndarray, tok: np.ndarray, scale: float, c: np.ndarray, tile: int,
                     n_threads: int) -> None:
    """Context ``c[b, l, :, i] = sum_{j<=l} a[l, j] v[b, j, :, i]``, ``a[l] = softmax_j(scale <q_l, k_j>)``.

    The projections of position l of sequence b are ``rows[tok[b, l]] + table[l]`` (q, k, v of head i at
    ``[0|1|2, :, i]``): rows [R, 3, dh, n], table [T, 3, dh, n], tok [B, T] (int). Either the projected
    inputs ``X W`` (R = B T, tok the row numbers, table zero) or, since ``x = E[tok] + P``, the projected
    tables ``E W`` (R = V) and ``P W`` - which spares the B T x d x 3 dh n product. c [B, T, dh, n] is
    overwritten. Work units (sequence, tile of ``tile`` heads) are independent: with ``n_threads > 1``
    they are split into contiguous ranges, one a thread of pdeflow's pool
    (:func:`pdeflow.core.workers.for_each_range`; the kernels release the GIL); with 1 the call runs on the
    caller's thread alone, so several Python threads may run it at once.
    """
    B, T, dh, n = c.shape
    tok = read_only(tok)
    c5 = c.reshape(B, T, 1, dh, n)
    for_each_range(work_units(B, n, tile), n_threads,
                   lambda lo, hi: _attention_units(rows, table, tok, scale, c5, tile, lo, hi))


@jit()
def _attention_vjp_units(rows: np.ndarray, table: np.ndarray, tok: np.ndarray, dc5: np.ndarray, scale: float,
                         c5: np.ndarray, grows: np.ndarray, gtable: np.ndarray, accumulate: bool, tile: int,
                         lo: int, hi: int) -> None:
    """Backward core of work units ``lo <= u < hi`` (see :func:`causal_attention_vjp`); dc5, c5 are
    dc, c reshaped [B, T, 1, dh, n]. Scratch allocated per call, as in :func:`_attention_units`."""
    T, dh = tok.shape[1], rows.shape[2]
    qs = empty_aligned((T, dh, tile), rows)
    ks = empty_aligned((T, dh, tile), rows)
    vs = empty_aligned((T, dh, tile), rows)
    dcs = empty_aligned((T, dh, tile), rows)
    cs = empty_aligned((T, dh, tile), rows)
    dqs = empty_aligned((T, dh, tile), rows)
    dks = empty_aligned((T, dh, tile), rows)
    dvs = empty_aligned((T, dh, tile), rows)
    a = empty_aligned((ROWS, T, tile), rows)   # attention rows of the block
    g = empty_aligned((ROWS, T, tile), rows)   # dA, then dS rows of the block
    consts = np.ones(2, dtype=rows.dtype)
    consts[1] = scale
    sc = consts[1]
    shift = np.empty(tile, dtype=a.real.dtype)
    inv = empty_aligned((tile,), rows)
    wsum = empty_aligned((tile,), rows)
    for u in range(lo, hi):
        b, i0, w = _load_unit(rows, table, tok, u, tile, qs, ks, vs)
        _load(dc5, b, 0, i0, w, dcs)
        dks[...] = 0.0
        dvs[...] = 0.0
        for l0 in range(0, T, ROWS):
            rb = min(ROWS, T - l0)
            top = l0 + rb  # columns j < top are touched by this block
            for r in range(rb):
                l = l0 + r
                ar = a[r]
                gr = g[r]
                _softmax_row(qs, ks, l, w, sc, consts[0], ar, shift, inv)
                _row_products(ar, vs, l, w, cs)
                _scores(dcs, vs, l, w, gr)
                # sum_j a[l, j] dA[l, j] = <dc_l, c_l>: dh terms instead of l + 1
                for ii in range(w):
                    wsum[ii] = 0.0
                for h in range(dh):
                    for ii in range(w):
                        wsum[ii] = madd(dcs[l, h, ii], cs[l, h, ii], wsum[ii])
                for j in range(l + 1):
                    for ii in range(w):
                        gr[j, ii] = ar[j, ii] * (gr[j, ii] - wsum[ii]) * sc
                _row_products(gr, ks, l, w, dqs)
                for j in range(l + 1, top):
                    for ii in range(w):
                        ar[j, ii] = 0.0
                        gr[j, ii] = 0.0
            # dv_j += sum_r a[r, j] dc_{l0+r}, dk_j += sum_r dS[r, j] q_{l0+r} (zeros above the diagonal)
            if rb == ROWS:
                for j in range(top):
                    for h in range(dh):
                        for ii in range(w):
                            dvs[j, h, ii] = _rows_dot(a, j, dcs, l0, h, ii, dvs[j, h, ii])
                        for ii in range(w):
                            dks[j, h, ii] = _rows_dot(g, j, qs, l0, h, ii, dks[j, h, ii])
            else:
                for r in range(rb):
                    for j in range(l0 + r + 1):
                        for h in range(dh):
                            for ii in range(w):
                                dvs[j, h, ii] = madd(a[r, j, ii], dcs[l0 + r, h, ii], dvs[j, h, ii])
                            for ii in range(w):
                                dks[j, h, ii] = madd(g[r, j, ii], qs[l0 + r, h, ii], dks[j, h, ii])
        _store(cs, b, 0, i0, w, c5)
        _put_unit(dqs, dks, dvs, b, i0, w, tok, grows, gtable, accumulate)


def causal_attention_vjp(rows: np.ndarray, table: np.ndarray, tok: np.ndarray, dc: np.ndarray, scale: float,
                         c: np.ndarray, grows: np.ndarray, gtable: np.ndarray | None, tile: int,
                         n_threads: int) -> None:
    """Forward context and its vector-Jacobian product.

    Given the cotangent ``dc`` of the context, with ``a`` the causal softmax and ``s = scale q k^T``:
    ``dA[l, j] = <dc_l, v_j>``, ``dS = a * (dA - sum_j a dA)``, ``dq_l = scale sum_j dS[l, j] k_j``,
    ``dk_j = scale sum_l dS[l, j] q_l``, ``dv_j = sum_l a[l, j] dc_l``. Query rows are processed in blocks
    of ROWS: per row the softmax, context, dA, dS and dq; per block the column sums of dk and dv.
    Projections rows, table, tok as in :func:`causal_attention`; dc, c [B, T, dh, n]; c is overwritten.
    The cotangents of q, k, v: with ``gtable`` None they are stored, ``grows[b T + l] = (dq, dk, dv)[b, l]``
    (grows [B T, 3, dh, n]); otherwise they go back through the gather, ``grows[tok[b, l]] += ...`` and
    ``gtable[l] += ...`` (with the factored projections grows [V, 3, dh, n], gtable [T, 3, dh, n], and
    ``E^T grows + P^T gtable`` is the weight gradient without the B T x d x 3 dh n product). Adding needs
    ``n_threads == 1`` (one thread per call: sequences share rows).
    Threads otherwise as in :func:`causal_attention`.
    """
    B, T, dh, n = c.shape
    accumulate = gtable is not None
    tok = read_only(tok)
    if n_threads > 1 and accumulate:
        raise ValueError("causal_attention_vjp adds into grows on one thread only (n_threads = 1)")
    c5, dc5 = c.reshape(B, T, 1, dh, n), dc.reshape(B, T, 1, dh, n)
    gtable = gtable if accumulate else table  # unread when storing: one signature for both
    for_each_range(work_units(B, n, tile), n_threads,
                   lambda lo, hi: _attention_vjp_units(rows, table, tok, dc5, scale, c5, grows, gtable, accumulate,
                                                       tile, lo, hi))
