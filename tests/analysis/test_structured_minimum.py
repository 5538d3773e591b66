"""The structured route to a certified minimum (:mod:`pdeflow.analysis.search.structured_minimum`, ``pdeflow stationary
--route structured``): on a tiny problem it reaches a point that the L-BFGS route accepts as stationary and an
independent dense eigendecomposition of S (exact JVP columns) confirms as a minimum; it escapes a saddle; two runs
are bit-identical; its pieces (the block preconditioner, preconditioned CG) agree with dense linear algebra."""
from __future__ import annotations

import numpy as np
import pytest

from pdeflow import Problem, loads_config
from pdeflow.analysis.search.lbfgs import lbfgs
from pdeflow.analysis.search.structured_minimum import ROUTE, pcg, structured_minimum
from pdeflow.analysis.stationary.block_preconditioner import BlockPreconditioner
from pdeflow.analysis.stationary.stationary import minimum, read_stationary
from pdeflow.interface.cli import main
from test_stability import TINY  # V = T = 3, d = 4, dh = 2: k = 32 full coordinates
from test_stationary import MASS, RUN, dense_spectrum, saddle  # noqa: F401  (saddle: the shared fixture)

pytestmark = pytest.mark.usefixtures("one_numba_thread")


@pytest.fixture(scope="module")
def eight_heads(one_numba_thread):
    """Eight heads of the tiny problem at random (scale 0.7): some die on the way to the minimum."""
    problem = Problem.from_config(loads_config(TINY))
    omega = np.random.default_rng(0).standard_normal((8, problem.k)) * 0.7
    mass = np.full(8, 1.0 / 8.0)
    return problem, omega, mass, problem.evaluate(omega, mass).dissipation


