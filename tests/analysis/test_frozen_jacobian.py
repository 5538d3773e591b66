"""The frozen-Jacobian engine of the rate check (:mod:`pdeflow.analysis.hessian.frozen_jacobian`, ``engine="frozen"`` of
:func:`pdeflow.analysis.linearised.minimum_rates.minimum_rates`), against independent references: ROS2 on a linear
flow against
``expm(-S t) v0`` (order 2, L-stable, the error bound ``1.3 (h / t)^2`` the step rule rests on); the factorised ``I + c
S`` against a dense solve with S from central differences of grad Phi (a head at the origin split off); the engine's
rates on a known minimum with a head at the origin against the dense lambda_min and the dense exponential, and
against the first engine (rkc on exact products)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from pdeflow.analysis.dirac.stability import fit_rate
from pdeflow.analysis.hessian.frozen_jacobian import (
    GAMMA,
    FrozenSolver,
    frozen_solver,
    live_heads,
    mass_weighted_field,
    ros2_paths,
    shifted_hessian,
)
from pdeflow.analysis.linearised.minimum_rates import (
    FROZEN,
    INTEGRATION_TOL,
    PRODUCTS,
    SLOWEST,
    SLOWEST_HALF,
    minimum_rates,
    split_linear_flow,
)
from test_minimum_rates import dense_reference, expm_flow, known_minimum  # noqa: F401  (the fixture)
from test_spectral_record import dense_s

pytestmark = pytest.mark.usefixtures("one_numba_thread")
TOLERANCE = 0.05


def linear_system(n: int = 24, seed: int = 5):
    """A symmetric positive definite S [n, n] with eigenvalues from 1e-3 to 1e3 (log-spaced) and a start v0 [n]."""
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    values = np.geomspace(1e-3, 1e3, n)
    return (Q * values) @ Q.T, rng.standard_normal(n)


def linear_ros2(S, v0, times, h, c=None, calls=None):
    """ROS2 on ``dv/dt = -S v`` with the exact factor of ``I + c S`` (c = gamma h unless given); ``calls`` (a list)
    receives one entry per evaluation of the field."""
    factor = scipy.linalg.cho_factor(np.eye(len(S)) + (GAMMA * h if c is None else c) * S)

    def field(v):
        if calls is not None:
            calls.append(1)
        return -S @ v

    return ros2_paths(field, lambda B: scipy.linalg.cho_solve(factor, B), v0[None], times, h)


def test_ros2_is_second_order_l_stable_and_within_the_step_rule_on_a_linear_flow():
    """On ``dv/dt = -S v`` (stiffness 1e6) ROS2 with the exact matrix: the error against ``expm(-S t) v0`` at
    ``t >= 20 h`` is below the rule's ``1.3 (h / t)^2 |v0|`` and falls 4x when h halves (order 2); a mode with
    ``lambda h = 1e5`` is gone after one step (L-stable: ``R(-inf) = 0``), which a wrong gamma (c = h) breaks."""
    S, v0 = linear_system()
    times = np.linspace(0.0, 400.0, 5)
    reference = expm_flow(S, v0, times)
    errors = []
    for h in (10.0, 5.0):
        calls = []
        paths = linear_ros2(S, v0, times, h, calls=calls)
        assert paths.steps == 400.0 / h and len(calls) == 2 * paths.steps  # two field evaluations a step
        error = np.linalg.norm(paths.samples[0] - reference, axis=1)
        assert np.all(error[2:] <= 1.3 * (h / times[2:]) ** 2 * np.linalg.norm(v0))
        errors.append(error[-1])
    assert 3.0 < errors[0] / errors[1] < 5.0
    stiff = np.diag([1e4])
    one = linear_ros2(stiff, np.ones(1), np.array([0.0, 10.0]), 10.0).samples[0, -1, 0]
    assert abs(one) < 1e-4
    wrong = linear_ros2(stiff, np.ones(1), np.array([0.0, 10.0]), 10.0, c=10.0).samples[0, -1, 0]
    assert abs(wrong) > 0.1                 # R(-inf) = -1/2 with gamma = 1: not L-stable


def test_ros2_refuses_a_step_that_does_not_divide_the_spacing():
    S, v0 = linear_system(4)
    with pytest.raises(ValueError, match="multiple"):
        linear_ros2(S, v0, np.array([0.0, 10.0]), 3.0)


@pytest.fixture(scope="module")
def with_dead_head(known_minimum):  # noqa: F811
    """The known minimum with a third head exactly at the origin (its mass 0.3: the measure's output unchanged)."""
    problem, omega, mass, values = known_minimum
    omega3 = np.vstack([omega, np.zeros((1, omega.shape[1]))])
    mass3 = np.array([mass[0], mass[1], 0.3])
    assert np.max(np.abs(problem.grad_phi(omega3, omega3, mass3))) < 1e-12
    return problem, omega3, mass3


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-6), (np.float32, 1e-4)])
def test_the_frozen_solver_inverts_i_plus_c_s(with_dead_head, dtype, tol):
    """``(I + c S)^(-1) B`` by the split factor (live block by Cholesky in ``dtype``, the dead head by the origin
    block) equals a dense solve with S from central differences of grad Phi (independent of the exact products)."""
    problem, omega, mass = with_dead_head
    assert list(live_heads(problem, omega, mass)) == [True, True, False]
    c = 30.0
    solver = frozen_solver(problem, omega, mass, c, dtype=dtype)
    assert isinstance(solver, FrozenSolver) and solver.factor.dtype == dtype
    K = np.eye(omega.size) + c * dense_s(problem, omega, mass)
    B = np.random.default_rng(2).standard_normal((omega.size, 3))
    X = solver.solve(B)
    np.testing.assert_allclose(X, np.linalg.solve(K, B), rtol=0, atol=tol * np.abs(X).max())
    np.testing.assert_allclose(solver.solve(B[:, 0]), X[:, 0], rtol=1e-12)
    live = shifted_hessian(problem, omega[:2], mass[:2], c, dtype=np.float64, structured=False)
    np.testing.assert_allclose(live, K[:2 * problem.k, :2 * problem.k], atol=1e-6 * np.abs(live).max())


