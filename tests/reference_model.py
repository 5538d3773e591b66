"""A slow, independent pure-numpy oracle of the model, written from docs/model.md alone.

Nothing here imports :mod:`pdeflow`. The oracle takes the fixed arrays of a problem (embedding ``E``,
positions ``P``, unembedding ``U``, data ``tok, y, mask, w``, head width, score scale, weight decay and
the affine coordinate map ``theta = theta0 + Bm omega``) and evaluates, one head and one sequence at a
time, with an explicit ``T x T`` score matrix and causal mask:

- ``psi_l(x_b; theta)`` (docs/model.md "One head and its parameter layout"),
- logits ``z = sum_i m_i psi(theta(omega_i))``, the per-sequence loss and the risk ``R``,
- the energy ``E = R + (lam/2) sum_i m_i |omega_i|^2`` (no entropy term),
- the first variation ``Phi(q; rho)`` and its gradient in ``q``;
- the Hessian-vector product of ``Phi`` (rho frozen) and the whole-system JVP of the velocity field (heads
  and measure moved together), by complex step through the hand-written reverse pass
  (:meth:`ReferenceModel.hvp`, :meth:`ReferenceModel.velocity_jvp`; the former checked against
  Richardson-extrapolated central differences of the gradient, :meth:`ReferenceModel.hvp_central`);
- the free energy of a grid measure with the entropy term, cell by cell (:meth:`ReferenceModel.grid_free_energy`).

The gradient of ``Phi`` (:meth:`ReferenceModel.grad_phi`) is a hand-written reverse pass through one
head, sequence by sequence, in the order written below; it shares no code with the forward pass beyond
the attention matrix. It is itself validated against complex-step differentiation of the oracle's own
``Phi`` (:meth:`ReferenceModel.grad_phi_complex_step`), coordinate by coordinate, which is exact to
rounding (no subtractive cancellation; truncation error ``O(h^2)`` with ``h = 1e-40``): every function
here is analytic in the parameters (the softmax shift uses the real part only), so the same code runs on
complex128 inputs.
"""
from __future__ import annotations

import numpy as np


