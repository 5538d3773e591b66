"""Stationary points of the particle flow (:mod:`pdeflow.analysis.stationary.stationary`, ``pdeflow stationary``):
Newton-Krylov
returns to a perturbed known saddle with its index, each minimum search escapes it to a certified minimum (checked by a
dense eigendecomposition), and the result file is read back by ``info`` and ``diagnose --stationary``."""
from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import scipy.sparse.linalg

from pdeflow import Problem, loads_config
from pdeflow.analysis.certificate.certificate import NOT_STATIONARY
from pdeflow.analysis.dirac.stability import analyse_point, complement_spectrum, find_stationary_points
from pdeflow.analysis.hessian.spectrum import hessian_operator, origin_block, spectrum_ends, symmetry_basis
from pdeflow.analysis.stationary.stationary import (
    METHODS,
    SCHEMA,
    minimum,
    nearest,
    newton_step,
    read_stationary,
)
from pdeflow.core.model import split_theta
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory
from test_stability import TINY  # V = T = 3, d = 4, dh = 2: k = 32 full coordinates, 27 sequences exactly

pytestmark = pytest.mark.usefixtures("one_numba_thread")
MASS = np.array([0.3, 0.7])


@pytest.fixture(scope="module")
def saddle(one_numba_thread):
    """Two heads (masses 0.3, 0.7) at the nonzero stationary Dirac w* of the tiny problem: a stationary measure
    whose S splits into the Dirac's translation Hessian Htr (the mean) and frozen Hessian H0 (the spread), so its
    index is the number of negative eigenvalues of both on the complement of the symmetry directions (pdeflow
    stability's dense Hessians: an independent reference). w* is splitting-unstable: a saddle."""
    problem = Problem.from_config(loads_config(TINY))
    cands, _ = find_stationary_points(problem, n_starts=1, seed=0, start_scale=1.0, grad_tol=1e-12)
    a = analyse_point(problem, cands[-1].point, tol=1e-8)
    index = int(np.sum(a.h0_relevant < 0) + np.sum(a.htr_relevant < 0))
    assert a.verdict == "splitting-unstable" and index >= 1
    omega = np.tile(a.point, (2, 1))
    initial = problem.evaluate(np.zeros_like(omega) + 0.5, MASS).dissipation
    return problem, omega, index, initial


def invariants(problem: Problem, omega: np.ndarray) -> np.ndarray:
    """Per head WQ^T WK and WO WV: what the symmetry orbit of a head leaves unchanged."""
    wq, wk, wv, wo = split_theta(omega, problem.d, problem.head_dim)
    return np.concatenate([np.einsum("nad,nae->nde", wq, wk).reshape(len(omega), -1),
                           np.einsum("nda,nae->nde", wo, wv).reshape(len(omega), -1)], axis=1)


