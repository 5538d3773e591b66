"""The structured assembly of S (pdeflow/core/hessian_assembly.py: per-head blocks with the residual frozen plus the
Gauss-Newton part W^T W) against independent references: the columns of S from the exact whole-system JVP
(Problem.system_jvp, n products), central differences of the mass-weighted gradient (real arithmetic, no forward
mode), and the per-head output tangent against the summed one and against central differences of one head's output.
Three small problems: full coordinates with factored projections and weight decay, a random basis with theta0 and
direct projections without weight decay, a config-built reduced family; non-uniform masses, masks with zeros and a
head exactly at the origin (omega_i = 0) in each."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import random_arrays, rel_err
from pdeflow import loads_config
from pdeflow.core import mean_field
from pdeflow.core.hessian_assembly import assemble_hessian, frozen_blocks, gauss_newton_factor, head_blocks
from pdeflow.core.problem import Problem

pytestmark = pytest.mark.usefixtures("one_numba_thread")

CONFIG = """
[task]
name = "lookback"
vocab_size = 3
seq_len = 3
lag = 1
exact = true
[model]
d = 4
head_dim = 2
positions = "sinusoidal"
coordinates = "gain3"
weight_decay = 0.05
"""

CASES = ("full", "basis", "family")


def case(name: str) -> tuple[Problem, np.ndarray, np.ndarray]:
    """A problem and a measure with one head at omega = 0 and non-uniform masses (module docstring)."""
    rng = np.random.default_rng(CASES.index(name) + 1)
    if name == "full":
        problem = Problem(random_arrays(rng, V=4, T=4, d=6, dh=2, B=9, weight_decay=0.07))
        N = 3
    elif name == "basis":
        problem = Problem(random_arrays(rng, V=5, T=3, d=4, dh=3, B=9, k=7, weight_decay=0.0))
        N = 4
    else:
        problem = Problem.from_config(loads_config(CONFIG))
        N = 3
    omega = 0.7 * rng.standard_normal((N, problem.k))
    omega[1] = 0.0
    mass = rng.dirichlet(np.full(N, 2.0))
    return problem, omega, mass



def jvp_columns(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """S column by column: ``M^(1/2) system_jvp(M^(-1/2) e_j)`` (the exact forward-mode product, n of them)."""
    N, k = omega.shape
    root = np.sqrt(mass)[:, None]
    S = np.empty((N * k, N * k))
    for j in range(N * k):
        u = np.zeros(N * k)
        u[j] = 1.0
        S[:, j] = (root * problem.system_jvp(omega, mass, u.reshape(N, k) / root)).ravel()
    return S


def difference_product(problem: Problem, omega: np.ndarray, mass: np.ndarray, v: np.ndarray,
                       h: float = 1e-4) -> np.ndarray:
    """``S v`` by central differences of the mass-weighted gradient ``M^(-1/2) grad E = M^(1/2) grad Phi`` along
    ``u = M^(-1/2) v``, Richardson-extrapolated (steps h and h / 2)."""
    root = np.sqrt(mass)[:, None]
    u = v.reshape(omega.shape) / root

    def central(s: float) -> np.ndarray:
        plus, minus = omega + s * u, omega - s * u
        return (root * (problem.grad_phi(plus, plus, mass) - problem.grad_phi(minus, minus, mass))).ravel() / (2 * s)
    return (4 * central(h / 2) - central(h)) / 3


@pytest.mark.parametrize("name", CASES)
def test_assembled_s_equals_the_exact_products_and_differences(name):
    """S from the structure equals S from n exact JVPs to 1e-12 (relative, Frobenius) and S v equals central
    differences of the mass-weighted gradient to 1e-6 for random v; the diagonal blocks of head_blocks are S's."""
    problem, omega, mass = case(name)
    N, k = omega.shape
    S = assemble_hessian(problem, omega, mass)
    reference = jvp_columns(problem, omega, mass)
    assert rel_err(S, reference) < 1e-12
    rng = np.random.default_rng(3)
    for _ in range(2):
        v = rng.standard_normal(N * k)
        assert rel_err(S @ v, difference_product(problem, omega, mass, v)) < 1e-6
    blocks = head_blocks(problem, omega, mass)
    for i in range(N):
        assert rel_err(blocks[i], reference[i * k:(i + 1) * k, i * k:(i + 1) * k]) < 1e-12
    if problem.coords.basis is None:  # a head at the origin has no coupling (its output Jacobian vanishes there)
        assert np.all(S[k:2 * k, :k] == 0.0) and np.all(S[k:2 * k, 2 * k:] == 0.0)