def whole_spectrum(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """The eigenvalues of S off the symmetry directions of the live heads, by eigh of S from exact JVP columns on
    the whole measure (dead heads included: their block is the origin's)."""
    return dense_spectrum(problem, omega, mass)


def test_the_route_reaches_a_minimum_the_lbfgs_route_and_a_dense_eigh_confirm(eight_heads):
    problem, omega, mass, initial = eight_heads
    point = structured_minimum(problem, omega, mass, initial)
    assert point.route == ROUTE and point.converged and point.certified and point.verdict == "local minimum"
    assert problem.evaluate(point.omega, mass).dissipation <= 1e-12 * initial
    values = whole_spectrum(problem, point.omega, mass)
    assert values[0] > 0
    assert point.certificate.lower <= values[0] * (1 + 1e-9) and values[0] <= point.certificate.upper * (1 + 1e-9)
    # the L-BFGS route, started there, takes no step and certifies it by its own (dense, JVP-column) rule
    old = minimum(problem, point.omega, mass, initial)
    assert old.iterations == 0 and old.certified and old.energy == point.energy
    # Newton-PCG did the endgame: products were spent, and heads that died sit exactly at the origin
    assert point.products > 0 and "Newton-PCG" in point.message
    # the message says why the search handed over (the dissipation it reached), not that "the callback" stopped it
    assert point.message.startswith("L-BFGS: I = ") and "callback" not in point.message
    dead = np.all(point.omega == 0.0, axis=1)
    assert np.all((np.linalg.norm(point.omega, axis=1) > 1e-6) | dead)


def test_two_runs_are_bit_identical(eight_heads):
    problem, omega, mass, initial = eight_heads
    a = structured_minimum(problem, omega, mass, initial, max_restarts=0)
    b = structured_minimum(problem, omega, mass, initial, max_restarts=0)
    np.testing.assert_array_equal(a.omega, b.omega)
    assert a.energy == b.energy and a.gradients == b.gradients and a.products == b.products


def test_the_route_escapes_a_saddle(saddle):  # noqa: F811
    """Started exactly at a saddle (I = 0): the certificate's Lanczos run proves the negative eigenvalue, the
    route leaves along it and ends at a certified minimum below the saddle (dense eigh confirms)."""
    problem, omega, index, initial = saddle
    point = structured_minimum(problem, omega, MASS, initial)
    assert point.certified and point.energy < problem.energy(omega, MASS) - 1e-3
    assert whole_spectrum(problem, point.omega, MASS)[0] > 0


def test_the_block_preconditioner_inverts_the_modified_blocks():
    """P^-1 against the inverse of each block with its eigenvalues replaced by max(|mu|, floor): an indefinite
    block gives a positive definite P (|mu|), and P^-1 applied head by head is that dense inverse."""
    rng = np.random.default_rng(1)
    k = 5
    blocks = []
    for shift in (0.0, -2.0, 1.0):
        a = rng.standard_normal((k, k))
        blocks.append(a @ a.T + shift * np.eye(k))
    blocks = np.stack(blocks)
    P = BlockPreconditioner.from_blocks(blocks)
    x = rng.standard_normal(3 * k)
    expected = []
    for i, b in enumerate(blocks):
        mu, V = np.linalg.eigh(b)
        expected.append(V @ np.diag(1.0 / np.abs(mu)) @ V.T @ x[i * k:(i + 1) * k])
    np.testing.assert_allclose(P(x), np.concatenate(expected), rtol=1e-10)
    assert P.negative >= 1 and float(x @ P(x)) > 0


def test_preconditioned_cg_solves_and_detects_negative_curvature():
    """PCG against numpy's solve on an SPD system with a nearly exact (block) preconditioner, in few iterations;
    on an indefinite matrix it returns a direction of non-positive curvature."""
    rng = np.random.default_rng(2)
    n, k = 40, 8
    blocks = np.stack([(lambda a: a @ a.T + np.eye(k) * 10.0 ** j)(rng.standard_normal((k, k))) for j in range(5)])
    A = np.zeros((n, n))
    for i in range(5):
        A[i * k:(i + 1) * k, i * k:(i + 1) * k] = blocks[i]
    low = rng.standard_normal((n, 2)) * 0.1
    A += low @ low.T  # a coupling the blocks do not see
    b = rng.standard_normal(n)
    P = BlockPreconditioner.from_blocks(blocks)
    x, curved, steps = pcg(lambda v: A @ v, b, P, lambda v: v, 1e-10, 100)
    np.testing.assert_allclose(x, np.linalg.solve(A, b), rtol=1e-8)
    assert not curved and steps <= 6  # block-diagonal plus rank 2: a few iterations
    plain, _, plain_steps = pcg(lambda v: A @ v, b, lambda v: v, lambda v: v, 1e-10, 100)
    assert plain_steps > 2 * steps
    # indefinite: the first direction already has negative curvature (returned as is); a later one ends CG
    D = np.diag(np.r_[np.ones(n - 1), -10.0])
    d, curved, steps = pcg(lambda v: D @ v, np.r_[0.1 * np.ones(n - 1), 1.0], lambda v: v, lambda v: v, 1e-10, 100)
    assert curved and steps == 1 and float(d @ D @ d) < 0
    d, curved, steps = pcg(lambda v: D @ v, np.r_[np.ones(n - 1), 0.1], lambda v: v, lambda v: v, 1e-10, 100)
    assert not curved and steps == 2 and float(d @ D @ d) > 0  # the iterate before the bad direction


def test_preconditioned_lbfgs_minimises_an_ill_conditioned_quadratic_faster():
    """L-BFGS with H_0 = gamma P^-1 (P the exact block diagonal of a block-diagonal quadratic of condition 1e6)
    reaches the minimiser in a few iterations, where the identity H_0 needs many more."""
    rng = np.random.default_rng(3)
    k = 4
    blocks = np.stack([(lambda a: a @ a.T / k + np.eye(k)) (rng.standard_normal((k, k))) * 10.0 ** j
                       for j in range(-2, 3)])
    n = blocks.shape[0] * k
    A = np.zeros((n, n))
    for i, b in enumerate(blocks):
        A[i * k:(i + 1) * k, i * k:(i + 1) * k] = b
    c = rng.standard_normal(n)
    exact = np.linalg.solve(A, c)

    def fun(x: np.ndarray):
        return 0.5 * float(x @ A @ x) - float(c @ x), A @ x - c

    stop = []

    def small(x: np.ndarray) -> None:
        if np.linalg.norm(A @ x - c) <= 1e-8 * np.linalg.norm(c):
            stop.append(1)
            raise StopIteration

    pre = lbfgs(fun, np.zeros(n), memory=10, max_iter=500, callback=small, precondition=BlockPreconditioner.from_blocks(
        blocks))
    plain = lbfgs(fun, np.zeros(n), memory=10, max_iter=500, callback=small)
    np.testing.assert_allclose(pre.x, exact, rtol=1e-6)
    assert pre.nit <= 3 and plain.nit > 10 * pre.nit


def test_the_command_takes_the_structured_route_by_default_and_says_so(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    traj = tmp_path / "run.h5"
    assert main(["run", str(config), "-o", str(traj), "--quiet", *RUN]) == 0
    fast, old = tmp_path / "fast.h5", tmp_path / "old.h5"
    assert main(["stationary", str(traj), "--kind", "minimum", "-o", str(fast), "--quiet"]) == 0
    out = capsys.readouterr().out
    r = read_stationary(fast)
    assert r["route"] == "structured" and "fixed by the config" in r["start_rule"] and r["certified"]
    assert "route       structured; start: the run's end time t = 2" in out
    assert main(["stationary", str(fast), "--kind", "minimum", "--route", "lbfgs", "-o", str(old), "--quiet"]) == 0
    s = read_stationary(old)
    assert s["route"] == "lbfgs" and s["certified"] and s["energy"] == r["energy"] and s["iterations"] == 0
    # the rates command takes the structured route's result as a certified minimum
    assert main(["stability", "--stationary", str(fast), "-o", str(tmp_path / "rates.h5")]) == 0
    capsys.readouterr()
    assert main(["stationary", str(traj), "--kind", "minimum", "--route", "structured", "--method", "lbfgs",
                 "-o", str(tmp_path / "x.h5")]) == 2
    assert main(["stationary", str(traj), "--kind", "nearest", "--route", "lbfgs", "-o", str(tmp_path / "y.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("pdeflow: error: ") for line in err), err


TWO_THREADS = """
import sys
import numpy as np
from pdeflow import Problem, loads_config
from pdeflow.analysis.search.structured_minimum import structured_minimum
import numba
assert numba.get_num_threads() == 2
problem = Problem.from_config(loads_config({toml!r}))
omega = np.load({start!r})
mass = np.full(len(omega), 1.0 / len(omega))
point = structured_minimum(problem, omega, mass, problem.evaluate(omega, mass).dissipation, max_restarts=0)
np.savez({out!r}, omega=point.omega, energy=point.energy, certified=point.certified)
"""


def on_two_threads(script: str, omega: np.ndarray, tmp_path, timeout: float) -> dict:
    """``script`` (a template of ``toml``, ``start`` and ``out``) run from ``omega`` in a process started with
    NUMBA_NUM_THREADS=2: the arrays it saved."""
    import os
    import subprocess
    import sys

    np.save(tmp_path / "start.npy", omega)
    path = tmp_path / "two.py"
    path.write_text(script.format(toml=TINY, start=str(tmp_path / "start.npy"), out=str(tmp_path / "two.npz")))
    proc = subprocess.run([sys.executable, str(path)], env=dict(os.environ, NUMBA_NUM_THREADS="2"),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return dict(np.load(tmp_path / "two.npz"))


def test_one_and_two_threads_reach_the_same_minimum(eight_heads, tmp_path):
    """The kernels' parallel reductions round differently on 1 and 2 threads; the route still ends at the same
    minimum (E* to 1e-12, the points to 1e-6), each certified. One thread: this process (the suite's workers run
    one); two: a process started with NUMBA_NUM_THREADS=2."""
    problem, omega, mass, initial = eight_heads
    one = structured_minimum(problem, omega, mass, initial, max_restarts=0)
    two = on_two_threads(TWO_THREADS, omega, tmp_path, 600)
    assert one.certified and bool(two["certified"])
    assert abs(one.energy - float(two["energy"])) <= 1e-12
    np.testing.assert_allclose(one.omega, two["omega"], atol=1e-6)