class ReferenceModel:
    """The model of docs/model.md on explicit arrays. ``basis=None`` means full coordinates (theta = omega)."""

    def __init__(self, E, P, U, tokens, targets, mask, weights, head_dim, score_scale=None,
                 weight_decay=0.0, theta0=None, basis=None):
        self.E = np.asarray(E, dtype=float)
        self.P = np.asarray(P, dtype=float)
        self.U = np.asarray(U, dtype=float)
        self.tokens = np.asarray(tokens, dtype=int)
        self.targets = np.asarray(targets, dtype=int)
        self.mask = np.asarray(mask, dtype=float)
        self.weights = np.asarray(weights, dtype=float)
        self.V, self.d = self.E.shape
        self.T = self.P.shape[0]
        self.dh = int(head_dim)
        self.p = 4 * self.d * self.dh
        self.scale = 1.0 / np.sqrt(self.dh) if not score_scale else float(score_scale)
        self.lam = float(weight_decay)
        self.basis = None if basis is None else np.asarray(basis, dtype=float)
        self.theta0 = np.zeros(self.p) if theta0 is None else np.asarray(theta0, dtype=float)
        self.k = self.p if self.basis is None else self.basis.shape[1]
        self.B = self.tokens.shape[0]

    @classmethod
    def from_arrays(cls, a: dict, **replace) -> ReferenceModel:
        """From a dictionary with the keys of ``Problem.arrays()`` (``replace`` overrides entries)."""
        a = {**a, **replace}
        return cls(a["embedding"], a["positions"], a["unembedding"], a["tokens"], a["targets"], a["mask"],
                   a["weights"], a["head_dim"], a["score_scale"], a["weight_decay"], a["theta0"], a.get("basis"))

    # ---- one head on one sequence ------------------------------------------------------------
    def inputs(self, b: int) -> np.ndarray:
        """``x[l] = E[tok[b, l]] + P[l]``: [T, d]."""
        X = np.zeros((self.T, self.d))
        for l in range(self.T):
            X[l] = self.E[self.tokens[b, l]] + self.P[l]
        return X

    def theta(self, omega: np.ndarray) -> np.ndarray:
        """``theta0 + Bm omega`` for one point omega [k] -> [p]."""
        if self.basis is None:
            return np.array(omega)
        return self.theta0 + self.basis @ omega

    def unpack(self, theta: np.ndarray):
        """Row-major (WQ, WK, WV, WO): WQ, WK, WV [dh, d], WO [d, dh]."""
        d, dh = self.d, self.dh
        size = d * dh
        WQ = theta[0:size].reshape(dh, d)
        WK = theta[size:2 * size].reshape(dh, d)
        WV = theta[2 * size:3 * size].reshape(dh, d)
        WO = theta[3 * size:4 * size].reshape(d, dh)
        return WQ, WK, WV, WO

    def attention(self, X: np.ndarray, WQ: np.ndarray, WK: np.ndarray):
        """Explicit T x T causal softmax: returns (A [T, T], Qm [T, dh], Km [T, dh])."""
        T = X.shape[0]
        Qm = X @ WQ.T
        Km = X @ WK.T
        S = self.scale * (Qm @ Km.T)               # S[l, j] = scale <WQ x_l, WK x_j>
        causal = np.tril(np.ones((T, T), dtype=bool))
        shift = np.max(np.where(causal, S.real, -np.inf), axis=1, keepdims=True)
        ex = np.where(causal, np.exp(np.where(causal, S - shift, 0.0)), 0.0)
        A = ex / ex.sum(axis=1, keepdims=True)
        return A, Qm, Km

    def head_feature(self, X: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """``psi_l = U WO c_l`` with ``c_l = sum_{j<=l} a[l, j] WV x_j``: [T, V]."""
        WQ, WK, WV, WO = self.unpack(theta)
        A, _, _ = self.attention(X, WQ, WK)
        Vm = X @ WV.T                               # [T, dh]
        C = A @ Vm                                  # [T, dh]
        O = C @ WO.T                                # [T, d]
        return O @ self.U.T                         # [T, V]

    # ---- measures ------------------------------------------------------------------------------
    def logits(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``z[b, l] = sum_i m_i psi_l(x_b; theta(omega_i))``: [B, T, V]."""
        omega = np.atleast_2d(omega)
        dtype = np.result_type(omega.dtype, np.asarray(mass).dtype, float)
        z = np.zeros((self.B, self.T, self.V), dtype=dtype)
        for b in range(self.B):
            X = self.inputs(b)
            for i in range(omega.shape[0]):
                z[b] += mass[i] * self.head_feature(X, self.theta(omega[i]))
        return z

    def sequence_losses(self, z: np.ndarray) -> np.ndarray:
        """``(1/|L_b|) sum_{l: mask=1} (logsumexp z[b, l] - z[b, l, y])``: [B]."""
        out = np.zeros(self.B, dtype=z.dtype)
        for b in range(self.B):
            total = 0.0
            for l in range(self.T):
                if self.mask[b, l] == 0:
                    continue
                row = z[b, l]
                shift = np.max(row.real)
                lse = shift + np.log(np.sum(np.exp(row - shift)))
                total = total + (lse - row[self.targets[b, l]])
            out[b] = total / self.mask[b].sum()
        return out

    def risk(self, omega: np.ndarray, mass: np.ndarray):
        return np.sum(self.weights * self.sequence_losses(self.logits(omega, mass)))

    def energy(self, omega: np.ndarray, mass: np.ndarray):
        omega = np.atleast_2d(omega)
        conf = 0.5 * self.lam * sum(mass[i] * np.sum(omega[i] * omega[i]) for i in range(omega.shape[0]))
        return self.risk(omega, mass) + conf

    def residuals(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        """``r[b, l] = softmax(z[b, l]) - onehot(y[b, l])``: [B, T, V]."""
        z = self.logits(omega, mass)
        r = np.zeros_like(z)
        for b in range(self.B):
            for l in range(self.T):
                row = z[b, l]
                e = np.exp(row - np.max(row.real))
                r[b, l] = e / e.sum()
                r[b, l, self.targets[b, l]] -= 1.0
        return r

    def _coef(self, b: int) -> float:
        return self.weights[b] / self.mask[b].sum()

    def phi_from_residuals(self, q: np.ndarray, r: np.ndarray):
        """``Phi(q) = sum_b w_b/|L_b| sum_{l: mask} <r[b, l], psi_l(x_b; theta(q))> + (lam/2)|q|^2``."""
        theta = self.theta(q)
        total = 0.0
        for b in range(self.B):
            psi = self.head_feature(self.inputs(b), theta)
            for l in range(self.T):
                if self.mask[b, l]:
                    total = total + self._coef(b) * np.sum(r[b, l] * psi[l])
        return total + 0.5 * self.lam * np.sum(q * q)

    def phi(self, q: np.ndarray, omega: np.ndarray, mass: np.ndarray):
        return self.phi_from_residuals(np.asarray(q), self.residuals(omega, mass))

    def grad_phi_from_residuals(self, q: np.ndarray, r: np.ndarray) -> np.ndarray:
        """Hand-written reverse pass of ``Phi`` through one head, per sequence; returns grad_omega [k]."""
        q = np.asarray(q)
        theta = self.theta(q)
        WQ, WK, WV, WO = self.unpack(theta)
        gQ, gK, gV, gO = (np.zeros_like(W, dtype=np.result_type(W.dtype, r.dtype)) for W in (WQ, WK, WV, WO))
        T = self.T
        for b in range(self.B):
            X = self.inputs(b)
            A, Qm, Km = self.attention(X, WQ, WK)
            Vm = X @ WV.T
            C = A @ Vm
            # Phi_b = sum_l <gout_l, WO c_l> with gout_l = coef mask_l U^T r_l  (d-vector)
            gout = np.zeros((T, self.d), dtype=np.result_type(r.dtype, theta.dtype))
            for l in range(T):
                if self.mask[b, l]:
                    gout[l] = self._coef(b) * (self.U.T @ r[b, l])
            gO += gout.T @ C                        # d Phi / d WO[m, h] = sum_l gout[l, m] C[l, h]
            dC = gout @ WO                          # [T, dh]
            dVm = A.T @ dC                          # c_l = sum_j A[l, j] Vm[j]
            dA = dC @ Vm.T                          # dA[l, j] = <dc_l, Vm_j>
            dS = np.zeros((T, T), dtype=dA.dtype)
            for l in range(T):
                a = A[l, :l + 1]
                g = dA[l, :l + 1]
                dS[l, :l + 1] = a * (g - np.dot(a, g))   # softmax Jacobian on the causal row
            dQm = self.scale * dS @ Km
            dKm = self.scale * dS.T @ Qm
            gV += dVm.T @ X
            gQ += dQm.T @ X
            gK += dKm.T @ X
        grad_theta = np.concatenate([gQ.ravel(), gK.ravel(), gV.ravel(), gO.ravel()])
        grad = grad_theta if self.basis is None else self.basis.T @ grad_theta
        return grad + self.lam * q

    def grad_phi(self, q: np.ndarray, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        return self.grad_phi_from_residuals(q, self.residuals(omega, mass))

    def grad_phi_complex_step(self, q: np.ndarray, omega: np.ndarray, mass: np.ndarray,
                              h: float = 1e-40) -> np.ndarray:
        """``d Phi / d q_a = Im Phi(q + i h e_a) / h``, coordinate by coordinate (exact to rounding)."""
        r = self.residuals(omega, mass)
        q = np.asarray(q, dtype=float)
        out = np.zeros(q.size)
        for a in range(q.size):
            qc = q.astype(complex)
            qc[a] += 1j * h
            out[a] = np.imag(self.phi_from_residuals(qc, r)) / h
        return out

    def feature_jacobian(self, b: int, omega: np.ndarray, h: float = 1e-40) -> np.ndarray:
        """``J[l] = d psi_l(x_b; theta(omega)) / d omega``: [T, V, k], by complex step."""
        X = self.inputs(b)
        J = np.zeros((self.T, self.V, self.k))
        for a in range(self.k):
            w = np.asarray(omega, dtype=complex).copy()
            w[a] += 1j * h
            J[:, :, a] = np.imag(self.head_feature(X, self.theta(w))) / h
        return J

    def translation_excess(self, omega: np.ndarray) -> np.ndarray:
        """``M = sum_b w_b/|L_b| sum_{l: mask} J^T (diag p - p p^T) J`` at ``rho = delta_omega``: [k, k]."""
        z = self.logits(np.atleast_2d(omega), np.ones(1))
        M = np.zeros((self.k, self.k))
        for b in range(self.B):
            J = self.feature_jacobian(b, omega)
            for l in range(self.T):
                if not self.mask[b, l]:
                    continue
                e = np.exp(z[b, l] - z[b, l].max())
                p = e / e.sum()
                M += self._coef(b) * J[l].T @ (np.diag(p) - np.outer(p, p)) @ J[l]
        return M

    # ---- second derivatives: complex step on the hand-written gradient -----------------------
    def hvp(self, q: np.ndarray, v: np.ndarray, omega: np.ndarray, mass: np.ndarray, h: float = 1e-40) -> np.ndarray:
        """``Hessian_q Phi(q; rho) v`` with rho frozen: ``Im grad Phi(q + i h v) / h`` (the reverse pass is
        analytic in q, so this is exact to rounding): [k]."""
        r = self.residuals(omega, mass)
        return np.imag(self.grad_phi_from_residuals(np.asarray(q, dtype=float) + 1j * h * np.asarray(v), r)) / h

    def velocity_jvp(self, omega: np.ndarray, mass: np.ndarray, u: np.ndarray, h: float = 1e-40) -> np.ndarray:
        """``d/ds grad Phi(omega_i + s u_i; rho_{omega + s u})`` at s = 0, heads and measure moved together:
        ``Im`` of the reverse pass at ``omega + i h u`` with the residuals of the complex measure, / h: [N, k]."""
        moved = np.atleast_2d(omega) + 1j * h * np.atleast_2d(u)
        r = self.residuals(moved, np.asarray(mass, dtype=float))
        return np.array([np.imag(self.grad_phi_from_residuals(w, r)) / h for w in moved])

    def hvp_central(self, q: np.ndarray, v: np.ndarray, omega: np.ndarray, mass: np.ndarray,
                    delta: float = 1e-3) -> np.ndarray:
        """The same product from real arithmetic only: central differences of the gradient at steps delta
        and delta/2, Richardson-extrapolated (truncation O(delta^4)): a check of :meth:`hvp` itself."""
        r = self.residuals(omega, mass)
        q, v = np.asarray(q, dtype=float), np.asarray(v, dtype=float)

        def central(s: float) -> np.ndarray:
            return (self.grad_phi_from_residuals(q + s * v, r) - self.grad_phi_from_residuals(q - s * v, r)) / (2 * s)
        return (4 * central(delta / 2) - central(delta)) / 3

    # ---- a grid measure --------------------------------------------------------------------------
    def grid_free_energy(self, centres: np.ndarray, masses: np.ndarray, cell_volume: float, beta: float) -> float:
        """``E = R + (lam/2) sum_c m_c |c|^2 + (1/beta) sum_c m_c log(m_c / |C|)`` for cell masses m_c at the
        cell centres [M, k] (``int rho log rho`` with ``rho_c = m_c / |C|``, ``0 log 0 = 0``; no entropy when
        beta = inf), summed cell by cell."""
        occupied = [c for c in range(len(masses)) if masses[c] > 0]
        energy = self.energy(np.asarray(centres)[occupied], np.asarray(masses)[occupied])
        if np.isinf(beta):
            return float(energy)
        entropy = 0.0
        for c in occupied:
            entropy += masses[c] * np.log(masses[c] / cell_volume)
        return float(energy + entropy / beta)
