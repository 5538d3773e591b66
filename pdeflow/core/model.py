"""The fixed parts of the attention layer and the map omega -> theta (docs/model.md, "Data" to
"Reduced coordinates and the families").

Shapes: ``V`` vocabulary, ``T`` sequence length, ``d`` model width, ``dh`` head width,
``p = 4 d dh`` parameters of one head, ``k`` reduced coordinates.

One head's parameters ``theta = (WQ, WK, WV, WO)`` - ``WQ, WK, WV`` of shape (dh, d), ``WO`` of shape
(d, dh) - are flattened row-major in that order. Reduced coordinates: ``theta(omega) = theta0 + basis @ omega``.

Named families (each fixed direction is a seeded Gaussian matrix of Frobenius norm ``family_scale``):

- ``output_gain`` (k = 1): ``WQ = Q0, WK = K0, WV = V0`` fixed, ``WO = omega_1 O0``. The head feature is
  linear in omega, so the risk is convex along the family.
- ``gain2`` (k = 2): ``WQ = omega_1 Q0`` (attention sharpness: the scores are linear in omega_1),
  ``WK = K0, WV = V0``, ``WO = omega_2 O0`` (output gain).
- ``gain3`` (k = 3): as ``gain2`` with a second output direction, ``WO = omega_2 O0 + omega_3 O1``.
- ``basis_file``: a user ``.npz`` file with ``basis`` [p, k] and optionally ``theta0`` [p].
- ``full``: k = p, ``basis = I``, ``theta0 = 0`` (stored as ``basis = None``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import ConfigError, ModelConfig


@dataclass(frozen=True)
class Coordinates:
    """The affine map ``theta = theta0 + basis @ omega``; ``basis is None`` means full coordinates."""
    theta0: np.ndarray          # [p]
    basis: np.ndarray | None    # [p, k] or None
    k: int

    def theta(self, omega: np.ndarray) -> np.ndarray:
        """[N, k] -> [N, p]."""
        if self.basis is None:
            return omega
        return self.theta0 + omega @ self.basis.T

    def pullback(self, grad_theta: np.ndarray) -> np.ndarray:
        """``grad_omega = grad_theta @ basis``: [N, p] -> [N, k]."""
        if self.basis is None:
            return grad_theta
        return grad_theta @ self.basis


def n_params(d: int, dh: int) -> int:
    """p = 4 d dh: the length of one head's flattened (WQ, WK, WV, WO)."""
    return 4 * d * dh


