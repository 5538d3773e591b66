"""Propagation of chaos and the static approximation: how far N heads are from the mean-field limit.

The experiment (``pdeflow chaos``, configured by ``[chaos]``, ``[run]``, ``[solver]`` and ``[sgd]``) runs a reference
``rho_ref(t)`` of ``chaos.n_ref`` particles carrying zero-mass tracers (the nonlinear characteristics
``omega_bar_i``), N-head flows and SGD runs from the same initial points, and measures the coupling distance
``D_N(t) = (1/N sum_i |omega^N_i(t) - omega_bar_i(t)|^2)^(1/2)``, the logit gap, the energy gap, sliced W2, the SGD
excess and the static gap ``E(hat rho_N) - E(rho_ref)``; rates are power laws fitted with a Student-t interval
(:func:`fit_power_law`). Every trajectory goes through the shared loop of :mod:`pdeflow.solvers.loop`; every random
stream is a child of ``SeedSequence(init.seed)`` named in ``SEED_KEYS``.
Details: docs/design.md, "Propagation of chaos and the static approximation".
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from ...core.config import Config, ConfigError
from ...core.mean_field import loss_weights
from ...core.problem import Problem, task_params
from ...core.tasks import TaskData, TaskError, reads_file, sample_data_set, sample_task
from ...io.result_schema import CHAOS, CHAOS_WORK
from ...solvers import make_stepper
from ...solvers.base import State, Stepper
from ...solvers.loop import advance, frame_times
from ...solvers.methods import explicit_flows
from ...solvers.sgd import SGD

SEED_KEYS = {"initial": 1, "sgd": 2, "probe": 3, "static": 4, "sliced": 5}



SCHEMA = CHAOS.schema  # the table: pdeflow.io.result_schema



SCHEMA_VERSION = 1



SLICED_PROJECTIONS = 64



# ---- rates ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PowerLawFit:
    """``y ~ prefactor * x^slope`` from least squares in log-log coordinates.

    ``ci`` is the two-sided ``confidence`` interval of the slope, ``slope +- t_{n-2} * stderr``;
    ``r2`` the coefficient of determination of the log-log fit; ``n`` the number of points.
    """
    slope: float
    prefactor: float
    stderr: float
    ci: tuple[float, float]
    confidence: float
    n: int
    r2: float

    def covers(self, value: float) -> bool:
        return self.ci[0] <= value <= self.ci[1]



def fit_power_law(x: np.ndarray, y: np.ndarray, confidence: float = 0.95,
                  groups: np.ndarray | None = None) -> PowerLawFit:
    """Fit ``log y = a + s log x`` by ordinary least squares; the slope's CI from Student's t.

    Without ``groups``: one intercept, ``stderr = sqrt(SSR / (n - 2) / sum (log x - mean)^2)``, n - 2 degrees
    of freedom. With ``groups`` (labels, one per point): a common slope and one intercept per group (the
    fixed-effects fit: log x and log y centred within each group), n - G - 1 degrees of freedom, and the
    prefactor is the geometric mean of the groups' (weighted by their points). Groups suit repeated
    measurements of one system (the same initial points at several eta), whose level varies from system
    to system.

    x, y: arrays of the same shape (flattened), all positive and finite; at least one more point than
    parameters and two distinct x within some group. Raises ValueError otherwise. With residuals exactly
    zero the CI is the slope itself.
    """
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"fit_power_law: x and y differ in size ({x.size} and {y.size})")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(x > 0) and np.all(y > 0)):
        raise ValueError("fit_power_law: every x and y must be positive and finite")
    if x.size == 0:
        raise ValueError("fit_power_law: no points")
    labels = np.zeros(x.size, dtype=int) if groups is None else np.unique(np.asarray(groups).ravel(),
                                                                           return_inverse=True)[1]
    if labels.size != x.size:
        raise ValueError(f"fit_power_law: {labels.size} group labels for {x.size} points")
    n_groups = int(labels.max()) + 1
    lx, ly = np.log(x), np.log(y)
    count = np.bincount(labels, minlength=n_groups)
    mx = (np.bincount(labels, lx, n_groups) / count)[labels]
    my = (np.bincount(labels, ly, n_groups) / count)[labels]
    sxx = float(np.sum((lx - mx) ** 2))
    dof = x.size - n_groups - 1
    if dof < 1 or not sxx > 0:
        raise ValueError(f"fit_power_law: needs more points than parameters and 2 distinct x (in a group), "
                         f"got {x.size} points in {n_groups} group(s)")
    slope = float(np.sum((lx - mx) * (ly - my)) / sxx)
    resid = (ly - my) - slope * (lx - mx)
    ssr = float(np.sum(resid**2))
    stderr = math.sqrt(ssr / dof / sxx)
    half = float(stats.t.ppf(0.5 + confidence / 2.0, dof)) * stderr
    sst = float(np.sum((ly - my) ** 2))
    r2 = 1.0 - ssr / sst if sst > 0 else 1.0
    intercept = float(np.mean(ly - slope * lx))
    return PowerLawFit(slope=slope, prefactor=math.exp(intercept), stderr=stderr, ci=(slope - half, slope + half),
                       confidence=confidence, n=int(x.size), r2=r2)



# ---- distances between measures -------------------------------------------------------------------
def coupling_distance(a: np.ndarray, b: np.ndarray) -> float:
    """``(1/N sum_i |a_i - b_i|^2)^(1/2)`` for two particle arrays [N, k] paired by index."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return float(np.sqrt(np.mean(np.einsum("ik,ik->i", diff, diff))))



