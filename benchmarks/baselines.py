"""Reference implementations of grad Phi at the particles, for timing against pdeflow.

Both compute, for a measure of N heads with masses ``m_i``, the same numbers as
``Problem.grad_phi(omega, omega, mass)`` (docs/model.md): ``grad Phi(omega_i) = (1/m_i) d R / d omega_i +
lam omega_i``, where ``R`` is the risk of the mean-field logits.

- :class:`TorchModel`: the finite-head model written the way a PyTorch user would - projections as
  matrix products over all heads, ``scaled_dot_product_attention`` with ``is_causal=True`` for the core,
  cross-entropy, one ``backward()``. Float64 or float32; the thread count is whatever
  ``torch.set_num_threads`` was given.
- :func:`numpy_grad_phi`: plain numpy, batched over a chunk of heads with ``einsum``/``matmul`` and a
  hand-written backward pass (the T x T attention of a chunk is materialized).
"""
from __future__ import annotations

from typing import Any

import numpy as np


def _layer(arrays: dict[str, Any]):
    E, P = arrays["embedding"], arrays["positions"]
    x = E[arrays["tokens"]] + P[None, :, :]
    mask, w = arrays["mask"], arrays["weights"]
    lw = w[:, None] * mask / mask.sum(axis=1, keepdims=True)
    return x, lw


def _theta(arrays: dict[str, Any], omega: np.ndarray) -> np.ndarray:
    basis = arrays.get("basis")
    return omega if basis is None else arrays["theta0"] + omega @ basis.T


class TorchModel:
    """grad Phi by PyTorch autograd; ``torch`` is imported here (it is an optional dependency)."""

    def __init__(self, arrays: dict[str, Any], dtype: str = "float64") -> None:
        import torch

        self.torch = torch
        self.dtype = getattr(torch, dtype)
        x, lw = _layer(arrays)
        t = lambda a: torch.tensor(np.asarray(a), dtype=self.dtype)  # noqa: E731
        self.x, self.lw, self.U = t(x), t(lw), t(arrays["unembedding"])
        self.y = torch.tensor(np.asarray(arrays["targets"]), dtype=torch.int64)
        self.basis = None if arrays.get("basis") is None else t(arrays["basis"])
        self.theta0 = t(arrays["theta0"])
        self.dh = int(arrays["head_dim"])
        self.scale = float(arrays["score_scale"])
        self.lam = float(arrays["weight_decay"])

    def grad_phi(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        torch = self.torch
        om = torch.tensor(omega, dtype=self.dtype, requires_grad=True)
        m = torch.tensor(mass, dtype=self.dtype)
        theta = om if self.basis is None else self.theta0 + om @ self.basis.T
        B, T, d = self.x.shape
        N, dh = theta.shape[0], self.dh
        s = dh * d
        wq, wk, wv = (theta[:, i * s:(i + 1) * s].reshape(N * dh, d) for i in range(3))
        wo = theta[:, 3 * s:].reshape(N, d, dh)

        def heads(w):  # [B, T, d] @ [d, N dh] -> [B, N, T, dh]
            return (self.x @ w.T).reshape(B, T, N, dh).transpose(1, 2)

        c = torch.nn.functional.scaled_dot_product_attention(heads(wq), heads(wk), heads(wv), is_causal=True,
                                                             scale=self.scale)
        out = c.transpose(1, 2).reshape(B, T, N * dh) @ (wo * m[:, None, None]).transpose(1, 2).reshape(N * dh, d)
        z = out @ self.U.T
        lse = torch.logsumexp(z, dim=-1)
        zy = z.gather(-1, self.y[..., None])[..., 0]
        risk = (self.lw * (lse - zy)).sum()
        risk.backward()
        grad = om.grad / m[:, None] + self.lam * om.detach()
        return grad.numpy()


def numpy_grad_phi(arrays: dict[str, Any], omega: np.ndarray, mass: np.ndarray,
                   chunk_bytes: int = 256 * 2**20) -> np.ndarray:
    """grad Phi at the particles with numpy only: batched over chunks of heads, hand-written backward."""
    x, lw = _layer(arrays)
    U, y = arrays["unembedding"], arrays["targets"]
    theta = _theta(arrays, omega)
    B, T, d = x.shape
    N = theta.shape[0]
    dh = int(arrays["head_dim"])
    scale = float(arrays["score_scale"])
    s = dh * d
    n = int(max(1, min(N, chunk_bytes // (6 * B * T * T * 8))))
    causal = np.tril(np.ones((T, T), dtype=bool))

    def split(th):
        k = th.shape[0]
        return (th[:, :s].reshape(k, dh, d), th[:, s:2 * s].reshape(k, dh, d),
                th[:, 2 * s:3 * s].reshape(k, dh, d), th[:, 3 * s:].reshape(k, d, dh))

    def attention(wq, wk, wv):
        q = np.einsum("btd,nhd->bnth", x, wq, optimize=True)
        k = np.einsum("btd,nhd->bnth", x, wk, optimize=True)
        v = np.einsum("btd,nhd->bnth", x, wv, optimize=True)
        sc = np.where(causal, (q @ k.transpose(0, 1, 3, 2)) * scale, -np.inf)
        a = np.exp(sc - sc.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        return q, k, v, a, a @ v

    out = np.zeros((B, T, d))
    for i in range(0, N, n):
        wq, wk, wv, wo = split(theta[i:i + n])
        c = attention(wq, wk, wv)[4]
        out += np.einsum("bnth,ndh->btd", c, wo * mass[i:i + n, None, None], optimize=True)
    z = out @ U.T
    r = np.exp(z - z.max(axis=-1, keepdims=True))
    r /= r.sum(axis=-1, keepdims=True)
    np.put_along_axis(r, y[..., None], np.take_along_axis(r, y[..., None], axis=-1) - 1.0, axis=-1)
    G = (lw[..., None] * r) @ U
    grad = np.empty_like(theta)
    for i in range(0, N, n):
        wq, wk, wv, wo = split(theta[i:i + n])
        q, k, v, a, c = attention(wq, wk, wv)
        dc = np.einsum("btd,ndh->bnth", G, wo, optimize=True)
        d_wo = np.einsum("btd,bnth->ndh", G, c, optimize=True)
        da = dc @ v.transpose(0, 1, 3, 2)
        dv = a.transpose(0, 1, 3, 2) @ dc
        ds = a * (da - (a * da).sum(axis=-1, keepdims=True)) * scale
        dq = ds @ k
        dk = ds.transpose(0, 1, 3, 2) @ q
        d_w = [np.einsum("bnth,btd->nhd", g, x, optimize=True) for g in (dq, dk, dv)]
        m = d_w[0].shape[0]
        grad[i:i + n] = np.concatenate([g.reshape(m, -1) for g in d_w] + [d_wo.reshape(m, -1)], axis=1)
    basis = arrays.get("basis")
    if basis is not None:
        grad = grad @ basis
    return grad + float(arrays["weight_decay"]) * omega
