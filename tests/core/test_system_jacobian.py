"""The one construction of S (:mod:`pdeflow.core.system_jacobian`): its products against central differences of
grad Phi with unequal masses, both kinds counted once per product by the Problem (the one counter: its shares and
the same problem in float32 count on it too), and ``dI/dt`` against a central difference of the dissipation along
the flow."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import symmetric_particle_jacobian
from pdeflow import Problem, loads_config
from pdeflow.core.system_jacobian import SystemJacobian

SMALL = """
[task]
name = "markov"
vocab_size = 3
seq_len = 3
n_samples = 8
[model]
d = 4
head_dim = 2
weight_decay = 0.01
[init]
n_particles = 3
scale = 1.0
"""


def state() -> tuple[Problem, np.ndarray, np.ndarray]:
    problem = Problem.from_config(loads_config(SMALL))
    rng = np.random.default_rng(5)
    omega = rng.standard_normal((3, problem.k))
    mass = np.array([0.2, 0.3, 0.5])  # unequal: the mass weighting matters
    return problem, omega, mass


@pytest.mark.parametrize("kind,rel", [("exact", 1e-6), ("difference", 1e-4)])
def test_s_is_the_mass_weighted_jacobian_and_each_product_is_counted(kind, rel):
    problem, omega, mass = state()
    reference = symmetric_particle_jacobian(problem, omega, mass, 1e-5)   # M^{1/2} J M^{-1/2}, central differences
    before = dict(problem.counts)
    jacobian = SystemJacobian(problem, omega, mass, problem.grad_phi(omega, omega, mass), kind)
    S = np.column_stack([jacobian.apply(e) for e in np.eye(omega.size)])
    scale = np.abs(reference).max()
    assert np.abs(S - reference).max() <= rel * scale
    assert problem.counts[f"jvp_{kind}"] - before[f"jvp_{kind}"] == omega.size
    block = jacobian.operator().matmat(np.eye(omega.size)[:, :2])
    np.testing.assert_array_equal(block, S[:, :2])


def test_a_share_sums_the_calls_inside_its_blocks_and_float32_counts_on_the_same_counter():
    """Two blocks of a Share hold 2 gradients and 3 exact products, made partly by the float32 copy of the problem;
    the calls between them are the Problem's but not the Share's."""
    problem, omega, mass = state()
    single = problem.in_precision("float32")
    share = problem.share()
    mark = problem.mark()
    jacobian = SystemJacobian(problem, omega, mass)
    with share:
        problem.grad_phi(omega, omega, mass)
        jacobian.product(omega)
    problem.grad_phi(omega, omega, mass)   # outside: the Problem's, not the share's
    with share:
        single.grad_phi(omega, omega, mass)
        SystemJacobian(single, omega, mass).product(omega)
        jacobian.product(omega)
    assert single.dtype == np.float32 and single.counts is problem.counts
    assert share.calls == {"gradient": 2, "jvp_exact": 3, "jvp_difference": 0}
    assert (share.gradients, share.products) == (2, 3)
    assert problem.since(mark) == {"gradient": 3, "jvp_exact": 3, "jvp_difference": 0}


def test_slope_is_the_derivative_of_the_dissipation_along_the_flow():
    """``dI/dt`` at the state against ``(I(y + eps f) - I(y - eps f)) / (2 eps)``, ``f = -grad Phi``: the flow's
    direction, one product."""
    problem, omega, mass = state()
    grad = problem.grad_phi(omega, omega, mass)
    eps = 1e-5

    def dissipation(y: np.ndarray) -> float:
        return float(problem.evaluate(y, mass).dissipation)

    expected = (dissipation(omega - eps * grad) - dissipation(omega + eps * grad)) / (2 * eps)
    mark = problem.mark()
    slope = SystemJacobian(problem, omega, mass, grad, "exact").slope()
    assert slope == pytest.approx(expected, rel=1e-6) and problem.products_since(mark) == 1


def test_a_difference_product_needs_the_gradient_and_a_kind_is_one_of_two():
    problem, omega, mass = state()
    with pytest.raises(ValueError, match="grad Phi"):
        SystemJacobian(problem, omega, mass, None, "difference")
    with pytest.raises(ValueError, match="kind"):
        SystemJacobian(problem, omega, mass, None, "complex")
