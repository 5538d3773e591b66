"""A certificate's bracket about the minimum its point approximates
(:mod:`pdeflow.analysis.certificate.about_minimum`; issue 52, finding 6): at a point off a known minimum (2 heads,
lambda_min > 1e-3 there by central differences) the bracket at the point is sharp and misses the minimum's
lambda_min, the widened one holds it; ``pdeflow stationary``'s result and ``pdeflow stability --stationary``'s polished
certificate then give overlapping brackets about the same minimum, where their brackets at their own points are
disjoint; and the widening shrinks with the distance, to first order."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from pdeflow import loads_config
from pdeflow.analysis.certificate.certificate import certify
from pdeflow.analysis.hessian.spectrum import spectrum_ends
from pdeflow.analysis.stationary.stationary import lambda_min_text, minimum, read_stationary, write_stationary
from pdeflow.interface.cli import main
from test_minimum_rates import PROBLEM, known_minimum  # noqa: F401  (the fixture: a strict minimum, dense spectrum)

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def off_the_minimum(problem, omega, mass, size: float, seed: int = 3) -> np.ndarray:
    """The minimum ``omega`` [N, k] moved by ``size`` (mass-weighted) along a seeded random direction."""
    root = np.sqrt(mass)[:, None]
    d = np.random.default_rng(seed).standard_normal(omega.shape)
    return omega + size * d / np.linalg.norm(d) / root


def test_the_widened_bracket_holds_the_minimums_lambda_min_and_shrinks_with_the_distance(known_minimum):  # noqa: F811
    """At points 1e-4, 1e-5 and 1e-6 off the minimum the certificate's bracket at the point misses the minimum's
    lambda_min (central differences at the minimum), the bracket about the minimum holds it, and its widening is
    proportional to the distance bound sqrt(I) / lambda_min (the slope |q| the same to 1 %); at the minimum itself
    (I ~ 1e-30) the widening is below 1e-12."""
    problem, omega, mass, values = known_minimum
    lam_star = float(values[0])
    slopes = []
    for size in (1e-4, 1e-5, 1e-6):
        point = off_the_minimum(problem, omega, mass, size)
        cert = certify(problem, point, mass, spectrum_ends(problem, point, mass, krylov_dim=40))
        assert cert.proven_minimum and cert.drift_products == 5
        assert not cert.lower <= lam_star <= cert.upper, size        # the premise: the point's bracket misses it
        low, high = cert.minimum_bracket
        assert low <= lam_star <= high and 0 < low
        assert cert.distance >= size                                  # a bound on the distance to the minimum
        slopes.append(cert.drift / cert.distance)
        assert "at the minimum it approximates" in cert.describe()
    np.testing.assert_allclose(slopes, slopes[0], rtol=1e-2)
    at_min = certify(problem, omega, mass, spectrum_ends(problem, omega, mass, krylov_dim=40))
    assert at_min.lower <= lam_star <= at_min.upper and at_min.drift <= 1e-12


def test_stationary_and_stability_give_overlapping_brackets_about_one_minimum(known_minimum, tmp_path,  # noqa: F811
                                                                               capsys):
    """``pdeflow stationary``'s result at a point 1e-5 off the minimum (written as the command writes it) and
    ``pdeflow stability --stationary`` on it (which polishes to the rounding floor first): their brackets at their
    own points are disjoint, each 1e-7 wide; their brackets about the minimum overlap, the polished one inside the
    other, and both hold the minimum's lambda_min from central differences. The result file, ``pdeflow info`` and
    the rates file say which bracket is which."""
    problem, omega, mass, values = known_minimum
    lam_star = float(values[0])
    point = minimum(problem, off_the_minimum(problem, omega, mass, 1e-5), mass, 1.0, ratio=1e-6, krylov_dim=40)
    assert point.certified and point.iterations == 0                  # stored where it was given
    stored = tmp_path / "minimum.h5"
    write_stationary(stored, point, loads_config(PROBLEM), problem, source="test", frame=0, time_of_frame=0.0,
                     ratio=1e-6)
    r = read_stationary(stored)
    rates = tmp_path / "rates.h5"
    assert main(["stability", "--stationary", str(stored), "-o", str(rates), "--random", "0", "--no-linearity",
                 "--no-plots", "--quiet"]) == 0
    with h5py.File(rates, "r") as f:
        g = f["rates"]
        polished_lower, i_star = float(g.attrs["lambda_min_lower"]), float(g.attrs["i_star"])
        polished = float(g.attrs["lambda_min_lower_at_minimum"]), float(g.attrs["lambda_min_upper_at_minimum"])
        certificate = str(g.attrs["certificate"])
    assert i_star < 1e-18 and polished[0] <= polished_lower <= polished[1] <= polished[0] + 1e-6 * lam_star
    # at their own points: disjoint (the finding)
    assert r["lambda_min_upper"] < polished[0] or polished[1] < r["lambda_min_lower"]
    # about the minimum: overlapping, the polished bracket inside the stored point's
    low, high = r["lambda_min_lower_at_minimum"], r["lambda_min_upper_at_minimum"]
    assert low <= polished[0] <= polished[1] <= high
    assert low <= lam_star <= high and polished[0] - 1e-8 <= lam_star <= polished[1] + 1e-8
    assert r["distance_to_minimum"] >= 1e-5 and 0 < low
    text = lambda_min_text(r)
    assert "at this point; at the minimum the point approximates in [" in text
    assert "at this point" in certificate and "at the minimum it approximates" in certificate
    capsys.readouterr()
    assert main(["info", str(stored)]) == 0
    assert "at the minimum the point approximates" in capsys.readouterr().out


def test_a_point_too_far_from_its_minimum_says_so(known_minimum):  # noqa: F811
    """3e-2 off the minimum (still certified there) the widening exceeds the lower bound: the bracket about the
    minimum reaches below 0 and the certificate says the minimum's lambda_min is not resolved from 0."""
    problem, omega, mass, _ = known_minimum
    point = off_the_minimum(problem, omega, mass, 3e-2)
    cert = certify(problem, point, mass, spectrum_ends(problem, point, mass, krylov_dim=40))
    assert cert.proven_minimum and cert.minimum_bracket[0] <= 0
    assert "not resolved from 0 at this distance" in cert.describe()
    assert not certify(problem, point, mass, spectrum_ends(problem, point, mass, krylov_dim=40),
                       about_minimum=False).about_minimum()