def test_the_structured_assembly_matches_the_products(with_dead_head):
    """Where the structured assembly exists: ``I + c S`` from ``blockdiag(H_i) + W^T W`` (head panels through the
    scratch file) equals the one from exact products."""
    pytest.importorskip("pdeflow.core.hessian_assembly")
    problem, omega, mass = with_dead_head
    live = live_heads(problem, omega, mass)
    structured = shifted_hessian(problem, omega[live], mass[live], 7.0, dtype=np.float64, structured=True)
    products = shifted_hessian(problem, omega[live], mass[live], 7.0, dtype=np.float64, structured=False)
    np.testing.assert_allclose(structured, products, atol=1e-9 * np.abs(products).max())


def test_the_field_skips_heads_at_the_origin_exactly(with_dead_head):
    """``F(v) = -M^(1/2) grad Phi`` with the head at the origin left out equals the whole evaluation, where that
    head is still at 0 and where it has moved."""
    problem, omega, mass = with_dead_head
    field = mass_weighted_field(problem, omega, mass)
    root = np.sqrt(mass)[:, None]
    rng = np.random.default_rng(4)
    for moved in (False, True):
        v = 1e-3 * rng.standard_normal(omega.shape)
        v[2] = v[2] if moved else 0.0
        w = omega + v / root
        np.testing.assert_allclose(field(v.ravel()), (-root * problem.grad_phi(w, w, mass)).ravel(),
                                   rtol=1e-12, atol=1e-18)


