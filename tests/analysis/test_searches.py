"""The structured route's other searches (issue 54, ``pdeflow stationary --kind minimum --search``): trust-region
Newton-Krylov (:mod:`pdeflow.analysis.search.trust_region`) and L-BFGS in float32 before the float64 endgame. On a
tiny problem each reaches a point that a dense eigendecomposition of S (exact JVP columns) confirms as a minimum,
inside the certificate's bracket; each leaves a saddle; each is bit-identical on 1 and 2 numba threads. The
Steihaug-Toint subproblem solver is checked against dense linear algebra."""
from __future__ import annotations

import math

import numpy as np
import pytest

from pdeflow import Problem
from pdeflow.analysis.search import structured_minimum as structured
from pdeflow.analysis.search.trust_region import steihaug_toint
from pdeflow.analysis.stationary.block_preconditioner import BlockPreconditioner
from pdeflow.analysis.stationary.stationary import read_stationary
from pdeflow.interface.cli import main
from test_stability import TINY  # V = T = 3, d = 4, dh = 2: k = 32 full coordinates
from test_stationary import MASS, RUN, dense_spectrum, saddle  # noqa: F401  (saddle: the shared fixture)
from test_structured_minimum import eight_heads, on_two_threads  # noqa: F401  (eight_heads: the shared fixture)

pytestmark = pytest.mark.usefixtures("one_numba_thread")


@pytest.fixture(scope="module")
def reached(eight_heads):  # noqa: F811
    """The route's point by each search from the eight heads."""
    problem, omega, mass, initial = eight_heads
    return {search: structured.structured_minimum(problem, omega, mass, initial, search=search)
            for search in structured.SEARCHES}


