"""Logits, risk, Phi and grad Phi of a weighted particle measure, on plain arrays (docs/model.md).

For ``rho = sum_i m_i delta_{theta_i}``: the aggregate output ``O`` [B, T, d], logits ``z = O U^T`` [B, T, V], the
risk, the residual features ``G`` [B, T, d] and ``Phi_data(theta) = sum_{b,l} <G[b, l], o_l(x_b; theta)>``. Heads
are processed in chunks so every projection is one BLAS product; results do not depend on the thread count; every
function is generic in the dtype (float64, float32, complex128), except the forward-mode tangents ``*_jvp``
(float64, float32). Details: docs/design.md, "Evaluating the mean field".
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from . import kernels, kernels_jvp, tuner
from .jit import num_threads
from .model import split_theta
from .workers import for_each_item

# The default variant (pdeflow.core.tuner): what runs unless a plan measured on this CPU, PDEFLOW_VARIANT or
# tuner.forced says otherwise.
CHUNK_BYTES = 8 * 2**20  # working memory of one chunk (heads x sequences), whatever N and B are
TILE_BYTES = 512  # lanes of one kernel work unit (heads), in bytes
HEAD_TILES = 1  # kernel tiles per chunk of heads
OUTPUT_PARTS = 8  # partial sums of O over consecutive chunks of heads in the logits pass (see _aggregate)
OUTPUT_PARTS_BYTES = 64 * 2**20  # at most this much memory for them
GRADIENT_ITEMS = 32  # items (chunk of heads, part of the sequences) of the gradient pass, at least (see _evaluate)


@dataclass(frozen=True)
class AttentionData:
    """The arrays one evaluation needs: a data set and the fixed tables of the layer.

    inputs ``x`` [B, T, d] (= E[tok] + P); unembedding ``U`` [V, d]; targets [B, T] (int);
    loss_weights ``lw`` [B, T]; ``head_dim`` dh; ``score_scale``; optionally the tokens [B, T] (int),
    embedding ``E`` [V, d] and positions ``P`` [T, d] that make x, so that projections can be taken of the
    tables (``x W = (E W)[tok] + P W``, see :func:`_projections`).
    """
    inputs: np.ndarray
    unembedding: np.ndarray
    targets: np.ndarray
    loss_weights: np.ndarray
    head_dim: int
    score_scale: float
    tokens: np.ndarray | None = None
    embedding: np.ndarray | None = None
    positions: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """(B, T, d)."""
        return self.inputs.shape

    @property
    def factored(self) -> bool:
        """Whether the projections are taken of the tables (:func:`factored_projections`)."""
        B, T, _ = self.shape
        return self.tokens is not None and factored_projections(B, T, self.embedding.shape[0])

    def astype(self, dtype: np.dtype) -> AttentionData:
        """The same data with float tables in ``dtype`` (targets and tokens stay integers)."""
        def cast(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else a.astype(dtype)

        return AttentionData(self.inputs.astype(dtype), self.unembedding.astype(dtype), self.targets,
                             self.loss_weights.astype(dtype), self.head_dim, self.score_scale, self.tokens,
                             cast(self.embedding), cast(self.positions))


class _Projections:
    """One thread's buffers for the Q/K/V projections of a chunk of heads, in the kernels' (rows, table, tok)
    form (:func:`pdeflow.core.kernels.causal_attention`).

    ``chunk(wcat)``: a new chunk of heads (weights laid out by :func:`_qkv_weights`); ``block(b0, nb)``: the
    (rows, table, tok) of sequences b0 <= b < b0 + nb. Factored data: ``rows = E W``, ``table = P W`` once
    per chunk, ``tok`` the tokens; otherwise ``rows = x[block] W`` per block, ``table = 0``, ``tok`` the row
    numbers.
    """

    def __init__(self, data: AttentionData, x: np.ndarray, n: int, bc: int, dtype: np.dtype) -> None:
        B, T, d = data.shape
        self.data, self.x, self.T, self.dh = data, x, T, data.head_dim
        width = 3 * data.head_dim * n
        if data.factored:
            self.E = data.embedding.astype(dtype, copy=False)
            self.P = data.positions.astype(dtype, copy=False)
            self.rows_buf = np.empty(self.E.shape[0] * width, dtype=dtype)
            self.table_buf = np.empty(T * width, dtype=dtype)
        else:
            self.rows_buf = np.empty(bc * T * width, dtype=dtype)
            self.table_buf = np.zeros(T * width, dtype=dtype)
            self.row_numbers = np.arange(bc * T, dtype=np.int64).reshape(bc, T)
            # read-only like the tokens of factored data: numba compiles one specialization of each kernel per
            # argument type, and a writable and a read-only tok are two types (two compilations, ~25 s each)
            self.row_numbers.setflags(write=False)

    def chunk(self, wcat: np.ndarray) -> None:
        self.wcat = wcat
        self.m = wcat.shape[1] // (3 * self.dh)
        shape = (-1, 3, self.dh, self.m)
        self.table = self.table_buf[:self.T * wcat.shape[1]].reshape(shape)
        if self.data.factored:
            rows = self.rows_buf[:self.E.shape[0] * wcat.shape[1]].reshape(self.E.shape[0], wcat.shape[1])
            np.matmul(self.E, wcat, out=rows)
            np.matmul(self.P, wcat, out=self.table.reshape(self.T, wcat.shape[1]))
            self.rows = rows.reshape(shape)

    def block(self, b0: int, nb: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.data.factored:
            return self.rows, self.table, self.data.tokens[b0:b0 + nb]
        width = self.wcat.shape[1]
        rows = self.rows_buf[:nb * self.T * width].reshape(nb * self.T, width)
        np.matmul(self.x[b0 * self.T:(b0 + nb) * self.T], self.wcat, out=rows)
        return rows.reshape(-1, 3, self.dh, self.m), self.table, self.row_numbers[:nb]


def factored_projections(B: int, T: int, V: int) -> bool:
    """Whether pdeflow projects the tables E [V, d] and P [T, d] instead of the inputs x [B T, d]: (V + T)
    rows instead of B T, worth it when V + T <= B T / 4 (the gather in the kernels' loads then costs less
    than the product it spares)."""
    return 4 * (V + T) <= B * T


def loss_weights(mask: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``lw[b, l] = w_b mask[b, l] / |L_b|`` with ``|L_b| = sum_l mask[b, l]``: [B, T]."""
    return weights[:, None] * mask / mask.sum(axis=1, keepdims=True)


