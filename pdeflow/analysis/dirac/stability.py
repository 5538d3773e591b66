"""Dirac stationary measures: where they are, their linear stability, and the check by simulation.

A Dirac measure ``delta_w`` is stationary iff ``grad e(w) = 0``, ``e(w) = E(delta_w)`` (docs/model.md, "Dirac
stationary measures and their stability"). At such a point: the frozen Hessian ``H0 = Hessian_omega Phi(w*; delta_w*)``
[k, k] (:func:`frozen_hessian`) governs the spread, the translation Hessian ``Htr = H0 + M`` [k, k]
(:func:`translation_hessian`, ``M`` positive semidefinite) the mean. :func:`verdict`: ``translation-unstable``,
``splitting-unstable``, ``stable`` or ``inconclusive``, from the spectra with the symmetry orbit's exact null
directions removed (full coordinates). :func:`simulate` checks the predicted rates ``-mu``, ``-nu`` with RK4 through
the shared time loop. Details: docs/design.md, "Dirac stationary measures and their stability".
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.optimize

from ...core.config import Config, ConfigError
from ...core.problem import Problem
from ...io.result_schema import STABILITY
from ...solvers.base import State, Stepper
from ...solvers.explicit import RK4
from ...solvers.loop import Observer, advance
from ..hessian.local_geometry import dense_hessian, symmetry_tangents
from ..optimality.verdict import NOT_ESTABLISHED, gap_verdict  # noqa: F401 (NOT_ESTABLISHED: imported from here)

MEAN, SPREAD = 0, 1                 # axis 1 of the rate arrays: the mean (Htr) mode and the spread (H0) mode
FIT_SKIP = 0.1                      # fraction of a run left out of the rate fit (start-up transients)
LOG_CHANGE = 4.0                    # a run stops once the faster mode has changed by exp(4): still linear
STEPS_PER_FASTEST = 0.2             # automatic dt = 0.2 / max|eigenvalue|: RK4 rate error ~ (0.2)^4/120
MIN_STEPS = 200                     # at least this many steps per run, whatever the spectrum
ZERO_HEAD = "zero head"
SAMPLES = 201                       # amplitudes are recorded at this many equally spaced times

Progress = Callable[[str], None]


# ---- the one-head energy and the Hessians --------------------------------------------------------
def one_head_energy(problem: Problem, point: np.ndarray) -> tuple[float, np.ndarray]:
    """``e(w) = E(delta_w)`` and ``grad e(w) = grad Phi(w; delta_w)``: point [k] -> (float, [k])."""
    ev = problem.evaluate(np.asarray(point, dtype=float)[None, :], np.ones(1))
    return ev.energy, ev.grad_phi[0]


def frozen_hessian(problem: Problem, point: np.ndarray) -> np.ndarray:
    """``H0 = Hessian_omega Phi(w; delta_w)`` at ``w = point``, the measure frozen: [k, k]."""
    point = np.asarray(point, dtype=float)
    return dense_hessian(lambda v: problem.hvp(point, v, point[None, :], np.ones(1)), problem.k)


def translation_hessian(problem: Problem, point: np.ndarray) -> np.ndarray:
    """``Htr = Hessian e(w)`` at ``w = point`` (head and measure move together): [k, k]."""
    point = np.asarray(point, dtype=float)
    return dense_hessian(lambda v: problem.translation_hvp(point, v), problem.k)


def complement_spectrum(H: np.ndarray, tangents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) [k - r] and eigenvectors [k, k - r] of ``H`` on the orthogonal complement
    of the columns of ``tangents`` [k, r] (all of ``H`` when r = 0)."""
    k, r = tangents.shape
    if r == 0:
        return np.linalg.eigh(H)
    # a full orthonormal basis whose first r columns span the tangents
    Q = np.linalg.qr(np.concatenate([tangents, np.eye(k)], axis=1))[0][:, :k]
    P = Q[:, r:]
    values, y = np.linalg.eigh(P.T @ H @ P)
    return values, P @ y


def verdict(h0_values: np.ndarray, htr_values: np.ndarray, tol: float) -> str:
    """The stability verdict (module docstring) from the relevant eigenvalues of ``H0`` and ``Htr``."""
    h0_min = float(np.min(h0_values)) if len(h0_values) else math.inf
    htr_min = float(np.min(htr_values)) if len(htr_values) else math.inf
    if htr_min < -tol:
        return "translation-unstable"
    if h0_min < -tol:
        return "splitting-unstable"
    if h0_min > tol:
        return "stable"
    return "inconclusive"


