"""The certified minimum of Phi (k <= 3): a proven lower bound from a grid, Taylor bounds and refinement."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.problem import Problem
from .domain import Domain

GRID_BATCH = 8192            # query points per Phi call on the exhaustive grid
CERTIFY_BUDGET = 1 << 17     # evaluations of Phi and grad Phi the refinement of a certificate may spend
CERTIFY_TOL = 1e-9           # refinement stops once the certified minimum is this close (relative) to the found one


@dataclass(frozen=True)
class _BoundTerms:
    """What :func:`grad_phi_bound` needs of the problem and of rho: ``X = max |x_bj|``, ``A = sum_{b,l} |G_bl|``,
    the score scale, the spectral norms of the basis blocks of (WQ, WK, WV, WO) and the weight decay."""
    X: float
    A: float
    scale: float
    basis_norm: np.ndarray   # [4]
    weight_decay: float
    data: _DataTerms | None = None

    @classmethod
    def of(cls, problem: Problem, G: np.ndarray) -> _BoundTerms:
        a = problem.arrays()
        inputs = a["embedding"][a["tokens"]] + a["positions"][None, :, :]
        basis = a.get("basis")
        norms = np.ones(4) if basis is None else np.array(
            [np.linalg.norm(basis[blk], 2) if basis[blk].size else 0.0 for blk in _blocks_of(problem)])
        return cls(X=float(np.max(np.linalg.norm(inputs, axis=-1))),
                   A=float(np.sum(np.linalg.norm(np.asarray(G).real.astype(float), axis=-1))),
                   scale=abs(float(a["score_scale"])), basis_norm=norms, weight_decay=problem.weight_decay,
                   data=None if basis is None else _DataTerms.of(problem, G, inputs))


PAIR_CHUNK = 256             # query inputs per block of the (x_l, x_j) pairs in _DataTerms.of


@dataclass(frozen=True)
class _DataTerms:
    """What :func:`_data_bounds` needs: maxima over the distinct inputs x (rows of ``embedding[tokens] +
    positions``) and sums over the residual features G_bl, each split into the part at omega = 0 and the
    parts per coordinate (``theta(omega) = theta0 + sum_i omega_i B_i``; ``W0`` is theta0's block of W, ``W_i``
    the block of basis column i), so that a ball about any centre costs O(k):

    - scores ``s(omega) = s_c (WQ x_l) . (WK x_j)`` over all pairs of inputs: ``grad s(omega) = g_p + S_p omega``
      with ``(g_p)_i = s_c (Q_i x_l . K0 x_j + Q0 x_l . K_i x_j)``, ``(S_p)_ii' = s_c (Q_i x_l . K_i' x_j +
      Q_i' x_l . K_i x_j)``: ``u0 = max_p |g_p|``, ``u_i = max_p |S_p e_i|``, ``w2 = max_p |S_p|_F``;
    - values: ``v0 = max_x |V0 x|``, ``v_i = max_x |V_i x|``, ``dv = max_x (sum_i |V_i x|^2)^(1/2)``;
    - outputs: ``p0 = sum_bl |O0^T G_bl|``, ``p_i = sum_bl |O_i^T G_bl|``, ``q = sum_bl (sum_i |O_i^T G_bl|^2)^(1/2)``.
    """
    u0: float
    u: np.ndarray     # [k]
    w2: float
    v0: float
    v: np.ndarray     # [k]
    dv: float
    p0: float
    p: np.ndarray     # [k]
    q: float

    @classmethod
    def of(cls, problem: Problem, G: np.ndarray, inputs: np.ndarray) -> _DataTerms:
        a = problem.arrays()
        d, dh, k = problem.d, problem.head_dim, problem.k
        x = np.unique(np.asarray(inputs, dtype=float).reshape(-1, d), axis=0)              # [J, d]
        cols = np.concatenate([np.asarray(a["theta0"], dtype=float)[:, None], np.asarray(a["basis"], dtype=float)],
                              axis=1)                                                      # [p, 1 + k]
        wq, wk, wv = (cols[blk].T.reshape(k + 1, dh, d) for blk in _blocks_of(problem)[:3])
        wo = cols[_blocks_of(problem)[3]].T.reshape(k + 1, d, dh)
        q, kk, v = (np.einsum("iad,jd->jia", w, x) for w in (wq, wk, wv))                 # [J, 1 + k, dh]
        scale = float(a["score_scale"])
        u0, u, w2 = 0.0, np.zeros(k), 0.0
        for start in range(0, x.shape[0], PAIR_CHUNK):
            ql = q[start:start + PAIR_CHUNK]
            g = scale * (np.einsum("lia,ja->lji", ql[:, 1:], kk[:, 0]) + np.einsum("la,jia->lji", ql[:, 0], kk[:, 1:]))
            S = np.einsum("lia,jba->ljib", ql[:, 1:], kk[:, 1:])
            S = scale * (S + np.swapaxes(S, 2, 3))                                         # [l, J, k, k]
            u0 = max(u0, float(np.max(np.linalg.norm(g, axis=-1))))
            u = np.maximum(u, np.max(np.linalg.norm(S, axis=2), axis=(0, 1)))
            w2 = max(w2, float(np.max(np.linalg.norm(S, axis=(2, 3)))))
        vn = np.linalg.norm(v, axis=-1)                                                    # [J, 1 + k]
        Gr = np.asarray(G).real.astype(float).reshape(-1, d)
        on = np.linalg.norm(np.einsum("ida,nd->nia", wo, Gr), axis=-1)                     # [BT, 1 + k]
        return cls(u0=u0, u=u, w2=w2, v0=float(np.max(vn[:, 0])), v=np.max(vn[:, 1:], axis=0),
                   dv=float(np.max(np.linalg.norm(vn[:, 1:], axis=1))), p0=float(np.sum(on[:, 0])),
                   p=np.sum(on[:, 1:], axis=0), q=float(np.sum(np.linalg.norm(on[:, 1:], axis=1))))


def _blocks_of(problem: Problem) -> list[slice]:
    s = problem.d * problem.head_dim
    return [slice(0, s), slice(s, 2 * s), slice(2 * s, 3 * s), slice(3 * s, 4 * s)]


def _head_norms(problem: Problem, centre: np.ndarray) -> np.ndarray:
    """Frobenius norms of (WQ, WK, WV, WO) at ``centre`` [C, k]: [C, 4]."""
    theta = problem.coords.theta(np.asarray(centre, dtype=float))
    return np.stack([np.linalg.norm(theta[:, blk], axis=1) for blk in _blocks_of(problem)], axis=1)


def grad_phi_bound(problem: Problem, centre: np.ndarray, radius: np.ndarray, G: np.ndarray) -> np.ndarray:
    """An upper bound on ``|grad_omega Phi(x; rho)|`` over each ball ``|x - centre_c| <= radius_c``: [C, k], [C] -> [C].

    With ``Phi_data(theta) = sum_{b,l} <G_bl, WO c_bl>``, ``c_bl = sum_{j<=l} a_lj WV x_bj`` (docs/model.md; G
    holds the loss weights and the unembedding), ``X = max |x_bj|``, ``A = sum_{b,l} |G_bl|`` and ``s`` the
    score scale, the derivative along a unit direction e of omega, which moves ``(WQ, WK, WV, WO)`` by
    ``(B_Q e, B_K e, B_V e, B_O e)``, is at most

        ``A [ X |WV| |B_O| + |WO| ( X |B_V| + 2 |s| X^3 |WV| (|WK| |B_Q| + |WQ| |B_K|) ) ] + lam |omega|``:

    ``|c| <= |WV| X`` (a convex combination); the softmax derivative gives
    ``sum_j da_j V_j = sum_j a_j ds_j (V_j - sum_i a_i V_i)``, at most ``max_j |ds_j| 2 |WV| X``, with
    ``|ds_j| <= |s| X^2 (|dWQ| |WK| + |WQ| |dWK|)``. Matrix norms are Frobenius (they bound the spectral
    ones), ``|B_W|`` the spectral norm of W's rows of the basis (1 in full coordinates), and over a ball
    ``|W(x)| <= |W(centre)| + |B_W| radius``. The bound holds for every rho (it uses only G). In reduced
    coordinates the result is the least of this and the data bound of :func:`_data_bounds` (maxima over the
    actual inputs and sums over the actual G_bl instead of products of norms; measured ~160x tighter on the
    Hessian of data/configs/wfr.toml's final measure), both proven.
    """
    return _derivative_bounds(_BoundTerms.of(problem, G), problem, np.atleast_2d(np.asarray(centre, dtype=float)),
                              np.asarray(radius, dtype=float))[0]


def _rounding(t: _BoundTerms, problem: Problem, centre: np.ndarray, phi: np.ndarray, n_terms: int) -> np.ndarray:
    """A bound on the float64 rounding error of Phi at ``centre`` [C, k]: ``(n + 16) eps`` times the sum of the
    magnitudes summed (each data term ``|<G_bl, WO c_bl>| <= |G_bl| |WO| |WV| X``; ``lam |omega|^2 / 2``)."""
    _, _, wv, wo = _head_norms(problem, centre).T
    magnitude = np.abs(phi) + t.A * t.X * wv * wo + 0.5 * t.weight_decay * np.einsum("ck,ck->c", centre, centre)
    return (n_terms + 16) * np.finfo(float).eps * magnitude


def hess_phi_bound(problem: Problem, centre: np.ndarray, radius: np.ndarray, G: np.ndarray) -> np.ndarray:
    """An upper bound on ``|e^T Hess_omega Phi(x; rho) e|`` over unit e and each ball ``|x - centre_c| <= radius_c``:
    [C, k], [C] -> [C].

    Along a line ``theta = theta(x) + tau B e`` (notation of :func:`grad_phi_bound`; ``d`` is ``d/dtau``):
    ``d^2 Phi_data = sum_{b,l} <G_bl, 2 dWO dc_bl + WO d^2 c_bl>`` with ``dc = sum_j da_j V_j + sum_j a_j dWV x_j``
    and ``d^2 c = sum_j d^2 a_j V_j + 2 sum_j da_j dWV x_j``. With ``S1 = |s| X^2 (|B_Q| |WK| + |WQ| |B_K|)``
    bounding ``|ds_j|`` and ``S2 = 2 |s| X^2 |B_Q| |B_K|`` bounding ``|d^2 s_j|``, the softmax derivatives
    ``da_j = a_j (ds_j - <ds>)``, ``d^2 a_j = a_j ((ds_j - <ds>)^2 - var(ds) + d^2 s_j - <d^2 s>)`` (means under
    a) give ``|dc| <= 2 S1 |WV| X + |B_V| X`` and ``|d^2 c| <= 2 |WV| X (2 S1^2 + 2 S2) + 4 S1 |B_V| X``, so

        ``|d^2 Phi| <= A (2 |B_O| |dc| + |WO| |d^2 c|) + lam``. Reduced coordinates: the least of this and
    :func:`_data_bounds`.
    """
    return _derivative_bounds(_BoundTerms.of(problem, G), problem, np.atleast_2d(np.asarray(centre, dtype=float)),
                              np.asarray(radius, dtype=float))[1]


def _data_bounds(t: _DataTerms, centre: np.ndarray, radius: np.ndarray,
                 weight_decay: float) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on ``|d Phi|`` and ``|d^2 Phi|`` along unit directions over balls, from the data (:class:`_DataTerms`):
    ([C], [C]).

    On the ball ``|x - centre| <= r``, ``|x_i| <= a_i = |centre_i| + r``. With ``u_j = ds_j``, ``v_j = d^2 s_j``
    (``d = d/dtau`` along ``x + tau e``, |e| = 1) the triangle inequality on ``grad s(x) = g_p + sum_i x_i S_p e_i``
    gives ``|u_j| <= U = u0 + sum_i a_i u_i`` and ``|v_j| = |e^T S_p e| <= w2``; likewise ``|V_j| <= Vm =
    v0 + sum_i a_i v_i``, ``|dV_j| = |sum_i e_i V_i x_j| <= dv`` (Cauchy-Schwarz), ``sum_bl |WO(x)^T G_bl| <=
    P = p0 + sum_i a_i p_i`` and ``sum_bl |dWO^T G_bl| <= q``. For a convex combination ``a`` (the softmax) and
    ``ubar = sum_j a_j u_j``: ``sum_j a_j |u_j - ubar| <= var(u)^(1/2) <= U`` and ``var(u) <= U^2``. With
    ``da_j = a_j (u_j - ubar)``, ``d^2 a_j = a_j ((u_j - ubar)^2 - var(u) + v_j - vbar)``,
    ``sum_j a_j |(u_j - ubar)^2 - var(u)| <= 2 var(u)`` and ``sum_j a_j |v_j - vbar| <= 2 w2``:

        ``|dc| <= U Vm + dv``,  ``|d^2 c| <= Vm (2 U^2 + 2 w2) + 2 U dv``,

    and since WO is affine (``d^2 WO = 0``), ``d Phi = sum_bl <G_bl, dWO c + WO dc> + lam <x, e>``,
    ``d^2 Phi = sum_bl <G_bl, 2 dWO dc + WO d^2 c> + lam``:

        ``|d Phi| <= q Vm + P |dc| + lam (|centre| + r)``,   ``|d^2 Phi| <= 2 q |dc| + P |d^2 c| + lam``.
    """
    a = np.abs(centre) + radius[:, None]
    U, Vm, P = t.u0 + a @ t.u, t.v0 + a @ t.v, t.p0 + a @ t.p
    dc = U * Vm + t.dv
    d2c = Vm * (2.0 * U * U + 2.0 * t.w2) + 2.0 * U * t.dv
    grad = t.q * Vm + P * dc + weight_decay * (np.linalg.norm(centre, axis=1) + radius)
    return grad, 2.0 * t.q * dc + P * d2c + weight_decay


def _derivative_bounds(t: _BoundTerms, problem: Problem, centre: np.ndarray,
                       radius: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bounds of :func:`grad_phi_bound` and :func:`hess_phi_bound` over balls: ([C], [C]); the least of the
    norm bounds below and (reduced coordinates) the data bounds of :func:`_data_bounds`, both proven."""
    wq, wk, wv, wo = (_head_norms(problem, centre) + t.basis_norm * radius[:, None]).T
    bq, bk, bv, bo = t.basis_norm
    X = t.X
    s1 = t.scale * X ** 2 * (bq * wk + wq * bk)        # |ds_j|
    s2 = 2.0 * t.scale * X ** 2 * bq * bk              # |d^2 s_j|
    dc = 2.0 * s1 * wv * X + bv * X
    d2c = 2.0 * wv * X * (2.0 * s1 ** 2 + 2.0 * s2) + 4.0 * s1 * bv * X
    grad = t.A * (X * wv * bo + wo * dc) + t.weight_decay * (np.linalg.norm(centre, axis=1) + radius)
    hess = t.A * (2.0 * bo * dc + wo * d2c) + t.weight_decay
    if t.data is None:
        return grad, hess
    grad_data, hess_data = _data_bounds(t.data, centre, radius, t.weight_decay)
    return np.minimum(grad, grad_data), np.minimum(hess, hess_data)


def _float64(problem: Problem) -> Problem:
    """The problem evaluated in float64 (a certificate needs float64 rounding)."""
    return problem if problem.dtype == np.float64 else Problem.from_arrays(problem.arrays(), "float64", problem.beta)


def certified_min_phi(problem: Problem, G: np.ndarray, dom: Domain, points: int, found: float,
                      budget: int = CERTIFY_BUDGET) -> tuple[float, int]:
    """A proven lower bound on ``min_Omega Phi(.; rho)``: ``(bound, evaluations of Phi and grad Phi spent)``.

    The boxes of half-widths ``h/2`` about the points of the regular grid of ``points`` per axis (h the
    spacing) cover the bounding box of Omega. On a box of half-widths ``w`` about c, Taylor's theorem gives
    ``Phi(x) >= Phi(c) - sum_i |dPhi/domega_i(c)| w_i - M |w|^2 / 2 - (rounding)`` with M from
    :func:`hess_phi_bound` over the ball of radius ``|w|`` and the float64 rounding of Phi and grad Phi
    (``(B T d + 16) eps`` times the magnitudes summed). Boxes whose bound lies below ``found`` (the least Phi
    found in Omega) by more than CERTIFY_TOL relative are split into 2^k children, worst first, while
    ``budget`` evaluations last (near a minimizer the slack falls fourfold per split, so the work per halving
    stays about constant); boxes that miss Omega are dropped. The least bound over the boxes is the
    certificate: it holds whatever the budget, which only decides how close it gets to ``found``.
    """
    problem = _float64(problem)
    G = np.asarray(G).astype(np.float64, copy=False)
    k = dom.k
    mesh, _ = dom.grid(points)
    half = (dom.upper - dom.lower) / max(points - 1, 1) / 2.0
    halves = np.tile(half, (mesh.shape[0], 1))
    keep = _meets(dom, mesh, halves)
    centre, halves = mesh[keep], halves[keep]
    terms, n_terms = _BoundTerms.of(problem, G), int(np.asarray(G).size)
    tol = CERTIFY_TOL * (1.0 + abs(found))

    def lower(c: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The lower bounds of Phi over the boxes, and Phi at their centres."""
        p, g = _grad_phi_batched(problem, G, c)
        r = np.linalg.norm(w, axis=1)
        slope, curvature = _derivative_bounds(terms, problem, c, r)
        rounding = _rounding(terms, problem, c, p, n_terms) + (n_terms + 16) * np.finfo(float).eps * slope * r
        return p - np.sum(np.abs(g) * w, axis=1) - 0.5 * curvature * r * r - rounding, p

    low, phi = lower(centre, halves)
    spent = centre.shape[0]
    inside = ~dom.outside(centre)
    target = min(found, float(np.min(phi[inside])) if inside.any() else math.inf) - tol
    children = np.array(np.meshgrid(*([[-0.5, 0.5]] * k), indexing="ij")).reshape(k, -1).T   # [2^k, k]
    while spent < budget:
        bad = np.flatnonzero(low < target)
        if bad.size == 0:
            break
        bad = bad[np.argsort(low[bad], kind="stable")][:max(1, (budget - spent) // children.shape[0])]
        c_new = (centre[bad, None, :] + children[None, :, :] * halves[bad, None, :]).reshape(-1, k)
        w_new = np.repeat(halves[bad] / 2.0, children.shape[0], axis=0)
        ok = _meets(dom, c_new, w_new)
        c_new, w_new = c_new[ok], w_new[ok]
        l_new, p_new = lower(c_new, w_new)
        spent += c_new.shape[0]
        inside = ~dom.outside(c_new)
        if inside.any():
            target = min(target, float(np.min(p_new[inside])) - tol)
        rest = np.ones(centre.shape[0], dtype=bool)
        rest[bad] = False
        centre, halves = np.concatenate([centre[rest], c_new]), np.concatenate([halves[rest], w_new])
        low = np.concatenate([low[rest], l_new])
    return float(np.min(low)) if low.size else math.inf, spent


def _meets(dom: Domain, centre: np.ndarray, half: np.ndarray) -> np.ndarray:
    """Boxes about ``centre`` [C, k] of half-widths ``half`` [C, k] that meet Omega: [C] bool."""
    if dom.kind == "box":
        mid, width = (dom.upper + dom.lower) / 2.0, (dom.upper - dom.lower) / 2.0
        return np.all(np.abs(centre - mid) <= width + half, axis=1)
    nearest = np.maximum(np.abs(centre) - half, 0.0)       # the box's point nearest the origin
    return np.linalg.norm(nearest, axis=1) <= dom.radius


def _phi_batched(problem: Problem, G: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], GRID_BATCH):
        out[start:start + GRID_BATCH] = problem.phi_field(x[start:start + GRID_BATCH], G)
    return out


def _grad_phi_batched(problem: Problem, G: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    phi, grad = np.empty(x.shape[0]), np.empty(x.shape)
    for start in range(0, x.shape[0], GRID_BATCH):
        rows = slice(start, start + GRID_BATCH)
        phi[rows], grad[rows] = problem.grad_phi_field(x[rows], G)
    return phi, grad
