"""The extrapolated stabilized explicit stepper (solvers/extrapolated.py, ``eserk4``): its first-order Chebyshev
polynomials, the extrapolated stability polynomial against its bound (and on deflated eigencomponents), order 4
with and without deflation, error control, the complement's radius against a dense spectrum, exact resume."""
from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.polynomial import chebyshev as cheb
from pdeflow.solvers.extrapolated import (
    MAX_STAGES,
    WEIGHTS,
    eserk4_step,
    evaluations,
    serk,
    serk_substep,
    stages_for,
)

from pdeflow.core.system_jacobian import SystemJacobian, deflation_inverse
from test_stiff import build, integrate, resumed_run_matches


def amplification(z: np.ndarray, s: int, deflated: np.ndarray | None = None) -> np.ndarray:
    """What one step of size 1 (s stages) does to the components of y' = z y, y(0) = 1 (``z`` [n] real); with
    ``deflated`` (a mask), those components are treated as deflated eigencomponents (A = z there)."""
    a = np.where(deflated, z, 0.0) if deflated is not None else np.zeros_like(z)
    y4, _ = eserk4_step(lambda y: z * y, np.ones(z.size), z.copy(), 1.0, s, lambda r, tau: r / (1.0 - tau * a))
    return y4


# ---- the base method and the extrapolated polynomial ------------------------------------------------------

@pytest.mark.parametrize("s", [1, 2, 5, 40, 300])
def test_first_order_chebyshev_step_is_its_damped_polynomial(s):
    """The sub-step is P_s(z) = T_s(w0 + w1 z) / T_s(w0), first order (P_s = 1 + z + O(z^2)), within
    1 / T_s(w0) (~0.27: the damping) on [-beta(s), 0], beta(s) = (1 + w0) / w1 ~ 0.97 s^2."""
    c = serk(s)
    unit = np.zeros(s + 1)
    unit[s] = 1.0
    zs = -np.linspace(0.0, c.beta, 4001)
    p = serk_substep(lambda y: zs * y, np.ones(zs.size), zs.copy(), 1.0, s)
    np.testing.assert_allclose(p, cheb.chebval(c.w0 + c.w1 * zs, unit) / c.T[s], rtol=1e-9, atol=1e-12)
    defects = [abs(serk_substep(lambda y: z * y, np.ones(1), np.array([z]), 1.0, s)[0] - (1 + z))
               for z in (-2e-3, -1e-3)]
    if s == 1:  # Euler: exactly 1 + z
        assert max(defects) < 1e-15
    else:
        assert abs(np.log2(defects[0] / defects[1]) - 2) < 0.05
    # where w0 + w1 z is in [-1, 1], |T_s| <= 1: the damped part of the interval
    damped = zs <= -(c.w0 - 1.0) / c.w1
    assert np.max(np.abs(p[damped])) <= 1.0 / c.T[s] + 1e-9 and 1.0 / c.T[s] < 0.34
    assert np.max(np.abs(p)) <= 1.0 + 1e-12
    if s >= 40:
        assert 0.96 < c.beta / s ** 2 < 0.97


def test_stages_for_is_the_fewest_stable_stages():
    for x in (0.0, 0.5, 1.4, 7.3, 65.0, 1e3, 1e5, serk(MAX_STAGES).beta):
        s = stages_for(x)
        assert serk(s).beta >= x and (s == 1 or serk(s - 1).beta < x)
    assert stages_for(1.01 * serk(MAX_STAGES).beta) == MAX_STAGES + 1
    assert [evaluations(s) for s in (1, 2, 7)] == [6, 16, 66]  # 10 s - 4: j sub-steps of s stages, f(y) shared


def test_extrapolated_polynomial_is_fourth_order_and_within_one_on_its_interval():
    """R(z) = sum_j w_j P_s(z / j)^j: R(z) - e^z = O(z^5); |R| <= 1 on [-x, 0] for every x up to 3e4 with the
    stages stages_for(x) gives (the damping makes it so: sum_j |w_j| = 28.3); on deflated eigencomponents
    (z_j = -tau lambda / (1 + tau lambda)) |R| <= 1 for every h lambda up to 1e8."""
    for s in (1, 5):
        defects = [abs(amplification(np.array([z]), s)[0] - math.exp(z)) for z in (-0.04, -0.02)]
        assert abs(np.log2(defects[0] / defects[1]) - 5) < 0.15, defects
    for x in np.concatenate([np.geomspace(0.01, 3e4, 80), [serk(s).beta for s in range(1, 30)]]):
        zs = -np.linspace(0.0, x, 2001)
        assert np.max(np.abs(amplification(zs, stages_for(x)))) <= 1.0 + 1e-9, x
    lam = -np.geomspace(1e-3, 1e8, 400)
    for s in (1, 2, 3, 12, 40):
        assert np.max(np.abs(amplification(lam, s, np.ones(lam.size, dtype=bool)))) <= 1.0


# ---- order ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    cfg, problem = build()
    ref, _, _, _ = integrate(cfg, problem, 1.0, method="adaptive", dt=0.01, rtol=1e-12, atol=1e-14)
    start, _, _, _ = integrate(cfg, problem, 0.0, method="adaptive", dt=0.01)
    return cfg, problem, ref, start