def logit_gap(z: np.ndarray, z_ref: np.ndarray, lw: np.ndarray) -> float:
    """``(sum_{b,l} lw[b,l] |z[b,l] - z_ref[b,l]|^2)^(1/2)``: z, z_ref [B, T, V], loss weights lw [B, T]."""
    diff = z - z_ref
    return float(np.sqrt(np.sum(lw * np.einsum("blv,blv->bl", diff, diff))))



def sliced_w2(a: np.ndarray, b: np.ndarray, seed: int, mass_a: np.ndarray | None = None,
              mass_b: np.ndarray | None = None) -> float:
    """Sliced 2-Wasserstein distance (POT) over ``SLICED_PROJECTIONS`` uniform random directions drawn
    from ``default_rng(seed)``: a [N, k], b [M, k] with optional masses (default uniform)."""
    import ot

    directions = np.random.default_rng(seed).standard_normal((a.shape[1], SLICED_PROJECTIONS))
    directions /= np.linalg.norm(directions, axis=0, keepdims=True)
    return float(ot.sliced_wasserstein_distance(a, b, mass_a, mass_b, projections=directions))



# ---- the experiment -------------------------------------------------------------------------------
def child_seed(cfg: Config, role: str, *key: int) -> int:
    """A 63-bit seed of the stream ``role`` (``SEED_KEYS``) and integer key, a child of ``init.seed``."""
    seq = np.random.SeedSequence(cfg.init.seed, spawn_key=(SEED_KEYS[role],) + tuple(int(k) for k in key))
    return int(seq.generate_state(1, np.uint64)[0] >> np.uint64(1))



class ChaosError(RuntimeError):
    """A run of the experiment failed numerically (a non-finite state)."""



def horizon_config(cfg: Config) -> Config:
    """``cfg`` with ``run.t_end`` set to the experiment's horizon ``chaos.t_end`` (when it is > 0): the frames of
    every trajectory of the experiment end there. ConfigError when ``run.frame_interval`` exceeds it."""
    if cfg.chaos.t_end <= 0:
        return cfg
    if cfg.run.frame_spacing != "log" and cfg.run.frame_interval > cfg.chaos.t_end:
        raise ConfigError(f"chaos.t_end = {cfg.chaos.t_end:g} is shorter than run.frame_interval = "
                          f"{cfg.run.frame_interval:g}: the coupling needs frames inside its horizon")
    return cfg.replace(run={"t_end": cfg.chaos.t_end})


def check_config(cfg: Config) -> None:
    """The rules of a chaos experiment beyond the schema (on :func:`horizon_config`'s config); ConfigError naming
    the key."""
    c = cfg.chaos
    if cfg.solver.method not in explicit_flows():  # the table is full: this module imports pdeflow.solvers
        raise ConfigError(f"solver.method must be one of {', '.join(explicit_flows())} for a chaos experiment "
                          f"(the reference flow), got {cfg.solver.method!r}")
    if math.isfinite(cfg.model.beta) or cfg.sgd.noise:
        raise ConfigError("a chaos experiment compares with the noiseless flow: model.beta must be inf and "
                          "sgd.noise false")
    if len(set(int(n) for n in c.n_list)) < 3:
        raise ConfigError(f"chaos.n_list must hold at least 3 distinct head counts to fit a rate, got {c.n_list!r}")
    if len(set(c.eta_list)) < 2:
        raise ConfigError(f"chaos.eta_list must hold at least 2 distinct steps to fit a rate, got {c.eta_list!r}")
    horizon, name = (c.t_end, "chaos.t_end") if c.t_end > 0 else (cfg.run.t_end, "run.t_end")
    if 0 < c.converge_time < horizon:
        raise ConfigError(f"chaos.converge_time must be >= {name} = {horizon:g}, got {c.converge_time:g}")
    horizon_config(cfg)



