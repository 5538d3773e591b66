"""The one rule on the sign of S (:mod:`pdeflow.analysis.certificate.certificate`): a negative Ritz value of any
block, converged
or not, is index >= 1 for the spectral record's phases, ``pdeflow stationary`` and the rate check; a minimum is
certified only by the dense eigenvalue bound or the Cholesky bound (Rump's test on S assembled from its structure),
checked here against ``numpy.linalg.eigh`` of S built independently from central differences of grad Phi
(:func:`test_spectral_record.dense_s`) with the symmetry tangents removed, and against each other (the dense bound's S
from n exact JVPs); Rump's test refuses an exactly singular matrix that floating-point Cholesky factorises; and a
point ``stationary`` certifies is one ``stability --stationary`` accepts."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from pdeflow import Problem, loads_config
from pdeflow.analysis.certificate.certificate import (
    BY_CHOLESKY,
    BY_DENSE,
    BY_LANCZOS,
    LANCZOS_VERDICT,
    PROOFS,
    certify,
    cholesky_bound,
    perron_bound,
    shifted_cholesky_bound,
    symmetric_part,
)
from pdeflow.analysis.convergence.spectral import MINIMUM, SADDLE, phase_of
from pdeflow.analysis.dirac.stability import complement_spectrum
from pdeflow.analysis.hessian.spectrum import origin_block, spectrum_ends, symmetry_basis
from pdeflow.analysis.linearised.minimum_rates import lowest_certified
from pdeflow.analysis.stationary.stationary import minimum, nearest, read_stationary, write_stationary
from pdeflow.core.config import ConfigError
from pdeflow.interface.cli import main
from test_minimum_rates import PROBLEM, known_minimum  # noqa: F401  (the fixture: a strict minimum, dense spectrum)
from test_spectral_record import dense_s, head_symmetries
from test_stability import TINY

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def reference_spectrum(problem: Problem, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """Eigenvalues of S off every live head's symmetry tangents, from central differences of grad Phi (not the JVP),
    together with the block of each head exactly at the origin (there S has no coupling to other heads)."""
    live = ~np.all(omega == 0.0, axis=1)
    S = dense_s(problem, omega[live], mass[live])
    values = complement_spectrum(S, head_symmetries(problem, omega[live]))[0]
    if (~live).any():
        block = dense_s(problem, omega, mass)
        k = problem.k
        first = int(np.flatnonzero(~live)[0])
        origin = np.linalg.eigvalsh(block[first * k:(first + 1) * k, first * k:(first + 1) * k])
        values = np.concatenate([values] + [origin] * int((~live).sum()))
    return np.sort(values)


def test_a_negative_unconverged_ritz_value_is_a_saddle_whatever_a_converged_one_says():
    """Two heads at a seeded random state, 7 Lanczos steps: the lowest Ritz value is negative and unconverged, the
    lowest converged one positive (the issue's finding 3, first case). The dense reference has a negative
    eigenvalue; the index (interlacing) is >= 1, the phase is a saddle and the rate check refuses."""
    problem = Problem.from_config(loads_config(TINY))
    rng = np.random.default_rng(1)
    omega, mass = rng.standard_normal((2, problem.k)), rng.dirichlet(np.full(2, 2.0))
    ends = spectrum_ends(problem, omega, mass, krylov_dim=7)
    assert ends.lowest.size and ends.lowest[0] > 0 and ends.lowest_ritz < 0        # the trap
    assert ends.lowest_ritz_residual > 1e-3 * abs(ends.lowest_ritz)                # unconverged
    reference = reference_spectrum(problem, omega, mass)
    assert reference[0] <= ends.lowest_ritz                                        # interlacing
    assert ends.morse_index_lower >= 1
    phase = phase_of(ends.lowest[0], ends.lowest_residual[0], ends.morse_index_lower, 1e-9, 1.0, 1e-4)
    assert phase == SADDLE.format(n=ends.morse_index_lower) != MINIMUM
    # a record stored before the index counted unconverged values: the lowest Ritz value alone decides
    assert phase_of(ends.lowest[0], ends.lowest_residual[0], 0, 1e-9, 1.0, 1e-4,
                    lowest_ritz=ends.lowest_ritz) == SADDLE.format(n=1)
    with pytest.raises(ConfigError, match="not a certified local minimum: index >= [1-9]"):
        lowest_certified(problem, omega, mass, symmetry_basis(problem, omega, mass), krylov_dim=7)


@pytest.fixture(scope="module")
def dead_head_saddle(one_numba_thread):
    """Five heads, two exactly at the origin, at a stationary point (Newton-Krylov from a seeded start; weight decay
    0.12 keeps the origin's block positive definite there) whose live heads sit at a saddle."""
    problem = Problem.from_config(loads_config(TINY, ["model.weight_decay=0.12"]))
    omega = np.random.default_rng(0).standard_normal((5, problem.k)) * 1.5
    omega[[1, 3]] = 0.0
    mass = np.full(5, 0.2)
    point = nearest(problem, omega, mass, problem.evaluate(omega, mass).dissipation, krylov_dim=2)
    assert point.converged and int(np.sum(np.all(point.omega == 0.0, axis=1))) == 2
    return problem, point


def test_an_origin_block_does_not_mask_an_unresolved_live_block(dead_head_saddle):
    """The issue's second case: with 2 Lanczos steps the live block's lowest Ritz value is positive and unconverged,
    the origin block's (dense, exact) is positive and lower, yet the dense spectrum is negative. Not certified:
    the dense bound finds the index of the reference; nor does Lanczos alone claim anything; nearest says saddle."""
    problem, point = dead_head_saddle
    omega, mass = point.omega, point.mass
    ends = spectrum_ends(problem, omega, mass, krylov_dim=2, split_origin=True)
    values, _, _ = origin_block(problem, omega, mass)
    assert values[0] > 0 and ends.lowest_ritz == values[0] and ends.morse_index_lower == 0   # the mask
    reference = reference_spectrum(problem, omega, mass)
    scale = np.abs(reference).max()
    negative = int(np.sum(reference < -1e-6 * scale))
    assert negative >= 1
    assert not ends.no_negative_found and ends.unresolved_blocks == 1
    cert = certify(problem, omega, mass, ends)
    assert cert.kind == BY_DENSE and not cert.proven_minimum and cert.index_lower == negative
    assert cert.upper < 0 and cert.lower - 1e-8 <= reference[0] <= cert.upper + 1e-8  # reference: differences
    assert not point.certified and point.verdict.startswith("saddle of index >= ")


def test_the_certificate_brackets_lambda_min_of_an_independent_dense_s(known_minimum):  # noqa: F811
    """At a strict minimum: the certificate is dense, its interval [lower, upper] holds the lowest eigenvalue of S
    built from central differences (error ~1e-9 here), is no wider than its stated rounding bound, and its lowest
    eigenvalues are the reference's; with the dense limit below the live heads' unknowns it is Lanczos evidence,
    not a proof, and says so."""
    problem, omega, mass, values = known_minimum
    reference = reference_spectrum(problem, omega, mass)
    np.testing.assert_allclose(reference[:values.size], values, atol=1e-9)
    ends = spectrum_ends(problem, omega, mass, krylov_dim=5)
    cert = certify(problem, omega, mass, ends, method="dense")
    assert cert.kind == BY_DENSE and cert.proven_minimum and cert.lower > 0
    assert cert.size == omega.size - symmetry_basis(problem, omega, mass).shape[1] == reference.size
    assert cert.lower - 1e-8 <= reference[0] <= cert.upper + 1e-8
    assert cert.upper - cert.lower <= 2.001 * cert.delta and cert.delta < 1e-10  # 2 delta, to rounding
    np.testing.assert_allclose(cert.values[:3], reference[:3], atol=1e-8)
    assert cert.products == omega.size
    lanczos = certify(problem, omega, mass, ends, dense_limit=omega.size - 1)
    assert lanczos.kind == BY_LANCZOS and not lanczos.proven_minimum and lanczos.products == 0
    assert LANCZOS_VERDICT.format(m=ends.lanczos_steps) in lanczos.describe()


def test_the_cholesky_certificate_agrees_with_the_dense_one(known_minimum):  # noqa: F811
    """At a strict minimum the default certificate is the Cholesky bound on S assembled from its structure (2 k
    forward passes, not n products): its interval holds the lowest eigenvalue of the dense bound's C (eigh of C
    from n exact JVPs, an independent assembly) and of S from central differences, is no wider than 1e-6 of it,
    and its Rayleigh value is that eigenvalue to 1e-6."""
    problem, omega, mass, _ = known_minimum
    reference = reference_spectrum(problem, omega, mass)
    ends = spectrum_ends(problem, omega, mass, krylov_dim=5)
    chol = certify(problem, omega, mass, ends)
    dense = certify(problem, omega, mass, ends, method="dense")
    assert chol.kind == BY_CHOLESKY and chol.proven_minimum and dense.kind == BY_DENSE
    lam = float(dense.values[0])
    assert chol.lower <= lam <= chol.upper and chol.upper - chol.lower <= 1e-6 * lam
    assert abs(float(chol.values[0]) - lam) <= 1e-6 * lam and chol.size == dense.size
    assert chol.lower - 1e-8 <= reference[0] <= chol.upper + 1e-8
    assert chol.products == 2 * problem.k and dense.products == omega.size
    assert "certified by the Cholesky bound" in chol.describe()
    with pytest.raises(ValueError, match="method must be one of"):
        certify(problem, omega, mass, ends, method="lu")


def test_the_result_file_stores_the_certificates_lambda_min_not_a_higher_ritz_value(known_minimum, tmp_path):  # noqa: F811
    """A certified point whose Lanczos run resolved only higher Ritz values (as a short run on the live heads beside
    the origin block's exact values does: the structured route at longtime.toml's minimum stored 6.8e-4 where its
    certificate proved lambda_min in [8.19998e-5, 8.20008e-5]): the file's ``lambda_min`` is the certificate's
    value, inside its bracket and the eigenvalue of S from central differences to 1e-6; ``pdeflow info``'s text
    says so, the index is 0 and proven, and the higher value is shown as a Ritz value, not as lambda_min."""
    import dataclasses

    from pdeflow.analysis.stationary.stationary import format_stationary

    problem, omega, mass, _ = known_minimum
    reference = reference_spectrum(problem, omega, mass)
    point = minimum(problem, omega, mass, 1.0)
    assert point.certified and point.certificate.kind in PROOFS
    lam = float(reference[0])
    higher = np.random.default_rng(3).standard_normal((omega.size, 1))
    ends = dataclasses.replace(point.spectrum, lowest=np.array([2.0 * lam]), lowest_residual=np.array([1e-14]),
                               lowest_vectors=higher / np.linalg.norm(higher))
    path = tmp_path / "point.h5"
    write_stationary(path, dataclasses.replace(point, spectrum=ends), loads_config(PROBLEM), problem, source="test",
                     frame=0, time_of_frame=0.0, ratio=1e-12)
    r = read_stationary(path)
    assert r["lambda_min_lower"] <= r["lambda_min"] <= r["lambda_min_upper"]
    assert abs(r["lambda_min"] / lam - 1) < 1e-6 and r["morse_index_lower"] == 0
    text = format_stationary(path, r)
    assert f"lambda_min  {r['lambda_min']:.10g}, in the certificate's bracket" in text
    assert "index       0 (proven: lambda_min >= " in text and f"low Ritz    {2.0 * lam:+.6g}" in text


def test_rump_test_brackets_a_known_spectrum_and_refuses_singular_matrices():
    """Rump's test: on Q diag(lambda) Q^T the bracket holds lambda_min = 1e-3 within 1e-6 of it, and an indefinite
    matrix has no bound; an exactly singular integer matrix X X^T (lambda_min = 0) whose shifted floating-point
    Cholesky factorisation succeeds at the shift 2^-50 is not proven positive definite (without the rounding bound
    it would be), nor certified by the whole bracket."""
    rng = np.random.default_rng(0)
    n = 60
    q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    values = np.concatenate([[1e-3], np.geomspace(1e-2, 10.0, n - 1)])
    A = (q * values) @ q.T
    symmetric_part(A)
    bound = cholesky_bound(A)
    assert bound.lower <= 1e-3 <= bound.upper and bound.upper - bound.lower <= 1e-9 and bound.lower > 0
    values[0] = -1e-3
    indefinite = (q * values) @ q.T
    symmetric_part(indefinite)
    assert cholesky_bound(indefinite) is None
    X = np.random.default_rng(2).integers(-3, 4, size=(40, 39)).astype(float)
    singular = X @ X.T  # integers, exact: singular
    work = singular - 2.0 ** -50 * np.eye(40)
    scipy.linalg.cholesky(work)  # the premise: floating point factorises it
    assert shifted_cholesky_bound(singular, 2.0 ** -50, work) <= 0
    whole = cholesky_bound(singular)
    assert whole is None or whole.lower <= 0


def test_an_estimate_of_lambda_min_saves_a_factorisation_and_a_wrong_one_does_not_mislead():
    """With lambda_min itself as the estimate one shifted factorisation and inverse iteration give the same bracket
    (theta to 1e-12); an estimate above lambda_min (the factorisation fails) or far below it (a loose bracket) falls
    back to the two factorisations and the same bracket; an exactly singular matrix with a tiny positive estimate
    is still not proven positive definite."""
    rng = np.random.default_rng(0)
    n = 60
    q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    A = (q * np.concatenate([[1e-3], np.geomspace(1e-2, 10.0, n - 1)])) @ q.T
    symmetric_part(A)
    plain = cholesky_bound(A)
    fast = cholesky_bound(A, estimate=plain.theta)
    assert "inverse" in fast.walls and "factor" not in fast.walls and "factor" in plain.walls
    assert abs(fast.theta - plain.theta) <= 1e-12 * plain.theta and fast.lower <= 1e-3 <= fast.upper
    assert fast.upper - fast.lower <= 1e-9
    for wrong in (2e-3, 5e-4):
        again = cholesky_bound(A, estimate=wrong)
        assert "factor" in again.walls and again.lower == plain.lower and again.upper == plain.upper
    X = np.random.default_rng(2).integers(-3, 4, size=(40, 39)).astype(float)
    singular = X @ X.T
    whole = cholesky_bound(singular, estimate=1e-15)
    assert whole is None or whole.lower <= 0


def test_perron_bound_is_an_upper_bound_below_the_trace():
    """The Collatz-Wielandt bound on rho(|R|^T |R|) of a Cholesky factor with mixed signs lies above the Perron root
    (eigvalsh of the nonnegative matrix), within 10 % of it, and below the trace bound it replaces."""
    rng = np.random.default_rng(4)
    G = rng.standard_normal((50, 50))
    R = scipy.linalg.cholesky(G @ G.T + 0.1 * np.eye(50))
    M = np.abs(R).T @ np.abs(R)
    rho = float(np.linalg.eigvalsh(M)[-1])
    for block in (16, 7, 50):   # blocks of rows from their diagonal on, the last one short or the whole factor
        bound = perron_bound(R, block=block)
        assert rho <= bound <= 1.1 * rho and bound < float(np.trace(M)), block


def test_symmetric_part_in_blocks():
    """The blockwise symmetrisation gives (C + C^T) / 2 and the asymmetry |C - C^T|_F, blocks not dividing n."""
    C = np.random.default_rng(1).standard_normal((37, 37))
    expected = 0.5 * (C + C.T)
    asymmetry = float(np.linalg.norm(C - C.T))
    assert symmetric_part(C, block=8) == pytest.approx(asymmetry, rel=1e-12)
    assert np.array_equal(C, C.T) and np.allclose(C, expected, rtol=0, atol=1e-15)


def test_stationary_certifies_what_stability_accepts(known_minimum, tmp_path, capsys):  # noqa: F811
    """``pdeflow stationary --kind nearest`` from a result at the known minimum certifies it (dense bound), and
    ``pdeflow stability --stationary`` accepts that file and names the certificate; with ``--dense-limit 0`` the
    same point is "no negative eigenvalue found in m Lanczos steps" (not certified), and stability refuses it,
    as it refuses the certified file when told it may not assemble S (it re-derives the proof)."""
    problem, omega, mass, _ = known_minimum
    start = tmp_path / "start.h5"
    write_stationary(start, minimum(problem, omega, mass, 1.0), loads_config(PROBLEM), problem, source="test",
                     frame=0, time_of_frame=0.0, ratio=1e-12)
    proven, lanczos = tmp_path / "proven.h5", tmp_path / "lanczos.h5"
    assert main(["stationary", str(start), "--kind", "nearest", "-o", str(proven), "--quiet"]) == 0
    assert main(["stationary", str(start), "--kind", "nearest", "-o", str(lanczos), "--quiet",
                 "--dense-limit", "0"]) == 0
    p, q = read_stationary(proven), read_stationary(lanczos)
    assert p["certified"] and p["verdict"] == "local minimum" and p["certificate"] in PROOFS
    assert 0 < p["lambda_min_lower"] <= p["lambda_min_upper"]
    assert not q["certified"] and q["certificate"] == BY_LANCZOS
    assert q["verdict"] == LANCZOS_VERDICT.format(m=q["lanczos_steps"])
    capsys.readouterr()
    assert main(["stability", "--stationary", str(proven), "-o", str(tmp_path / "rates.h5"), "--random", "0",
                 "--no-linearity", "--quiet"]) == 0
    assert "certificate: certified by the Cholesky bound" in capsys.readouterr().out
    assert main(["stability", "--stationary", str(lanczos), "-o", str(tmp_path / "x.h5"), "--quiet"]) == 2
    # the products engine re-proves the point where it measures: above the dense limit it refuses
    assert main(["stability", "--stationary", str(proven), "-o", str(tmp_path / "y.h5"), "--quiet",
                 "--dense-limit", "0", "--engine", "products"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not a certified local minimum" in err[0] and "no negative eigenvalue found" in err[1]
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "y.h5").exists()
    # the frozen engine (the default) takes the source's proof there, and says so
    assert main(["stability", "--stationary", str(proven), "-o", str(tmp_path / "z.h5"), "--random", "0",
                 "--no-linearity", "--dense-limit", "0"]) == 0
    assert "certificate: the source's, at the point before the polish" in capsys.readouterr().out


def test_minimum_leaves_the_dead_head_saddle_for_a_proven_minimum(dead_head_saddle):
    """Where 2 Lanczos steps show no negative value, the dense bound's lowest eigenpair is the escape direction: its
    curvature, measured on S built by central differences, is the negative eigenvalue, and E falls along it. The
    search itself (2 steps per spectrum, grown to 6) leaves the saddle and ends at a lower point the certificate
    proves a minimum; the independent dense reference agrees."""
    from pdeflow.analysis.stationary.stationary import descent_direction

    problem, point = dead_head_saddle
    omega, mass = point.omega, point.mass
    ends = spectrum_ends(problem, omega, mass, krylov_dim=2, split_origin=True)
    lam, x = descent_direction(ends, certify(problem, omega, mass, ends))
    assert ends.lowest_ritz > 0 > lam
    assert x @ dense_s(problem, omega, mass) @ x == pytest.approx(lam, abs=1e-8)
    root = np.sqrt(mass)[:, None]
    assert problem.energy(omega + 1e-2 * x.reshape(omega.shape) / root, mass) < point.energy
    found = minimum(problem, omega, mass, point.initial_dissipation, krylov_dim=2)
    assert found.energy < point.energy - 1e-6
    assert found.certified and found.verdict == "local minimum" and found.certificate.proven_minimum
    reference = reference_spectrum(problem, found.omega, found.mass)
    assert reference[0] > 0 and found.certificate.lower - 1e-8 <= reference[0] <= found.certificate.upper + 1e-8