def test_the_slope_is_the_gradient_of_lambda_min_and_the_widening_its_size(known_minimum):  # noqa: F811
    """The measured slope q (JVP differences along the lowest eigenvector) is the gradient of lambda_min: the
    lowest eigenvalue of the certificate's assembled S at points 1e-4 either side of the minimum (an independent
    computation: the Cholesky bracket's value, 1e-7 wide) changes at the rate |q| along q / |q| and not at all (to
    1 % of |q|) along directions orthogonal to it and to the symmetry directions; at a point 1e-5 off the minimum
    the widening is |q| times the distance bound, to 1 %."""
    from pdeflow.analysis.certificate.about_minimum import drift_to_minimum
    from pdeflow.analysis.hessian.spectrum import head_symmetries

    problem, omega, mass, _ = known_minimum
    root = np.sqrt(mass)[:, None]
    point = off_the_minimum(problem, omega, mass, 1e-5)
    cert = certify(problem, point, mass, spectrum_ends(problem, point, mass, krylov_dim=40), about_minimum=False)
    drift = drift_to_minimum(problem, point, mass, cert.lower, cert.vectors[:, 0])
    assert drift.products == 5 and drift.change == pytest.approx(drift.slope * drift.distance, rel=1e-2)

    def lam(v_shift: np.ndarray) -> float:
        moved = point + v_shift.reshape(point.shape) / root
        return certify(problem, moved, mass, spectrum_ends(problem, moved, mass, krylov_dim=40),
                       about_minimum=False).estimate

    eps = 1e-4
    q_hat = drift.direction
    assert lam(eps * q_hat) - lam(-eps * q_hat) == pytest.approx(2 * eps * drift.slope, rel=1e-2)
    sym = head_symmetries(problem, point)
    for seed in (1, 2):
        u = sym.project(np.random.default_rng(seed).standard_normal(point.size))
        u -= (u @ q_hat) * q_hat
        u /= np.linalg.norm(u)
        assert abs(lam(eps * u) - lam(-eps * u)) <= 2 * eps * 1e-2 * drift.slope


def test_the_distance_bound_is_attained_along_the_slowest_direction(known_minimum):  # noqa: F811
    """Moved by s along the minimum's slowest eigenvector (where the gradient is lambda_min s along it), the point's
    distance bound sqrt(I) / lambda_min is s itself, to 1e-3: the bound is the distance there, not a loose one."""
    problem, omega, mass, _ = known_minimum
    at_min = certify(problem, omega, mass, spectrum_ends(problem, omega, mass, krylov_dim=40))
    root = np.sqrt(mass)[:, None]
    for s in (1e-4, 1e-5):
        point = omega + s * at_min.vectors[:, 0].reshape(omega.shape) / root
        cert = certify(problem, point, mass, spectrum_ends(problem, point, mass, krylov_dim=40))
        assert cert.distance == pytest.approx(s, rel=1e-3)
