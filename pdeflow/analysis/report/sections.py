"""The sections of ``pdeflow report``: one per statement of the model contract (docs/model.md), each with the
prediction, the measurement, the verdict and its figures, built from what the wrapped commands wrote.

A section never computes a verdict of its own where a command states one: it shows the string that command returned
(the run's accuracy record, the stationary search's verdict, the gap's certificate, the KL status, the stability
verdicts, the chaos fits) and maps it to one of :data:`VERDICTS`: ``holds`` (the command measured what the theory
predicts), ``contradicted`` (it measured the opposite) or ``not established`` (with the reason: not run, not
converged, an estimate without a certificate); the pipeline marks ``failed`` the statement of a stage that failed.

Every section is a :class:`Section`; :mod:`pdeflow.analysis.report.page` writes them as HTML, JSON, CSV and LaTeX.
The figures' module is imported by the functions that draw: through the command line's parser, every pdeflow
process would otherwise pay matplotlib's import (about half a second).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...io.trajectory import Trajectory
from ..convergence.predictions import APPROACHING, PRE_ASYMPTOTIC, spectral_test
from ..convergence.spectral import phase_spans
from ..diagnostics import Analysis
from ..linearised.minimum_rates import SLOWEST
from ..optimality.verdict import REPORT_GAP_TOL, YES, gap_verdict
from ..stationary.stationary import index_text, lambda_min_text

HOLDS, CONTRADICTED, NOT_ESTABLISHED = "holds", "contradicted", "not established"
FAILED = "failed"   # the stage that decides the statement failed (report.pipeline): its message says why
VERDICTS = (HOLDS, CONTRADICTED, NOT_ESTABLISHED, FAILED)
# every figure of the report is written in both formats: PDF for a paper, PNG for the page
FIGURE_FORMATS = ("pdf", "png")
# a measured exponential rate agrees with its prediction within this relative error (the linearisation's next order
# and the fit over a finite window are of a few per cent at the default perturbation sizes)
RATE_TOLERANCE = 0.1


@dataclass
class Section:
    """One statement of the model contract: ``prediction`` (what the theory says, plain text with Unicode math),
    ``rows`` (quantity, value, what the value is: certified / estimate / measured, with its assumption), the
    ``verdict`` (one of VERDICTS) and its ``reason``, the ``source`` (the command whose output it shows), the
    figure stems drawn in every FIGURE_FORMATS."""
    key: str
    title: str
    prediction: str
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    verdict: str = NOT_ESTABLISHED
    reason: str = ""
    source: str = ""
    figures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "title": self.title, "prediction": self.prediction,
                "table": [{"quantity": q, "value": v, "what": w} for q, v, w in self.rows],
                "verdict": self.verdict, "reason": self.reason, "source": self.source, "figures": self.figures}


def draw(figure_dir: Path, stem: str, plot, *args) -> str:
    """``plot(*args, path)`` written as ``stem.pdf`` and ``stem.png`` in ``figure_dir``; returns the stem."""
    from ..plots.figures import figure_output

    with figure_output(formats=FIGURE_FORMATS):
        plot(*args, figure_dir / f"{stem}.{FIGURE_FORMATS[0]}")
    return stem


def _g(x: float, digits: int = 4, missing: str = "not measured") -> str:
    """``x`` to ``digits`` significant digits; a table cell never shows NaN: ``missing`` says why there is none."""
    return f"{x:.{digits}g}" if math.isfinite(x) else missing


def energy_section(traj: Trajectory, analysis: Analysis, figure_dir: Path) -> Section:
    """Energy dissipation ``dE/dt = -I <= 0`` and the energy identity, as the run's accuracy record states them
    (the run's ``accuracy`` attribute: "held: ..." or "lost ..."), with the largest energy increase between steps and
    the identity residual of the steps (:func:`plot_energy_identity`)."""
    from ..plots.plotting import _steps, plot_energy, plot_energy_identity

    t, e, i = _steps(traj)
    rise = float(np.max(np.diff(e), initial=0.0))
    drop = float(e[0] - e[-1]) if len(e) else math.nan
    residual = analysis.energy_identity_residual
    worst = float(np.max(np.abs(residual))) if residual.size else math.nan
    record = str(traj.attrs.get("accuracy", ""))
    s = Section("energy", "Energy dissipation and the energy identity",
                "Along the flow dE/dt = −I with I = ∫|∇Φ|² dρ ≥ 0: the energy never increases and "
                "E(t) − E(0) + ∫₀ᵗ I ds = 0.", source="pdeflow run (the accuracy record), pdeflow diagnose")
    s.rows = [("E(0) − E(t_end)", _g(drop, 6), "measured decrease over the run"),
              ("largest increase of E between steps", _g(rise, 3), "measured (≤ 0: E never rose)"),
              ("largest |E(t) − E(0) + ∫ I| at the frames", _g(worst, 3),
               "measured (stage quadrature where stored, else trapezoid rule)"),
              ("the run's identity defect", _g(float(traj.attrs.get("max_identity_defect", math.nan)), 3,
                                                "not recorded (no identity check in the file)"),
               "largest per-step defect / run.identity_tol, the run's own check")]
    headline = record.split(";")[0]   # the verdict and its numbers; the cost of the checks follows in the table
    s.rows.append(("the run's accuracy record", record, "pdeflow run's own check of the identity and stability"))
    if record.startswith("held"):
        s.verdict, s.reason = HOLDS, f"the run's accuracy record: {headline}"
    elif record:
        s.verdict, s.reason = CONTRADICTED, f"the run's accuracy record: {headline}"
    else:
        s.reason = "the file has no accuracy record (written by another code or an older pdeflow)"
    s.figures = [draw(figure_dir, "energy", plot_energy, traj, analysis)]
    if len(t) >= 2:
        s.figures.append(draw(figure_dir, "identity", plot_energy_identity, traj, analysis))
    return s


def stationary_section(traj: Trajectory, analysis: Analysis, stationary: dict[str, Any] | None,
                       figure_dir: Path) -> Section:
    """The stationary set and the point reached: the spectral phases over time (``diagnose``'s record), the saddles
    visited with their index lower bounds, and the certified point of ``pdeflow stationary --kind minimum`` with its
    spectrum (its ``verdict`` string shown as the command wrote it)."""
    from ..plots.plotting import plot_spectrum

    s = Section("stationary", "The stationary set and the stationary point reached",
                "The flow converges to the stationary set {∇Φ = 0 on supp ρ}; near a saddle the spectrum of S has "
                "negative eigenvalues (the Morse index), at a local minimum λ_min(S) > 0.",
                source="pdeflow diagnose (spectral record), pdeflow stationary --kind minimum")
    rec = analysis.spectrum
    if rec is not None and len(rec.spectrum_time):
        phases = ", ".join(f"{p} (t = {_g(a)}..{_g(b)})" for a, b, p, _ in phase_spans(rec.spectrum_time,
                                                                                       rec.phases))
        s.rows.append(("phases over time", phases, "the spectral record's phase of each analysed frame"))
        saddles = [(float(t), int(n)) for t, n in zip(rec.spectrum_time, rec.morse_index_lower) if n > 0]
        s.rows.append(("saddles visited", "; ".join(f"t = {_g(t)}: index ≥ {n}" for t, n in saddles) or "none seen",
                       "converged negative eigenvalues of S (a lower bound on the index)"))
        if np.any(rec.spectrum_products > 0):
            s.figures.append(draw(figure_dir, "spectrum", plot_spectrum, traj, analysis))
    if math.isfinite(analysis.stationary_time):
        s.rows.append(("first time I ≤ tol · I(0)", _g(analysis.stationary_time),
                       f"measured (tol = {_g(analysis.stationary_tol, 3)}: a threshold, not the value of I)"))
    reached = ""
    if rec is not None and len(rec.phases):
        reached = f"; the flow's phase at t = {_g(float(rec.spectrum_time[-1]))}: {rec.phases[-1]}"
    if stationary is None:
        s.reason = "pdeflow stationary --kind minimum was not run (report --skip stationary)" + reached
        return s
    s.rows += [("point found", str(stationary.get("verdict", "")), "pdeflow stationary's verdict"),
               ("energy E of the point", _g(float(stationary.get("energy", math.nan)), 12), "evaluated at the point"),
               ("dissipation of the point", _g(float(stationary.get("dissipation", math.nan)), 3),
                f"target {_g(float(stationary.get('ratio', math.nan)), 3, 'not recorded')} × I(0)"),
               ("λ_min of S", lambda_min_text(stationary),
                "the lowest eigenvalue off the symmetry directions (pdeflow stationary's certificate)"),
               ("Morse index", index_text(stationary), "pdeflow stationary's certificate")]
    verdict = str(stationary.get("verdict", ""))
    if bool(stationary.get("certified", False)):
        s.verdict, s.reason = HOLDS, (f"pdeflow stationary: {verdict}, "
                                      f"{stationary.get('certificate_text', 'certified')}")
    else:
        s.reason = (f"pdeflow stationary: {verdict or 'no verdict'}, not certified ({stationary.get('message', '')})"
                    + reached)
    return s


def optimality_section(traj: Trajectory, analysis: Analysis, figure_dir: Path) -> Section:
    """Optimality: ``rho`` is a global minimiser iff ``Phi >= int Phi d rho`` everywhere (the support condition),
    measured by the gap ``G``; certified where ``min Phi`` was certified (k <= 3 or a branch-and-bound box), an
    estimate of a non-exhaustive search otherwise."""
    from ..plots.plotting import plot_gap

    s = Section("optimality", "Optimality: the support condition and the gap",
                "ρ is a global minimiser of E iff Φ(ω; ρ) ≥ ∫Φ dρ for every ω (the support condition); the gap "
                "G = ∫Φ dρ − min Φ ≥ 0 vanishes exactly there and E − E* ≤ G bounds the excess energy.",
                source="pdeflow diagnose (the gap)")
    if not analysis.gap_computed:
        s.reason = "the gap was not computed (diagnostics.gap = false: report --gap to search)"
        return s
    gf = analysis.gap_frames
    last = int(gf[-1])
    g, certified = float(analysis.gap[last]), bool(analysis.gap_certified[last])
    bound = float(analysis.gap_bound[last]) if certified else math.nan
    what = "found: a lower bound on G (Φ attained there)"
    k = traj.frames["omega"].shape[-1] if "omega" in traj.frames else "?"
    s.rows = [("G at the last gap frame", _g(g, 4), what),
              ("certified upper bound on G", _g(bound, 4) if certified else "none",
               "certified (min Φ certified on Ω)" if certified else
               f"min Φ not certified (certified for k ≤ 3, here k = {k}): G is an estimate"),
              ("domain Ω", analysis.gap_domain + (f" {_g(analysis.gap_radius)}" if math.isfinite(analysis.gap_radius)
                                                   else ""), "where min Φ was searched"),
              ("E − G (lower bound on E*)", _g(float(analysis.lower_bound[last]), 10) if certified else "none",
               "E minus the certified upper bound on G" if certified else "no bound (G is an estimate)")]
    # the one rule on optimality, shared with pdeflow stability's global_minimizer: on the certified upper bound
    verdict = gap_verdict(g, bound, REPORT_GAP_TOL)
    s.verdict = HOLDS if verdict.answer == YES else NOT_ESTABLISHED
    s.reason = f"at the last gap frame, {verdict.reason}"
    s.figures.append(draw(figure_dir, "gap", plot_gap, traj, analysis))
    return s


def rates_section(traj: Trajectory, analysis: Analysis, figure_dir: Path) -> Section:
    """PL and KL over time: ``I >= 2 mu (E - E*)`` and ``I >= c (E - E*)^(2 (1 - theta))``, as ``diagnose`` fitted
    them (its KL status string and its E* source shown as written)."""
    from ..plots.plotting import plot_kl, plot_pl

    s = Section("rates", "Convergence rates: PL and KL",
                "Near a minimiser the Łojasiewicz inequality I ≥ c (E − E*)^{2(1−θ)} holds with θ ∈ (0, 1/2]; "
                "θ = 1/2 is the PL inequality I ≥ 2μ (E − E*), which gives E − E* ≤ (E(0) − E*) e^{−2μt}.",
                source="pdeflow diagnose (PL and KL)")
    s.rows = [("E*", _g(analysis.e_star, 12, "unknown"), f"source: {analysis.e_star_text}")]
    if not math.isfinite(analysis.e_star):
        s.reason = "E* unknown: no certified point and no fit of E(t) (run pdeflow stationary, or give --e-star)"
        return s
    lo, hi = analysis.kl_theta_range
    measured = (f"[{_g(lo)}, {_g(hi)}] over t in [{_g(analysis.kl_t_first)}, {_g(analysis.kl_t_last)}]"
                if math.isfinite(lo) and math.isfinite(hi) else "not measured (too few trusted samples)")
    s.rows.append(("least μ over the window", _g(analysis.pl_mu_min, 4, "no trusted sample of the window"),
                   "measured PL ratio I / (2(E − E*)) where E − E* is trustworthy"))
    status_row = ("KL status", analysis.kl_status or "not computed", "diagnose's statement of the fit")
    s.figures += [draw(figure_dir, "pl", plot_pl, traj, analysis), draw(figure_dir, "kl", plot_kl, traj, analysis)]
    if math.isfinite(analysis.predicted_theta):
        _rates_at_minimum(s, analysis, measured)
        s.rows.append(status_row)
        return s
    status = analysis.kl_status.lower()
    theta = (_g(analysis.kl_theta) if math.isfinite(analysis.kl_theta)
             else f"not established ({analysis.kl_status or 'no fit'})")
    s.rows += [("KL exponent θ", theta, "one θ only where the local exponent is constant over the window"),
               ("local exponent θ(t)", measured, "its range over the window and E*'s interval"), status_row]
    if math.isfinite(analysis.kl_theta) and not status.startswith(("no ", "pre-asymptotic")):
        lo, hi = analysis.kl_theta_range
        if lo <= 0.5 + 1e-9 and hi > 0:
            s.verdict, s.reason = HOLDS, f"θ = {_g(analysis.kl_theta)} in (0, 1/2] within its interval"
        else:
            s.verdict, s.reason = CONTRADICTED, f"θ interval [{_g(lo)}, {_g(hi)}] outside (0, 1/2]"
    else:
        s.reason = f"no KL regime established: {analysis.kl_status or 'no fit'}"
    return s


def _rates_at_minimum(s: Section, analysis: Analysis, measured: str) -> None:
    """The rates at a proven nondegenerate minimum (``diagnose --stationary``): the theory's exponent 1/2 and
    ``lambda_min``, the measured local exponent called what the spectral test
    (:func:`pdeflow.analysis.convergence.predictions.spectral_test`, diagnose's rule) calls it. Holds when the
    measured PL ratio stays at or above ``lambda_min`` (within PL_TOL) over the window: there ``I >= 2 lambda_min
    (E - E*)``, the Lojasiewicz inequality with theta = 1/2 of that minimum, whether the slowest mode dominates yet
    (approaching) or not (pre-asymptotic)."""
    lam, theta = analysis.predicted_mu, analysis.predicted_theta
    test = spectral_test(analysis.pl_mu_last, analysis.pl_mu_min, lam)
    s.rows += [("KL exponent θ", f"{theta:g}", "the theory's at a nondegenerate minimum (" + analysis.prediction + ")"),
               ("λ_min(S) at the minimum", _g(lam), "the PL ratio's limit along the slowest mode, its bound near it"),
               ("measured local exponent θ(t)", measured, test.text or "no trusted sample of the window")]
    if test.state in (APPROACHING, PRE_ASYMPTOTIC):
        s.verdict = HOLDS
        s.reason = (f"θ = {theta:g} (the theory's): I ≥ 2μ (E − E*) with μ ≥ {_g(analysis.pl_mu_min / lam, 3)} "
                    f"λ_min over the window; the measured local exponent is {test.text}")
    else:
        s.reason = f"θ = {theta:g} (the theory's); the window: {test.text or 'no trusted sample'}"


def _rate_verdict(s: Section, relative_errors: np.ndarray) -> None:
    """holds when the largest finite relative error of the measured rates is <= RATE_TOLERANCE, contradicted above,
    not established when no rate was measured."""
    errors = np.abs(relative_errors[np.isfinite(relative_errors)])
    if not errors.size:
        s.reason = "no rate was measured"
        return
    worst = _g(float(errors.max()), 2)
    if float(errors.max()) <= RATE_TOLERANCE:
        s.verdict, s.reason = HOLDS, f"every measured rate within {worst} (relative) of its prediction"
    else:
        s.verdict, s.reason = CONTRADICTED, f"a measured rate is {worst} (relative) off its prediction"


def prediction_labels(direction: str) -> tuple[str, str]:
    """What a run's predicted energy and distance rates are (``pdeflow stability --stationary``'s
    ``predicted_energy_rate``, ``predicted_distance_rate``): ``2λ_min`` and ``λ_min`` along the slowest direction (at
    any size), the fitted rates of the linearised flow exp(−St) from the run's own start for any other direction."""
    if direction.startswith(SLOWEST):
        return "2λ_min", "λ_min"
    return "by the linear flow from this start", "by the linear flow from this start"


def minimum_section(rates: dict[str, Any] | None, figure_stems: list[str]) -> Section:
    """Local exponential stability at the certified minimum: the rates ``pdeflow stability --stationary`` measured
    (``/rates`` of its file: ``energy_rate``, ``distance_rate`` per run) against ``2 lambda_min`` and ``lambda_min``;
    holds when every run's relative errors are within RATE_TOLERANCE."""
    s = Section("minimum", "Local exponential stability at the minimum",
                "At a local minimum with λ_min(S) > 0 perturbations decay: the distance like e^{−λ_min t}, "
                "E − E* like e^{−2λ_min t}.", source="pdeflow stability --stationary", figures=list(figure_stems))
    if rates is None:
        s.reason = "no certified minimum to perturb, or the stage was skipped"
        return s
    lam = float(rates.get("lambda_min", math.nan))
    residual = float(rates.get("lambda_min_residual", math.nan))
    s.rows.append(("λ_min(S) at the point", _g(lam) + (f" ± {_g(residual, 2)}" if math.isfinite(residual) else ""),
                   "Lanczos Ritz value with its residual"))
    for j, direction in enumerate(rates.get("direction", [])):
        measured = {k: _g(float(rates[k][j])) for k in ("energy_rate", "predicted_energy_rate", "distance_rate",
                                                         "predicted_distance_rate")}
        integration = float(rates["integration_error"][j]) if "integration_error" in rates else math.nan
        energy, distance = prediction_labels(str(direction))
        s.rows.append((f"run {j} ({direction})",
                       f"energy {measured['energy_rate']} (predicted {energy}: {measured['predicted_energy_rate']}), "
                       f"distance {measured['distance_rate']} (predicted {distance}: "
                       f"{measured['predicted_distance_rate']})",
                       "measured exponential rates" + (f"; their integration error ≈ {_g(integration, 2)} (relative, "
                                                       "Richardson)" if math.isfinite(integration) else "")))
    _rate_verdict(s, np.asarray(rates.get("relative_error", np.zeros((0, 3))), dtype=float))
    return s


def dirac_section(stability: dict[str, Any] | None, figure_stems: list[str]) -> Section:
    """Dirac stationary measures: ``pdeflow stability``'s verdict per point (from ``H0`` and ``Htr``) and the
    simulation's measured rates against the predicted ones."""
    s = Section("dirac", "Dirac stationary measures",
                "A Dirac δ_ω* with ∇Φ(ω*) = 0 is stationary; it is stable under mass-preserving spreads iff H0 = "
                "∇²Φ(ω*; δ_ω*) ⪰ 0 and under translations iff Htr ⪰ 0; perturbations grow or decay at the rates "
                "−λ(H0), −λ(Htr).", source="pdeflow stability CONFIG", figures=list(figure_stems))
    if not stability or not len(stability.get("verdict", [])):
        s.reason = "no stationary Dirac found, or the stage was skipped"
        return s
    pred, meas = (np.asarray(stability[k], dtype=float) for k in ("predicted_rate", "measured_rate"))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(meas - pred) / np.abs(pred)
    for i, verdict in enumerate(stability["verdict"]):
        err = rel[i][np.isfinite(rel[i])]
        s.rows.append((f"point {i} ({stability['origin'][i]})", str(verdict),
                       f"λ_min(H0) = {float(stability['h0_relevant_min'][i]):+.3e}, λ_min(Htr) = "
                       f"{float(stability['htr_relevant_min'][i]):+.3e}; max rel. rate error "
                       f"{_g(float(err.max()), 2) if err.size else 'not simulated'}"))
    _rate_verdict(s, rel)
    return s


def chaos_section(attrs: dict[str, Any] | None, figure_stems: list[str]) -> Section:
    """Propagation of chaos and the static ``N^(-1/2)`` approximation: the fitted slopes with their intervals as
    ``pdeflow chaos`` wrote them. Holds where the interval of every fitted slope contains -1/2 and lies below 0 (a
    decay in N is measured: an interval that holds 0 as well cannot tell N^(-1/2) from no decay, and is not
    established); contradicted where an interval misses -1/2."""
    s = Section("chaos", "Propagation of chaos", "N heads follow the mean-field flow at distance O(N^{−1/2}) on "
                "finite time intervals; the static error E(ρ̂_N) − E(ρ) is O(N^{−1/2}) in RMS.",
                source="pdeflow chaos", figures=list(figure_stems))
    if attrs is None:
        s.reason = "the chaos ladder was skipped"
        return s
    intervals = []
    for name in ("coupling", "static"):
        slope = float(attrs.get(f"slope_{name}", math.nan))
        ci = np.asarray(attrs.get(f"slope_{name}_ci", [math.nan, math.nan]), dtype=float)
        note = str(attrs.get(f"note_{name}", ""))
        s.rows.append((f"slope of {name} in N", f"{_g(slope, 3)} [{_g(ci[0], 3)}, {_g(ci[1], 3)}]"
                       if np.all(np.isfinite([slope, *ci])) else "no fit",
                       note or "least-squares fit, 95% interval; predicted −1/2"))
        if math.isfinite(slope) and np.all(np.isfinite(ci)):
            intervals.append((name, slope, float(ci[0]), float(ci[1])))
    s.rows.append(("N ladder", " ".join(str(int(n)) for n in np.ravel(attrs.get("n_list", []))), "heads"))
    missed = [name for name, slope, lo, hi in intervals if not lo <= -0.5 <= hi]
    flat = [f"{name} [{_g(lo, 3)}, {_g(hi, 3)}]" for name, slope, lo, hi in intervals if not hi < 0.0]
    if not intervals:
        s.reason = "no slope could be fitted"
    elif missed:
        s.verdict = CONTRADICTED
        s.reason = f"−1/2 lies outside the interval of the {' and the '.join(missed)} slope (on this ladder)"
    elif flat:
        s.reason = (f"the interval of {', '.join(flat)} holds 0 as well, so the ladder cannot tell "
                    "a decay like N^{−1/2} from none (more seeds, or a longer ladder of N)")
    elif len(intervals) < 2:
        s.reason = "only one of the two slopes could be fitted"
    else:
        s.verdict, s.reason = HOLDS, "−1/2 lies inside every fitted slope's interval, and each lies below 0"
    return s


__all__ = ["VERDICTS", "RATE_TOLERANCE", "HOLDS", "CONTRADICTED", "NOT_ESTABLISHED", "FAILED", "FIGURE_FORMATS",
           "Section",
           "draw",
           "energy_section", "stationary_section", "optimality_section", "rates_section", "minimum_section",
           "dirac_section", "chaos_section"]