# ---- stationary points ---------------------------------------------------------------------------
@dataclass
class Candidate:
    """A stationary point found by the search: the point [k], ``e``, ``|grad e|``, ``Htr`` [k, k] and how many
    starts converged to it (up to symmetry)."""
    point: np.ndarray
    energy: float
    grad_norm: float
    htr: np.ndarray
    multiplicity: int = 1
    origin: str = "start"


def newton_polish(problem: Problem, point: np.ndarray, grad_tol: float,
                  max_iter: int = 10) -> tuple[np.ndarray, float, np.ndarray]:
    """Newton steps on ``grad e = 0`` with the dense ``Htr``: ``w <- w - Htr^+ grad e(w)``, the pseudo-inverse
    dropping eigenvalues below ``1e-10 max|lambda|`` (the symmetry null space). Returns the point, ``|grad e|``
    there and the last ``Htr`` (computed before the last step when it converged)."""
    w = np.asarray(point, dtype=float).copy()
    H = None
    for _ in range(max_iter):
        g = one_head_energy(problem, w)[1]
        if not np.all(np.isfinite(g)):
            return w, math.inf, np.full((problem.k, problem.k), np.nan)
        gnorm = float(np.linalg.norm(g))
        if gnorm <= grad_tol and H is not None:
            return w, gnorm, H
        H = translation_hessian(problem, w)
        values, vectors = np.linalg.eigh(H)
        keep = np.abs(values) > 1e-10 * max(1e-300, float(np.max(np.abs(values))))
        w = w - vectors[:, keep] @ ((vectors[:, keep].T @ g) / values[keep])
    g = one_head_energy(problem, w)[1]
    return w, float(np.linalg.norm(g)), translation_hessian(problem, w)


def _same_point(a: Candidate, b: Candidate) -> bool:
    """Equal points, or points with the same ``e`` and the same ``Htr`` spectrum (images under a symmetry)."""
    if np.linalg.norm(a.point - b.point) <= 1e-6 * (1.0 + np.linalg.norm(a.point)):
        return True
    if abs(a.energy - b.energy) > 1e-9 * (1.0 + abs(a.energy)):
        return False
    sa, sb = np.linalg.eigvalsh(a.htr), np.linalg.eigvalsh(b.htr)
    return bool(np.max(np.abs(sa - sb)) <= 1e-6 * (1.0 + np.max(np.abs(sa))))


def find_stationary_points(problem: Problem, *, n_starts: int, seed: int, start_scale: float,
                           grad_tol: float, progress: Progress | None = None) -> tuple[list[Candidate], dict]:
    """Dirac stationary points: the zero head (always, when it is stationary) and the limits of L-BFGS on
    ``e`` from ``n_starts`` Gaussian starts ``start_scale N(0, I)``, polished by :func:`newton_polish` and kept
    when ``|grad e| <= grad_tol``; deduplicated up to symmetry (:func:`_same_point`).

    Returns the points (zero head first, then by increasing ``e``) and a summary: ``zero_grad_norm``
    (``|grad e(0)|``), ``n_converged``, ``n_rejected``.
    """
    k = problem.k
    zero = np.zeros(k)
    e0, g0 = one_head_energy(problem, zero)
    info = {"zero_grad_norm": float(np.linalg.norm(g0)), "n_converged": 0, "n_rejected": 0}
    found: list[Candidate] = []
    if info["zero_grad_norm"] <= grad_tol:
        found.append(Candidate(zero, e0, info["zero_grad_norm"], translation_hessian(problem, zero),
                               origin=ZERO_HEAD))
    rng = np.random.default_rng(seed)
    starts = start_scale * rng.standard_normal((n_starts, k))
    if info["zero_grad_norm"] > grad_tol:  # reduced coordinates: omega = 0 is only a start
        starts = np.concatenate([zero[None, :], starts])

    def fun(w):
        e, g = one_head_energy(problem, w)
        return (e, g) if np.isfinite(e) else (np.inf, np.zeros_like(g))

    for i, w0 in enumerate(starts):
        res = scipy.optimize.minimize(fun, w0, jac=True, method="L-BFGS-B",
                                      options={"maxiter": 5000, "gtol": grad_tol, "ftol": 1e-15})
        w, gnorm, H = newton_polish(problem, res.x, grad_tol)
        if not gnorm <= grad_tol:
            info["n_rejected"] += 1
            if progress:
                progress(f"start {i + 1}/{len(starts)}: no stationary point (|grad e| = {gnorm:.2e})")
            continue
        info["n_converged"] += 1
        cand = Candidate(w, one_head_energy(problem, w)[0], gnorm, H, origin=f"start {i + 1}")
        twin = next((c for c in found if _same_point(c, cand)), None)
        if twin is not None:
            twin.multiplicity += 1
        else:
            found.append(cand)
        if progress:
            progress(f"start {i + 1}/{len(starts)}: e = {cand.energy:.10g}, |grad e| = {gnorm:.1e}"
                     + (" (seen before)" if twin is not None else ""))
    head = [c for c in found if c.origin == ZERO_HEAD]
    rest = sorted((c for c in found if c.origin != ZERO_HEAD), key=lambda c: c.energy)
    return head + rest, info


