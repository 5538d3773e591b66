"""The verdict rules of the report (:mod:`pdeflow.analysis.report.sections`) and of ``compare --order`` on
constructed inputs, one case per side of each rule: the KL exponent's interval against (0, 1/2] (rates), the
measured rates' relative errors against ``RATE_TOLERANCE`` (the minimum and the Dirac sections share
``_rate_verdict``), the chaos slopes' intervals against the predicted -1/2 (not against the fitted slope, which
every interval holds), and the observed order, read from the finest pair of runs. A rule forced to "holds", made to
accept any slope inside its own interval, or reading the order from the coarsest pair fails here (issue 52,
findings 2 and 3; tests/mutations/run_mutations.py applies those mutations). No file and no run: the sections are
called on hand-made records, their figures stubbed."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from pdeflow.analysis.comparison.convergence_order import ORDER_TOL, QuantityOrder, successive_orders
from pdeflow.analysis.diagnostics import Analysis
from pdeflow.analysis.report import sections
from pdeflow.analysis.report.sections import (
    CONTRADICTED,
    HOLDS,
    NOT_ESTABLISHED,
    RATE_TOLERANCE,
    chaos_section,
    dirac_section,
    minimum_section,
    rates_section,
)


@pytest.fixture
def no_figures(monkeypatch, tmp_path):
    """The rates section's figures stubbed (they need a trajectory; the verdict does not)."""
    monkeypatch.setattr(sections, "draw", lambda figure_dir, stem, plot, *args: stem)
    return tmp_path


def kl_analysis(theta: float, interval: tuple[float, float], status: str = "KL regime") -> Analysis:
    """An :class:`Analysis` with a known E* and a KL fit ``theta`` within ``interval`` (arrays empty: the rule reads
    only the scalars)."""
    empty = np.zeros(0)
    return Analysis(empty, empty, empty, *([empty] * 12), e_star=0.25, e_star_source="given", kl_status=status,
                    kl_theta=theta, kl_theta_range=interval, pl_mu_min=0.1)


@pytest.mark.parametrize("theta,interval,expected", [
    (0.5, (0.48, 0.52), HOLDS),            # PL: the interval reaches 1/2
    (0.3, (0.25, 0.35), HOLDS),            # inside (0, 1/2]
    (0.7, (0.65, 0.75), CONTRADICTED),     # every exponent of the interval above 1/2
    (0.62, (0.55, 0.9), CONTRADICTED),
    (-0.1, (-0.2, 0.0), CONTRADICTED),     # theta > 0 in the theory: an interval that only reaches 0 misses (0, 1/2]
])
def test_the_rates_verdict_follows_the_kl_interval(no_figures, theta, interval, expected):
    """holds exactly when theta's interval meets (0, 1/2]; an interval wholly above 1/2 is contradicted (a rule
    forced to "holds" passes it), and the reason names the interval."""
    s = rates_section(None, kl_analysis(theta, interval), no_figures)
    assert s.verdict == expected
    if expected == CONTRADICTED:
        assert f"[{interval[0]:.4g}, {interval[1]:.4g}]" in s.reason


@pytest.mark.parametrize("theta,status", [
    (math.nan, "no KL regime: the excess is not trustworthy"),   # no exponent: report tiny.toml's case
    (0.4, "pre-asymptotic: theta(t) still drifts"),              # an exponent diagnose does not stand behind
    (math.nan, "KL regime"),
])
def test_no_kl_exponent_is_not_a_verdict(no_figures, theta, status):
    """Without an established exponent the verdict is "not established" (forced to "holds" it printed "theta = nan
    in (0, 1/2]" for report tiny.toml), and the reason says why."""
    s = rates_section(None, kl_analysis(theta, (math.nan, math.nan) if math.isnan(theta) else (0.3, 0.5), status),
                      no_figures)
    assert s.verdict == NOT_ESTABLISHED and "nan in" not in s.reason and s.reason


@pytest.mark.parametrize("mu_last,mu_min,expected", [
    (1.01, 0.99, HOLDS),               # approaching: the slowest mode dominates, mu -> lambda_min
    (2.0, 1.2, HOLDS),                 # pre-asymptotic, but I >= 2 lambda_min (E - E*) holds over the window
    (1.01, 0.5, NOT_ESTABLISHED),      # mu falls to half lambda_min: the bound fails, no verdict of "holds"
    (math.nan, math.nan, NOT_ESTABLISHED),
])
def test_the_rates_verdict_at_a_minimum_follows_the_pl_bound(no_figures, mu_last, mu_min, expected):
    """At a proven minimum (diagnose --stationary: theta = 1/2 and lambda_min predicted) the rates verdict holds when
    the measured PL ratio stays at or above lambda_min (within PL_TOL) over the window, and is not "holds" when it
    falls to half of it or was not measured (mu given in units of lambda_min = 1e-3)."""
    lam = 1e-3
    a = dataclasses.replace(kl_analysis(math.nan, (0.45, 0.5)), predicted_theta=0.5, predicted_mu=lam,
                            prediction="a certified minimum", pl_mu_last=mu_last * lam, pl_mu_min=mu_min * lam)
    assert rates_section(None, a, no_figures).verdict == expected


def minimum_rates(relative_error: np.ndarray) -> dict:
    """A ``/rates`` record of ``pdeflow stability --stationary`` with the given relative errors [J, 3]."""
    J = relative_error.shape[0]
    ones = np.ones(J)
    return {"lambda_min": 1e-3, "lambda_min_residual": 1e-12, "direction": ["slowest"] * J, "energy_rate": 2e-3 * ones,
            "predicted_energy_rate": 2e-3 * ones, "distance_rate": 1e-3 * ones, "predicted_distance_rate": 1e-3 * ones,
            "relative_error": relative_error}


