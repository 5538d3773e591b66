"""Numba kernels: the forward-mode tangent of the causal attention core (exact Jacobian-vector products).

The whole-system Jacobian-vector product (:meth:`pdeflow.core.problem.Problem.system_jvp`) differentiates the
logits pass and the gradient pass of :mod:`pdeflow.core.kernels` along a direction of the heads' parameters:
every quantity ``x`` of a work unit is carried with its tangent ``x'`` (primal and tangent computed together,
in real arithmetic, with the vectorized :func:`pdeflow.core.kernels.vexp`). With ``s = scale q k^T``, ``a`` the
causal softmax of ``s``, ``c = a v``:

- forward (:func:`causal_attention_jvp`): ``s' = scale (q' k^T + q k'^T)``, ``a' = a * (s' - sum_j a s')``,
  ``c' = a' v + a v'``;
- backward (:func:`causal_attention_vjp_jvp`), the tangent of the vector-Jacobian product of
  :func:`pdeflow.core.kernels.causal_attention_vjp` with cotangent ``g`` of the context moving as ``g'``:
  ``dA = g v^T``, ``dA' = g' v^T + g v'^T``, ``w = <g_l, c_l>``, ``w' = <g'_l, c_l> + <g_l, c'_l>``,
  ``dS = scale a * (dA - w)``, ``dS' = scale (a' * (dA - w) + a * (dA' - w'))``, and the tangents of the
  cotangents ``dq' = dS' k + dS k'``, ``dk' = dS'^T q + dS^T q'``, ``dv' = a'^T g + a^T g'``.

Per (query row, key position, channel) the forward costs 6 fused multiply-adds against 2 of the logits
kernel, the backward 15 against 6 of the gradient kernel; a complex step costs 4 real multiply-adds per
complex one and calls libm's complex exp.

Layout, work units (sequence, tile of heads), scratch arrays and the fixed order of every sum are those of
:mod:`pdeflow.core.kernels` (whose loaders, softmax pieces and block sums are reused): results do not depend on
the thread count. Sums of a primal and a tangent product are one chain of fused multiply-adds, the two
products of a channel (or position) one after the other in the order written in the formulas above.
"""
from __future__ import annotations

import numpy as np

from .jit import jit
from .kernels import (
    ROWS,
    _load,
    _load_unit,
    _put_unit,
    _rows_dot,
    _store,
    empty_aligned,
    madd,
    read_only,
    softmax_scores,
    work_units,
)
from .workers import for_each_range


def scratch_bytes(T: int, dh: int, tile: int, itemsize: int) -> tuple[int, int]:
    """Bytes of the per-call scratch arrays of the forward and backward tangent kernels for a tile of
    ``tile`` heads: forward q, k, v, q', k', v', c, c' [T, dh, tile], s, s' [T, tile]; backward q, k, v, q',
    k', v', g, g', c, c', dq', dk', dv' [T, dh, tile], a, a', dS, dS' [ROWS, T, tile]."""
    forward = (8 * T * dh + 2 * T + 4) * tile * itemsize
    backward = (13 * T * dh + 4 * ROWS * T + 6) * tile * itemsize
    return forward, backward