# ---- analysis of one point -----------------------------------------------------------------------
@dataclass
class DiracAnalysis:
    """Second-order analysis of one stationary Dirac ``delta_w*`` (module docstring).

    Full spectra ``h0_values``, ``htr_values``, ``m_values`` [k] (ascending) and the relevant ones on the
    complement of the ``n_symmetry`` symmetry tangents (``h0_relevant``, ``htr_relevant`` [k - r] with
    eigenvectors [k, k - r]); ``symmetry_residual = max |H t|`` over the tangents and both Hessians.
    """
    point: np.ndarray
    energy: float
    grad_norm: float
    h0: np.ndarray
    htr: np.ndarray
    h0_values: np.ndarray
    htr_values: np.ndarray
    m_values: np.ndarray
    h0_relevant: np.ndarray
    h0_vectors: np.ndarray
    htr_relevant: np.ndarray
    htr_vectors: np.ndarray
    n_symmetry: int
    symmetry_residual: float
    verdict: str
    multiplicity: int = 1
    origin: str = ""
    gap: float = math.nan
    min_phi: float = math.nan
    gap_exhaustive: bool = False
    phi_minimizer: np.ndarray | None = None
    gap_bound: float = math.nan        # certified upper bound on the gap (nan: min Phi not certified)
    global_minimizer: str = ""         # "yes" / "no" / "not established" (:func:`global_minimizer`)


def global_minimizer(a: DiracAnalysis, gap_tol: float) -> str:
    """Is ``delta_w*`` a global minimizer of E over measures on Omega? ``"yes"``, ``"no"`` or ``"not established"``:
    the one rule :func:`pdeflow.analysis.optimality.verdict.gap_verdict` on the gap found ``a.gap`` (a lower bound
    on G: above ``gap_tol`` it proves "no") and the certified upper bound ``a.gap_bound`` (within ``gap_tol`` it
    proves "yes"; without a certificate, or with one too loose to decide, "not established")."""
    return gap_verdict(a.gap, a.gap_bound, gap_tol).answer


def analyse_point(problem: Problem, point: np.ndarray, tol: float, htr: np.ndarray | None = None) -> DiracAnalysis:
    """``H0``, ``Htr``, ``M = Htr - H0``, their spectra, the symmetry directions and the verdict at a stationary
    point ([k]); ``htr`` may pass a translation Hessian already computed at exactly this point."""
    point = np.asarray(point, dtype=float)
    energy, grad = one_head_energy(problem, point)
    h0 = frozen_hessian(problem, point)
    htr = translation_hessian(problem, point) if htr is None else htr
    tangents = symmetry_tangents(problem, point)
    residual = max([float(np.max(np.abs(H @ tangents))) for H in (h0, htr)] if tangents.shape[1] else [0.0])
    h0_rel, h0_vec = complement_spectrum(h0, tangents)
    htr_rel, htr_vec = complement_spectrum(htr, tangents)
    return DiracAnalysis(point=point, energy=energy, grad_norm=float(np.linalg.norm(grad)), h0=h0, htr=htr,
                         h0_values=np.linalg.eigvalsh(h0), htr_values=np.linalg.eigvalsh(htr),
                         m_values=np.linalg.eigvalsh(htr - h0), h0_relevant=h0_rel, h0_vectors=h0_vec,
                         htr_relevant=htr_rel, htr_vectors=htr_vec, n_symmetry=tangents.shape[1],
                         symmetry_residual=residual, verdict=verdict(h0_rel, htr_rel, tol))