def quick_config(cfg: Config) -> Config:
    """The smaller experiment of ``--quick`` (a smoke test, not a measurement): the three smallest N, two
    seeds, the two largest eta, a quarter of the reference particles, 8 static draws."""
    c = cfg.chaos
    n_list = sorted({int(n) for n in c.n_list})[:3]
    eta_list = sorted(set(c.eta_list), reverse=True)[:2]
    return cfg.replace(chaos={"n_list": n_list, "eta_list": eta_list, "seeds": min(c.seeds, 2),
                              "n_ref": max(1, c.n_ref // 4), "static_draws": min(c.static_draws, 8)})



@dataclass
class ChaosResult:
    """Raw measurements (arrays indexed [N, seed, (eta,) frame]) and the fitted rates."""
    times: np.ndarray
    n_list: np.ndarray
    eta_list: np.ndarray
    data: dict[str, np.ndarray]
    fits: dict[str, PowerLawFit | None]
    notes: dict[str, str] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)



def _advance(stepper: Stepper, state: State, times: np.ndarray,
             on_frame: Callable[[int, State], None] | None = None) -> State:
    """``state`` through ``times`` by the shared time loop (:func:`pdeflow.solvers.loop.advance`: steps land on
    every time), ``on_frame(f, state)`` at each; the final state. ChaosError if a step fails or is not finite."""
    end, stop = advance(stepper, state, times, on_frame)
    if stop.status != "finished":
        raise ChaosError(f"{stepper.name}: {stop.message}")
    return end



def _trajectory(stepper: Stepper, omega: np.ndarray, mass: np.ndarray, times: np.ndarray, dt: float,
                rng: np.random.Generator | None = None, on_frame: Callable[[int, State], None] | None = None) -> State:
    """Integrate from (omega, mass) at t = 0 through ``times``; ``on_frame(f, state)`` at each; the final state."""
    start = State(t=0.0, step=0, dt=dt, fields={"omega": np.array(omega, dtype=float),
                                                "mass": np.array(mass, dtype=float)}, rng=rng)
    return _advance(stepper, start, times, on_frame)



def characteristics(stepper, omega_ref: np.ndarray, mass_ref: np.ndarray, tracers: np.ndarray, times: np.ndarray,
                    dt: float, on_frame: Callable[[int, Any], None] | None = None):
    """The reference measure and tracer particles in its velocity field, integrated together.

    The state holds the reference particles (masses ``mass_ref``) followed by the tracers with mass 0, so
    the measure - hence ``Phi`` and the field ``-grad Phi(.; rho_ref(t))`` at every stage - is the reference's
    alone, and the stepper moves both by the same stages. omega_ref [N_ref, k], tracers [M, k], times [F].
    Returns the reference frames [F, N_ref, k], the tracer frames [F, M, k] and the final (augmented)
    state; ``on_frame(f, state)`` sees the augmented state at each frame (its evaluation is the reference's).
    """
    n_ref = len(omega_ref)
    F, k = len(times), omega_ref.shape[1]
    ref_frames, tracer_frames = np.empty((F, n_ref, k)), np.empty((F, len(tracers), k))

    def record(f: int, state) -> None:
        ref_frames[f] = state.fields["omega"][:n_ref]
        tracer_frames[f] = state.fields["omega"][n_ref:]
        if on_frame is not None:
            on_frame(f, state)

    end = _trajectory(stepper, np.concatenate([omega_ref, tracers]),
                      np.concatenate([mass_ref, np.zeros(len(tracers))]), times, dt, on_frame=record)
    return ref_frames, tracer_frames, end



def task_sampler(problem: Problem, cfg: Config, n_samples: int,
                 stored: bool = False) -> Callable[[int], TaskData]:
    """``sampler(seed)``: ``n_samples`` fresh sequences of the config's task. ``stored``: ``problem`` came from a
    file's ``/data`` (``pdeflow chaos FILE``), so a task that reads its data from a file (``text``,
    :func:`pdeflow.core.tasks.reads_file`) draws them from that data set
    (:func:`pdeflow.core.tasks.sample_data_set`): the task's file may not exist where this runs."""
    t = cfg.task
    if stored and reads_file(t.name):
        a = problem.arrays()
        data = TaskData(np.asarray(a["tokens"], dtype=np.int64), np.asarray(a["targets"], dtype=np.int64),
                        np.asarray(a["mask"], dtype=float), np.asarray(a["weights"], dtype=float),
                        problem.vocab_size)
        return lambda seed: sample_data_set(data, n_samples=n_samples, seed=seed)
    params = task_params(cfg)
    return lambda seed: sample_task(t.name, vocab_size=t.vocab_size, seq_len=t.seq_len, n_samples=n_samples,
                                    seed=seed, **params)


def probe_problem(problem: Problem, cfg: Config, stored: bool = False) -> Problem:
    """The layer on ``chaos.probe_size`` fresh task sequences (seed: the ``probe`` stream; ``stored``: as
    :func:`task_sampler`)."""
    try:
        data = task_sampler(problem, cfg, cfg.chaos.probe_size, stored)(child_seed(cfg, "probe"))
    except TaskError as exc:
        raise ConfigError(f"chaos.probe_size: task: {exc}") from None
    return problem.with_data(data.tokens, data.targets, data.mask, data.weights)



def static_gaps(problem: Problem, omega: np.ndarray, mass: np.ndarray, n_list: np.ndarray, draws: int,
                rng: np.random.Generator) -> np.ndarray:
    """``E(hat rho_N) - E(rho)`` [len(n_list), draws]: hat rho_N holds N i.i.d. draws from rho (with
    replacement, by mass), each of mass 1/N."""
    e_ref = problem.energy(omega, mass)
    gaps = np.empty((len(n_list), draws))
    for a, n in enumerate(n_list):
        for d in range(draws):
            index = rng.choice(len(omega), size=int(n), replace=True, p=mass)
            gaps[a, d] = problem.energy(omega[index], np.full(int(n), 1.0 / n)) - e_ref
    return gaps



def run_chaos(cfg: Config, problem: Problem, times: np.ndarray | None = None,
              progress: Callable[[str, float], None] | None = None, work: str | Path | None = None,
              stored: bool = False) -> ChaosResult:
    """The whole experiment of the module docstring on ``problem``.

    ``times`` [F] are the frame times, 0 first and the horizon last (default :func:`pdeflow.solvers.loop.frame_times`
    of :func:`horizon_config`: ``chaos.t_end``, or ``run.t_end`` when that is 0); ``progress(label, units)``
    is called as work completes (units: particle-time, a rough cost measure). ``work``: a work file
    (:func:`write_work`) rewritten after every finished (N, seed) block; if it exists, its blocks are
    taken as done and skipped (a resumed experiment recomputes the reference flow, which is deterministic,
    and gives the uninterrupted experiment's numbers bit for bit). ``stored``: ``problem`` came from a file's
    ``/data`` (the probe set and fresh minibatches as :func:`task_sampler` draws them). ConfigError for a config
    the experiment cannot run or a work file of another config, ChaosError for a non-finite state."""
    check_config(cfg)
    cfg = horizon_config(cfg)
    wall0 = time.perf_counter()
    c, i = cfg.chaos, cfg.init
    report = progress or (lambda label, units: None)
    times = np.asarray(frame_times(cfg) if times is None else times, dtype=float)
    n_list = np.array(sorted({int(n) for n in c.n_list}))
    eta_list = np.array(sorted(set(float(e) for e in c.eta_list), reverse=True))
    nN, S, nE, F = len(n_list), c.seeds, len(eta_list), len(times)
    flow = make_stepper(problem, cfg)

    minibatches = {**SGD.parameters(cfg), "sampler": task_sampler(problem, cfg, cfg.sgd.batch_size, stored)}

    def sgd_stepper(n: int, s: int, e: int) -> SGD:
        """SGD with step eta_list[e] and the minibatches of [sgd], its generator seeded by the (N, seed, eta)."""
        return SGD(problem, float(eta_list[e]), **{**minibatches, "seed": child_seed(cfg, "sgd", n, s, e)})

    sgd_stepper(0, 0, 0)  # a bad [sgd] setting fails here, before any work
    probe = probe_problem(problem, cfg, stored)
    probe_lw = loss_weights(probe.arrays()["mask"], probe.arrays()["weights"])

    def initial(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        return problem.initial_particles(n, seed, i.distribution, i.scale, i.mean)

    # 1. reference and tracers in one state: tracers carry mass 0
    omega_ref0, mass_ref = initial(c.n_ref, i.seed)
    starts = {(a, s): initial(int(n), child_seed(cfg, "initial", n, s))[0]
              for a, n in enumerate(n_list) for s in range(S)}
    bounds = np.cumsum([0] + [len(x) for x in starts.values()])
    where = {key: slice(bounds[j], bounds[j + 1]) for j, key in enumerate(starts)}
    ref_energy, ref_dissipation = np.empty(F), np.empty(F)
    ref_logits = []

    def on_reference(f: int, state) -> None:
        ev = flow.evaluate(state)
        ref_energy[f], ref_dissipation[f] = ev.energy, ev.dissipation
        ref_logits.append(probe.logits(state.fields["omega"][:c.n_ref], mass_ref))

    ref_frames, tracer_frames, reference_end = characteristics(
        flow, omega_ref0, mass_ref, np.concatenate(list(starts.values())), times, cfg.solver.dt, on_reference)
    report("reference", (c.n_ref + bounds[-1]) * times[-1])

    # 2-3. finite heads and SGD against the characteristics
    shape, shape_sgd = (nN, S, F), (nN, S, nE, F)
    data = {name: np.full(shape_sgd if name.startswith("sgd") else shape, np.nan) for name in BLOCK_DATA}
    done = np.zeros((nN, S), dtype=bool)
    if work is not None and Path(work).exists():
        done = read_work(work, cfg, data)
    for (a, s), x in starts.items():
        n = len(x)
        if done[a, s]:
            report(f"N={n} (done before)", n * times[-1] * (1 + nE))
            continue
        mass = np.full(n, 1.0 / n)
        tracers = tracer_frames[:, where[(a, s)]]
        flow_frames = np.empty((F, n, problem.k))

        def on_flow(f: int, state) -> None:
            omega = state.fields["omega"]
            flow_frames[f] = omega
            data["coupling"][a, s, f] = coupling_distance(omega, tracers[f])
            data["logit_gap"][a, s, f] = logit_gap(probe.logits(omega, mass), ref_logits[f], probe_lw)
            data["energy_gap"][a, s, f] = flow.evaluate(state).energy - ref_energy[f]
            data["sliced_w2"][a, s, f] = sliced_w2(omega, ref_frames[f], child_seed(cfg, "sliced", f))

        _trajectory(flow, x, mass, times, cfg.solver.dt, on_frame=on_flow)
        report(f"flow N={n}", n * times[-1])
        for e, eta in enumerate(eta_list):
            sgd = sgd_stepper(n, s, e)
            rng = np.random.default_rng(sgd.seed)

            def on_sgd(f: int, state, e=e, sgd=sgd) -> None:
                omega = state.fields["omega"]
                data["sgd_excess"][a, s, e, f] = coupling_distance(omega, flow_frames[f])
                data["sgd_coupling"][a, s, e, f] = coupling_distance(omega, tracers[f])
                data["sgd_energy_gap"][a, s, e, f] = sgd.evaluate(state).energy - ref_energy[f]

            _trajectory(sgd, x, mass, times, float(eta), rng=rng, on_frame=on_sgd)
            report(f"sgd N={n} eta={eta:g}", n * times[-1])
        done[a, s] = True
        if work is not None:
            write_work(work, cfg, data, done)

    # 4. static approximation at the converged reference
    converge_time = c.converge_time or float(times[-1])
    converged = _advance(flow, _reference_only(reference_end, c.n_ref), np.array([converge_time]))
    ev = flow.evaluate(converged)
    # sqrt(Var_rho Phi): zero when Phi is constant on the support, and then the static gap is O(1/N)
    phi_spread = float(np.sqrt(np.sum(mass_ref * (ev.phi - mass_ref @ ev.phi) ** 2)))
    static = static_gaps(problem, converged.fields["omega"], mass_ref, n_list, c.static_draws,
                         np.random.default_rng(child_seed(cfg, "static")))
    report("static", c.n_ref * (converge_time - times[-1]))
    data.update(times=times, reference_energy=ref_energy, reference_dissipation=ref_dissipation,
                static_gap=static)
    result = ChaosResult(times=times, n_list=n_list, eta_list=eta_list, data=data, fits={},
                         attrs={"n_ref": c.n_ref, "seeds": S, "fit_time": float(times[-1]),
                                "converge_time": converge_time, "converged_energy": ev.energy,
                                "converged_dissipation": ev.dissipation, "converged_phi_spread": phi_spread,
                                "initial_dissipation": float(ref_dissipation[0])})
    fit_rates(result)
    result.attrs["wall_time"] = time.perf_counter() - wall0
    return result



def _reference_only(state, n_ref: int):
    """The state with the tracers dropped (the reference measure alone)."""
    return type(state)(t=state.t, step=state.step, dt=state.dt,
                       fields={"omega": state.fields["omega"][:n_ref], "mass": state.fields["mass"][:n_ref]})



def _try_fit(result: ChaosResult, name: str, x: np.ndarray, y: np.ndarray, groups: np.ndarray | None = None) -> None:
    try:
        result.fits[name] = fit_power_law(x, y, groups=groups)
    except ValueError as exc:
        result.fits[name] = None
        result.notes[name] = str(exc)



def fit_rates(result: ChaosResult) -> None:
    """Fill ``result.fits`` (see the module docstring, step 5); a rate that cannot be fitted (a non-positive
    mean gap, say) is None with the reason in ``result.notes``."""
    d, n = result.data, result.n_list
    nN, S, nE, F = d["sgd_excess"].shape
    per_seed = np.repeat(n, S).astype(float)
    for name in ("coupling", "logit_gap", "sliced_w2"):
        _try_fit(result, name, per_seed, d[name][:, :, -1].ravel())
    _try_fit(result, "energy_gap", n, np.sqrt(np.mean(d["energy_gap"][:, :, -1] ** 2, axis=1)))
    # each (N, seed) is one system seen at every eta: a common exponent, a level per system
    _try_fit(result, "sgd_eta", np.tile(result.eta_list, nN * S), d["sgd_excess"][:, :, :, -1].ravel(),
             groups=np.repeat(np.arange(nN * S), nE))
    _try_fit(result, "sgd_coupling", per_seed, d["sgd_coupling"][:, :, -1, -1].ravel())
    gaps = d["static_gap"]
    _try_fit(result, "static", n, np.sqrt(np.mean(gaps**2, axis=1)))
    _try_fit(result, "static_mean", n, gaps.mean(axis=1))
    _try_fit(result, "static_spread", n, gaps.std(axis=1, ddof=1))
    # the coupling rate at every frame after the first (the characteristics start at the particles)
    slopes = np.full(F, np.nan)
    for f in range(1, F):
        try:
            slopes[f] = fit_power_law(per_seed, d["coupling"][:, :, f].ravel()).slope
        except ValueError:
            pass
    d["slope_coupling_t"] = slopes



# ---- output -------------------------------------------------------------------------------------
WORK_SCHEMA = CHAOS_WORK.schema



BLOCK_DATA = ("coupling", "logit_gap", "energy_gap", "sliced_w2", "sgd_excess", "sgd_coupling", "sgd_energy_gap")



def work_path(path: str | Path) -> Path:
    """The work file of an experiment writing ``path``: ``<name>.work``, removed when it finishes."""
    path = Path(path)
    return path.with_name(path.name + ".work")



def write_work(path: str | Path, cfg: Config, data: dict[str, np.ndarray], done: np.ndarray) -> None:
    """The finished (N, seed) blocks of an unfinished experiment, all or nothing: ``done`` [nN, S] (bool) and
    the per-block measurements ``data`` (BLOCK_DATA, named as in ``/chaos``; NaN where not done),
    with the config as TOML in the root attributes."""
    from ...io.result_files import new_result_file

    with new_result_file(path, WORK_SCHEMA, SCHEMA_VERSION, cfg) as f:
        f["done"] = done
        for name, value in data.items():
            f[name] = value



def read_work(path: str | Path, cfg: Config, data: dict[str, np.ndarray]) -> np.ndarray:
    """Fill ``data`` from a work file of the same config; returns ``done`` [nN, S]. ConfigError otherwise."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("schema") != WORK_SCHEMA:
                raise ConfigError(f"{path} is not a pdeflow chaos work file")
            if f.attrs.get("config") != cfg.to_toml():
                raise ConfigError(f"{path} belongs to an experiment with another config (or --quick setting); "
                                  f"--force starts over")
            done = f["done"][()]
            for name, value in data.items():
                value[...] = f[name][()]
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read as a chaos work file ({exc})") from None
    return done



def write_result(path: str | Path, result: ChaosResult, cfg: Config, problem: Problem, quick: bool = False) -> None:
    """The HDF5 file of an experiment: root attributes ``schema = "pdeflow-chaos"``, ``schema_version``,
    ``pdeflow_version``, ``created``, ``config`` (TOML), ``quick``; group ``/chaos`` with the raw
    measurements as datasets and, as attributes, every fitted rate: ``slope_<name>``, ``slope_<name>_ci``
    [lo, hi], ``slope_<name>_stderr``, ``slope_<name>_n``, ``prefactor_<name>`` (nan and ``note_<name>`` when
    the rate could not be fitted), plus ``n_list``, ``eta_list``, ``n_ref``, ``seeds``, ``fit_time``,
    ``confidence``, ``converged_energy``, ``converged_dissipation``, ``converged_phi_spread``, ``wall_time``.
    ``/model`` and ``/data`` hold ``problem`` as in a trajectory (:func:`pdeflow.io.problem_file.stored_problem`
    rebuilds it from the file alone). Written all or nothing (:func:`pdeflow.io.result_files.new_result_file`)."""
    from ...io.result_files import new_result_file

    with new_result_file(path, SCHEMA, SCHEMA_VERSION, cfg, problem=problem, quick=bool(quick)) as f:
        g = f.create_group("chaos")
        g.create_dataset("n_list", data=result.n_list)
        g.create_dataset("eta_list", data=result.eta_list)
        for key, value in result.data.items():
            g.create_dataset(key, data=value)
        g.attrs.update({k: v for k, v in result.attrs.items()})
        g.attrs["n_list"] = result.n_list
        g.attrs["eta_list"] = result.eta_list
        for name, fit in result.fits.items():
            if fit is None:
                g.attrs[f"slope_{name}"] = np.nan
                g.attrs[f"slope_{name}_ci"] = np.array([np.nan, np.nan])
                g.attrs[f"note_{name}"] = result.notes.get(name, "")
                continue
            g.attrs[f"slope_{name}"] = fit.slope
            g.attrs[f"slope_{name}_ci"] = np.array(fit.ci)
            g.attrs[f"slope_{name}_stderr"] = fit.stderr
            g.attrs[f"slope_{name}_n"] = fit.n
            g.attrs[f"prefactor_{name}"] = fit.prefactor
            g.attrs["confidence"] = fit.confidence



def read_result(path: str | Path) -> dict[str, Any]:
    """The ``/chaos`` group of a file as a flat dict of arrays and attributes."""
    import h5py

    with h5py.File(path, "r") as f:
        if f.attrs.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a pdeflow chaos file")
        g = f["chaos"]
        out: dict[str, Any] = {k: g[k][()] for k in g.keys()}
        out.update({k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()})
    return out



def summary(result: ChaosResult) -> str:
    """One line per fitted rate: slope, CI, points."""
    labels = {"coupling": "coupling distance vs N", "logit_gap": "logit gap vs N",
              "energy_gap": "energy gap (rms) vs N", "sliced_w2": "sliced W2 vs N (beside)",
              "sgd_eta": "SGD excess vs eta", "sgd_coupling": "SGD coupling distance vs N (smallest eta)",
              "static": "static gap (rms over draws) vs N", "static_mean": "static gap (mean over draws) vs N",
              "static_spread": "static gap (spread over draws) vs N"}
    lines = []
    for name, label in labels.items():
        fit = result.fits.get(name)
        if fit is None:
            lines.append(f"{label:44s} not fitted: {result.notes.get(name, '')}")
        else:
            lines.append(f"{label:44s} slope {fit.slope:+.3f}  {100 * fit.confidence:.0f}% CI "
                         f"[{fit.ci[0]:+.3f}, {fit.ci[1]:+.3f}]  ({fit.n} points, r2 {fit.r2:.3f})")
    return "\n".join(lines)