@jit()
def _scores_tangent(qs: np.ndarray, ks: np.ndarray, dqs: np.ndarray, dks: np.ndarray, l: int, w: int,
                    s: np.ndarray, ds: np.ndarray) -> None:
    """s[j, ii] = sum_h q[l, h, ii] k[j, h, ii] and ds[j, ii] = sum_h q'[l, h, ii] k[j, h, ii] + q[l, h, ii]
    k'[j, h, ii] for j <= l, ii < w: channels in blocks of 4 (then 1), each block one chain of fused
    multiply-adds per output in increasing h; primal and tangent share the loads of q and k."""
    dh = qs.shape[1]
    for j in range(l + 1):
        for ii in range(w):
            s[j, ii] = 0.0
            ds[j, ii] = 0.0
    h = 0
    while h + 4 <= dh:
        for j in range(l + 1):
            for ii in range(w):
                q0, q1, q2, q3 = qs[l, h, ii], qs[l, h + 1, ii], qs[l, h + 2, ii], qs[l, h + 3, ii]
                k0, k1, k2, k3 = ks[j, h, ii], ks[j, h + 1, ii], ks[j, h + 2, ii], ks[j, h + 3, ii]
                s[j, ii] = madd(q3, k3, madd(q2, k2, madd(q1, k1, madd(q0, k0, s[j, ii]))))
                acc = madd(qs[l, h, ii], dks[j, h, ii], madd(dqs[l, h, ii], k0, ds[j, ii]))
                acc = madd(qs[l, h + 1, ii], dks[j, h + 1, ii], madd(dqs[l, h + 1, ii], k1, acc))
                acc = madd(qs[l, h + 2, ii], dks[j, h + 2, ii], madd(dqs[l, h + 2, ii], k2, acc))
                ds[j, ii] = madd(q3, dks[j, h + 3, ii], madd(dqs[l, h + 3, ii], k3, acc))
        h += 4
    while h < dh:
        for j in range(l + 1):
            for ii in range(w):
                s[j, ii] = madd(qs[l, h, ii], ks[j, h, ii], s[j, ii])
                ds[j, ii] = madd(qs[l, h, ii], dks[j, h, ii], madd(dqs[l, h, ii], ks[j, h, ii], ds[j, ii]))
        h += 1


@jit()
def _row_products_tangent(a: np.ndarray, da: np.ndarray, v: np.ndarray, dv: np.ndarray, l: int, w: int,
                          c: np.ndarray, dc: np.ndarray) -> None:
    """c[l, h, ii] = sum_{j<=l} a[j, ii] v[j, h, ii] and dc[l, h, ii] = sum_{j<=l} da[j, ii] v[j, h, ii] +
    a[j, ii] dv[j, h, ii] for every h, ii < w: positions in blocks of 4 (then 1), each block one chain per
    output in increasing j."""
    dh = v.shape[1]
    n = l + 1
    for h in range(dh):
        for ii in range(w):
            c[l, h, ii] = 0.0
            dc[l, h, ii] = 0.0
    j = 0
    while j + 4 <= n:
        for h in range(dh):
            for ii in range(w):
                v0, v1, v2, v3 = v[j, h, ii], v[j + 1, h, ii], v[j + 2, h, ii], v[j + 3, h, ii]
                a0, a1, a2, a3 = a[j, ii], a[j + 1, ii], a[j + 2, ii], a[j + 3, ii]
                c[l, h, ii] = madd(a3, v3, madd(a2, v2, madd(a1, v1, madd(a0, v0, c[l, h, ii]))))
                acc = madd(a0, dv[j, h, ii], madd(da[j, ii], v0, dc[l, h, ii]))
                acc = madd(a1, dv[j + 1, h, ii], madd(da[j + 1, ii], v1, acc))
                acc = madd(a2, dv[j + 2, h, ii], madd(da[j + 2, ii], v2, acc))
                dc[l, h, ii] = madd(a3, dv[j + 3, h, ii], madd(da[j + 3, ii], v3, acc))
        j += 4
    while j < n:
        for h in range(dh):
            for ii in range(w):
                c[l, h, ii] = madd(a[j, ii], v[j, h, ii], c[l, h, ii])
                dc[l, h, ii] = madd(a[j, ii], dv[j, h, ii], madd(da[j, ii], v[j, h, ii], dc[l, h, ii]))
        j += 1


@jit()
def _row_products_pair(x: np.ndarray, k: np.ndarray, y: np.ndarray, dk: np.ndarray, l: int, w: int,
                       out: np.ndarray) -> None:
    """out[l, h, ii] = sum_{j<=l} x[j, ii] k[j, h, ii] + y[j, ii] dk[j, h, ii]: positions in blocks of 4
    (then 1), one chain in increasing j."""
    dh = k.shape[1]
    n = l + 1
    for h in range(dh):
        for ii in range(w):
            out[l, h, ii] = 0.0
    j = 0
    while j + 4 <= n:
        for h in range(dh):
            for ii in range(w):
                acc = madd(y[j, ii], dk[j, h, ii], madd(x[j, ii], k[j, h, ii], out[l, h, ii]))
                acc = madd(y[j + 1, ii], dk[j + 1, h, ii], madd(x[j + 1, ii], k[j + 1, h, ii], acc))
                acc = madd(y[j + 2, ii], dk[j + 2, h, ii], madd(x[j + 2, ii], k[j + 2, h, ii], acc))
                out[l, h, ii] = madd(y[j + 3, ii], dk[j + 3, h, ii], madd(x[j + 3, ii], k[j + 3, h, ii], acc))
        j += 4
    while j < n:
        for h in range(dh):
            for ii in range(w):
                out[l, h, ii] = madd(y[j, ii], dk[j, h, ii], madd(x[j, ii], k[j, h, ii], out[l, h, ii]))
        j += 1