def dense_spectrum(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    op = hessian_operator(problem, omega, mass, np.zeros((omega.size, 0)))
    S = np.stack([op.matvec(e) for e in np.eye(omega.size)], axis=1)
    return complement_spectrum(0.5 * (S + S.T), symmetry_basis(problem, omega, mass))[0]


def test_nearest_returns_to_a_perturbed_saddle_with_its_index(saddle):
    """From the saddle moved by 1e-2 at random, Newton-Krylov comes back to it (up to the symmetry orbit: the
    per-head invariants and the energy agree to rounding) and reports its index."""
    problem, omega, index, initial = saddle
    start = omega + 1e-2 * np.random.default_rng(1).standard_normal(omega.shape)
    point = nearest(problem, start, MASS, initial, ratio=1e-26)
    assert point.converged and point.dissipation <= 1e-26 * initial
    E_saddle = problem.energy(omega, MASS)
    assert abs(point.energy - E_saddle) <= 1e-14 * E_saddle
    assert np.abs(invariants(problem, point.omega) - invariants(problem, omega)).max() <= 1e-9
    assert np.abs(point.omega - start).max() > 1e-3  # it moved back
    assert point.morse_index_lower == index
    assert point.verdict == f"saddle of index >= {index}"
    np.testing.assert_allclose(point.spectrum.lowest[:index], dense_spectrum(problem, omega, MASS)[:index],
                               atol=1e-10)
    assert point.products > 0 and point.history["dissipation"][-1] == point.dissipation


@pytest.mark.parametrize("method", METHODS)
def test_minimum_escapes_the_saddle_to_a_certified_minimum(saddle, method):
    """Started exactly at the saddle (zero gradient), each search follows the unstable eigenvector down and stops
    at a lower point with I <= 1e-12 I(0) whose lowest eigenvalue is positive beyond its residual; a dense
    eigendecomposition there agrees: positive definite on the complement of the symmetry directions."""
    problem, omega, index, initial = saddle
    point = minimum(problem, omega, MASS, initial, method=method)
    assert point.energy < problem.energy(omega, MASS) - 1e-3
    assert point.converged and point.certified and point.verdict == "local minimum"
    assert point.certificate.proven_minimum and point.spectrum.lowest_ritz == point.spectrum.lowest[0]
    values = dense_spectrum(problem, point.omega, MASS)
    assert values[0] > 0 and point.certificate.lower <= values[0] <= point.certificate.upper
    assert point.spectrum.lowest[0] == pytest.approx(values[0], abs=1e-10)
    assert point.spectrum.highest[-1] == pytest.approx(values[-1], rel=1e-10)
    assert problem.evaluate(point.omega, MASS).dissipation <= 1e-12 * initial


def test_minimum_finishes_by_newton_where_lbfgs_stalls_on_rounding(saddle):
    """Asked for I <= 1e-28 I(0), beyond what E's rounding lets a line search on E resolve (the L-BFGS search
    stalls near 1e-27 I(0)), Newton steps globalised on I finish it: a certified minimum with I below the target
    (the same minimum as at the default ratio). The ratio sits between the stall and I's own rounding floor,
    which is machine-dependent (about 3.5e-30 I(0) on AMD Zen 5 with AVX-512, where a target of 1e-30 I(0)
    cannot be met; lower on Zen 3)."""
    problem, omega, _, initial = saddle
    deep = minimum(problem, omega, MASS, initial, ratio=1e-28)
    assert deep.converged and deep.certified and deep.products > 0  # the search's products are Newton's
    assert problem.evaluate(deep.omega, MASS).dissipation <= 1e-28 * initial
    usual = minimum(problem, omega, MASS, initial)
    # at the usual ratio E is off E* by about I / (2 lambda_min) <= 1e-12 here
    assert usual.products == 0 and deep.energy == pytest.approx(usual.energy, abs=1e-12)


def test_minimum_holds_dead_heads_at_the_origin_and_leaves_them_out(monkeypatch):
    """Six heads, two exactly at the origin (a stationary point of every head in full coordinates, not in reduced
    ones): the L-BFGS search evaluates only the four live heads, and ends at the same certified minimum, the dead
    heads still at 0, as the search over all six heads (which keeps them at 0 too: their gradient vanishes)."""
    import pdeflow.analysis.stationary.stationary as st

    problem = Problem.from_config(loads_config(TINY))
    omega = np.random.default_rng(0).standard_normal((6, problem.k)) * 0.7
    omega[[1, 4]] = 0.0
    mass = np.full(6, 1.0 / 6.0)
    assert st.origin_is_stationary(problem, omega, mass)
    reduced = Problem.from_config(loads_config(TINY, ["model.coordinates=gain2"]))
    assert not st.origin_is_stationary(reduced, np.ones((3, reduced.k)), np.full(3, 1.0 / 3.0))
    initial = problem.evaluate(omega, mass).dissipation
    sizes = []
    evaluate = problem.evaluate
    monkeypatch.setattr(problem, "evaluate", lambda o, m: sizes.append(len(o)) or evaluate(o, m))
    held = minimum(problem, omega, mass, initial)
    assert held.certified and sizes.count(4) >= held.iterations and set(sizes) == {4, 6}
    assert np.all(held.omega[[1, 4]] == 0.0)
    monkeypatch.setattr(st, "origin_is_stationary", lambda *args: False)
    sizes.clear()
    every = minimum(problem, omega, mass, initial)
    assert set(sizes) == {6} and every.certified
    assert held.energy == pytest.approx(every.energy, abs=1e-13)


def test_the_spectrum_splits_off_heads_at_the_origin_exactly():
    """S has no block coupling a head at the origin to another (dE/domega_i = m_i grad Phi(omega_i) vanishes at 0
    for every measure) and that head's block is Hess Phi(0): the split spectrum (Lanczos on the live heads, the
    dense block's eigenvalues once per dead head) equals a dense eigendecomposition of the whole S, at a measure
    that is not stationary (the split does not need it) and with negative eigenvalues to count."""
    problem = Problem.from_config(loads_config(TINY))
    omega = np.random.default_rng(0).standard_normal((6, problem.k)) * 0.7
    omega[[1, 4]] = 0.0
    mass = np.full(6, 1.0 / 6.0)
    split = spectrum_ends(problem, omega, mass, split_origin=True)
    dense = dense_spectrum(problem, omega, mass)
    scale = np.abs(dense).max()
    assert split.lowest[0] == pytest.approx(dense[0], abs=1e-10 * scale) == split.lowest_ritz
    assert split.highest[-1] == pytest.approx(dense[-1], rel=1e-10)
    for value in np.concatenate([split.lowest, split.highest]):
        assert np.abs(dense - value).min() <= 1e-9 * scale
    assert split.morse_index_lower == int(np.sum(dense < -1e-9 * scale)) > 0
    values, _, _ = origin_block(problem, omega, mass)
    assert np.sum(values < 0) > 0  # the dead heads' block has negative eigenvalues, counted twice in the index
    assert split.n_symmetry == symmetry_basis(problem, omega, mass).shape[1]
    x = split.lowest_vectors
    np.testing.assert_allclose(np.linalg.norm(x, axis=0), 1.0, atol=1e-12)


def test_the_newton_solve_reaches_the_residual_asked_on_a_nearly_singular_indefinite_system():
    """A symmetric indefinite matrix with two eigenvalues near 0 (-1e-4, 2e-4) among [-1, 100], as S has near a
    saddle where heads die: the Newton step's solve reaches |A p + b| <= 0.01 |b|, where scipy's MINRES stops early
    (its |A| |x| test) and reports success at a residual twenty times larger: the reason the step uses GMRES."""
    rng = np.random.default_rng(0)
    n = 400
    values = np.concatenate([[-1e-4, 2e-4], np.linspace(-1.0, 100.0, n - 2)])
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    A = (Q * values) @ Q.T
    b = rng.standard_normal(n)
    p = newton_step(A, -b, 1e-2)
    assert np.linalg.norm(A @ p - b) <= 1e-2 * np.linalg.norm(b)
    x, info = scipy.sparse.linalg.minres(A, b, rtol=1e-2, maxiter=500)
    assert info == 0 and np.linalg.norm(A @ x - b) > 10 * 1e-2 * np.linalg.norm(b)


RUN = ["--set", "init.n_particles=2", "--set", "init.seed=3", "--set", "run.t_end=2.0", "--set", "run.n_frames=3",
       "--set", "diagnostics.gap=false"]


def test_the_command_writes_a_result_that_info_and_diagnose_read(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    traj = tmp_path / "run.h5"
    assert main(["run", str(config), "-o", str(traj), "--quiet", *RUN]) == 0
    out = tmp_path / "point.h5"
    assert main(["stationary", str(traj), "--kind", "nearest", "--frame", "1", "-o", str(out), "--quiet"]) == 0
    r = read_stationary(out)
    with h5py.File(out, "r") as f:
        assert f.attrs["schema"] == SCHEMA and "model" in f and "data" in f
    with h5py.File(traj, "r") as f:
        start = f["frames/omega"][1]
        initial = f["frames/dissipation"][0]
    problem = open_trajectory(traj).problem()
    again = nearest(problem, start, np.full(2, 0.5), initial)
    assert r["frame"] == 1 and r["kind"] == "nearest" and r["energy"] == again.energy
    np.testing.assert_array_equal(r["omega"], again.omega)
    assert r["dissipation"] <= 1e-12 * r["initial_dissipation"] and r["converged"]
    assert r["unstable_directions"].shape == (r["morse_index_lower"], 2, problem.k)
    capsys.readouterr()

    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "nearest from frame 1" in text and r["verdict"] in text and f"{r['energy']:.12g}" in text

    assert main(["diagnose", str(traj), "--stationary", str(out), "--no-write"]) == 0
    text = capsys.readouterr().out
    assert f"E*            {r['energy']:.12g} (E* of the stationary point found from frame 1)" in text

    # a search stopped by --max-wall reports the point it reached, not converged
    stopped = tmp_path / "stopped.h5"
    assert main(["stationary", str(traj), "--kind", "minimum", "--frame", "0", "--max-wall", "1e-9", "-o",
                 str(stopped), "--quiet"]) == 0
    s = read_stationary(stopped)
    assert not s["converged"] and s["verdict"] == "not converged" and "stopped after" in s["message"]
    # no certificate at a point that is not stationary: its Lanczos ends only, no dense matrix assembled
    assert s["certificate"] == NOT_STATIONARY and s["certificate_size"] == 0 and not s["certified"]
    assert s["lambda_min_upper"] == pytest.approx(s["lowest_ritz"]) and s["lanczos_steps"] > 0
    capsys.readouterr()
    assert main(["info", str(stopped)]) == 0
    text = capsys.readouterr().out
    assert "index       none: the point is not stationary" in text and "certified" not in text
    # ... and a search continues from a result's point, with its I(0), source frame and time
    polished = tmp_path / "polished.h5"
    assert main(["stationary", str(stopped), "--kind", "nearest", "-o", str(polished), "--quiet"]) == 0
    p = read_stationary(polished)
    assert p["converged"] and p["initial_dissipation"] == s["initial_dissipation"] and p["frame"] == 0
    assert p["start_energy"] == s["energy"] and p["source"] == f"{traj} via {stopped}"
    capsys.readouterr()

    # bad input: one line, exit 2, nothing overwritten
    before = out.read_bytes()
    assert main(["stationary", str(traj), "--kind", "minimum", "-o", str(out)]) == 2
    assert main(["stationary", str(traj), "--kind", "minimum", "--frame", "99", "-o", str(tmp_path / "x.h5")]) == 2
    assert main(["stationary", str(traj), "--kind", "saddle"]) == 2
    assert main(["stationary", str(out), "--kind", "nearest", "--frame", "1", "-o", str(tmp_path / "y.h5")]) == 2
    assert main(["diagnose", str(traj), "--stationary", str(traj), "--no-write"]) == 2
    assert out.read_bytes() == before and not (tmp_path / "x.h5").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 5 and all(line.startswith("pdeflow: error: ") for line in err), err


def test_classify_grows_one_lanczos_run_until_the_lowest_end_converges(saddle):
    """Near a minimum the lowest eigenvalues converge last: classify's Lanczos run goes on past krylov_dim steps (up
    to KRYLOV_GROWTH times) until the lowest Ritz value converges, in one run (no products repeated), and
    what it reports equals a dense eigendecomposition of S off the symmetry directions."""
    import pdeflow.analysis.stationary.stationary as st

    problem, omega, _, _ = saddle
    dense = dense_spectrum(problem, omega, MASS)
    c = st.Counter(problem, MASS, omega.shape)
    before = problem.counts["jvp_exact"]
    spectrum, certificate = st.classify(problem, c, c.coordinates(omega), 11, lambda msg: None)
    products = problem.counts["jvp_exact"] - before
    assert 11 < products < 11 * st.KRYLOV_GROWTH and products % 11 == 0  # stopped at a check before the longest
    assert c.gradients == 1 and products == spectrum.products  # one start vector, one run
    assert c.certification.products == products and c.products == 0  # the certification's, not the search's
    assert certificate.index_lower >= 1 and certificate.products == 0  # a saddle by interlacing: nothing assembled
    assert spectrum.lowest[0] == spectrum.lowest_ritz  # the lowest Ritz value is the converged one
    np.testing.assert_allclose(spectrum.lowest[0], dense[0], atol=1e-9 * np.abs(dense).max())
    short = st.spectrum_ends(problem, omega, MASS, krylov_dim=11)
    # eleven steps alone leave the lowest Ritz value unconverged there: the growth was needed
    assert short.lowest.size == 0 or short.lowest[0] != short.lowest_ritz


def shipped(name: str):
    """A shipped result of data/stationary: (path, stored result, the problem stored in it)."""
    from pathlib import Path

    from pdeflow.io.problem_file import stored_problem

    path = Path(__file__).resolve().parents[2] / "data" / "stationary" / name
    return path, read_stationary(path), stored_problem(path)


def lowest_end_rederived(problem: Problem, r: dict, krylov_dim: int = 20) -> None:
    """The stored verdict checked at the stored point at a suite's cost, by what could refute it. A Lanczos-only
    verdict ("no negative eigenvalue found", not certified): :func:`certify` of a fresh short Lanczos run says the
    live heads exceed the dense limit, so nothing here may be called certified. A dense certificate (proven with a
    raised ``--dense-limit``): every Ritz value of a fresh ``krylov_dim``-step run and the Rayleigh quotient of the
    stored lowest vector bound lambda_min from above, so neither may fall below the stored lower bound. Either way the
    fresh run finds no negative Ritz value, none below the stored lowest value, and one product gives the stored
    lowest vector's Rayleigh quotient and residual, the stored lowest value within that residual."""
    from pdeflow.analysis.certificate.certificate import (
        BY_DENSE,
        BY_LANCZOS,
        DENSE_LIMIT,
        LANCZOS_VERDICT,
        certify,
    )

    omega, mass = np.asarray(r["omega"]), np.asarray(r["mass"])
    ends = spectrum_ends(problem, omega, mass, krylov_dim=krylov_dim, split_origin=True)
    live = int(np.sum(~np.all(omega == 0.0, axis=1))) * problem.k
    if r["certificate"] == BY_DENSE:
        assert r["certified"] and r["verdict"] == "local minimum" and r["lambda_min_lower"] > 0
        assert r["certificate_size"] >= live - r["n_symmetry"] and r["dense_limit"] >= live > DENSE_LIMIT
        assert ends.lowest_ritz >= r["lambda_min_lower"]
    else:
        assert not r["certified"] and r["certificate"] == BY_LANCZOS
        assert r["verdict"] == LANCZOS_VERDICT.format(m=r["lanczos_steps"])
        cert = certify(problem, omega, mass, ends)
        assert cert.kind == BY_LANCZOS and cert.size == live > DENSE_LIMIT and not cert.proven_minimum
    assert ends.morse_index_lower == 0 and ends.lowest_ritz >= r["lowest"][0] * (1 - 1e-9)
    assert "lowest_directions" in r
    x = r["lowest_directions"][0].ravel()
    y = hessian_operator(problem, omega, mass).matvec(x)
    theta = float(x @ y)
    residual = float(np.linalg.norm(y - theta * x))
    assert residual <= 1e-3 * theta and abs(theta - r["lowest"][0]) <= residual + 1e-12 * theta
    if r["certificate"] == BY_DENSE:
        assert r["lambda_min_lower"] <= theta <= r["lambda_min_upper"] + residual


def test_the_shipped_minimum_of_the_long_run_is_stationary_at_its_energy():
    """data/stationary/longtime-minimum.h5, the stationary point of data/configs/longtime.toml with no negative
    eigenvalue found (docs, "Stationary points"): one gradient evaluation of the problem stored in the file,
    independent of the search that found it, gives I <= 1e-12 I(0) at the stored point and the stored energy; the
    verdict and the lowest end are re-derived (:func:`lowest_end_rederived`); the stored spectrum has the
    condition number the docs state."""
    _, r, problem = shipped("longtime-minimum.h5")
    ev = problem.evaluate(r["omega"], r["mass"])
    assert ev.dissipation <= 1e-12 * r["initial_dissipation"]
    assert ev.energy == pytest.approx(r["energy"], rel=1e-13)
    lowest_end_rederived(problem, r)  # its lowest Ritz vector: 600 steps (residual 5.6e-8), added after the search
    assert r["lowest"][0] > r["lowest_residual"][0] and r["lowest"][0] == pytest.approx(7.39e-5, rel=1e-3)
    assert r["lambda_max"] / r["lowest"][0] == pytest.approx(1.23e6, rel=1e-2)


def test_the_shipped_minimum_reached_from_t0_is_stationary_and_its_dead_heads_are_stable():
    """data/stationary/longtime-minimum-from-t0.h5, the point studies/minimum/TIME_TO_MINIMUM.md reached from t ~ 1 of
    data/configs/longtime.toml by L-BFGS: one gradient of the stored problem gives I <= 1e-12 I(0) and the stored
    energy; 74 heads sit exactly at the origin, and the block of S they share, Hess Phi(0; rho), rebuilt densely
    from the exact Hessian-vector product, is positive definite beyond its rounding bound (that part proven without
    Lanczos); the live part's lowest Ritz value, re-derived from the stored vector by one product, is the one the
    docs state, and the stored verdict (a dense certificate, proven with a raised ``--dense-limit``) is checked by what
    could refute it (:func:`lowest_end_rederived`)."""
    from pdeflow.analysis.certificate.certificate import eigenvalue_bound
    from pdeflow.analysis.hessian.local_geometry import dense_hessian

    _, r, problem = shipped("longtime-minimum-from-t0.h5")
    omega, mass = np.asarray(r["omega"]), np.asarray(r["mass"])
    ev = problem.evaluate(omega, mass)
    assert ev.dissipation <= 1e-12 * r["initial_dissipation"]
    assert ev.energy == pytest.approx(r["energy"], rel=1e-13) and r["energy"] == pytest.approx(0.503995543445)
    assert r["time"] < 1.0 and int(np.sum(np.all(omega == 0.0, axis=1))) == 74
    H = dense_hessian(lambda u: problem.hvp(np.zeros(problem.k), u, omega, mass), problem.k)
    values, _, delta = eigenvalue_bound(H)
    assert values[0] - delta > 0
    lowest_end_rederived(problem, r)
    assert r["lowest"][0] == pytest.approx(5.016e-5, rel=1e-3) and r["lowest_residual"][0] <= 1e-3 * r["lowest"][0]


@pytest.mark.slow
def test_the_shipped_minimum_from_t0s_positive_lower_bound_is_rederived():
    """The certificate of data/stationary/longtime-minimum-from-t0.h5 re-derived from the stored point (issue 52,
    finding 8), not re-read: S assembled afresh from its structure on the 54 live heads (13,338 unknowns off the
    symmetry directions) and Rump's test at one shift below the Rayleigh quotient of the stored lowest direction (one
    product: the estimate only fixes the shift; the proof is the factorisation) prove lambda_min >= a positive lower
    bound, the origin block's included; the fresh bracket overlaps the stored one. One factorisation: ~65 CPU
    seconds and 3.4 GB (measured on 2 cores at load 14: 3.9 minutes of wall), hence ``slow``."""
    from pdeflow.analysis.certificate.certificate import BY_CHOLESKY, certify

    _, r, problem = shipped("longtime-minimum-from-t0.h5")
    omega, mass = np.asarray(r["omega"]), np.asarray(r["mass"])
    x = r["lowest_directions"][0].ravel()
    y = hessian_operator(problem, omega, mass).matvec(x)
    theta = float(x @ y)
    residual = float(np.linalg.norm(y - theta * x))
    assert residual <= 1e-9 * theta    # resolved: one shifted factorisation tried at theta (1 - 1e-7)
    hint = spectrum_ends(problem, omega, mass, krylov_dim=2, split_origin=True)
    hint = dataclasses.replace(hint, lowest_ritz=theta, lowest_ritz_residual=residual)
    cert = certify(problem, omega, mass, hint, dense_limit=14000, about_minimum=False)
    assert cert.kind == BY_CHOLESKY and cert.proven_minimum and cert.lower > 0
    assert cert.size == r["certificate_size"]
    assert cert.lower <= r["lambda_min_upper"] and r["lambda_min_lower"] <= cert.upper
    assert cert.upper - cert.lower <= 1e-4 * cert.lower


def test_an_iteration_limit_over_several_starts_is_reported_whole(monkeypatch):
    """L-BFGS starts again on the live heads whenever heads die (here: at every check, FREEZE_GAIN = 0); the limit
    of ``max_iter`` iterations counts every start, and the message says so, not the last start's share."""
    from pathlib import Path

    import pdeflow.analysis.stationary.stationary as st

    full = Path(__file__).resolve().parents[2] / "data" / "configs" / "full.toml"   # k = 256
    problem = Problem.from_config(loads_config(full.read_text()))
    omega = np.random.default_rng(0).standard_normal((16, problem.k)) * 0.5
    mass = np.full(16, 1.0 / 16.0)
    monkeypatch.setattr(st, "FREEZE_GAIN", 0)
    point = minimum(problem, omega, mass, problem.evaluate(omega, mass).dissipation, ratio=1e-300, max_iter=150,
                    max_restarts=0, max_cost=400)
    assert point.iterations == 150 and "150 iterations (the limit, over 2 starts)" in point.message