def test_chosen_heads_are_the_submatrix_and_mutations_fail():
    """``heads=`` gives S's submatrix on those heads (in their order); S without the Gauss-Newton part, with the
    masses dropped from it, or without the weight decay differs from the exact products."""
    problem, omega, mass = case("full")
    N, k = omega.shape
    reference = jvp_columns(problem, omega, mass)
    rows = np.concatenate([np.arange(2 * k, 3 * k), np.arange(0, k)])
    assert rel_err(assemble_hessian(problem, omega, mass, heads=[2, 0]), reference[np.ix_(rows, rows)]) < 1e-12
    W = gauss_newton_factor(problem, omega, mass)
    R = W.shape[0]
    H = frozen_blocks(problem, omega, mass)
    diagonal = np.zeros((N * k, N * k))
    for i in range(N):
        diagonal[i * k:(i + 1) * k, i * k:(i + 1) * k] = H[i]
    flat = W.reshape(R, N * k)
    assert rel_err(diagonal + flat.T @ flat, reference) < 1e-12
    assert rel_err(diagonal, reference) > 1e-3  # no Gauss-Newton part
    unweighted = (W / np.sqrt(mass)[None, :, None]).reshape(R, N * k)
    assert rel_err(diagonal + unweighted.T @ unweighted, reference) > 1e-3  # masses dropped
    no_decay = diagonal - problem.weight_decay * np.eye(N * k)
    assert rel_err(no_decay + flat.T @ flat, reference) > 1e-3  # weight decay dropped


def test_loss_weights_must_be_nonnegative():
    """A negative loss weight makes the cross-entropy's Hessian no Gram matrix: refused, not assembled wrongly."""
    rng = np.random.default_rng(5)
    arrays = random_arrays(rng)
    arrays["weights"] = arrays["weights"] * np.where(np.arange(arrays["weights"].size) == 1, -1.0, 1.0)
    problem = Problem(arrays)
    omega = rng.standard_normal((2, problem.k))
    with pytest.raises(ValueError, match="negative loss weights"):
        assemble_hessian(problem, omega, np.full(2, 0.5))


@pytest.mark.parametrize("heads_per_chunk", [64, 3])
def test_head_output_tangents(monkeypatch, heads_per_chunk):
    """Each head's output tangent (mean_field.head_outputs_jvp): summed with the masses it is the aggregate's
    tangent (mean_field.aggregate_output_jvp), and one head's is the central difference of that head's output;
    in one chunk, or in chunks of 3 heads and blocks of one sequence (mean_field.CHUNK_BYTES lowered)."""
    rng = np.random.default_rng(11)
    arrays = random_arrays(rng, B=5)
    problem = Problem(arrays)
    data = problem.data64
    B, T, d = data.shape
    if heads_per_chunk < 64:
        monkeypatch.setattr(mean_field, "CHUNK_BYTES", heads_per_chunk * 8 * T * arrays["head_dim"] * 8 + 1)
    N = 7
    theta = rng.standard_normal((N, problem.p))
    dtheta = rng.standard_normal((N, problem.p))
    mass = rng.dirichlet(np.full(N, 2.0))
    tangents = mean_field.head_outputs_jvp(theta, dtheta, data)
    assert tangents.shape == (N, B, T, d)
    summed = mean_field.aggregate_output_jvp(theta, dtheta, mass, data)[1]
    assert rel_err(np.einsum("i,ibtd->btd", mass, tangents), summed) < 1e-13
    i, h = 4, 1e-5
    one = np.zeros(N)
    one[i] = 1.0
    difference = (mean_field.aggregate_output(theta + h * dtheta, one, data)
                  - mean_field.aggregate_output(theta - h * dtheta, one, data)) / (2 * h)
    assert rel_err(tangents[i], difference) < 1e-8



def test_projected_assembly_is_b_transpose_s_b():
    """With per-head bases (widths k, k - 3 and 2) the assembly is ``B^T S B`` for the block-diagonal B, S from the
    exact products; a base count that does not match the heads is refused."""
    problem, omega, mass = case("basis")
    N, k = omega.shape
    reference = jvp_columns(problem, omega, mass)[: 3 * k, : 3 * k]
    rng = np.random.default_rng(7)
    bases = [np.linalg.qr(rng.standard_normal((k, c)))[0] for c in (k, k - 3, 2)]
    B = np.zeros((3 * k, sum(b.shape[1] for b in bases)))
    col = 0
    for i, b in enumerate(bases):
        B[i * k:(i + 1) * k, col:col + b.shape[1]] = b
        col += b.shape[1]
    C = assemble_hessian(problem, omega, mass, heads=[0, 1, 2], bases=bases)
    assert rel_err(C, B.T @ reference @ B) < 1e-12
    with pytest.raises(ValueError, match="2 bases for 3 heads"):
        assemble_hessian(problem, omega, mass, heads=[0, 1, 2], bases=bases[:2])


def test_head_blocks_in_groups_of_heads(monkeypatch):
    """head_blocks formed one head at a time (hessian_assembly.BLOCKS_BYTES lowered) equals the diagonal blocks."""
    from pdeflow.core import hessian_assembly

    problem, omega, mass = case("full")
    N, k = omega.shape
    whole = head_blocks(problem, omega, mass)
    monkeypatch.setattr(hessian_assembly, "BLOCKS_BYTES", 1)
    assert rel_err(head_blocks(problem, omega, mass), whole) < 1e-14
    reference = jvp_columns(problem, omega, mass)
    assert rel_err(whole[2], reference[2 * k:, 2 * k:]) < 1e-12