def split_theta(theta: np.ndarray, d: int, dh: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[N, p] -> WQ, WK, WV [N, dh, d] and WO [N, d, dh] (views, row-major docs/model.md order)."""
    n, s = theta.shape[0], dh * d
    return (theta[:, :s].reshape(n, dh, d), theta[:, s:2 * s].reshape(n, dh, d),
            theta[:, 2 * s:3 * s].reshape(n, dh, d), theta[:, 3 * s:].reshape(n, d, dh))


def join_theta(wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, wo: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_theta`: [N, dh, d] x3 and [N, d, dh] -> [N, p]."""
    n = wq.shape[0]
    return np.concatenate([wq.reshape(n, -1), wk.reshape(n, -1), wv.reshape(n, -1), wo.reshape(n, -1)], axis=1)


def token_width(cfg: ModelConfig, seq_len: int) -> int:
    """Columns of the model width used by tokens (onehot positions take the last T)."""
    return cfg.d - seq_len if cfg.positions == "onehot" else cfg.d


def make_tables(cfg: ModelConfig, vocab_size: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Embedding E [V, d], positional table P [T, d] and unembedding U [V, d].

    ``onehot`` tokens: ``E[v] = e_v`` (needs token width >= V); ``gaussian``: entries N(0, 1/d).
    ``sinusoidal`` positions are added to every column (the transformer table); ``onehot`` positions
    occupy the last T columns, tokens the first d - T (the concatenating layout of docs/model.md).
    Unembedding ``tied``: U = E; ``identity``: U = [I_V | 0]; ``gaussian``: N(0, 1/d); ``zero``: U = 0
    (switches the data term off: Phi is then the weight decay alone).
    """
    V, T, d = vocab_size, seq_len, cfg.d
    dt = token_width(cfg, T)
    rng = np.random.default_rng([cfg.family_seed, 1])
    E = np.zeros((V, d))
    if cfg.embedding == "onehot":
        if dt < V:
            what = "model.d - task.seq_len" if cfg.positions == "onehot" else "model.d"
            raise ConfigError(f"model.embedding = 'onehot' needs {what} >= vocabulary size {V}, got {dt}")
        E[:, :V] = np.eye(V)
    else:
        E[:, :dt] = rng.normal(0.0, 1.0 / np.sqrt(d), size=(V, dt))
    P = np.zeros((T, d))
    if cfg.positions == "sinusoidal":
        pos = np.arange(T)[:, None]
        i = np.arange(d)[None, :]
        angle = pos / 10000.0 ** (2 * (i // 2) / d)
        P = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    elif cfg.positions == "onehot":
        P[:, dt:] = np.eye(T)
    if cfg.unembedding == "tied":
        U = E.copy()
    elif cfg.unembedding == "identity":
        if d < V:
            raise ConfigError(f"model.unembedding = 'identity' needs model.d >= vocabulary size {V}, got {d}")
        U = np.zeros((V, d))
        U[:, :V] = np.eye(V)
    elif cfg.unembedding == "gaussian":
        U = rng.normal(0.0, 1.0 / np.sqrt(d), size=(V, d))
    else:
        U = np.zeros((V, d))
    return E, P, U


def _direction(rng: np.random.Generator, shape: tuple[int, int], norm: float) -> np.ndarray:
    m = rng.normal(size=shape)
    return m * (norm / np.linalg.norm(m))


def make_coordinates(cfg: ModelConfig, base: Path | None = None) -> Coordinates:
    """The reduced-coordinate map of ``cfg.coordinates`` (see the module docstring)."""
    d, dh = cfg.d, cfg.head_dim
    p = n_params(d, dh)
    if cfg.coordinates == "full":
        return Coordinates(theta0=np.zeros(p), basis=None, k=p)
    if cfg.coordinates == "basis_file":
        path = Path(cfg.basis_path)
        if not path.is_absolute() and base is not None:
            path = base / path
        try:
            with np.load(path, allow_pickle=False) as f:
                basis = np.asarray(f["basis"], dtype=float)
                theta0 = np.asarray(f["theta0"], dtype=float) if "theta0" in f.files else np.zeros(p)
        except FileNotFoundError:
            raise ConfigError(f"model.basis_path: file {str(path)!r} does not exist") from None
        except KeyError:
            raise ConfigError(f"model.basis_path: {str(path)!r} has no array 'basis'") from None
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.basis_path: {str(path)!r} is not a readable .npz file "
                              f"({exc.__class__.__name__})") from None
        if basis.ndim != 2 or basis.shape[0] != p or basis.shape[1] < 1:
            raise ConfigError(f"model.basis_path: 'basis' must have shape [p = 4 d dh = {p}, k], "
                              f"got {list(basis.shape)}")
        if theta0.shape != (p,):
            raise ConfigError(f"model.basis_path: 'theta0' must have shape [{p}], got {list(theta0.shape)}")
        if not (np.all(np.isfinite(basis)) and np.all(np.isfinite(theta0))):
            raise ConfigError(f"model.basis_path: {str(path)!r} holds non-finite values")
        return Coordinates(theta0=theta0, basis=basis, k=basis.shape[1])
    rng = np.random.default_rng([cfg.family_seed, 2])
    s = cfg.family_scale
    q0, k0, v0 = (_direction(rng, (dh, d), s) for _ in range(3))
    o0, o1 = (_direction(rng, (d, dh), s) for _ in range(2))
    z_in, z_out = np.zeros((dh, d)), np.zeros((d, dh))

    def vec(wq, wk, wv, wo):
        return join_theta(wq[None], wk[None], wv[None], wo[None])[0]

    if cfg.coordinates == "output_gain":
        theta0 = vec(q0, k0, v0, z_out)
        cols = [vec(z_in, z_in, z_in, o0)]
    else:
        theta0 = vec(z_in, k0, v0, z_out)
        cols = [vec(q0, z_in, z_in, z_out), vec(z_in, z_in, z_in, o0)]
        if cfg.coordinates == "gain3":
            cols.append(vec(z_in, z_in, z_in, o1))
    basis = np.stack(cols, axis=1)
    return Coordinates(theta0=theta0, basis=basis, k=basis.shape[1])