def test_the_split_prediction_is_the_dense_exponential(with_dead_head):
    """:func:`split_linear_flow` (Lanczos on the live heads, the dead head exactly) equals ``expm(-C t) v0`` with the
    dense C of the whole measure (central differences, symmetries projected)."""
    problem, omega, mass = with_dead_head
    C, Q = dense_reference(problem, omega, mass)
    v0 = np.random.default_rng(6).standard_normal(C.shape[0])
    v0 = 1e-3 * (v0 - Q @ (Q.T @ v0))
    times = np.linspace(0.0, 300.0, 7)
    pred = split_linear_flow(problem, omega, mass, live_heads(problem, omega, mass), v0, times, 60)
    ref = expm_flow(C, v0, times)
    np.testing.assert_allclose(pred.distance, np.linalg.norm(ref, axis=1), rtol=1e-5)
    np.testing.assert_allclose(pred.excess, 0.5 * np.einsum("fi,ij,fj->f", ref, C, ref), rtol=1e-4)
    np.testing.assert_allclose(pred.dissipation, np.sum((ref @ C) ** 2, axis=1), rtol=1e-4)


def test_the_frozen_engine_measures_the_rates_of_the_dense_references(with_dead_head):
    """The frozen engine on the known minimum with a head at the origin: lambda_min is the dense one; along the
    slowest direction (eps, eps/2) E - E* decays at 2 lambda_min, the distance at lambda_min, the PL ratio is
    lambda_min, each within 5 % (and 1e-3: the linear regime); along a random direction the measured rates are
    those of ``expm(-C t) v0`` fitted over the same window within twice the engine's own estimate of its integration
    error (<= INTEGRATION_TOL; 1.8e-4 against 1.77e-4 estimated, measured), and agree with the first engine's run (rkc
    on exact products) within 1e-2."""
    problem, omega, mass = with_dead_head
    C, Q = dense_reference(problem, omega, mass)
    P = np.eye(C.shape[0]) - Q @ Q.T
    lam = float(np.linalg.eigvalsh(C + 10.0 * np.abs(C).max() * Q @ Q.T)[0])
    eps = 1e-4
    result = minimum_rates(problem, omega, mass, eps=eps, n_random=1, seed=0, engine=FROZEN)
    assert result.engine == FROZEN and result.certificate.startswith("certified")
    assert abs(result.lambda_min / lam - 1) < 1e-6
    assert [r.direction for r in result.runs] == [SLOWEST, SLOWEST_HALF, "random 1"]
    assert all(r.stepper == "ros2-w" for r in result.runs)
    for r in result.runs[:2]:
        assert abs(r.energy_rate / (2 * lam) - 1) < 1e-3
        assert abs(r.distance_rate / lam - 1) < 1e-3
        assert abs(r.pl_ratio_min / lam - 1) < 1e-3
    r = result.runs[2]
    d = np.random.default_rng(0).standard_normal(C.shape[0])
    d = P @ d
    ref = expm_flow(C, 1e-4 * d / np.linalg.norm(d), r.times)
    window = r.times >= r.fit_from
    distance = np.linalg.norm(ref, axis=1)
    excess = 0.5 * np.einsum("fi,ij,fj->f", ref, C, ref)
    # the step was halved until Richardson's estimate of the rates' error was below INTEGRATION_TOL, and the
    # estimate is the error against the exact linear flow, to within a factor 2
    assert 0 < r.integration_error <= INTEGRATION_TOL
    for measured, reference in ((r.distance_rate, -fit_rate(r.times[window], distance[window], 0.0)[0]),
                                (r.energy_rate, -fit_rate(r.times[window], excess[window], 0.0)[0])):
        assert abs(measured / reference - 1) <= 2 * r.integration_error + 1e-5
    assert np.all(np.abs(r.errors()) < TOLERANCE) and r.pl_ratio_least >= lam
    first = minimum_rates(problem, omega, mass, eps=eps, n_random=1, seed=0, engine=PRODUCTS, method="rkc")
    np.testing.assert_allclose([r.energy_rate, r.distance_rate, r.pl_ratio_min],
                               [first.runs[2].energy_rate, first.runs[2].distance_rate, first.runs[2].pl_ratio_min],
                               rtol=1e-2)