def errors_of(reference, s: int, steps: tuple[int, ...], deflate: int = 0) -> np.ndarray:
    """RMS errors at t = 1 of ``n`` fixed steps of s stages from t = 0 for each n in ``steps``; ``deflate``: with the
    top pairs of S at t = 0 held for the whole run (a W-method: any A keeps the order)."""
    cfg, problem, ref, start = reference
    omega, mass = start.fields["omega"], start.fields["mass"]

    def velocity(y: np.ndarray) -> np.ndarray:
        return -problem.grad_phi(y, y, mass)

    precondition = None
    if deflate:
        lam, V = SystemJacobian(problem, omega, mass, -velocity(omega)).top_eigenpairs(deflate)
        root = np.repeat(np.sqrt(mass), omega.shape[1])

        def precondition(r: np.ndarray, tau: float) -> np.ndarray:
            return deflation_inverse(r.ravel(), root, lam, V, tau).reshape(r.shape)
    errors = []
    for n in steps:
        y = omega.copy()
        for _ in range(n):
            y, _ = eserk4_step(velocity, y, velocity(y), 1.0 / n, s, precondition)
        errors.append(np.sqrt(np.mean((y - ref.fields["omega"]) ** 2)))
    return np.array(errors)


@pytest.mark.parametrize("s", [1, 4])
def test_step_halving_gives_order_four(reference, s):
    """Order 4 under step halving against a tight Dormand-Prince run, the stage count held fixed (s enters the
    error constant)."""
    errors = errors_of(reference, s, (5, 10, 20))
    orders = np.log2(errors[:-1] / errors[1:])
    assert np.all(np.abs(orders - 4) < 0.2), (errors, orders)


def test_one_stage_count_for_every_sub_integration(reference):
    """Why every sub-integration takes the same s: with s_j = (4, 3, 3, 2), the fewest stable stages for each
    sub-step h / j, the extrapolation cancels nothing (P_s = 1 + z + c_s z^2 + ..., c_s depends on s) and the
    observed order falls to 1."""
    cfg, problem, ref, start = reference
    mass = start.fields["mass"]

    def velocity(y: np.ndarray) -> np.ndarray:
        return -problem.grad_phi(y, y, mass)

    errors = []
    for n in (5, 10, 20):
        y, h = start.fields["omega"].copy(), 1.0 / n
        for _ in range(n):
            results = []
            for j, s in zip((1, 2, 3, 4), (4, 3, 3, 2)):
                x = y
                for _ in range(j):
                    x = serk_substep(velocity, x, velocity(x), h / j, s)
                results.append(x)
            y = sum(w * r for w, r in zip(WEIGHTS, results))
        errors.append(np.sqrt(np.mean((y - ref.fields["omega"]) ** 2)))
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert np.all(np.abs(orders - 1) < 0.1), (errors, orders)


def test_deflated_steps_keep_order_four(reference):
    """With A from the top 3 eigenpairs at t = 0, frozen for the run (h lambda_A up to 0.4): the observed order
    rises towards 4 under step halving (3.43, 3.69, 3.83 measured), the error of the size it has without A
    (7.9e-10 against 5.2e-10 at 80 steps)."""
    errors = errors_of(reference, 1, (10, 20, 40, 80), deflate=3)
    orders = np.log2(errors[:-1] / errors[1:])
    assert np.all(np.diff(orders) > 0) and 3.7 < orders[-1] < 4.2, (errors, orders)
    assert errors[-1] < 3 * errors_of(reference, 1, (80,))[0]


def test_adaptive_steps_follow_the_tolerance(reference):
    """The tolerance bounds the local error of a step; the global error at t = 1 stays within 10 x rtol and
    falls with it, with and without deflation."""
    cfg, problem, ref, _ = reference
    scale = np.max(np.abs(ref.fields["omega"]))
    for deflate in (0, 3):
        counts, errors = [], []
        for rtol in (1e-4, 1e-7):
            final, states, _, _ = integrate(cfg, problem, 1.0, method="eserk4", dt=0.05, rtol=rtol, atol=rtol * 1e-3,
                                            deflate=deflate)
            errors.append(np.max(np.abs(final.fields["omega"] - ref.fields["omega"])) / scale)
            assert errors[-1] < 10 * rtol
            counts.append(len(states))
        assert counts[1] > counts[0] and errors[1] < errors[0] / 100


# ---- deflation: the complement's radius --------------------------------------------------------------------

def test_complement_radius_against_the_dense_spectrum(reference):
    """With solver.deflate = 3 the stages are sized by the largest eigenvalue of S outside the deflated pairs:
    a lower bound of the 4th eigenvalue of the dense S (the pairs being exact to their tolerance) and within 5 %
    of it, well below the largest."""
    cfg, problem, _, start = reference
    from pdeflow.solvers import make_stepper

    stepper = make_stepper(problem, cfg.replace(solver={"method": "eserk4", "deflate": 3}))
    omega, mass = start.fields["omega"], start.fields["mass"]
    apply = SystemJacobian(problem, omega, mass, problem.grad_phi(omega, omega, mass)).apply
    dense = np.column_stack([apply(e) for e in np.eye(omega.size)])
    eigenvalues = np.linalg.eigvalsh(0.5 * (dense + dense.T))
    plan = stepper._new_plan(start)
    rho, _ = stepper._radius(start, None, plan)
    np.testing.assert_allclose(np.sort(plan.pairs.lam), eigenvalues[-3:], rtol=1e-2)
    assert 0.95 * eigenvalues[-4] < rho <= eigenvalues[-4] * (1 + 1e-2) < eigenvalues[-1]


# ---- files -------------------------------------------------------------------------------------------------

def test_resume_is_bit_exact(tmp_path):
    """Resume after run.max_steps repeats the uninterrupted run bit for bit: rkc's carry (radius, vector, age,
    dI/dt, the PI controller's memory) and the deflated pairs are in the checkpoint."""
    a = resumed_run_matches(tmp_path, ["--set", "solver.method=\"eserk4\"", "--set", "solver.radius_every=3",
                                       "--set", "solver.rtol=1e-7", "--set", "solver.deflate=3"])
    assert a.attrs["steps"] > 10
    assert np.all(a.steps["stages"][1:] >= 1) and np.all(a.steps["spectral_radius"][1:] > 0)
