"""The forward-mode whole-system Jacobian-vector product (Problem.system_jvp, pdeflow/core/kernels_jvp.py) against
independent references: the complex step through the reverse pass (Problem.system_jvp_complex_step), central
differences of grad Phi in real arithmetic, the symmetry of the Hessian in the mass-weighted inner product, the
oracle (tests/core/test_oracle_coverage.py), on every path of the evaluation - kernel tiles and chunks of heads, blocks
of sequences, factored and direct projections, random bases, non-uniform masses and masks, float32 and thread counts
(1 and 2 numba threads: tests/core/test_core.py, test_results_do_not_depend_on_thread_count; two MPI ranks:
tests/core/test_mpi.py, test_problem_on_two_ranks_equals_the_serial_problem)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import random_arrays, random_measure, rel_err
from pdeflow.core import kernels, kernels_jvp, mean_field
from pdeflow.core.problem import Problem

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def central_jvp(problem: Problem, omega: np.ndarray, mass: np.ndarray, u: np.ndarray, delta: float = 1e-3):
    """grad Phi(omega + s u; rho_{omega + s u}) differentiated by central differences at steps delta and delta / 2,
    Richardson-extrapolated (truncation O(delta^4)), real arithmetic only."""
    def central(s: float) -> np.ndarray:
        plus, minus = omega + s * u, omega - s * u
        return (problem.grad_phi(plus, plus, mass) - problem.grad_phi(minus, minus, mass)) / (2 * s)
    return (4 * central(delta / 2) - central(delta)) / 3


@pytest.mark.parametrize("k", [None, 5], ids=["full", "random-basis"])
@pytest.mark.parametrize("factored", [True, False], ids=["factored", "direct"])
def test_system_jvp_matches_complex_step_and_central_differences(k, factored):
    """Random tables, masks with zeros, non-uniform sequence weights and masses, 7 heads: the forward mode equals
    the complex step to rounding and Richardson-extrapolated central differences of the real grad Phi to their
    truncation; it is linear in the direction and exactly zero for a zero direction."""
    rng = np.random.default_rng(71 if k is None else 72)
    arrays = random_arrays(rng, V=3, T=5, d=4, dh=3, B=12, k=k)
    problem = Problem(arrays)
    if not factored:
        problem._data = problem._data64 = dataclasses.replace(problem._data64, tokens=None, embedding=None,
                                                              positions=None)
    assert problem._data.factored == factored
    omega, mass = random_measure(problem.k, 7, rng, 0.8 if k is None else 1.5)
    u = rng.standard_normal(omega.shape)
    jvp = problem.system_jvp(omega, mass, u)
    assert jvp.shape == omega.shape and jvp.dtype == np.float64
    assert rel_err(jvp, problem.system_jvp_complex_step(omega, mass, u)) <= 1e-13
    assert rel_err(jvp, central_jvp(problem, omega, mass, u)) <= 1e-8
    assert rel_err(problem.system_jvp(omega, mass, -2.5 * u), -2.5 * jvp) <= 1e-14
    assert np.all(problem.system_jvp(omega, mass, np.zeros_like(u)) == 0.0)


def test_system_jvp_is_symmetric_in_the_mass_weighted_inner_product():
    """J = M^-1 Hess E: <v, M J u> = <u, M J v> for random u, v (a property the complex step is not needed for)."""
    rng = np.random.default_rng(73)
    problem = Problem(random_arrays(rng, V=4, T=6, d=5, dh=2, B=10))
    omega, mass = random_measure(problem.k, 9, rng, 0.9)
    u, v = rng.standard_normal((2, *omega.shape))
    ju, jv = problem.system_jvp(omega, mass, u), problem.system_jvp(omega, mass, v)
    left, right = np.sum(v * mass[:, None] * ju), np.sum(u * mass[:, None] * jv)
    assert abs(left - right) <= 1e-13 * np.sqrt(np.sum(mass[:, None] * ju ** 2) * np.sum(mass[:, None] * v ** 2))


@pytest.mark.parametrize("heads_per_chunk", [None, 3], ids=["tiles", "small-chunks"])
def test_many_heads_and_chunks_match_the_complex_step(monkeypatch, heads_per_chunk):
    """150 heads: three chunks of one 64-head kernel tile, the last partial (the factored tables' summed weight
    gradient), or chunks of 3 heads and blocks of one sequence (mean_field.CHUNK_BYTES lowered)."""
    rng = np.random.default_rng(74)
    arrays = random_arrays(rng, V=3, T=9, d=4, dh=2, B=12)
    problem = Problem(arrays)
    omega, mass = random_measure(problem.k, 150, rng, 0.7)
    u = rng.standard_normal(omega.shape)
    if heads_per_chunk:
        T = arrays["tokens"].shape[1]
        monkeypatch.setattr(mean_field, "CHUNK_BYTES", heads_per_chunk * 8 * T * arrays["head_dim"] * 8 + 1)
        # chunks of 3 heads, blocks of one sequence
        assert mean_field._blocks(problem._data, 8, 150) == (heads_per_chunk, 1)
    else:
        assert mean_field._blocks(problem._data, 8, 150)[0] == 64
    assert rel_err(problem.system_jvp(omega, mass, u), problem.system_jvp_complex_step(omega, mass, u)) <= 1e-12


def test_float32_jvp_agrees_with_float64():
    """precision = float32: the forward mode runs in float32 (the kernels' float32 path) and agrees with float64
    to float32 rounding; the rounding is visible, so the precision is honoured."""
    rng = np.random.default_rng(75)
    arrays = random_arrays(rng, V=4, T=6, d=5, dh=2, B=10)
    p64, p32 = Problem(arrays), Problem(arrays, precision="float32")
    omega, mass = random_measure(p64.k, 70, rng, 0.7)
    u = rng.standard_normal(omega.shape)
    j64, j32 = p64.system_jvp(omega, mass, u), p32.system_jvp(omega, mass, u)
    assert j32.dtype == np.float64
    assert 1e-12 < rel_err(j32, j64) <= 1e-4


def test_tangent_kernels_carry_the_primal_context_and_match_the_complex_step():
    """Kernel level, 70 heads (a full and a partial tile of 64) and T = 11 (a partial block of ROWS query rows):
    the forward tangent kernel's context is bitwise the logits kernel's; its tangent and the backward tangent
    kernel's outputs equal the complex step of pdeflow.core.kernels (complex128) along the same directions."""
    rng = np.random.default_rng(76)
    B, T, dh, n, R = 3, 11, 3, 70, 33
    rows, drows = rng.standard_normal((2, R, 3, dh, n))
    table, dtable = 0.3 * rng.standard_normal((2, T, 3, dh, n))
    tok = rng.integers(0, R, size=(B, T))
    g, dg = rng.standard_normal((2, B, T, dh, n))
    scale, tile, h = 0.7, 64, 1e-30
    c, dc = np.empty((2, B, T, dh, n))
    kernels_jvp.causal_attention_jvp(rows, table, drows, dtable, tok, scale, c, dc, tile, 1)
    c_primal = np.empty((B, T, dh, n))
    kernels.causal_attention(rows, table, tok, scale, c_primal, tile, 1)
    np.testing.assert_array_equal(c, c_primal)
    zc = np.empty((B, T, dh, n), dtype=complex)
    kernels.causal_attention(rows + 1j * h * drows, table + 1j * h * dtable, tok, scale, zc, 32, 1)
    assert rel_err(dc, zc.imag / h) <= 1e-14
    # backward, stored and accumulated through the gather
    for accumulate in (False, True):
        shape = (R, 3, dh, n) if accumulate else (B * T, 3, dh, n)
        grows, zrows = np.zeros(shape), np.zeros(shape, dtype=complex)
        gtab, ztab = (np.zeros((T, 3, dh, n)), np.zeros((T, 3, dh, n), dtype=complex)) if accumulate else (None, None)
        c2, dc2 = np.empty((2, B, T, dh, n))
        kernels_jvp.causal_attention_vjp_jvp(rows, table, drows, dtable, tok, g, dg, scale, c2, dc2, grows, gtab,
                                             tile, 1)
        np.testing.assert_array_equal(c2, c_primal)
        assert rel_err(dc2, dc) <= 1e-15
        kernels.causal_attention_vjp(rows + 1j * h * drows, table + 1j * h * dtable, tok, g + 1j * h * dg, scale, zc,
                                     zrows, ztab, 32, 1)
        assert rel_err(grows, zrows.imag / h) <= 1e-13
        if accumulate:
            assert rel_err(gtab, ztab.imag / h) <= 1e-13