@jit()
def _softmax_tangent_row(qs: np.ndarray, ks: np.ndarray, dqs: np.ndarray, dks: np.ndarray, l: int, w: int, sc, one,
                         s: np.ndarray, ds: np.ndarray, shift: np.ndarray, inv: np.ndarray, mu: np.ndarray) -> None:
    """s[j, :w] = a_j = softmax_j(sc <q_l, k_j>) and ds[j, :w] = a'_j = a_j (s'_j - sum_i a_i s'_i) with
    s'_j = sc (<q'_l, k_j> + <q_l, k'_j>), for j <= l. The exponentials and the shift are those of
    :func:`pdeflow.core.kernels._softmax_row` (same values to the last bit)."""
    _scores_tangent(qs, ks, dqs, dks, l, w, s, ds)
    softmax_scores(l, w, sc, one, s, shift, inv)
    for ii in range(w):
        mu[ii] = 0.0
    for j in range(l + 1):
        for ii in range(w):
            mu[ii] = madd(s[j, ii], ds[j, ii], mu[ii])
    for j in range(l + 1):
        for ii in range(w):
            ds[j, ii] = s[j, ii] * (ds[j, ii] - mu[ii]) * sc


# ---- forward: the logits pass and its tangent ---------------------------------------------------------

@jit()
def _attention_jvp_units(rows: np.ndarray, table: np.ndarray, drows: np.ndarray, dtable: np.ndarray, tok: np.ndarray,
                         scale: float, c5: np.ndarray, dc5: np.ndarray, tile: int, lo: int, hi: int) -> None:
    """Forward core and its tangent for work units ``lo <= u < hi``; c5, dc5 are c, c' reshaped
    [B, T, 1, dh, n]. Scratch allocated per call, as in :func:`pdeflow.core.kernels._attention_units`."""
    T, dh = tok.shape[1], rows.shape[2]
    qs = empty_aligned((T, dh, tile), rows)
    ks = empty_aligned((T, dh, tile), rows)
    vs = empty_aligned((T, dh, tile), rows)
    dqs = empty_aligned((T, dh, tile), rows)
    dks = empty_aligned((T, dh, tile), rows)
    dvs = empty_aligned((T, dh, tile), rows)
    cs = empty_aligned((T, dh, tile), rows)
    dcs = empty_aligned((T, dh, tile), rows)
    s = empty_aligned((T, tile), rows)
    ds = empty_aligned((T, tile), rows)
    consts = np.ones(2, dtype=rows.dtype)
    consts[1] = scale
    shift = empty_aligned((tile,), rows)
    inv = empty_aligned((tile,), rows)
    mu = empty_aligned((tile,), rows)
    for u in range(lo, hi):
        b, i0, w = _load_unit(rows, table, tok, u, tile, qs, ks, vs)
        _load_unit(drows, dtable, tok, u, tile, dqs, dks, dvs)
        for l in range(T):
            _softmax_tangent_row(qs, ks, dqs, dks, l, w, consts[1], consts[0], s, ds, shift, inv, mu)
            _row_products_tangent(s, ds, vs, dvs, l, w, cs, dcs)
        _store(cs, b, 0, i0, w, c5)
        _store(dcs, b, 0, i0, w, dc5)