def attach_gap(problem: Problem, a: DiracAnalysis, cfg: Config) -> str | None:
    """Fill ``a.gap = Phi(w*; delta_w*) - min_Omega Phi(.; delta_w*)`` (0: the Dirac is a global minimizer of
    E over measures on Omega) with ``diagnostics.optimality_gap`` on the Omega of ``[diagnostics]``.
    Returns a one-line reason when the gap cannot be computed (then it stays NaN)."""
    try:
        from ..optimality.gap import optimality_gap
    except ImportError:
        return "pdeflow.analysis.diagnostics.optimality_gap is not available in this pdeflow"
    dg = cfg.diagnostics
    domain = "ball" if dg.domain == "grid" else dg.domain  # no grid box here: a Dirac is a particle measure
    # Phi decreases from w* along the negative directions of H0: start the search there too
    negative = a.h0_vectors[:, a.h0_relevant < -cfg.stability.tol][:, :4].T
    steps = np.array([-1.0, -0.1, 0.1, 1.0])[:, None, None] * negative[None, :, :]
    extra = (a.point + steps.reshape(-1, problem.k)) if negative.size else None
    res = optimality_gap(problem, a.point[None, :], np.ones(1), domain=domain, radius=dg.radius,
                         n_starts=dg.n_starts, grid_points=dg.grid_points, seed=dg.seed, extra_starts=extra)
    a.gap, a.min_phi, a.gap_exhaustive = float(res.gap), float(res.min_phi), bool(res.exhaustive)
    a.gap_bound = float(res.gap_bound)
    a.phi_minimizer = np.asarray(res.minimizer, dtype=float)
    if res.outside_mass > 0:
        return (f"a Dirac lies outside Omega (|omega| = {np.linalg.norm(a.point):.3g}); raise diagnostics.radius "
                f"= {dg.radius:g} for its optimality gap to mean anything")
    return None


# ---- the check by simulation ---------------------------------------------------------------------
@dataclass
class ModeRun:
    """One simulation: particles at ``w* + eps (u + c_i v)``; amplitudes along ``u`` (mean) and ``v`` (spread)
    at ``times`` [F]; ``eigenvalues`` (mu, nu), ``predicted`` = -eigenvalues and ``measured`` fitted rates
    (NaN for an absent mode); ``linearity`` = largest |log residual| of the fits."""
    times: np.ndarray
    mean_amplitude: np.ndarray
    spread_amplitude: np.ndarray
    eigenvalues: np.ndarray      # [2]
    predicted: np.ndarray        # [2]
    measured: np.ndarray         # [2]
    linearity: float
    dt: float
    directions: np.ndarray       # [2, k] (zero rows for an absent mode)


def spread_coefficients(n: int, seed: int) -> np.ndarray:
    """``c`` [n] with ``mean(c) = 0`` and ``mean(c^2) = 1`` (equal masses), seeded."""
    c = np.random.default_rng(seed).standard_normal(n)
    c -= c.mean()
    return c / math.sqrt(float(np.mean(c * c)))


