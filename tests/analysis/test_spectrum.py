"""The spectrum of the mass-weighted Hessian (:mod:`pdeflow.analysis.hessian.spectrum`; its Lanczos,
:func:`pdeflow.core.lanczos.krylov_ritz`, is tested in tests/core/test_lanczos.py): the symmetry directions
against their count formula and as null vectors at a stationary measure, the dense Hessian from the exact JVP against
finite differences of grad Phi, and the reported spectrum ends against the dense projected spectrum
(docs/experiments.md, "Stationary points")."""
from __future__ import annotations

import numpy as np
import pytest

from pdeflow import Problem, loads_config
from pdeflow.analysis.dirac.stability import complement_spectrum, find_stationary_points, one_head_energy
from pdeflow.analysis.hessian.spectrum import (
    SpectrumEnds,
    head_symmetries,
    hessian_operator,
    negative_ritz_count,
    spectrum_ends,
    symmetry_basis,
)
from test_stability import TINY  # V = T = 3, d = 4, dh = 2: k = 32 full coordinates, 27 sequences exactly

pytestmark = pytest.mark.usefixtures("one_numba_thread")

def tiny(*overrides: str) -> Problem:
    return Problem.from_config(loads_config(TINY, list(overrides)))


def random_state(problem: Problem, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, problem.k)), rng.dirichlet(np.full(n, 2.0))


def dense(op) -> np.ndarray:
    n = op.shape[0]
    return np.stack([op.matvec(e) for e in np.eye(n)], axis=1)


# ---- the symmetry directions ---------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [2, 3])
def test_symmetry_count_equals_the_formula(head_dim):
    """Per head dh (dh - 1) directions with weight decay (rotations of (WQ, WK) and of (WV, WO)), 2 dh^2 without
    (invertible changes of basis), none at a zero head (the orbit is a point) or at a head within 1e-6 of the
    largest head's norm from it (a dead head off the origin by rounding), and none in reduced coordinates."""
    dh = head_dim
    problem = tiny(f"model.head_dim={dh}")
    omega, mass = random_state(problem, 3, seed=1)
    omega[1] = 0.0  # a zero head: degenerate orbit
    Q = symmetry_basis(problem, omega, mass)
    assert Q.shape == (omega.size, 2 * dh * (dh - 1))
    np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-12)
    assert np.abs(Q.reshape(3, problem.k, -1)[1]).max() == 0.0
    free = problem.with_weight_decay(0.0)
    assert symmetry_basis(free, omega, mass).shape == (omega.size, 2 * 2 * dh * dh)
    assert list(head_symmetries(free, omega).counts) == [2 * dh * dh, 0, 2 * dh * dh]
    nearly_dead = omega.copy()
    nearly_dead[1] = 1e-9 * omega[0] / np.linalg.norm(omega[0])  # a rounding-size distance from the origin
    assert list(head_symmetries(problem, nearly_dead).counts) == [dh * (dh - 1), 0, dh * (dh - 1)]
    reduced = tiny('model.coordinates="gain2"')
    omega_r, mass_r = random_state(reduced, 4, seed=2)
    assert symmetry_basis(reduced, omega_r, mass_r).shape == (omega_r.size, 0)
    assert spectrum_ends(reduced, omega_r, mass_r).n_symmetry == 0


@pytest.mark.parametrize("weight_decay", [0.05, 0.0])
def test_symmetry_directions_are_orthogonal_to_the_gradient(weight_decay):
    """E is constant along each head's orbit: its mass-weighted gradient M^(1/2) grad Phi has no component
    along the symmetry directions, at any measure."""
    problem = tiny().with_weight_decay(weight_decay)
    omega, mass = random_state(problem, 4, seed=3)
    g = (np.sqrt(mass)[:, None] * problem.grad_phi(omega, omega, mass)).ravel()
    Q = symmetry_basis(problem, omega, mass)
    assert np.abs(Q.T @ g).max() <= 1e-12 * np.linalg.norm(g)


def test_symmetry_directions_are_null_vectors_at_a_stationary_measure():
    """Four heads at the nonzero stationary Dirac w* (grad e(w*) = 0, so grad Phi = 0 at every head) form a
    stationary measure; there every symmetry direction is a null vector of S (to rounding), and the spectrum on
    the complement has the Dirac's Htr (mean) and H0 (spread) eigenvalues."""
    problem = tiny()
    cands, _ = find_stationary_points(problem, n_starts=1, seed=0, start_scale=1.0, grad_tol=1e-10)
    w = cands[-1].point
    assert np.linalg.norm(w) > 1.0 and np.linalg.norm(one_head_energy(problem, w)[1]) <= 1e-10
    omega, mass = np.tile(w, (4, 1)), np.full(4, 0.25)
    S = dense(hessian_operator(problem, omega, mass, np.zeros((omega.size, 0))))
    Q = symmetry_basis(problem, omega, mass)
    assert Q.shape[1] == 4 * 2
    assert np.abs(S @ Q).max() <= 1e-10 * np.abs(S).max()