def causal_attention_jvp(rows: np.ndarray, table: np.ndarray, drows: np.ndarray, dtable: np.ndarray, tok: np.ndarray,
                         scale: float, c: np.ndarray, dc: np.ndarray, tile: int, n_threads: int) -> None:
    """Context ``c`` (as :func:`pdeflow.core.kernels.causal_attention`) and its tangent ``c' = a' v + a v'``.

    The projections and their tangents come in the same (rows, table, tok) form: q, k, v of position l of
    sequence b are ``rows[tok[b, l]] + table[l]``, their tangents ``drows[tok[b, l]] + dtable[l]`` (rows,
    drows [R, 3, dh, n], table, dtable [T, 3, dh, n]). c, dc [B, T, dh, n] are overwritten. Threads as in
    :func:`pdeflow.core.kernels.causal_attention`.
    """
    B, T, dh, n = c.shape
    tok = read_only(tok)
    c5, dc5 = c.reshape(B, T, 1, dh, n), dc.reshape(B, T, 1, dh, n)
    for_each_range(work_units(B, n, tile), n_threads,
                   lambda lo, hi: _attention_jvp_units(rows, table, drows, dtable, tok, scale, c5, dc5, tile, lo, hi))


# ---- backward: the tangent of the gradient pass ---------------------------------------------------------

@jit()
def _attention_vjp_jvp_units(rows: np.ndarray, table: np.ndarray, drows: np.ndarray, dtable: np.ndarray,
                             tok: np.ndarray, g5: np.ndarray, dg5: np.ndarray, scale: float, c5: np.ndarray,
                             dc5: np.ndarray, grows: np.ndarray, gtable: np.ndarray, accumulate: bool, tile: int,
                             lo: int, hi: int) -> None:
    """Tangent of the backward core for work units ``lo <= u < hi`` (see :func:`causal_attention_vjp_jvp`);
    g5, dg5, c5, dc5 are g, g', c, c' reshaped [B, T, 1, dh, n]."""
    T, dh = tok.shape[1], rows.shape[2]
    qs = empty_aligned((T, dh, tile), rows)
    ks = empty_aligned((T, dh, tile), rows)
    vs = empty_aligned((T, dh, tile), rows)
    dqs = empty_aligned((T, dh, tile), rows)
    dks = empty_aligned((T, dh, tile), rows)
    dvs = empty_aligned((T, dh, tile), rows)
    gs = empty_aligned((T, dh, tile), rows)
    dgs = empty_aligned((T, dh, tile), rows)
    cs = empty_aligned((T, dh, tile), rows)
    dcs = empty_aligned((T, dh, tile), rows)
    tq = empty_aligned((T, dh, tile), rows)    # dq', dk', dv': the tangents of the cotangents
    tk = empty_aligned((T, dh, tile), rows)
    tv = empty_aligned((T, dh, tile), rows)
    a = empty_aligned((ROWS, T, tile), rows)   # attention rows of the block
    da = empty_aligned((ROWS, T, tile), rows)  # their tangents
    e = empty_aligned((ROWS, T, tile), rows)   # dA, then dS rows of the block
    de = empty_aligned((ROWS, T, tile), rows)  # dA', then dS'
    consts = np.ones(2, dtype=rows.dtype)
    consts[1] = scale
    sc = consts[1]
    shift = empty_aligned((tile,), rows)
    inv = empty_aligned((tile,), rows)
    mu = empty_aligned((tile,), rows)
    wsum = empty_aligned((tile,), rows)
    dwsum = empty_aligned((tile,), rows)
    for u in range(lo, hi):
        b, i0, w = _load_unit(rows, table, tok, u, tile, qs, ks, vs)
        _load_unit(drows, dtable, tok, u, tile, dqs, dks, dvs)
        _load(g5, b, 0, i0, w, gs)
        _load(dg5, b, 0, i0, w, dgs)
        tk[...] = 0.0
        tv[...] = 0.0
        for l0 in range(0, T, ROWS):
            rb = min(ROWS, T - l0)
            top = l0 + rb  # columns j < top are touched by this block
            for r in range(rb):
                l = l0 + r
                ar, dar, er, der = a[r], da[r], e[r], de[r]
                _softmax_tangent_row(qs, ks, dqs, dks, l, w, sc, consts[0], ar, dar, shift, inv, mu)
                _row_products_tangent(ar, dar, vs, dvs, l, w, cs, dcs)
                _scores_tangent(gs, vs, dgs, dvs, l, w, er, der)
                # w = <g_l, c_l>, w' = <g'_l, c_l> + <g_l, c'_l>
                for ii in range(w):
                    wsum[ii] = 0.0
                    dwsum[ii] = 0.0
                for h in range(dh):
                    for ii in range(w):
                        wsum[ii] = madd(gs[l, h, ii], cs[l, h, ii], wsum[ii])
                        dwsum[ii] = madd(gs[l, h, ii], dcs[l, h, ii], madd(dgs[l, h, ii], cs[l, h, ii], dwsum[ii]))
                for j in range(l + 1):
                    for ii in range(w):
                        x = er[j, ii] - wsum[ii]
                        der[j, ii] = madd(dar[j, ii], x, ar[j, ii] * (der[j, ii] - dwsum[ii])) * sc
                        er[j, ii] = ar[j, ii] * x * sc
                _row_products_pair(der, ks, er, dks, l, w, tq)
                for j in range(l + 1, top):
                    for ii in range(w):
                        ar[j, ii] = 0.0
                        dar[j, ii] = 0.0
                        er[j, ii] = 0.0
                        der[j, ii] = 0.0
            # dv'_j += sum_r a'[r, j] g_r + a[r, j] g'_r, dk'_j += sum_r dS'[r, j] q_r + dS[r, j] q'_r (r = l0 + ...)
            if rb == ROWS:
                for j in range(top):
                    for h in range(dh):
                        for ii in range(w):
                            acc = _rows_dot(da, j, gs, l0, h, ii, tv[j, h, ii])
                            tv[j, h, ii] = _rows_dot(a, j, dgs, l0, h, ii, acc)
                        for ii in range(w):
                            acc = _rows_dot(de, j, qs, l0, h, ii, tk[j, h, ii])
                            tk[j, h, ii] = _rows_dot(e, j, dqs, l0, h, ii, acc)
            else:
                for r in range(rb):
                    for j in range(l0 + r + 1):
                        for h in range(dh):
                            for ii in range(w):
                                tv[j, h, ii] = madd(a[r, j, ii], dgs[l0 + r, h, ii],
                                                    madd(da[r, j, ii], gs[l0 + r, h, ii], tv[j, h, ii]))
                            for ii in range(w):
                                tk[j, h, ii] = madd(e[r, j, ii], dqs[l0 + r, h, ii],
                                                    madd(de[r, j, ii], qs[l0 + r, h, ii], tk[j, h, ii]))
        _store(cs, b, 0, i0, w, c5)
        _store(dcs, b, 0, i0, w, dc5)
        _put_unit(tq, tk, tv, b, i0, w, tok, grows, gtable, accumulate)