def blocks_and_matrix(rng: np.random.Generator, shifts: list[float], k: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric blocks [h, k, k] (``a a^T + shift I``) and the matrix they form with a coupling of rank 2."""
    blocks = np.stack([(lambda a: a @ a.T + s * np.eye(k))(rng.standard_normal((k, k))) for s in shifts])
    n = len(shifts) * k
    A = np.zeros((n, n))
    for i, b in enumerate(blocks):
        A[i * k:(i + 1) * k, i * k:(i + 1) * k] = b
    low = rng.standard_normal((n, 2)) * 0.3
    return blocks, A + low @ low.T


def p_norm(blocks: np.ndarray, p: np.ndarray) -> float:
    """``|p|_P`` with P the block preconditioner's matrix (each block's eigenvalues replaced by ``|mu|``), dense."""
    k = blocks.shape[1]
    total = 0.0
    for i, b in enumerate(blocks):
        mu, V = np.linalg.eigh(b)
        x = p[i * k:(i + 1) * k]
        total += float(x @ V @ np.diag(np.abs(mu)) @ V.T @ x)
    return math.sqrt(total)


def test_steihaug_toint_solves_inside_and_stops_on_the_boundary_of_the_p_norm():
    """Inside a large region it returns A^-1 (-g) (numpy's solve) with A p exact; in a small one it stops on the
    boundary of the P-norm computed densely (the recurrences carry it), with a lower model value than the
    Cauchy point's; on an indefinite A it follows the negative curvature to the boundary."""
    rng = np.random.default_rng(4)
    blocks, A = blocks_and_matrix(rng, [1.0, 10.0, 100.0, 0.1])
    g = rng.standard_normal(A.shape[0])
    P = BlockPreconditioner.from_blocks(blocks)
    same = lambda v: v  # noqa: E731

    def model(p: np.ndarray) -> float:
        return float(g @ p) + 0.5 * float(p @ A @ p)

    p, Ap, status, steps, length = steihaug_toint(lambda v: A @ v, g, P, same, 1e6, 1e-12, 100)
    np.testing.assert_allclose(p, np.linalg.solve(A, -g), rtol=1e-8)
    np.testing.assert_allclose(Ap, A @ p, rtol=1e-9, atol=1e-12)
    assert status == "converged" and steps <= 8 and length == pytest.approx(p_norm(blocks, p), rel=1e-8)
    first = steihaug_toint(lambda v: A @ v, g, P, same, 1e6, 1e-12, 1)[4]  # |p_1|_P: CG's norms grow
    assert first < length
    radius = 0.5 * (first + length)
    p, Ap, status, steps, length = steihaug_toint(lambda v: A @ v, g, P, same, radius, 1e-12, 100)
    assert status == "boundary" and length == radius and steps > 1
    assert p_norm(blocks, p) == pytest.approx(radius, rel=1e-10)
    np.testing.assert_allclose(Ap, A @ p, rtol=1e-9, atol=1e-12)
    z = P(g)  # the Cauchy point in the P-norm: -t P^-1 g on the boundary or at the model's minimum along it
    t = min(radius / math.sqrt(float(g @ z)), float(g @ z) / float(z @ A @ z))
    assert model(p) < model(-t * z)
    # indefinite: the blocks' shift makes one eigenvalue of A negative; the step reaches the boundary
    blocks, B = blocks_and_matrix(rng, [1.0, -3.0, 2.0])
    assert np.linalg.eigvalsh(B)[0] < 0
    Q = BlockPreconditioner.from_blocks(blocks)
    p, Bp, status, steps, length = steihaug_toint(lambda v: B @ v, g[:B.shape[0]], Q, same, 1e3, 1e-12, 100)
    assert status == "negative curvature" and p_norm(blocks, p) == pytest.approx(1e3, rel=1e-10)
    assert float(g[:B.shape[0]] @ p) + 0.5 * float(p @ Bp) < -1.0


@pytest.mark.parametrize("search", ["trust-region", "float32"])
def test_each_search_reaches_a_minimum_that_a_dense_eigh_confirms(eight_heads, reached, search):  # noqa: F811
    problem, omega, mass, initial = eight_heads
    point = reached[search]
    assert point.converged and point.certified and point.verdict == "local minimum"
    assert point.route == f"structured ({search} search)"
    assert problem.evaluate(point.omega, mass).dissipation <= 1e-12 * initial
    values = dense_spectrum(problem, point.omega, mass)
    assert values[0] > 0
    assert point.certificate.lower <= values[0] * (1 + 1e-9) and values[0] <= point.certificate.upper * (1 + 1e-9)
    dead = np.all(point.omega == 0.0, axis=1)
    assert np.all((np.linalg.norm(point.omega, axis=1) > 1e-6) | dead)


def test_the_trust_region_search_takes_second_order_steps_alone(reached):
    """No L-BFGS, no Newton-PCG: the trust-region iterations, each with exact products, to the target."""
    point = reached["trust-region"]
    assert point.message.startswith("trust region: I = ") and "L-BFGS" not in point.message
    assert point.products > point.gradients  # every iteration a CG solve of several products and one gradient


def test_the_float32_search_evaluates_in_float32_and_ends_at_the_float64_routes_minimum(
        eight_heads, reached, monkeypatch):  # noqa: F811
    """The L-BFGS phase's gradients are the float32 problem's (counted on the one counter, and here by a wrapper of
    its own); the float64 endgame takes the point to the same minimum as the default search's: E* to 1e-11, the
    heads' invariants to 1e-5."""
    problem, omega, mass, initial = eight_heads
    made, calls = [], []

    def single(p: Problem) -> Problem:
        made.append(p.in_precision("float32"))
        own = made[-1].grad_phi_field

        def counted(query, G):
            calls.append(1)
            return own(query, G)

        made[-1].grad_phi_field = counted  # evaluate() and grad_phi() call it once each
        return made[-1]

    monkeypatch.setattr(structured, "single_precision", single)
    point = structured.structured_minimum(problem, omega, mass, initial, search="float32")
    used = len(calls)
    assert made[0].dtype == np.float32 and used > 10 and made[0].counts is problem.counts
    # every gradient of the L-BFGS phase, the one grad Phi at the origin that tells whether dead heads stay dead too
    assert point.message.startswith(f"float32 L-BFGS ({used} gradients): ")
    default = reached["lbfgs"]
    assert abs(point.energy - default.energy) <= 1e-11
    for a, b in ((point.omega, default.omega),):
        ga, gb = (np.sort(np.linalg.norm(x, axis=1)) for x in (a, b))  # head norms: invariant under the symmetries
        np.testing.assert_allclose(ga, gb, atol=1e-5)


@pytest.mark.parametrize("search", ["trust-region", "float32"])
def test_each_search_leaves_a_saddle(saddle, search):  # noqa: F811
    """Started exactly at a saddle (I = 0): the certificate's Lanczos run proves the negative eigenvalue, the route
    leaves along it and the search ends at a certified minimum below the saddle (dense eigh confirms)."""
    problem, omega, index, initial = saddle
    point = structured.structured_minimum(problem, omega, MASS, initial, search=search)
    assert point.certified and point.energy < problem.energy(omega, MASS) - 1e-3
    assert dense_spectrum(problem, point.omega, MASS)[0] > 0


TWO_THREADS = """
import numpy as np
import numba
from pdeflow import Problem, loads_config
from pdeflow.analysis.search.structured_minimum import structured_minimum
assert numba.get_num_threads() == 2
problem = Problem.from_config(loads_config({toml!r}))
omega = np.load({start!r})
mass = np.full(len(omega), 1.0 / len(omega))
initial = problem.evaluate(omega, mass).dissipation
out = {{}}
for search in ("trust-region", "float32"):
    point = structured_minimum(problem, omega, mass, initial, search=search)
    out[search + "-omega"], out[search + "-energy"] = point.omega, point.energy
    out[search + "-counts"] = [point.gradients, point.products]
np.savez({out!r}, **out)
"""


def test_one_and_two_threads_give_the_same_point_bit_for_bit(eight_heads, reached, tmp_path):  # noqa: F811
    """The route's result does not depend on the thread count: the point, E* and the counts of each new search on 1
    thread (this process) and 2 (a process started with NUMBA_NUM_THREADS=2) are identical."""
    two = on_two_threads(TWO_THREADS, eight_heads[1], tmp_path, 900)
    for search in ("trust-region", "float32"):
        one = reached[search]
        np.testing.assert_array_equal(one.omega, two[search + "-omega"])
        assert one.energy == float(two[search + "-energy"])
        assert [one.gradients, one.products] == list(two[search + "-counts"])


def test_the_command_takes_a_search_and_refuses_it_off_the_structured_route(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    traj = tmp_path / "run.h5"
    assert main(["run", str(config), "-o", str(traj), "--quiet", *RUN]) == 0
    out = tmp_path / "tr.h5"
    assert main(["stationary", str(traj), "--kind", "minimum", "--search", "trust-region", "-o", str(out),
                 "--quiet"]) == 0
    r = read_stationary(out)
    assert r["route"] == "structured (trust-region search)" and r["certified"]
    assert r["message"].startswith("trust region: ")
    capsys.readouterr()
    assert main(["stationary", str(traj), "--kind", "minimum", "--route", "lbfgs", "--search", "float32",
                 "-o", str(tmp_path / "x.h5")]) == 2
    assert main(["stationary", str(traj), "--kind", "nearest", "--search", "float32",
                 "-o", str(tmp_path / "y.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("pdeflow: error: ") for line in err), err
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "y.h5").exists()