# ---- the Hessian and its spectrum ----------------------------------------------------------------
@pytest.mark.parametrize("weight_decay", [0.05, 0.0])
def test_dense_hessian_from_the_jvp_matches_finite_differences(weight_decay):
    """S = M^(1/2) (M^-1 Hess E) M^(-1/2) from the exact JVP, column by column, against central differences of
    the mass-weighted gradient v -> M^(1/2) grad Phi(M^(-1/2) v); and it is symmetric."""
    problem = tiny().with_weight_decay(weight_decay)
    omega, mass = random_state(problem, 3, seed=4)
    op = hessian_operator(problem, omega, mass, np.zeros((omega.size, 0)))
    mark = problem.mark()
    S = dense(op)
    assert problem.since(mark) == {"gradient": 0, "jvp_exact": omega.size, "jvp_difference": 0}  # a column each
    root = np.sqrt(mass)[:, None]

    def gradient(v):
        y = omega + v.reshape(omega.shape) / root
        return (root * problem.grad_phi(y, y, mass)).ravel()

    h = 1e-5
    fd = np.stack([(gradient(h * e) - gradient(-h * e)) / (2 * h) for e in np.eye(omega.size)], axis=1)
    assert np.abs(S - fd).max() <= 1e-6 * np.abs(S).max()
    assert np.abs(S - S.T).max() <= 1e-12 * np.abs(S).max()


@pytest.mark.parametrize("weight_decay,krylov_dim", [(0.05, 500), (0.0, 500), (0.05, 40)])
def test_spectrum_ends_equal_dense_eigh_of_the_projected_hessian(weight_decay, krylov_dim):
    """The converged Ritz values spectrum_ends reports at both ends are the lowest / highest eigenvalues of the
    dense Pi S Pi on the complement of the symmetry directions, the lower bound on the index is the count of
    negative ones there (all of them on a full Krylov space), and the Ritz vectors are eigenvectors."""
    problem = tiny().with_weight_decay(weight_decay)
    omega, mass = random_state(problem, 4, seed=5)
    Q = symmetry_basis(problem, omega, mass)
    S = dense(hessian_operator(problem, omega, mass, np.zeros((omega.size, 0))))
    values = complement_spectrum(0.5 * (S + S.T), Q)[0]
    ends = spectrum_ends(problem, omega, mass, krylov_dim=krylov_dim, n_ends=5, tol=1e-8)
    n = omega.size - Q.shape[1]
    assert ends.n_symmetry == Q.shape[1] and ends.products <= min(krylov_dim, n)
    scale = np.abs(values).max()
    assert ends.lowest.size >= 1 and ends.highest.size >= 1
    np.testing.assert_allclose(ends.lowest, values[:ends.lowest.size], atol=1e-9 * scale)
    np.testing.assert_allclose(ends.highest, values[n - ends.highest.size:], atol=1e-9 * scale)
    assert np.all(ends.lowest_residual <= 1e-8 * scale) and np.all(ends.highest_residual <= 1e-8 * scale)
    negative = int(np.sum(values < 0))
    assert negative >= 1 and ends.morse_index_lower <= negative
    assert values[0] <= ends.lowest_ritz < 0 and not ends.no_negative_found  # interlacing: an upper bound
    if krylov_dim >= n:
        assert ends.morse_index_lower == negative and ends.lowest.size == 5 and ends.highest.size == 5
    x = ends.lowest_vectors
    Sx = S @ x
    Sx -= Q @ (Q.T @ Sx)
    np.testing.assert_allclose(Sx, x * ends.lowest[None, :], atol=1e-7 * scale)
    assert np.abs(Q.T @ x).max() <= 1e-12


def test_no_negative_found_needs_every_block_converged_and_no_ritz_value_negative():
    """A converged positive value above an unconverged lower Ritz value shows nothing, nor does a converged lowest
    value beside an unconverged block; a negative Ritz value, converged or not, is index >= 1 (the one rule)."""
    def ends(lowest, residual, ritz, ritz_residual, unresolved=0):
        return SpectrumEnds(lowest=np.array(lowest), lowest_residual=np.array(residual), highest=np.array([5.0]),
                            highest_residual=np.array([0.0]), morse_index_lower=negative_ritz_count([ritz, 5.0]),
                            n_symmetry=0, products=10, lowest_vectors=np.zeros((3, len(lowest))), lowest_ritz=ritz,
                            lowest_ritz_residual=ritz_residual, unresolved_blocks=unresolved)

    assert ends([0.2, 0.3], [1e-9, 1e-9], 0.2, 1e-9).no_negative_found
    assert not ends([0.2, 0.3], [1e-9, 1e-9], 0.2, 1e-9, unresolved=1).no_negative_found
    assert not ends([0.3], [1e-9], 0.2, 1e-2).no_negative_found       # the lowest Ritz value did not converge
    assert not ends([0.2], [0.3], 0.2, 0.3).no_negative_found         # converged, but not resolved from 0
    assert not ends([], [], -0.1, 1e-2).no_negative_found
    assert ends([2.0], [1e-9], -0.1, 1e-2).morse_index_lower == 1     # unconverged, negative: index >= 1
    assert negative_ritz_count([-1e-14, 1.0, 3.0]) == 0               # rounding of a null direction
    assert negative_ritz_count([-0.5, -1e-3, 2.0]) == 2