def mode_amplitudes(omega: np.ndarray, mass: np.ndarray, point: np.ndarray, u: np.ndarray,
                    v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``|<mean_rho(omega) - w*, u>|`` and ``sqrt(sum_i m_i <omega_i - mean, v>^2)`` for omega [F, N, k]: [F], [F]."""
    mean = np.einsum("n,fnk->fk", mass, omega)
    along_u = np.abs((mean - point) @ u)
    dev = (omega - mean[:, None, :]) @ v
    return along_u, np.sqrt(np.einsum("n,fn->f", mass, dev * dev))


def fit_rate(times: np.ndarray, amplitude: np.ndarray, skip: float = FIT_SKIP) -> tuple[float, float]:
    """Least-squares slope of ``log amplitude`` against time over the last ``1 - skip`` of the run, and the
    largest absolute residual of the fit: (rate, residual)."""
    sel = times >= times[0] + skip * (times[-1] - times[0])
    if not np.all(amplitude[sel] > 0):  # the mode crossed zero: not an exponential
        return math.nan, math.inf
    t, y = times[sel], np.log(amplitude[sel])
    A = np.stack([t, np.ones_like(t)], axis=1)
    coef = np.linalg.lstsq(A, y, rcond=None)[0]
    return float(coef[0]), float(np.max(np.abs(A @ coef - y)))


def simulate(problem: Problem, omega0: np.ndarray, mass: np.ndarray, times: np.ndarray, dt: float,
             stepper: Stepper | None = None, observers: Sequence[Observer] = ()) -> np.ndarray:
    """The particles ``omega0`` [N, k] (masses [N]) moved by the explicit RK4 stepper with step ``dt`` (or by
    ``stepper``, starting with step ``dt``) through the shared time loop (:func:`pdeflow.solvers.loop.advance`: the
    steps land on every time), recorded at ``times`` [F] (``times[0] = 0``): [F, N, k]. Frames after a non-finite
    step are NaN. ``observers`` watch the loop's steps (:class:`pdeflow.solvers.loop.Observer`)."""
    out = np.full((len(times),) + np.shape(omega0), np.nan)

    def record(f: int, state: State) -> None:
        out[f] = state.fields["omega"]

    start = State(t=0.0, step=0, dt=float(dt), fields={"omega": np.array(omega0, dtype=float), "mass": mass})
    advance(stepper if stepper is not None else RK4(problem, dt=float(dt)), start, times, record, observers)
    return out


def simulate_modes(problem: Problem, point: np.ndarray, mean_mode: tuple[float, np.ndarray] | None,
                   spread_mode: tuple[float, np.ndarray] | None, *, eps: float,
                   n_particles: int, t_end: float, seed: int, dt: float = 0.0,
                   fastest: float = 0.0) -> ModeRun:
    """Perturb the Dirac at ``point`` along a mean mode ``(mu, u)`` of ``Htr`` and a spread mode ``(nu, v)`` of
    ``H0`` (either may be None), integrate and fit both rates.

    The run lasts ``min(t_end, LOG_CHANGE / max(|mu|, |nu|))``; ``dt = 0`` picks
    ``STEPS_PER_FASTEST / fastest`` (``fastest``: the largest |eigenvalue| of both Hessians), at most
    ``duration / MIN_STEPS``.
    """
    k = problem.k
    modes = [mean_mode, spread_mode]
    eig = np.array([m[0] if m is not None else np.nan for m in modes])
    dirs = np.stack([m[1] / np.linalg.norm(m[1]) if m is not None else np.zeros(k) for m in modes])
    rates = np.abs(eig[np.isfinite(eig)])
    fastest_mode = float(np.max(rates)) if rates.size else 0.0
    duration = t_end if fastest_mode <= 0 else min(t_end, LOG_CHANGE / fastest_mode)
    if dt <= 0:
        dt = duration / MIN_STEPS if fastest <= 0 else min(duration / MIN_STEPS, STEPS_PER_FASTEST / fastest)
    c = spread_coefficients(n_particles, seed) if spread_mode is not None else np.zeros(n_particles)
    mass = np.full(n_particles, 1.0 / n_particles)
    omega0 = point[None, :] + eps * (dirs[MEAN][None, :] + c[:, None] * dirs[SPREAD][None, :])
    times = np.linspace(0.0, duration, SAMPLES)
    omega = simulate(problem, omega0, mass, times, dt)
    amp_mean, amp_spread = mode_amplitudes(omega, mass, point, dirs[MEAN], dirs[SPREAD])
    measured, worst = np.full(2, np.nan), 0.0
    for axis, amp in ((MEAN, amp_mean), (SPREAD, amp_spread)):
        if modes[axis] is not None:
            measured[axis], residual = fit_rate(times, amp)
            worst = max(worst, residual)
    return ModeRun(times=times, mean_amplitude=amp_mean, spread_amplitude=amp_spread, eigenvalues=eig,
                   predicted=-eig, measured=measured, linearity=worst, dt=dt, directions=dirs)


def relevant_modes(values: np.ndarray, vectors: np.ndarray, tol: float, n: int) -> list[tuple[float, np.ndarray]]:
    """Eigenpairs of the ``n`` smallest distinct eigenvalues (ascending ``values``) with ``|lambda| > tol``: a zero
    rate cannot be compared in relative terms, and a repeated eigenvalue would test the same rate twice."""
    out: list[tuple[float, np.ndarray]] = []
    for j in range(len(values)):
        lam = float(values[j])
        if len(out) == n:
            break
        if abs(lam) <= tol or (out and abs(lam - out[-1][0]) <= 1e-8 * (1.0 + abs(lam))):
            continue
        out.append((lam, vectors[:, j]))
    return out


def simulate_point(problem: Problem, a: DiracAnalysis, cfg: Config,
                   seed: int) -> list[ModeRun]:
    """The ``stability.n_modes`` pairs (j-th relevant mode of ``Htr``, j-th relevant mode of ``H0``)."""
    s = cfg.stability
    means = relevant_modes(a.htr_relevant, a.htr_vectors, s.tol, s.n_modes)
    spreads = relevant_modes(a.h0_relevant, a.h0_vectors, s.tol, s.n_modes)
    fastest = float(max(np.max(np.abs(a.h0_values)), np.max(np.abs(a.htr_values))))
    runs = []
    for j in range(max(len(means), len(spreads))):
        runs.append(simulate_modes(problem, a.point, means[j] if j < len(means) else None,
                                   spreads[j] if j < len(spreads) else None, eps=s.eps,
                                   n_particles=s.n_particles, t_end=s.t_end, seed=seed + j, dt=s.dt,
                                   fastest=fastest))
    return runs


# ---- the weight-decay sweep of the zero head -----------------------------------------------------
@dataclass
class Sweep:
    """The zero head under weight decays ``lam`` [W]: relevant minima of ``H0``/``Htr``, verdicts, one run per
    ``lam`` along the least stable modes, and the critical ``lam_c`` predicted (``-lambda_min(H0)`` at lam = 0)
    and measured (zero of the least-squares line through the measured spread rates)."""
    weight_decay: np.ndarray
    h0_min: np.ndarray
    htr_min: np.ndarray
    verdicts: list[str]
    runs: list[ModeRun]
    lam_c_predicted: float
    lam_c_measured: float
    slope: float

    @property
    def predicted(self) -> np.ndarray:
        return np.array([r.predicted for r in self.runs])

    @property
    def measured(self) -> np.ndarray:
        return np.array([r.measured for r in self.runs])


def zero_head_sweep(problem: Problem, cfg: Config,
                    progress: Progress | None = None) -> Sweep:
    """The sweep of ``stability.weight_decays`` at the zero head (see :class:`Sweep`)."""
    s = cfg.stability
    zero = np.zeros(problem.k)
    base = frozen_hessian(problem.with_weight_decay(0.0), zero)
    lam_c = -float(np.linalg.eigvalsh(base)[0])
    h0_min, htr_min, verdicts, runs = [], [], [], []
    for i, lam in enumerate(s.weight_decays):
        p = problem.with_weight_decay(lam)
        a = analyse_point(p, zero, s.tol)
        if a.grad_norm > s.grad_tol:
            raise ConfigError(f"stability.weight_decays: the zero head is not stationary at weight decay {lam:g} "
                              f"(|grad e(0)| = {a.grad_norm:.2e}); use model.coordinates = 'full'")
        fastest = float(max(np.max(np.abs(a.h0_values)), np.max(np.abs(a.htr_values))))
        run = simulate_modes(p, zero, (float(a.htr_relevant[0]), a.htr_vectors[:, 0]),
                             (float(a.h0_relevant[0]), a.h0_vectors[:, 0]), eps=s.eps,
                             n_particles=s.n_particles, t_end=s.t_end, seed=s.seed + 1000 + i, dt=s.dt,
                             fastest=fastest)
        h0_min.append(float(a.h0_relevant[0]))
        htr_min.append(float(a.htr_relevant[0]))
        verdicts.append(a.verdict)
        runs.append(run)
        if progress:
            progress(f"weight decay {lam:g}: {a.verdict}, spread rate predicted {run.predicted[SPREAD]:+.6f} "
                     f"measured {run.measured[SPREAD]:+.6f}")
    lams = np.asarray(s.weight_decays, dtype=float)
    measured = np.array([r.measured[SPREAD] for r in runs])
    if len(lams) >= 2 and np.ptp(lams) > 0:
        slope, intercept = np.polyfit(lams, measured, 1)
        lam_c_meas = -intercept / slope if slope != 0 else math.nan
    else:
        slope, lam_c_meas = math.nan, math.nan
    return Sweep(weight_decay=lams, h0_min=np.array(h0_min), htr_min=np.array(htr_min), verdicts=verdicts,
                 runs=runs, lam_c_predicted=lam_c, lam_c_measured=float(lam_c_meas), slope=float(slope))


# ---- everything ----------------------------------------------------------------------------------
@dataclass
class StabilityResult:
    """The analysed points, their runs (``runs[s]``: one list per point), the sweep and the search summary."""
    points: list[DiracAnalysis]
    runs: list[list[ModeRun]]
    sweep: Sweep | None
    search: dict
    notes: list[str] = field(default_factory=list)

    def rates(self, n_modes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``predicted_rate``, ``measured_rate`` and ``mode_eigenvalue`` [S, 2, n_modes] (NaN: not simulated)."""
        out = np.full((3, len(self.points), 2, n_modes), np.nan)
        for i, runs in enumerate(self.runs):
            for j, r in enumerate(runs[:n_modes]):
                out[0, i, :, j], out[1, i, :, j], out[2, i, :, j] = r.predicted, r.measured, r.eigenvalues
        return out[0], out[1], out[2]


def run_stability(cfg: Config, problem: Problem,
                  progress: Progress | None = None) -> StabilityResult:
    """Find the stationary Diracs of ``problem``, analyse each (Hessians, verdict, optimality gap), check the
    predicted rates by simulation, and sweep the zero head over ``stability.weight_decays``."""
    s = cfg.stability
    say = progress or (lambda msg: None)
    cands, search = find_stationary_points(problem, n_starts=s.n_starts, seed=s.seed, start_scale=s.start_scale,
                                           grad_tol=s.grad_tol, progress=progress)
    say(f"{len(cands)} stationary Dirac point(s); |grad e(0)| = {search['zero_grad_norm']:.1e}")
    if s.weight_decays and search["zero_grad_norm"] > s.grad_tol:  # grad e(0) does not depend on lam
        raise ConfigError(f"stability.weight_decays: the sweep needs a stationary zero head, but |grad e(0)| = "
                          f"{search['zero_grad_norm']:.2e} in these coordinates; use model.coordinates = 'full'")
    points, all_runs, notes = [], [], []
    for i, c in enumerate(cands):
        a = analyse_point(problem, c.point, s.tol)
        a.multiplicity, a.origin = c.multiplicity, c.origin
        reason = attach_gap(problem, a, cfg)
        a.global_minimizer = global_minimizer(a, s.gap_tol)
        if reason and reason not in notes:
            notes.append(reason)
        runs = simulate_point(problem, a, cfg, seed=s.seed + 100 * i)
        points.append(a)
        all_runs.append(runs)
        say(f"point {i} ({c.origin}): e = {a.energy:.10g}, verdict {a.verdict}, lambda_min(H0) = "
            f"{a.h0_relevant[0]:+.6g}, lambda_min(Htr) = {a.htr_relevant[0]:+.6g}, symmetry modes {a.n_symmetry}, "
            f"gap {a.gap:.3g}, global minimizer: {a.global_minimizer}")
        for r in runs:
            say(f"    rates predicted {r.predicted[MEAN]:+.6f} / {r.predicted[SPREAD]:+.6f}, measured "
                f"{r.measured[MEAN]:+.6f} / {r.measured[SPREAD]:+.6f} (mean / spread)")
    sweep = zero_head_sweep(problem, cfg, progress) if s.weight_decays else None
    return StabilityResult(points=points, runs=all_runs, sweep=sweep, search=search, notes=notes)


# ---- the output file -----------------------------------------------------------------------------
SCHEMA, SCHEMA_VERSION = STABILITY.schema, STABILITY.version  # the table: pdeflow.io.result_schema


def write_stability(path: str | Path, result: StabilityResult, cfg: Config, k: int, problem: Problem) -> None:
    """Write ``/stability`` (layout in docs/experiments.md; S points, k coordinates, n = stability.n_modes):

    ``points`` [S,k], ``energy``, ``grad_norm``, ``multiplicity`` [S], ``origin`` [S] (str), ``h0``, ``htr``
    [S,k,k], ``h0_eigenvalues``, ``htr_eigenvalues``, ``m_eigenvalues`` [S,k] (ascending),
    ``h0_relevant_min``, ``htr_relevant_min``, ``n_symmetry_modes``, ``symmetry_residual`` [S], ``verdict``
    [S] (str), ``optimality_gap``, ``min_phi``, ``global_minimizer`` [S] (str: :func:`global_minimizer`),
    ``gap_exhaustive``, ``gap_bound`` (certified upper bound on the gap, NaN when not certified) [S];
    ``predicted_rate``, ``measured_rate``, ``mode_eigenvalue`` [S,2,n] (axis 1: 0 mean/Htr, 1 spread/H0; NaN
    where not simulated); ``runs/p<s>_m<j>``: ``times``, ``mean_amplitude``, ``spread_amplitude`` [F],
    ``directions`` [2,k]; ``sweep``: ``weight_decay``, ``h0_min``, ``htr_min`` [W], ``verdict`` [W],
    ``predicted_rate``, ``measured_rate`` [W,2], attributes ``lam_c_predicted``, ``lam_c_measured``, ``slope``.
    The ``problem`` goes to ``/model`` and ``/data`` as in a trajectory, so the file alone rebuilds it
    (:func:`pdeflow.io.problem_file.stored_problem`). Written all or nothing
    (:func:`pdeflow.io.result_files.new_result_file`).
    """
    from ...io.result_files import new_result_file, text_array

    pts = result.points
    S, n = len(pts), cfg.stability.n_modes

    def stack(get, shape):
        return np.array([get(a) for a in pts], dtype=float).reshape((S,) + shape)

    with new_result_file(path, SCHEMA, SCHEMA_VERSION, cfg, problem=problem) as f:
        g = f.create_group("stability")
        g.attrs["tol"] = cfg.stability.tol
        g.attrs["eps"] = cfg.stability.eps
        g.attrs["n_particles"] = cfg.stability.n_particles
        g.attrs["weight_decay"] = cfg.model.weight_decay
        g.attrs["rate_axes"] = "[point, (mean: -eig Htr, spread: -eig H0), mode]"
        g.attrs["notes"] = "; ".join(result.notes)
        for key, value in result.search.items():
            g.attrs[key] = value
        g["points"] = stack(lambda a: a.point, (k,))
        g["energy"] = stack(lambda a: a.energy, ())
        g["grad_norm"] = stack(lambda a: a.grad_norm, ())
        g["multiplicity"] = np.array([a.multiplicity for a in pts], dtype=np.int64)
        g["origin"] = text_array([a.origin for a in pts])
        g["h0"] = stack(lambda a: a.h0, (k, k))
        g["htr"] = stack(lambda a: a.htr, (k, k))
        g["h0_eigenvalues"] = stack(lambda a: a.h0_values, (k,))
        g["htr_eigenvalues"] = stack(lambda a: a.htr_values, (k,))
        g["m_eigenvalues"] = stack(lambda a: a.m_values, (k,))
        g["h0_relevant_min"] = stack(lambda a: a.h0_relevant[0], ())
        g["htr_relevant_min"] = stack(lambda a: a.htr_relevant[0], ())
        g["n_symmetry_modes"] = np.array([a.n_symmetry for a in pts], dtype=np.int64)
        g["symmetry_residual"] = stack(lambda a: a.symmetry_residual, ())
        g["verdict"] = text_array([a.verdict for a in pts])
        g["optimality_gap"] = stack(lambda a: a.gap, ())
        g["min_phi"] = stack(lambda a: a.min_phi, ())
        g["global_minimizer"] = text_array([a.global_minimizer or global_minimizer(a, cfg.stability.gap_tol)
                                          for a in pts])
        g["gap_exhaustive"] = np.array([a.gap_exhaustive for a in pts])
        g["gap_bound"] = stack(lambda a: a.gap_bound, ())
        predicted, measured, eig = result.rates(n)
        g["predicted_rate"], g["measured_rate"], g["mode_eigenvalue"] = predicted, measured, eig
        runs = g.create_group("runs")
        for i, point_runs in enumerate(result.runs):
            for j, r in enumerate(point_runs):
                _write_run(runs.create_group(f"p{i}_m{j}"), r)
        if result.sweep is not None:
            sw, sg = result.sweep, g.create_group("sweep")
            sg["weight_decay"], sg["h0_min"], sg["htr_min"] = sw.weight_decay, sw.h0_min, sw.htr_min
            sg["verdict"] = text_array(sw.verdicts)
            sg["predicted_rate"], sg["measured_rate"] = sw.predicted, sw.measured
            sg.attrs["lam_c_predicted"] = sw.lam_c_predicted
            sg.attrs["lam_c_measured"] = sw.lam_c_measured
            sg.attrs["slope"] = sw.slope
            for i, r in enumerate(sw.runs):
                _write_run(sg.create_group(f"run{i}"), r)


def _write_run(g, r: ModeRun) -> None:
    g["times"], g["mean_amplitude"], g["spread_amplitude"] = r.times, r.mean_amplitude, r.spread_amplitude
    g["directions"] = r.directions
    g.attrs["eigenvalues"], g.attrs["predicted"], g.attrs["measured"] = r.eigenvalues, r.predicted, r.measured
    g.attrs["dt"], g.attrs["linearity"] = r.dt, r.linearity