def variant(data: AttentionData, dtype: np.dtype, n_total: int) -> tuple[tuner.Variant, str]:
    """The variant (tile, chunks) the evaluation of ``n_total`` heads in ``dtype`` runs with, and why
    (:func:`pdeflow.core.tuner.plan`): a plan measured on this CPU for the shape class, a forced one, or the
    default of this module's constants."""
    B, T, d = data.shape
    v, why = tuner.plan(tuner.shape_class(dtype, B, T, d, data.head_dim, n_total, data.factored))
    if why.startswith("default"):
        v = tuner.Variant(TILE_BYTES, HEAD_TILES * TILE_BYTES, CHUNK_BYTES)
    return v, why


def _tile(dtype: np.dtype, v: tuner.Variant | None = None) -> int:
    """Heads per work unit of the kernels (the SIMD loop length): the variant's tile of lanes, by default
    TILE_BYTES = 512: 64 float64, 128 float32 or 32 complex128 heads."""
    return (v or tuner.Variant(TILE_BYTES, HEAD_TILES * TILE_BYTES, CHUNK_BYTES)).tile(np.dtype(dtype).itemsize)


def _blocks(data: AttentionData, itemsize: int, n_total: int, v: tuner.Variant | None = None) -> tuple[int, int]:
    """(heads, sequences) per chunk: the variant's chunk of heads (whole tiles; by default HEAD_TILES tiles),
    and as many sequences as keep the eight [b, T, dh, heads] work arrays (q, k, v, c, dc, dq, dk, dv) within
    its chunk bytes (by default CHUNK_BYTES)."""
    v = v or tuner.Variant(TILE_BYTES, HEAD_TILES * TILE_BYTES, CHUNK_BYTES)
    B, T, _ = data.shape
    per = 8 * T * data.head_dim * itemsize  # bytes per (sequence, head)
    m = int(max(1, min(n_total, v.chunk_heads(itemsize), v.chunk_bytes // per)))
    bc = int(max(1, min(B, v.chunk_bytes // (per * m))))
    return m, bc


def _dtype(theta: np.ndarray, data: AttentionData) -> np.dtype:
    return np.result_type(theta.dtype, data.inputs.dtype)


def _qkv_weights(theta: np.ndarray, d: int, dh: int, out: np.ndarray) -> np.ndarray:
    """``Wcat [d, 3, dh, m]`` with ``Wcat[c, w, h, i] = W_w[i][h, c]`` (w = q, k, v) in the buffer ``out``,
    so that ``X @ Wcat`` is the [B T, 3, dh, m] layout of :mod:`pdeflow.core.kernels`."""
    m = theta.shape[0]
    wcat = out[:d * 3 * dh * m].reshape(d, 3, dh, m)
    for w, wx in enumerate(split_theta(theta, d, dh)[:3]):
        wcat[:, w] = wx.transpose(2, 1, 0)
    return wcat.reshape(d, 3 * dh * m)


def aggregate_output(theta: np.ndarray, mass: np.ndarray, data: AttentionData) -> np.ndarray:
    """``O[b, l] = sum_i m_i WO_i c_l(x_b; theta_i)``: theta [N, p], mass [N] -> [B, T, d].

    The heads are cut into ``P = min(OUTPUT_PARTS, chunks)`` parts of consecutive chunks (fewer if P copies
    of O would exceed OUTPUT_PARTS_BYTES); part k sums its chunks in their order into its own ``O_k``, and
    ``O = O_1 + ... + O_P`` in that order. P depends on the problem's shape only, so O depends neither on
    the thread count nor on which thread took which item. The threads' items (:mod:`pdeflow.core.workers`)
    are (part, group of blocks of sequences), one group per thread (two when P = 1): at least two items
    per thread, each laying out its chunks' weights once for all its blocks, handed out one at a time: a
    thread that finishes early takes the next item instead of waiting, as with the chunks of the gradient
    pass (with a few large groups of blocks as the only items, any slowdown of one core left the other
    idle for the difference).
    """
    return _aggregate(theta, mass, data, None)[0]


def aggregate_output_jvp(theta: np.ndarray, dtheta: np.ndarray, mass: np.ndarray,
                         data: AttentionData) -> tuple[np.ndarray, np.ndarray]:
    """``O`` and its tangent ``O' = sum_i m_i (WO'_i c_l + WO_i c'_l)`` along head directions dtheta [N, p]
    (forward mode, :func:`pdeflow.core.kernels_jvp.causal_attention_jvp`): [B, T, d] each. O is bitwise the
    value :func:`aggregate_output` returns."""
    return _aggregate(theta, mass, data, dtheta)


def _aggregate(theta: np.ndarray, mass: np.ndarray, data: AttentionData, dtheta: np.ndarray | None):
    """O and (``dtheta`` given) O' of :func:`aggregate_output_jvp`; (O, None) without a direction."""
    B, T, d = data.shape
    dh = data.head_dim
    dtype = _dtype(theta, data)
    x = data.inputs.reshape(B * T, d).astype(dtype, copy=False)
    N = theta.shape[0]
    tangent = dtheta is not None
    plan = variant(data, dtype, N)[0]
    n, bc = _blocks(data, np.dtype(dtype).itemsize, N, plan)
    mass = np.asarray(mass).astype(dtype, copy=False)
    tile = _tile(dtype, plan)
    n_blocks = -(-B // bc)
    n_chunks = -(-N // n)
    parts = int(max(1, min(OUTPUT_PARTS, n_chunks,
                           OUTPUT_PARTS_BYTES // (B * T * d * np.dtype(dtype).itemsize * (2 if tangent else 1)))))
    threads = num_threads()
    groups = min(n_blocks, threads * -(-2 // parts)) if threads > 1 else 1  # at least two items per thread
    outs = np.zeros((parts, B * T, d), dtype=dtype)
    douts = np.zeros((parts, B * T, d), dtype=dtype) if tangent else None

    def run(items: Iterator[int], kernel_threads: int) -> None:
        part_buf = np.empty(bc * T * d, dtype=dtype)
        proj = _Projections(data, x, n, bc, dtype)
        c_buf = np.empty(bc * T * dh * n, dtype=dtype)
        wcat_buf = np.empty(d * 3 * dh * n, dtype=dtype)
        wo_buf = np.empty(dh * n * d, dtype=dtype)
        if tangent:
            dproj = _Projections(data, x, n, bc, dtype)
            dc_buf = np.empty(bc * T * dh * n, dtype=dtype)
            dwcat_buf = np.empty(d * 3 * dh * n, dtype=dtype)
            dwo_buf = np.empty(dh * n * d, dtype=dtype)
        for item in items:
            k, group = divmod(item, groups)
            out = outs[k]
            dout = douts[k] if tangent else None
            blocks = range(group * n_blocks // groups, (group + 1) * n_blocks // groups)
            for chunk in range(k * n_chunks // parts, (k + 1) * n_chunks // parts):
                start = chunk * n
                stop = min(N, start + n)
                m = stop - start
                th = theta[start:stop].astype(dtype, copy=False)
                proj.chunk(_qkv_weights(th, d, dh, wcat_buf))
                wo_t = _scaled_output_weights(th, mass[start:stop], d, dh, wo_buf)
                if tangent:
                    dth = dtheta[start:stop].astype(dtype, copy=False)
                    dproj.chunk(_qkv_weights(dth, d, dh, dwcat_buf))
                    dwo_t = _scaled_output_weights(dth, mass[start:stop], d, dh, dwo_buf)
                for blk in blocks:
                    b0 = blk * bc
                    nb = min(B, b0 + bc) - b0
                    rows = slice(b0 * T, (b0 + nb) * T)
                    c = c_buf[:nb * T * dh * m].reshape(nb * T, dh * m)
                    part = part_buf[:nb * T * d].reshape(nb * T, d)
                    if tangent:
                        dc = dc_buf[:nb * T * dh * m].reshape(nb * T, dh * m)
                        kernels_jvp.causal_attention_jvp(*proj.block(b0, nb)[:2], *dproj.block(b0, nb),
                                                         data.score_scale, c.reshape(nb, T, dh, m),
                                                         dc.reshape(nb, T, dh, m), tile, kernel_threads)
                        # O' = c' WO^T + c WO'^T, in that order
                        np.matmul(dc, wo_t, out=part)
                        dout[rows] += part
                        np.matmul(c, dwo_t, out=part)
                        dout[rows] += part
                    else:
                        kernels.causal_attention(*proj.block(b0, nb), data.score_scale, c.reshape(nb, T, dh, m),
                                                 tile, kernel_threads)
                    np.matmul(c, wo_t, out=part)
                    out[rows] += part

    for_each_item(parts * groups, threads, run)
    out = outs[0]
    for k in range(1, parts):
        out += outs[k]
    if tangent:
        dout = douts[0]
        for k in range(1, parts):
            dout += douts[k]
    return out.reshape(B, T, d), (dout.reshape(B, T, d) if tangent else None)


def head_outputs_jvp(theta: np.ndarray, dtheta: np.ndarray, data: AttentionData) -> np.ndarray:
    """Each head's output tangent ``o'_i[b, l] = WO'_i c_l + WO_i c'_l`` (not summed over the heads, unlike
    :func:`aggregate_output_jvp`) along head directions dtheta [N, p] (forward mode,
    :func:`pdeflow.core.kernels_jvp.causal_attention_jvp`): theta, dtheta [N, p] -> [N, B, T, d]. One pass over
    the heads in chunks and the sequences in blocks, as :func:`aggregate_output_jvp` (the kernel on numba's
    threads); what the structured Hessian (:mod:`pdeflow.core.hessian_assembly`) takes each head's output
    Jacobian from, one coordinate for every head per call."""
    B, T, d = data.shape
    dh = data.head_dim
    dtype = _dtype(theta, data)
    x = data.inputs.reshape(B * T, d).astype(dtype, copy=False)
    N = theta.shape[0]
    n, bc = _blocks(data, np.dtype(dtype).itemsize, N, variant(data, dtype, N)[0])
    tile = _tile(dtype, variant(data, dtype, N)[0])
    out = np.empty((N, B * T, d), dtype=dtype)
    proj, dproj = _Projections(data, x, n, bc, dtype), _Projections(data, x, n, bc, dtype)
    wcat_buf, dwcat_buf = np.empty(d * 3 * dh * n, dtype=dtype), np.empty(d * 3 * dh * n, dtype=dtype)
    c_buf, dc_buf = np.empty(bc * T * dh * n, dtype=dtype), np.empty(bc * T * dh * n, dtype=dtype)
    for start in range(0, N, n):
        stop = min(N, start + n)
        m = stop - start
        th = theta[start:stop].astype(dtype, copy=False)
        dth = dtheta[start:stop].astype(dtype, copy=False)
        proj.chunk(_qkv_weights(th, d, dh, wcat_buf))
        dproj.chunk(_qkv_weights(dth, d, dh, dwcat_buf))
        wo, dwo = split_theta(th, d, dh)[3], split_theta(dth, d, dh)[3]  # [m, d, dh]
        for b0 in range(0, B, bc):
            nb = min(B, b0 + bc) - b0
            c = c_buf[:nb * T * dh * m].reshape(nb, T, dh, m)
            dc = dc_buf[:nb * T * dh * m].reshape(nb, T, dh, m)
            kernels_jvp.causal_attention_jvp(*proj.block(b0, nb)[:2], *dproj.block(b0, nb), data.score_scale, c,
                                             dc, tile, num_threads())
            # per head [nb T, dh] @ [dh, d]: WO' c + WO c'
            ci = c.reshape(nb * T, dh, m).transpose(2, 0, 1)
            dci = dc.reshape(nb * T, dh, m).transpose(2, 0, 1)
            rows = slice(b0 * T, (b0 + nb) * T)
            out[start:stop, rows] = np.matmul(ci, dwo.transpose(0, 2, 1)) + np.matmul(dci, wo.transpose(0, 2, 1))
    return out.reshape(N, B, T, d)


def _scaled_output_weights(theta: np.ndarray, mass: np.ndarray, d: int, dh: int, out: np.ndarray) -> np.ndarray:
    """Rows (h, i) of WO_i^T scaled by the head's mass [dh m, d], so the mass-weighted sum over heads is one
    product."""
    m = theta.shape[0]
    wo_t = out[:dh * m * d].reshape(dh, m, d)
    np.multiply(split_theta(theta, d, dh)[3].transpose(2, 0, 1), mass[None, :, None], out=wo_t)
    return wo_t.reshape(dh * m, d)


def logits(theta: np.ndarray, mass: np.ndarray, data: AttentionData) -> np.ndarray:
    """``z = O U^T``: [B, T, V]."""
    return aggregate_output(theta, mass, data) @ data.unembedding.T.astype(_dtype(theta, data), copy=False)


def _softmax(z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``e = exp(z - shift)`` and ``total = sum e`` over the last axis, with the shift ``max Re z`` (real, so
    that the function stays analytic for complex-step differentiation): (e, total, shift)."""
    shift = z.real.max(axis=-1, keepdims=True)
    e = np.exp(z - shift)
    return e, e.sum(axis=-1, keepdims=True), shift


def cross_entropy(z: np.ndarray, data: AttentionData) -> tuple[complex | float, np.ndarray]:
    """Risk ``R = sum_{b,l} lw (logsumexp z[b,l] - z[b,l,y])`` and residual features ``G`` [B, T, d].

    ``G[b, l] = lw[b, l] (softmax z[b, l] - onehot y[b, l]) @ U``. The softmax shift uses the real part,
    so the function stays analytic for complex-step differentiation.
    """
    e, total, shift = _softmax(z)
    lse = (np.log(total) + shift)[..., 0]
    zy = np.take_along_axis(z, data.targets[..., None], axis=-1)[..., 0]
    lw = data.loss_weights.astype(z.dtype, copy=False)
    risk = np.sum(lw * (lse - zy))
    r = e / total
    np.put_along_axis(r, data.targets[..., None], np.take_along_axis(r, data.targets[..., None], axis=-1) - 1.0,
                      axis=-1)
    G = (lw[..., None] * r) @ data.unembedding.astype(z.dtype, copy=False)
    return risk, G


def residual_features_jvp(z: np.ndarray, dz: np.ndarray, data: AttentionData) -> np.ndarray:
    """The tangent ``G'[b, l] = lw[b, l] (p * (z' - <p, z'>)) @ U`` of the residual features of
    :func:`cross_entropy` as the logits move along dz, ``p = softmax z[b, l]``: z, dz [B, T, V] -> [B, T, d]."""
    e, total, _ = _softmax(z)
    p = e / total
    dp = p * (dz - np.sum(p * dz, axis=-1, keepdims=True))
    lw = data.loss_weights.astype(dz.dtype, copy=False)
    return (lw[..., None] * dp) @ data.unembedding.astype(dz.dtype, copy=False)


def phi_data(theta: np.ndarray, G: np.ndarray, data: AttentionData) -> np.ndarray:
    """``Phi_data(theta_q) = sum_{b,l} <G[b,l], o_l(x_b; theta_q)>`` for query heads theta [Q, p] -> [Q]."""
    return _evaluate(theta, G, data, with_grad=False)[0]


def grad_phi_data(theta: np.ndarray, G: np.ndarray, data: AttentionData) -> tuple[np.ndarray, np.ndarray]:
    """``Phi_data`` [Q] and its gradient in theta [Q, p] at query heads theta [Q, p]."""
    return _evaluate(theta, G, data, with_grad=True)


def grad_phi_data_jvp(theta: np.ndarray, dtheta: np.ndarray, G: np.ndarray, dG: np.ndarray,
                      data: AttentionData) -> np.ndarray:
    """The tangent of the gradient of :func:`grad_phi_data` as the query heads move along dtheta [Q, p] and
    the residual features along dG [B, T, d]: ``Hess_theta Phi_data(theta; G) dtheta + grad_theta
    Phi_data(theta; dG)`` [Q, p] (forward mode through the gradient pass,
    :func:`pdeflow.core.kernels_jvp.causal_attention_vjp_jvp`)."""
    return _evaluate(theta, G, data, with_grad=True, tangent=(dtheta, dG))[1]


def _sequence_parts(n_chunks: int, n_blocks: int) -> int:
    """Parts of the sequences per chunk of heads in the gradient pass: enough for GRADIENT_ITEMS items
    (chunks x parts), at most one per block of sequences; 1 for a single chunk (whose kernels split their work
    units over the threads instead). A function of the shape only, so results do not depend on the thread count."""
    if n_chunks == 1:
        return 1
    return int(max(1, min(n_blocks, -(-GRADIENT_ITEMS // n_chunks))))


# one function: the per-thread worker `run` closes over the chunk plan, the shared parts' sums and their lock, and
# its per-thread buffers are reused across items; splitting it would hand some twenty arrays to every block call
# on the kernels' hot path, where the profile (docs/performance.md) counts every Python-level call
def _evaluate(theta: np.ndarray, G: np.ndarray, data: AttentionData, with_grad: bool,
              tangent: tuple[np.ndarray, np.ndarray] | None = None):
    """Phi_data [Q] and (``with_grad``) its gradient [Q, p]; the threads' items are (chunk of heads, part of the
    sequences). With a ``tangent`` (dtheta, dG) the second value is the gradient's tangent
    (:func:`grad_phi_data_jvp`) instead of the gradient, and the first is not computed.

    A chunk's sums over the sequences (the WO gradient ``G^T c``, the weight gradient ``X^T dQKV`` or the
    kernel's sums S and R of the factored projections) are taken per part, blocks in order, and the parts
    added in their order by the thread that finishes a chunk's last part; that thread then writes the chunk's
    rows of Phi and of the gradient. With several parts per chunk the threads' items are small enough that
    the last ones leave little idle time at the end (:func:`_sequence_parts`: 16 chunks of 64 heads at the
    reference size, two parts each)."""
    B, T, d = data.shape
    dh = data.head_dim
    dtype = np.result_type(_dtype(theta, data), G.dtype)
    x = data.inputs.reshape(B * T, d).astype(dtype, copy=False)
    g = G.reshape(B * T, d).astype(dtype, copy=False)
    if tangent is not None:
        dtheta, gp = tangent[0], tangent[1].reshape(B * T, d).astype(dtype, copy=False)
    Q = theta.shape[0]
    s = dh * d
    plan = variant(data, dtype, Q)[0]
    n, bc = _blocks(data, np.dtype(dtype).itemsize, Q, plan)
    phi = np.empty(Q, dtype=dtype)
    grad = np.empty(theta.shape, dtype=dtype) if with_grad else None
    tile = _tile(dtype, plan)
    n_chunks = -(-Q // n)
    n_blocks = -(-B // bc)
    parts = _sequence_parts(n_chunks, n_blocks)
    # the weight gradient of the tables, E^T S + P^T R with S and R summed by the kernel, when the
    # projections are factored and there are several chunks (then every kernel call runs on one thread,
    # which summing needs, whatever the thread count); else X^T dQKV block by block
    tables_grad = with_grad and data.factored and n_chunks > 1
    finished: dict[int, list] = {}  # chunk -> its parts' sums, until the last part is done
    lock = threading.Lock()

    # one function: see _evaluate's note (the worker is the hot loop over a thread's items)
    def run(items: Iterator[int], kernel_threads: int) -> None:
        proj = _Projections(data, x, n, bc, dtype)
        c_buf = np.empty(bc * T * dh * n, dtype=dtype)
        wcat_buf = np.empty(d * 3 * dh * n, dtype=dtype)
        wo_buf = np.empty(d * dh * n, dtype=dtype)
        part_buf = np.empty(d * 3 * dh * n, dtype=dtype)  # a block's products before they are accumulated
        if with_grad:
            dqkv_buf = np.empty(bc * T * 3 * dh * n, dtype=dtype) if not tables_grad else None
            dc_buf = np.empty(bc * T * dh * n, dtype=dtype)
            dw_buf = np.empty(d * 3 * dh * n, dtype=dtype)
        if tangent is not None:  # the direction's projections and output weights, c', the cotangent's tangent
            dproj = _Projections(data, x, n, bc, dtype)
            dwcat_buf = np.empty(d * 3 * dh * n, dtype=dtype)
            dwo_buf = np.empty(d * dh * n, dtype=dtype)
            cp_buf = np.empty(bc * T * dh * n, dtype=dtype)
            ddc_buf = np.empty(bc * T * dh * n, dtype=dtype)
            ddc_part_buf = np.empty(bc * T * dh * n, dtype=dtype)

        def add_product(target: np.ndarray, left: np.ndarray, right: np.ndarray, first: bool) -> None:
            """target = left @ right (first) or target += left @ right."""
            if first:
                np.matmul(left, right, out=target)
            else:
                part = part_buf[:target.size].reshape(target.shape)
                np.matmul(left, right, out=part)
                target += part

        laid_out = -1  # the chunk whose weights proj, wo (and dproj, dwo) hold
        for item in items:
            chunk, k = divmod(item, parts)
            start = chunk * n
            stop = min(Q, start + n)
            m = stop - start
            wo = wo_buf[:d * dh * m].reshape(d, dh, m)  # wo[c, h, i] = WO_i[c, h]
            if chunk != laid_out:
                # a thread that takes the next part of the chunk it just did (on one thread: every part) keeps
                # the chunk's weights as they are laid out
                laid_out = chunk
                th = theta[start:stop].astype(dtype, copy=False)
                proj.chunk(_qkv_weights(th, d, dh, wcat_buf))
                wo[...] = split_theta(th, d, dh)[3].transpose(1, 2, 0)
                if tangent is not None:
                    dth = dtheta[start:stop].astype(dtype, copy=False)
                    dproj.chunk(_qkv_weights(dth, d, dh, dwcat_buf))
                    dwo = dwo_buf[:d * dh * m].reshape(d, dh, m)
                    dwo[...] = split_theta(dth, d, dh)[3].transpose(1, 2, 0)
            # this part's sums, kept until the chunk's last part is done: the gradient of Phi_data in WO,
            # g_c[c, (h, i)], and dw[c, (w, h, i)] = dW_w[i][h, c] or the kernel's S and R
            g_c = np.empty((d, dh * m), dtype=dtype)
            sums = [g_c]
            if tables_grad:
                S = np.zeros((data.embedding.shape[0], 3 * dh * m), dtype=dtype)
                R = np.zeros((T, 3 * dh * m), dtype=dtype)
                sums += [S, R]
            elif with_grad:
                dw_part = np.empty((d, 3 * dh * m), dtype=dtype)
                sums.append(dw_part)
            blocks = range(k * n_blocks // parts, (k + 1) * n_blocks // parts)
            for blk in blocks:
                b0 = blk * bc
                first = blk == blocks[0]
                nb = min(B, b0 + bc) - b0
                rows = slice(b0 * T, (b0 + nb) * T)
                c = c_buf[:nb * T * dh * m].reshape(nb * T, dh * m)
                projections = proj.block(b0, nb)
                shape4 = (nb, T, dh, m)
                if with_grad:
                    dc = dc_buf[:nb * T * dh * m].reshape(nb * T, dh * m)
                    np.matmul(g[rows], wo.reshape(d, dh * m), out=dc)
                    if tables_grad:
                        grows, gtable = S.reshape(-1, 3, dh, m), R.reshape(T, 3, dh, m)
                    else:
                        dqkv = dqkv_buf[:nb * T * 3 * dh * m].reshape(nb * T, 3 * dh * m)
                        grows, gtable = dqkv.reshape(nb * T, 3, dh, m), None
                if tangent is not None:
                    # the cotangent's tangent G' WO + G WO', the tangent context c' and (dq', dk', dv')
                    cp = cp_buf[:nb * T * dh * m].reshape(nb * T, dh * m)
                    ddc = ddc_buf[:nb * T * dh * m].reshape(nb * T, dh * m)
                    np.matmul(gp[rows], wo.reshape(d, dh * m), out=ddc)
                    ddc_part = ddc_part_buf[:nb * T * dh * m].reshape(nb * T, dh * m)
                    np.matmul(g[rows], dwo.reshape(d, dh * m), out=ddc_part)
                    ddc += ddc_part
                    kernels_jvp.causal_attention_vjp_jvp(*projections[:2], *dproj.block(b0, nb), dc.reshape(shape4),
                                                         ddc.reshape(shape4), data.score_scale, c.reshape(shape4),
                                                         cp.reshape(shape4), grows, gtable, tile, kernel_threads)
                elif with_grad:
                    kernels.causal_attention_vjp(*projections, dc.reshape(shape4), data.score_scale,
                                                 c.reshape(shape4), grows, gtable, tile, kernel_threads)
                else:
                    kernels.causal_attention(*projections, data.score_scale, c.reshape(shape4), tile, kernel_threads)
                # sums over the sequences: the part's first block writes, the next ones accumulate; with a tangent
                # the WO gradient's tangent G'^T c + G^T c'
                add_product(g_c, (g if tangent is None else gp)[rows].T, c, first)
                if tangent is not None:
                    add_product(g_c, g[rows].T, cp, False)
                if with_grad and not tables_grad:
                    add_product(dw_part, x[rows].T, dqkv, first)
            if parts > 1:
                with lock:
                    done = finished.setdefault(chunk, [None] * parts)
                    done[k] = sums
                    if any(p is None for p in done):
                        continue
                    del finished[chunk]
                # the parts' sums added in the order of the parts, whichever thread finished which
                sums = done[0]
                for other in done[1:]:
                    for total, more in zip(sums, other):
                        total += more
            g_c = sums[0]
            if tables_grad:
                dw = dw_buf[:d * 3 * dh * m].reshape(d, 3 * dh * m)
                np.matmul(proj.E.T, sums[1], out=dw)
                dw += proj.P.T @ sums[2]
            elif with_grad:
                dw = sums[1]
            g_c3 = g_c.reshape(d, dh, m)
            if tangent is None:
                phi[start:stop] = np.einsum("chi,chi->i", g_c3, wo)
            if with_grad:
                dw4 = dw.reshape(d, 3, dh, m)
                out_rows = grad[start:stop]
                for w in range(3):
                    out_rows[:, w * s:(w + 1) * s].reshape(m, dh, d)[...] = dw4[:, w].transpose(2, 1, 0)
                out_rows[:, 3 * s:].reshape(m, d, dh)[...] = g_c3.transpose(2, 0, 1)

    for_each_item(n_chunks * parts, num_threads(), run)
    return phi, grad