def causal_attention_vjp_jvp(rows: np.ndarray, table: np.ndarray, drows: np.ndarray, dtable: np.ndarray,
                             tok: np.ndarray, g: np.ndarray, dg: np.ndarray, scale: float, c: np.ndarray,
                             dc: np.ndarray, grows: np.ndarray, gtable: np.ndarray | None, tile: int,
                             n_threads: int) -> None:
    """The tangent of :func:`pdeflow.core.kernels.causal_attention_vjp`: projections moving along (drows, dtable)
    (as in :func:`causal_attention_jvp`) and the cotangent ``g`` of the context [B, T, dh, n] along ``dg``.

    Writes the context c and its tangent c' (dc) [B, T, dh, n] and the tangents ``(dq', dk', dv')`` of the
    cotangents of q, k, v (module docstring): stored, ``grows[b T + l] = (dq', dk', dv')[b, l]`` with
    ``gtable`` None, or added through the transpose of the gather (``n_threads == 1``), exactly as
    :func:`pdeflow.core.kernels.causal_attention_vjp` does with (dq, dk, dv). The primal cotangents are not
    formed. Threads as in :func:`pdeflow.core.kernels.causal_attention`.
    """
    B, T, dh, n = c.shape
    accumulate = gtable is not None
    tok = read_only(tok)
    if n_threads > 1 and accumulate:
        raise ValueError("causal_attention_vjp_jvp adds into grows on one thread only (n_threads = 1)")
    shape5 = (B, T, 1, dh, n)
    c5, dc5, g5, dg5 = c.reshape(shape5), dc.reshape(shape5), g.reshape(shape5), dg.reshape(shape5)
    gtable = gtable if accumulate else table  # unread when storing: one signature for both
    for_each_range(work_units(B, n, tile), n_threads,
                   lambda lo, hi: _attention_vjp_jvp_units(rows, table, drows, dtable, tok, g5, dg5, scale, c5, dc5,
                                                           grows, gtable, accumulate, tile, lo, hi))