@pytest.mark.parametrize("errors,expected", [
    ([[0.01, 0.02, 0.03]], HOLDS),
    ([[0.01, RATE_TOLERANCE, 0.0]], HOLDS),                   # the tolerance itself holds
    ([[0.01, 0.02, 0.03], [0.02, 0.35, 0.01]], CONTRADICTED),  # one run 35 % off
    ([[-0.4, 0.0, 0.0]], CONTRADICTED),                        # the size counts, not the sign
    ([[math.nan, 0.3, math.nan]], CONTRADICTED),               # a NaN does not hide a finite error
    ([[math.nan, math.nan, math.nan]], NOT_ESTABLISHED),       # nothing measured
])
def test_the_minimum_rates_verdict_follows_the_tolerance(errors, expected):
    s = minimum_section(minimum_rates(np.array(errors, dtype=float)), [])
    assert s.verdict == expected, s.reason


def dirac_record(predicted: list[float], measured: list[float]) -> dict:
    """``pdeflow stability``'s record of one Dirac point with its predicted and measured rates [2, n]."""
    return {"verdict": ["stable"], "origin": ["search"], "h0_relevant_min": [0.1], "htr_relevant_min": [0.2],
            "predicted_rate": np.array([[predicted]]).reshape(1, 2, -1),
            "measured_rate": np.array([[measured]]).reshape(1, 2, -1)}


@pytest.mark.parametrize("predicted,measured,expected", [
    ([-0.1, -0.2], [-0.102, -0.195], HOLDS),
    ([-0.1, -0.2], [-0.102, -0.3], CONTRADICTED),     # 50 % off
    ([-0.1, math.nan], [-0.13, math.nan], CONTRADICTED),
    ([math.nan, math.nan], [math.nan, math.nan], NOT_ESTABLISHED),
])
def test_the_dirac_rates_verdict_follows_the_tolerance(predicted, measured, expected):
    s = dirac_section(dirac_record(predicted, measured), [])
    assert s.verdict == expected, s.reason


def chaos_attrs(coupling: tuple[float, float, float], static: tuple[float, float, float]) -> dict:
    """``pdeflow chaos``'s attributes: each slope with its 95 % interval."""
    out: dict = {"n_list": np.array([4, 8, 16, 32])}
    for name, (slope, lo, hi) in (("coupling", coupling), ("static", static)):
        out[f"slope_{name}"], out[f"slope_{name}_ci"] = slope, np.array([lo, hi])
    return out


@pytest.mark.parametrize("coupling,static,expected", [
    ((-0.52, -0.6, -0.44), (-0.49, -0.55, -0.43), HOLDS),
    ((-1.0, -1.2, -0.8), (-0.49, -0.55, -0.43), CONTRADICTED),   # a tight slope of -1: its interval holds it
    ((-0.52, -0.6, -0.44), (-0.25, -0.3, -0.2), CONTRADICTED),
    ((math.nan, math.nan, math.nan), (math.nan, math.nan, math.nan), NOT_ESTABLISHED),
    # pdeflow chaos --quick on the quickstart problem: -1/2 inside, and so are 0 and positive slopes
    ((-0.79, -2.63, 1.05), (-0.39, -3.55, 2.77), NOT_ESTABLISHED),
    ((-0.52, -0.6, -0.44), (-0.45, -0.95, 0.05), NOT_ESTABLISHED),    # one interval reaches 0
    ((-0.52, -0.6, -0.44), (math.nan, math.nan, math.nan), NOT_ESTABLISHED),   # one slope of two
    ((-0.3, -0.45, -0.15), (-0.49, -0.55, -0.43), CONTRADICTED),       # below 0 but short of -1/2
])
def test_the_chaos_verdict_asks_whether_minus_one_half_is_inside(coupling, static, expected):
    """holds when -1/2 lies in every fitted slope's interval and each interval lies below 0 (a decay is measured); a
    slope of -1 with the interval [-1.2, -0.8] is contradicted, though it lies inside its own interval; an interval
    holding 0 too cannot tell N^(-1/2) from no decay: not established."""
    s = chaos_section(chaos_attrs(coupling, static), [])
    assert s.verdict == expected, s.reason


def test_the_order_verdict_reads_the_finest_pair():
    """``compare --order``'s verdict (:class:`pdeflow.analysis.comparison.convergence_order.QuantityOrder`): on a
    family still pre-asymptotic at its coarse end (h halved three times, errors 8, 1, 0.25, 0.125: successive orders
    3, 2, 1; the least-squares slope 2) the observed order is the finest pair's, 1: it passes an expected order 1 and
    fails 3 and 2, which the coarsest pair (3) or the slope would give."""
    h = np.array([0.4, 0.2, 0.1, 0.05])
    e = np.array([8.0, 1.0, 0.25, 0.125])
    orders = successive_orders(h, e)
    np.testing.assert_allclose(orders, [3.0, 2.0, 1.0], rtol=1e-12)
    slope = float(np.polyfit(np.log(h), np.log(e), 1)[0])

    def verdict(expected: float) -> QuantityOrder:
        return QuantityOrder("energy", e, orders, slope, math.nan, 1e-6, expected, ORDER_TOL)

    assert verdict(1.0).ok and verdict(1.0).observed == pytest.approx(1.0, rel=1e-12)
    assert not verdict(3.0).ok and not verdict(2.0).ok
    assert verdict(1.0).line().startswith("energy: observed order 1.00, expected 1: pass")
    assert "expected 3: FAIL" in verdict(3.0).line()
