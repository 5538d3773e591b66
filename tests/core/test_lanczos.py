"""The one Lanczos (:mod:`pdeflow.core.lanczos`): Ritz pairs against a dense ``eigh`` of the projected matrix, the
run that grows until enough, the refusal of an empty start, and the warm-or-cold start policy of every top-pair
estimate."""
from __future__ import annotations

import numpy as np
import pytest

from pdeflow.core.lanczos import StartPolicy, krylov_ritz, top_ritz, warm_or_cold_top


def complement(Q: np.ndarray) -> np.ndarray:
    """An orthonormal basis [n, n - r] of the orthogonal complement of the orthonormal columns of Q [n, r]."""
    n, r = Q.shape
    return np.linalg.qr(np.concatenate([Q, np.eye(n)], axis=1))[0][:, r:n]


def test_krylov_ritz_equals_eigh_of_the_projected_matrix():
    """On a full Krylov space the Ritz pairs are the eigenpairs of Pi A Pi on the complement of the projected
    directions, with residuals at rounding; on a short one the ends converge first and every residual is the
    true |C x - theta x|; top_ritz is its last pair."""
    rng = np.random.default_rng(0)
    n, r = 40, 3
    A = rng.standard_normal((n, n))
    A = A + A.T
    Q = np.linalg.qr(rng.standard_normal((n, r)))[0]

    def project(x):
        return x - Q @ (Q.T @ x)

    calls = []

    def apply(x):
        calls.append(1)
        return A @ x

    pairs = krylov_ritz(apply, rng.standard_normal(n), n - r, project)
    assert len(calls) == n - r
    expected = np.linalg.eigvalsh(complement(Q).T @ A @ complement(Q))
    np.testing.assert_allclose(pairs.values, expected, atol=1e-11 * np.abs(expected).max())
    assert pairs.residuals.max() <= 1e-10 * np.abs(expected).max()
    np.testing.assert_allclose(pairs.vectors.T @ pairs.vectors, np.eye(n - r), atol=1e-12)
    assert np.abs(Q.T @ pairs.vectors).max() <= 1e-12

    short = krylov_ritz(A.__matmul__, rng.standard_normal(n), 15, project)
    C = A - Q @ (Q.T @ A) - (A @ Q) @ Q.T + Q @ (Q.T @ A @ Q) @ Q.T
    true = np.linalg.norm(C @ short.vectors - short.vectors * short.values, axis=0)
    np.testing.assert_allclose(short.residuals, true, rtol=1e-8, atol=1e-12)
    assert short.values[0] >= expected[0] - 1e-12 and short.values[-1] <= expected[-1] + 1e-12  # interlacing
    theta, x = top_ritz(A.__matmul__, np.arange(n, dtype=float), 12, project)
    again = krylov_ritz(A.__matmul__, np.arange(n, dtype=float), 12, project)
    assert theta == again.values[-1] and np.array_equal(x, again.vectors[:, -1])


def test_krylov_ritz_grows_until_enough_and_stops_there():
    """With check_every and enough, the run offers its Ritz pairs every check_every steps and ends at the first
    accepted: the products stop there, and the pairs are those of a run asked for that many steps from the same
    start (the same Lanczos basis), so the lowest Ritz value is the interlacing bound it would be."""
    rng = np.random.default_rng(1)
    n = 60
    A = np.diag(np.concatenate([[1e-3, 2e-3], np.linspace(1.0, 100.0, n - 2)]))
    start = rng.standard_normal(n)
    offered, calls = [], []

    def apply(x):
        calls.append(1)
        return A @ x

    def enough(pairs):
        offered.append(pairs.values.size)
        return bool(pairs.residuals[0] <= 1e-6 * pairs.values[-1])

    grown = krylov_ritz(apply, start, n, check_every=5, enough=enough)
    assert offered == list(range(5, len(calls) + 1, 5)) and len(calls) < n and grown.values.size == len(calls)
    assert grown.residuals[0] <= 1e-6 * 100.0 and abs(grown.values[0] - 1e-3) <= grown.residuals[0]
    fixed = krylov_ritz(A.__matmul__, start, len(calls))
    np.testing.assert_allclose(grown.values, fixed.values, rtol=0, atol=1e-12)
    ignored = krylov_ritz(A.__matmul__, start, 12, check_every=0, enough=lambda pairs: True)
    assert ignored.values.size == 12


def test_krylov_ritz_refuses_a_start_with_nothing_left_after_the_projection():
    """A start vector inside the projected-out space leaves no Krylov space: a ValueError, not NaN Ritz values."""
    n = 6
    A = np.diag(np.arange(1.0, n + 1))
    e0 = np.eye(n)[:, 0]

    def project(v: np.ndarray) -> np.ndarray:
        return v - e0 * (e0 @ v)

    with pytest.raises(ValueError, match="no \\(finite\\) component"):
        krylov_ritz(A.__matmul__, e0, 3, project)
    with pytest.raises(ValueError):
        krylov_ritz(A.__matmul__, np.full(n, np.nan), 3)


def test_warm_or_cold_top_follows_its_policy():
    """Cold (no start, or one of another size): the top Ritz pair from the policy's seeded random vector with its
    cold dimension; warm: from the start with the warm dimension; a warm start with nothing left after the
    projection raises unless the policy falls back to cold."""
    rng = np.random.default_rng(3)
    n = 30
    A = np.diag(np.linspace(1.0, 50.0, n))
    policy = StartPolicy(warm=3, cold=9, seed=7)
    calls = []

    def apply(x):
        calls.append(1)
        return A @ x

    cold = warm_or_cold_top(apply, n, None, policy)
    assert len(calls) == 9
    expected = top_ritz(A.__matmul__, np.random.default_rng(7).standard_normal(n), 9)
    assert cold[0] == expected[0] and np.array_equal(cold[1], expected[1])
    assert warm_or_cold_top(A.__matmul__, n, np.ones(n + 1), policy)[0] == expected[0]
    calls.clear()
    start = rng.standard_normal(n)
    warm = warm_or_cold_top(apply, n, start, policy)
    assert len(calls) == 3 and warm[0] == top_ritz(A.__matmul__, start, 3)[0]
    e0 = np.eye(n)[:, 0]

    def project(v):
        return v - e0 * (e0 @ v)

    with pytest.raises(ValueError):
        warm_or_cold_top(A.__matmul__, n, e0, policy, project)
    fallen = warm_or_cold_top(A.__matmul__, n, e0, StartPolicy(3, 9, 7, fall_back=True), project)
    assert fallen[0] == top_ritz(A.__matmul__, np.random.default_rng(7).standard_normal(n), 9, project)[0]
