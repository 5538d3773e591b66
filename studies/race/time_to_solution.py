"""Time to solution of the stiff stepper against Dormand-Prince and particle JKO (issue 17).

``python -m studies.race.time_to_solution --hvp`` measures the exact JVP (forward mode, and the complex step
it replaced) against grad Phi at N = 128 and N = 1024 (``hvp_cost.json``/``.md``).
``python -m studies.race.time_to_solution [--n N] [--out DIR] [--wall SECONDS]`` integrates the quickstart's
problem (data/configs/full.toml since the main job moved to reduced coordinates; the quickstart when these records
were made; ``--n`` particles and sequences, default 128: the problem itself) and
writes ``time_to_solution.json`` and ``time_to_solution.md``:

- **cost of a product**: seconds of one grad Phi at all particles (``Problem.grad_phi``), of one exact
  whole-system JVP (``Problem.system_jvp``, forward mode) and of one difference JVP (a real grad Phi),
  medians of interleaved repeats; their ratios convert products into gradient-evaluation equivalents;
- **reference**: Dormand-Prince at rtol 1e-10 to t = 200, an independent method whose energies the others are
  compared with; lambda_max (Lanczos) is sampled on it every 10 time units;
- **rkc** with data/configs/longtime.toml's solver settings, run to stationarity (dissipation <= 1e-9 x its
  initial value), ``--wall`` seconds or ``--max-steps`` steps: wall time, gradient evaluations and products at
  t = 40, t = 200 and where it stopped;
- **rosenbrock** (``--rtol``, difference Jacobian, ``--deflate`` carried eigenpairs refined every
  ``--deflate-every`` steps, ``--stage-solve``) to t = 200;
- **adaptive** (Dormand-Prince, rtol 1e-5) to t = 200. Beyond, it is held at its stability bound
  ``h ~ c / lambda_max(t)``: its gradient evaluations to the rkc run's final time are **extrapolated** from
  t = 200 with lambda_max held at its last sampled value; the JSON says which figures are extrapolated;
- **jko** (particle JKO, tau = 2) to t = 40 (measured); its error is first order in tau, so the cost at the
  rkc run's accuracy is **extrapolated** as ``evals x err_jko / err_target`` (steps scale with
  1/tau, the inner evaluations per step assumed unchanged).

JKO's ``inner_evaluations`` count its gradient evaluations and complex-step HVPs alike as one each, an
underestimate of its cost. Wall times depend on the machine's load (recorded as the load average).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from pdeflow.benchmarks.common import REFERENCE_CONFIG, RESULTS, interleaved, loglog_exponent, machine, median

# a study of the shipped full-coordinate problem (the quickstart of the records): run from a checkout
QUICKSTART = Path(__file__).resolve().parents[2] / "data" / "configs" / "full.toml"
MARKS = (40.0, 200.0)
STATIONARY = 1e-9  # dissipation relative to its initial value
# /steps columns that are a per-step value rather than a count (rkc): the runs keep their largest
PER_STEP = ("spectral_radius", "stability_margin", "order")


def setup(n: int, *overrides: str):
    from pdeflow.core.config import load_config
    from pdeflow.core.problem import Problem

    cfg = load_config(QUICKSTART, [f"init.n_particles={n}", f"task.n_samples={n}", *overrides])
    return cfg, Problem.from_config(cfg)


def product_costs(problem, cfg, repeats: int = 7, complex_step: bool = False) -> dict[str, float]:
    """Median seconds of grad Phi, the exact JVP (forward mode) and the difference JVP at the initial particles,
    interleaved; with ``complex_step`` also the complex-step JVP (``jvp_complex_step``)."""
    omega, mass = problem.initial_measure(cfg)
    u = np.random.default_rng(0).standard_normal(omega.shape)
    funcs = {"grad_phi": lambda: problem.grad_phi(omega, omega, mass),
             "jvp_exact": lambda: problem.system_jvp(omega, mass, u),
             "jvp_difference": lambda: problem.grad_phi(omega + 1e-8 * u, omega + 1e-8 * u, mass)}
    if complex_step:
        funcs["jvp_complex_step"] = lambda: problem.system_jvp_complex_step(omega, mass, u)
    times = interleaved(funcs, repeats)
    out = {k: median(v) for k, v in times.items()}
    out["exact_over_grad"] = out["jvp_exact"] / out["grad_phi"]
    out["difference_over_grad"] = out["jvp_difference"] / out["grad_phi"]
    if complex_step:
        out["complex_step_over_grad"] = out["jvp_complex_step"] / out["grad_phi"]
    return out


def hvp_costs(log=print) -> dict[str, Any]:
    """The exact whole-system JVP (forward mode, and the complex step it replaced) against one grad Phi at the
    quickstart size (N = 128) and at the benchmark reference size (benchmarks/bench-reference.toml, N = 1024);
    the load average before and after each size."""
    from pdeflow.core.config import load_config
    from pdeflow.core.problem import Problem

    out: dict[str, Any] = {"load_average": os.getloadavg(), "machine": machine()}
    for name, path in (("quickstart", QUICKSTART),
                       ("bench-reference", REFERENCE_CONFIG)):
        cfg = load_config(path)
        problem = Problem.from_config(cfg)
        load_before = os.getloadavg()
        out[name] = product_costs(problem, cfg, repeats=5, complex_step=True)
        out[name]["load_average"] = [load_before, os.getloadavg()]
        log(f"{name}: {out[name]}")
    return out


def run_stepper(cfg, problem, t_end: float, marks=MARKS, wall: float = np.inf, probe=None,
                progress=None, max_steps: int | None = None) -> dict[str, Any]:
    """Step ``cfg``'s stepper to t_end (or stationarity, the wall limit or ``max_steps`` steps) without files,
    through the one time loop (:mod:`pdeflow.solvers.loop`); counts at each mark and at the state a stop leaves.
    A step budget stops the same run at the same state on every machine; a wall limit does not.

    ``probe(t, state, stepper)`` is called at t = 0 and at every multiple of 10 crossed (lambda_max sampling);
    ``progress(t, wall, totals)`` before every step (a long run's log)."""
    from pdeflow.solvers import make_stepper
    from pdeflow.solvers.loop import Frames, Loop, MaxSteps, Observer, Stationary, WallTime

    stepper = make_stepper(problem, cfg)
    state = stepper.initial_state()
    d0 = stepper.diagnostics(state)
    totals: dict[str, float] = {"steps": 0.0}
    at: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()

    def row(state) -> None:
        d = stepper.diagnostics(state)
        at[f"{state.t:.6g}"] = {"t": state.t, "wall": time.perf_counter() - t0, "energy": d["energy"],
                                "dissipation": d["dissipation"], "dt": state.dt, **totals}

    class Counts(Observer):
        """Sums the stepper's /steps columns and calls ``probe`` as the loop passes multiples of 10."""
        next_probe = 0.0

        def check(self, state) -> None:
            if progress is not None:
                progress(state.t, time.perf_counter() - t0, totals)
            if probe is not None and state.t >= self.next_probe:
                probe(state.t, state, stepper)
                self.next_probe += 10.0

        def accept(self, step) -> None:
            totals["steps"] += 1
            for key, value in step.stepper_columns.items():
                if key == "explicit_margin":  # a per-step ratio, not a count: how many steps and the largest
                    finite = bool(np.isfinite(value))
                    totals["krylov_free_steps"] = totals.get("krylov_free_steps", 0.0) + finite
                    largest = totals.get("max_explicit_margin", 0.0)
                    totals["max_explicit_margin"] = max(largest, value) if finite else largest
                    continue
                if key in PER_STEP:  # a per-step value, not a count: the largest
                    totals[f"max_{key}"] = max(totals.get(f"max_{key}", -np.inf), float(value))
                    continue
                totals[key] = totals.get(key, 0.0) + value

    stops = sorted(set([m for m in marks if m <= t_end] + [t_end]))
    observers = [Counts(), Frames(lambda index, state: row(state)),
                 WallTime(wall, lambda: time.perf_counter() - t0), Stationary(STATIONARY * d0["dissipation"])]
    if max_steps is not None:
        observers.append(MaxSteps(max_steps))
    state, stop = Loop(stepper, stops, observers, measure=True).run(state)
    if stop.status not in ("finished", "stationary", "wall_time", "max_steps"):
        raise RuntimeError(f"{cfg.solver.method}: {stop.message}")
    if f"{state.t:.6g}" not in at:
        row(state)
    result = {"status": stop.status, "initial_energy": d0["energy"], "initial_dissipation": d0["dissipation"]}
    result.update(at=at, final=at[list(at)[-1]])
    return result


def gradient_equivalents(row: dict[str, float], method: str, jacobian: str = "") -> float:
    """Gradient evaluations of a run up to one of its rows (``method`` a stepper): the one formula
    :func:`pdeflow.core.problem.gradient_equivalents` of its cost columns (:data:`pdeflow.solvers.base.COST_COLUMNS`,
    every stepper's), plus the initial state's evaluation. A row recorded before those columns (the records' runs):
    the stepper's own ``gradient_evals`` and ``jvps`` (products of kind ``jacobian``, "exact" or "difference"), jko's
    ``inner_evaluations`` plus one, or an explicit pair's ``stages`` new evaluations per attempted step plus one."""
    from pdeflow.solvers import stepper_class
    from pdeflow.solvers.base import COST_COLUMN

    from pdeflow.core.problem import gradient_equivalents as cost

    if all(column in row for column in COST_COLUMN.values()):
        return cost({kind: row[column] for kind, column in COST_COLUMN.items()}) + 1.0
    if "jvps" in row:
        return cost({"gradient": row["gradient_evals"], f"jvp_{jacobian or 'exact'}": row["jvps"]})
    if "inner_evaluations" in row:
        return row["inner_evaluations"] + 1.0
    return stepper_class(method).stages * (row["steps"] + row.get("rejected", 0.0)) + 1.0


def energy_at(run: dict[str, Any], t: float) -> float | None:
    for row in run["at"].values():
        if abs(row["t"] - t) <= 1e-9 * max(1.0, t):
            return row["energy"]
    return None


# the stepper and settings of the shipped long run (its [solver] table), measured here to t = 40, 200 and beyond
LONGTIME = QUICKSTART.parent / "longtime.toml"
# the reference: Dormand-Prince at a tolerance far below every run compared with it (independent of the stiff
# steppers; held at its stability bound in the stiff part, so its error there is far below even this tolerance)
REFERENCE_TOLERANCE = {"rtol": 1e-10, "atol": 1e-13}
# Dormand-Prince as a user would run it: its cost is set by stability, not by this tolerance, past t ~ 20
ADAPTIVE_TOLERANCE = {"rtol": 1e-5, "atol": 1e-8}
METHODS_MEASURED = ("rkc", "rosenbrock", "adaptive", "jko")


def benchmark(n: int, wall: float, rosenbrock_rtol: float = 3e-5, deflate: int = 32, deflate_every: int = 50,
              stage_solve: str = "auto", log=print, max_steps: int | None = None) -> dict[str, Any]:
    """The runs of the table: the reference (Dormand-Prince, :data:`REFERENCE_TOLERANCE`) to t = 200, sampling
    lambda_max every 10 time units; ``rkc`` with data/configs/longtime.toml's [solver] to stationarity, ``wall``
    seconds or ``max_steps`` steps; ``rosenbrock`` (``rosenbrock_rtol``, atol = rtol / 1000, difference Jacobian,
    the deflation given) to t = 200; Dormand-Prince (:data:`ADAPTIVE_TOLERANCE`) to t = 200; particle JKO (tau = 2)
    to t = 40."""
    from pdeflow.core.config import load_config
    from pdeflow.core.system_jacobian import euler_stability_limit

    cfg, problem = setup(n)
    res: dict[str, Any] = {"problem": f"quickstart task/model, N = {n} particles, B = {n} sequences",
                           "machine": machine(), "load_average": os.getloadavg()}
    costs = product_costs(problem, cfg)
    res["costs"] = costs
    log(f"costs: {costs}")
    lambdas: list[tuple[float, float]] = []

    def probe(t, state, stepper):
        limit = euler_stability_limit(problem, state.fields["omega"], state.fields["mass"], tol=1e-3)
        lambdas.append((t, 2.0 / limit))

    def solver(method: str, **keys) -> Any:
        return cfg.replace(solver={"method": method, "dt": 0.05, **keys}, run={"t_end": 1e6})

    log("reference (Dormand-Prince, rtol 1e-10) to t = 200 ...")
    ref = run_stepper(solver("adaptive", **REFERENCE_TOLERANCE), problem, 200.0, probe=probe)
    res["reference"] = {**REFERENCE_TOLERANCE, **ref}
    res["lambda_max"] = lambdas
    log(f"  {ref['final']}")
    long = load_config(LONGTIME).solver
    rkc_solver = {"method": long.method, "dt": long.dt, "rtol": long.rtol, "atol": long.atol,
                  "radius_every": long.radius_every}
    budget = "" if max_steps is None else f", at most {max_steps} steps"
    log(f"rkc ({rkc_solver}) to stationarity (wall limit {wall:g} s{budget}) ...")
    rkc = run_stepper(cfg.replace(solver=rkc_solver, run={"t_end": 1e6}), problem, 1e6, wall=wall,
                      max_steps=max_steps)
    res["rkc"] = {**rkc_solver, **rkc}
    log(f"  {rkc['final']} {rkc['status']}")
    ros_solver = {"rtol": rosenbrock_rtol, "atol": rosenbrock_rtol * 1e-3, "jacobian": "difference",
                  "deflate": deflate, "deflate_every": deflate_every, "stage_solve": stage_solve}
    log(f"rosenbrock ({ros_solver}) to t = 200 ...")
    ros = run_stepper(solver("rosenbrock", **ros_solver), problem, 200.0)
    res["rosenbrock"] = {**ros_solver, **ros}
    log(f"  {ros['final']}")
    log("adaptive (Dormand-Prince, rtol 1e-5) to t = 200 ...")
    dp = run_stepper(solver("adaptive", **ADAPTIVE_TOLERANCE), problem, 200.0)
    res["adaptive"] = {**ADAPTIVE_TOLERANCE, **dp}
    log(f"  {dp['final']}")
    log("jko (particles, tau = 2) to t = 40 ...")
    jko = run_stepper(cfg.replace(solver={"method": "jko", "dt": 2.0, "tau": 2.0}), problem, 40.0)
    res["jko"] = jko
    log(f"  {jko['final']}")
    res["table"] = table(res)
    return res


def table(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the time-to-solution table from the raw runs of :func:`benchmark` (also re-rendered from a
    saved JSON by ``--render``): per mark, each method's wall time, gradient equivalents, steps and energy error
    against the reference; JKO also extrapolated to the rkc run's accuracy; a last row for the long run."""
    ref, rkc, dp, jko = res["reference"], res["rkc"], res["adaptive"], res["jko"]
    rows = []
    lam_t = np.array([t for t, _ in res["lambda_max"]])
    lam_v = np.array([v for _, v in res["lambda_max"]])

    def lam_integral(t_end: float) -> float:
        grid = np.linspace(0.0, t_end, 2001)
        return float(np.trapezoid(np.interp(grid, lam_t, lam_v), grid))

    def measured(method: str, r: dict[str, float], e_ref: float | None) -> dict[str, Any]:
        jacobian = "difference" if method in ("rkc", "rosenbrock") else ""
        return {"wall": r["wall"], "grad_equivalents": gradient_equivalents(r, method, jacobian),
                "steps": r["steps"], "energy_error": None if e_ref is None else abs(r["energy"] - e_ref),
                "measured": True}

    for mark in MARKS:
        e_ref = energy_at(ref, mark)
        row: dict[str, Any] = {"t": mark, "reference_energy": e_ref}
        for method in ("rkc", "rosenbrock", "adaptive"):
            r = res[method]["at"].get(f"{mark:.6g}")
            if r is not None:
                row[method] = measured(method, r, e_ref)
        if mark in (40.0,):
            j = jko["at"]["40"]
            row["jko"] = measured("jko", j, e_ref)
            target = row.get("rkc", {}).get("energy_error") or row["jko"]["energy_error"]
            scale = max(1.0, row["jko"]["energy_error"] / max(target, 1e-300))
            row["jko"]["at_matched_accuracy"] = {
                "grad_equivalents": row["jko"]["grad_equivalents"] * scale, "wall": j["wall"] * scale,
                "measured": False, "method": f"extrapolated: first order, tau / {scale:.3g}"}
        rows.append(row)
    # the long run: stationary, or as far as the wall limit or the step budget let it go
    f = rkc["final"]
    label = "stationary" if rkc["status"] == "stationary" else "reached"
    row = {"t": label, "rkc": {**measured("rkc", f, None), "t": f["t"],
                               "relative_dissipation": f["dissipation"] / rkc["initial_dissipation"]}}
    # Dormand-Prince beyond its last measured mark with lambda_max held at its last measured value
    d = dp["final"]
    last = float(lam_v[-1])
    factor = (lam_integral(float(lam_t[-1])) + last * (f["t"] - float(lam_t[-1]))) / lam_integral(d["t"])
    row["adaptive"] = {"wall": d["wall"] * factor,
                       "grad_equivalents": gradient_equivalents(d, "adaptive") * factor,
                       "steps": d["steps"] * factor, "energy_error": None, "measured": False,
                       "method": f"extrapolated: lambda_max held at {last:.3g} (its value at t = {lam_t[-1]:.0f}) "
                                 f"beyond the sampled range, x {factor:.3g}"}
    rows.append(row)
    return rows


def markdown(res: dict[str, Any]) -> str:
    c, cpu = res["costs"], res["machine"].get("cpu") or {}
    rkc, ros = res["rkc"], res["rosenbrock"]
    lines = [f"# Time to solution ({res['problem']})", "",
             f"Measured by `python -m studies.race.time_to_solution` on {cpu.get('model', '?')} (family "
             f"{cpu.get('family', '?')}, model {cpu.get('model_number', '?')}, {res['machine'].get('cpu_count', '?')} "
             f"cores), load average {res['load_average'][0]:.1f} at the "
             f"start. One grad Phi {1e3 * c['grad_phi']:.2f} ms; exact JVP (forward mode) "
             f"{c['exact_over_grad']:.2f} x grad Phi; a difference JVP is one grad Phi call, counted as 1 (timed at "
             f"{c['difference_over_grad']:.2f} x). The reference is Dormand-Prince at rtol "
             f"{res['reference']['rtol']:g}. rkc: data/configs/longtime.toml's solver (rtol {rkc['rtol']:g}, atol "
             f"{rkc['atol']:g}, radius_every {rkc['radius_every']}). rosenbrock: rtol {ros['rtol']:g}, difference "
             f"Jacobian, deflate {ros['deflate']}, deflate_every {ros['deflate_every']}, stage_solve "
             f"{ros['stage_solve']}. adaptive: Dormand-Prince at rtol {res['adaptive']['rtol']:g}.",
             "", "| target | method | wall s | grad-equivalents | steps | energy error | how |",
             "|---|---|---|---|---|---|---|"]
    for row in res["table"]:
        for method in METHODS_MEASURED:
            r = row.get(method)
            if r is None:
                continue
            err = "-" if r.get("energy_error") is None else f"{r['energy_error']:.2e}"
            how = "measured" if r["measured"] else r["method"]
            target = row["t"]
            if isinstance(target, str):
                r0 = row["rkc"]
                target = f"{target} t = {r0['t']:.4g} (I/I(0) = {r0['relative_dissipation']:.2g})"
            lines.append(f"| {target} | {method} | {r['wall']:.1f} | {r['grad_equivalents']:.0f} | {r['steps']:.0f} | "
                         f"{err} | {how} |")
            m = r.get("at_matched_accuracy")
            if m:
                lines.append(f"| {target} | {method} (matched accuracy) | {m['wall']:.1f} "
                             f"| {m['grad_equivalents']:.0f} | - | - | {m['method']} |")
    lines.append("")
    for row in res["table"]:
        for method in ("rkc", "rosenbrock"):
            if method in row and "adaptive" in row:
                lines.append(f"t = {row['t']}: Dormand-Prince / {method} gradient equivalents = "
                             f"{row['adaptive']['grad_equivalents'] / row[method]['grad_equivalents']:.2f}")
                lines.append("")
    return "\n".join(lines)


# ---- the matched-accuracy race ----------------------------------------------------------------------------------
# Each long-run stepper at a ladder of tolerances from the same initial state to RACE_END (lower marks on the way),
# its energy error against the reference there, its cost in gradient equivalents (load-independent) and wall time.
# One run per process (``--race METHOD:RTOL``, a JSON file each, so runs may go in parallel and a killed one loses
# nothing else); ``--race-render`` gathers the files into the table and the work-precision plot.
RACE_END = 200.0
RACE_MARKS = (40.0, 200.0)
# the energy errors the race asks each stepper for
RACE_TARGETS = (1e-4, 1e-6, 1e-8)
# eserk4's deflated eigenpairs in the race
RACE_ESERK4_DEFLATE = 8


# the [solver] of each race entry: its stepper (``method``), its first step and other keys, and ``atol`` as a fraction
# of the run's rtol (``atol_over_rtol``); ``cvode-difference`` runs cvode with its Jacobian products (GMRES's, the
# eigenpairs' and dI/dt's) as forward differences of grad Phi; ``cvode-plain`` is CVODE as a SUNDIALS user sets it up
# in ten lines (BDF, GMRES on CVODE's own difference quotients, no preconditioner: the rival, RACE_RIVAL);
# ``cvode-heads`` preconditions GMRES with the per-head blocks of the Jacobian (solver.preconditioner = "heads").
# A registered adaptive method without an entry races with RACE_DEFAULT.
RACE_SOLVERS: dict[str, dict[str, Any]] = {
    "rkc": {"method": "rkc", "dt": 0.005, "atol_over_rtol": 1e-2, "radius_every": 25},
    "eserk4": {"method": "eserk4", "dt": 0.005, "atol_over_rtol": 1e-2, "radius_every": 25,
               "deflate": RACE_ESERK4_DEFLATE},
    "cvode": {"method": "cvode", "dt": 0.005, "atol_over_rtol": 1e-3, "deflate": 20},
    "cvode-difference": {"method": "cvode", "dt": 0.005, "atol_over_rtol": 1e-3, "deflate": 20,
                         "jacobian": "difference"},
    "cvode-plain": {"method": "cvode", "dt": 0.005, "atol_over_rtol": 1e-3, "jacobian": "cvode"},
    "cvode-heads": {"method": "cvode", "dt": 0.005, "atol_over_rtol": 1e-3, "jacobian": "difference",
                    "preconditioner": "heads"},
    "rosenbrock": {"method": "rosenbrock", "dt": 0.05, "atol_over_rtol": 1e-3, "jacobian": "difference",
                   "deflate": 32, "deflate_every": 50, "stage_solve": "auto"},
    "adaptive": {"method": "adaptive", "dt": 0.05, "atol_over_rtol": 1e-3},
}
# any other registered error-controlled method (bs23, ...): its own defaults but the first step and the tolerances
RACE_DEFAULT: dict[str, Any] = {"dt": 0.05, "atol_over_rtol": 1e-3}
# the entry every other is measured against in the verdict (pdeflow's cheapest / it): plain SUNDIALS, its cost what
# the ten-line setup pays, CVODE's own right-hand-side calls (its initial one, Newton's and the difference
# quotients'); the energy identity pdeflow's cvode stepper keeps besides (f at each new state and dI/dt, two
# gradients a step) is not the rival's cost, and is shown apart in its breakdown
RACE_RIVAL = "cvode-plain"


def race_settings(entry: str) -> dict[str, Any]:
    """The :data:`RACE_SOLVERS` row of a race entry, or :data:`RACE_DEFAULT` for a registered error-controlled
    method (:class:`pdeflow.solvers.controller.AdaptiveStepper`); ValueError for anything else (no tolerance to
    race)."""
    from pdeflow.solvers import STEPPERS
    from pdeflow.solvers.controller import AdaptiveStepper

    if entry in RACE_SOLVERS:
        return RACE_SOLVERS[entry]
    if entry in STEPPERS and issubclass(STEPPERS[entry], AdaptiveStepper):
        return {"method": entry, **RACE_DEFAULT}
    raise ValueError(f"no race settings for {entry!r}: not a registered error-controlled method")


def race_stepper(method: str) -> str:
    """The stepper (``solver.method``) a race entry runs (:func:`race_settings`)."""
    return race_settings(method)["method"]


def race_solver(method: str, rtol: float) -> dict[str, Any]:
    """The [solver] of one race run: the entry's settings (:func:`race_settings`) at ``rtol``, ``atol`` its
    ``atol_over_rtol`` times ``rtol``."""
    settings = dict(race_settings(method))
    atol_over_rtol = settings.pop("atol_over_rtol")
    return {**settings, "rtol": rtol, "atol": rtol * atol_over_rtol}


# seconds between two progress lines of a race run
RACE_LOG_EVERY = 60.0


def race_run(method: str, rtol: float, n: int = 128, t_end: float = RACE_END, wall: float = np.inf,
             log=print) -> dict[str, Any]:
    """One run of the race: ``method`` at ``rtol`` (:func:`race_solver`) to ``t_end`` (or ``wall`` seconds: the
    run then ends where it got, its counts there telling the cost rate) with the counts at :data:`RACE_MARKS`;
    the product costs measured before it, the machine and the load before and after; a progress line to ``log``
    every :data:`RACE_LOG_EVERY` seconds."""
    cfg, problem = setup(n)
    solver = race_solver(method, rtol)
    load_before = os.getloadavg()
    costs = product_costs(problem, cfg)
    log(f"{method} {solver} to t = {t_end:g} ...")
    last = [0.0]

    def progress(t: float, seconds: float, totals: dict[str, float]) -> None:
        if seconds - last[0] >= RACE_LOG_EVERY:
            last[0] = seconds
            log(f"  t = {t:.6g} after {seconds:.0f} s (load {os.getloadavg()[0]:.1f}): "
                + ", ".join(f"{k} {v:.0f}" for k, v in totals.items() if k in ("steps", "gradient_evals", "jvps")))

    run = run_stepper(cfg.replace(solver=solver, run={"t_end": 1e6}), problem, t_end,
                      marks=[m for m in RACE_MARKS if m < t_end], wall=wall, progress=progress)
    log(f"  {run['final']} {run['status']}")
    return {"method": method, "rtol": rtol, "solver": solver, "n": n, "t_end": t_end, "costs": costs,
            "machine": machine(), "load_average": [load_before, os.getloadavg()], **run}


def race_runs_from_table(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of a saved time-to-solution JSON (:func:`benchmark`) as race runs: its reference (Dormand-Prince
    at rtol 1e-10), rkc, rosenbrock and adaptive to t = 200, marked with where they come from."""
    out = []
    for key, method in (("reference", "adaptive"), ("rkc", "rkc"), ("rosenbrock", "rosenbrock"),
                        ("adaptive", "adaptive")):
        r = res[key]
        out.append({"method": method, "rtol": r["rtol"], "n": 128, "t_end": 200.0, "costs": res["costs"],
                    "machine": res["machine"], "load_average": [res["load_average"], None],
                    "solver": {k: v for k, v in r.items() if k not in ("status", "initial_energy",
                                                                       "initial_dissipation", "final", "at")},
                    "at": r["at"], "final": r["final"], "status": r["status"],
                    "source": "studies/race/TIME_TO_SOLUTION.json"})
    return out


def race_jacobian(run: dict[str, Any]) -> str:
    """The kind of a race run's Jacobian-vector products: rkc's and eserk4's are differences, the others'
    ``solver.jacobian`` (with "cvode", CVODE's own quotients, pdeflow's products are differences)."""
    if run["method"] in ("rkc", "eserk4") or run["solver"].get("jacobian") == "cvode":
        return "difference"
    return run["solver"].get("jacobian", "exact")


def race_cost(run: dict[str, Any], row: dict[str, float]) -> float:
    """Gradient equivalents of a race run up to one of its rows: :func:`gradient_equivalents` (exact JVPs at
    :data:`pdeflow.core.problem.JVP_COST`, difference JVPs at 1, whatever the product cost measured with the run);
    for :data:`RACE_RIVAL`, CVODE's own right-hand-side calls, its initial one among them (what plain SUNDIALS
    pays)."""
    if run["method"] == RACE_RIVAL:
        return row["rhs_evals"] + row["linear_rhs_evals"]
    return gradient_equivalents(row, race_stepper(run["method"]), race_jacobian(run))


def cost_breakdown(run: dict[str, Any], row: dict[str, float]) -> dict[str, float]:
    """Where a run's gradient equivalents (:func:`race_cost`) went, by what each evaluation or product was for."""
    from pdeflow.core.problem import GRADIENT_EQUIVALENTS

    ratio = GRADIENT_EQUIVALENTS[f"jvp_{race_jacobian(run)}"]
    if race_stepper(run["method"]) == "cvode" and "rhs_evals" in row:
        slopes = row["steps"] + 1.0  # dI/dt at every new state and at the start
        internal = run["solver"].get("jacobian") == "cvode"  # GMRES on CVODE's quotients: no product of pdeflow's
        gmres = row["linear_rhs_evals"] if internal else ratio * row["linear_iters"]
        # CVODE's f calls (its initial one among them), each new state's f, the head blocks' columns: the gradients
        parts = {"Newton f": row["rhs_evals"], "GMRES products": gmres,
                 "head blocks": row["gradient_evals"] - row["rhs_evals"] - row["linear_rhs_evals"] - row["steps"],
                 "eigenpair JVPs": ratio * (row["jvps"] - slopes - (0.0 if internal else row["linear_iters"]))}
        diagnostics = {"f at the new state": row["steps"], "dI/dt JVPs": ratio * slopes}
        if run["method"] == RACE_RIVAL:  # not the rival's cost (RACE_RIVAL): shown, not summed
            return {**parts, **{f"{k} (not counted)": v for k, v in diagnostics.items()}}
        return {**parts, **diagnostics}
    if race_stepper(run["method"]) == "cvode":
        slopes = row["steps"] + 1.0  # dI/dt at every new state and at the start
        return {"Newton f": row["gradient_evals"] - row["steps"], "f at the new state": row["steps"],
                "GMRES JVPs": ratio * row["linear_iters"], "dI/dt JVPs": ratio * slopes,
                "eigenpair JVPs": ratio * (row["jvps"] - row["linear_iters"] - slopes)}
    if run["method"] == "rkc":
        return {"stages": row["gradient_evals"], "radius and dI/dt (difference)": row["jvps"]}
    if run["method"] == "eserk4":
        return {"stages": row["gradient_evals"], "radius, eigenpairs and dI/dt (difference)": row["jvps"]}
    if run["method"] == "rosenbrock":
        return {"stages": row["gradient_evals"], "products (difference)": row["jvps"]}
    return {"stages": race_cost(run, row)}


def race_table(runs: list[dict[str, Any]], references: list[dict[str, Any]],
               checks: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """At each time a reference recorded, each run's energy error against the first of ``references`` that
    recorded it (a tight run of a method that is not raced there), its gradient equivalents, wall time and steps;
    the first of ``checks`` (second references, by another method or tolerance) recording the time is compared with
    that reference (``references``: time, the two runs, their energies' difference)."""
    rows = []
    marks = sorted({row["t"] for ref in references for row in ref["at"].values()})

    def first(candidates, mark):
        return next((c for c in candidates if energy_at(c, mark) is not None), None)

    compared = []
    for mark in marks:
        reference = first(references, mark)
        e_ref = energy_at(reference, mark)
        for run in runs:
            r = run["at"].get(f"{mark:.6g}")
            if run is reference or r is None:
                continue
            rows.append({"method": run["method"], "rtol": run["rtol"], "t": mark,
                         "energy_error": abs(r["energy"] - e_ref), "grad_equivalents": race_cost(run, r),
                         "wall": r["wall"], "steps": r["steps"], "load_average": run["load_average"],
                         "source": run.get("source", "measured"), "breakdown": cost_breakdown(run, r),
                         "cpu": "{family}/{model_number}".format(**{"family": "?", "model_number": "?",
                                                                      **(run["machine"].get("cpu") or {})})})
        check = first([c for c in checks if c is not reference], mark)
        if check is not None:
            compared.append({"t": mark, "reference": run_name(reference), "check": run_name(check),
                             "difference": abs(energy_at(check, mark) - e_ref)})
    return {"rows": rows, "references": compared}


def run_name(run: dict[str, Any]) -> str:
    """``METHOD rtol RTOL`` of a race run."""
    return f"{run['method']} rtol {run['rtol']:g}"


def race_summary(res: dict[str, Any], last: float) -> list[str]:
    """The markdown lines summarizing the race at time ``last``: the cheapest run per target, the power laws and
    where each run's cost went."""
    lines: list[str] = []
    lines += ["", f"The cheapest measured run of each method whose energy error at t = {last:g} is at most each "
                  "target (gradient equivalents; '-': no run reached it, then the run that came closest, or a run "
                  "stopped before this time and what it had cost by then):", "",
              "| target | " + " | ".join(sorted({r["method"] for r in res["table"]["rows"]})) + " |",
              "|---|" + "---|" * len({r["method"] for r in res["table"]["rows"]})]
    for target, best in race_targets(res["table"]["rows"], last).items():
        cells = [f"{best[m]['grad_equivalents']:.0f} (rtol {best[m]['rtol']:g})" if best[m]
                 else unreached_cell(res, m, last) for m in sorted(best)]
        lines.append(f"| {target:g} | " + " | ".join(cells) + " |")
    lines += race_verdict(res["table"]["rows"], last)
    fits = race_fits(res["table"]["rows"], last)
    if fits:
        lines += ["", f"Power laws cost = c err^-b through each method's runs at t = {last:g} and the cost they "
                      "give at the targets (extrapolated where no run reached the target):", "",
                  "| method | b | " + " | ".join(f"cost at {t:g}" for t in RACE_TARGETS) + " |",
                  "|---|---|" + "---|" * len(RACE_TARGETS)]
        for method, fit in fits.items():
            lines.append(f"| {method} | {fit['b']:.2f} | "
                         + " | ".join(f"{fit[f'{t:g}']:.0f}" for t in RACE_TARGETS) + " |")
    lines += ["", f"Where the cost to t = {last:g} goes (gradient equivalents):", "",
              "| method | rtol | energy error | parts |", "|---|---|---|---|"]
    for row in sorted(res["table"]["rows"], key=lambda r: (r["method"], -r["rtol"])):
        if row["t"] == last:
            parts = ", ".join(f"{k} {v:.0f}" for k, v in row["breakdown"].items())
            lines.append(f"| {row['method']} | {row['rtol']:g} | {row['energy_error']:.2e} | {parts} |")
    return lines


def race_verdict(rows: list[dict[str, Any]], t: float, rival: str = RACE_RIVAL) -> list[str]:
    """The markdown lines of the race's question at time ``t``: at each of :data:`RACE_TARGETS`, the cheapest run of
    the entry ``rival`` reaching it against the cheapest run of every other entry (pdeflow's steppers, its own
    cvode configurations among them) and their cost ratio (pdeflow / rival; below 1 pdeflow is the cheaper, at most
    0.5 twice as cheap); no lines without a ``rival`` run at ``t``."""
    best = race_targets(rows, t)
    if not any(r["method"] == rival and r["t"] == t for r in rows):
        return []
    lines = ["", f"pdeflow's cheapest stepper against {rival} at t = {t:g} (the cheapest runs reaching each target, "
                 f"gradient equivalents; ratio pdeflow / {rival}):", "",
             f"| target | {rival} | pdeflow's cheapest | ratio |", "|---|---|---|---|"]

    def text(c: dict[str, Any] | None) -> str:
        return f"{c['grad_equivalents']:.0f} ({c['method']} rtol {c['rtol']:g})" if c else "no run reached it"

    for target, cells in best.items():
        theirs = cells.get(rival)
        ours = min((c for m, c in cells.items() if m != rival and c),
                   key=lambda c: c["grad_equivalents"], default=None)
        ratio = f"{ours['grad_equivalents'] / theirs['grad_equivalents']:.2f}" if ours and theirs else "-"
        lines.append(f"| {target:g} | {text(theirs)} | {text(ours)} | {ratio} |")
    return lines


def unreached_cell(res: dict[str, Any], method: str, t: float) -> str:
    """The cell of a target no run of ``method`` reached at time ``t``: the run with the smallest error there
    ("- (closest ERR for COST, rtol R)"), else the runs that stopped before ``t`` (their wall or step limit) with
    the gradient equivalents they had spent by then, a lower bound of that run's cost to ``t``, else the method's
    cheapest run at the latest earlier time (a lower bound of that setting's cost to ``t``); "-" when the method has
    none of these."""
    rows = [r for r in res["table"]["rows"] if r["method"] == method and r["t"] == t]
    if rows:
        closest = min(rows, key=lambda r: r["energy_error"])
        return (f"- (closest {closest['energy_error']:.2g} for {closest['grad_equivalents']:.0f}, "
                f"rtol {closest['rtol']:g})")
    stopped = [run for run in res.get("runs", ()) if run["method"] == method and run["status"] != "finished"
               and run["final"]["t"] < t]
    if stopped:
        return "- (" + "; ".join(f"rtol {run['rtol']:g} stopped at t = {run['final']['t']:.0f} after "
                                 f"{race_cost(run, run['final']):.0f}" for run in stopped) + ")"
    earlier = [r for r in res["table"]["rows"] if r["method"] == method and r["t"] < t]
    if earlier:
        last = max(r["t"] for r in earlier)
        cheapest = min((r for r in earlier if r["t"] == last), key=lambda r: r["grad_equivalents"])
        return (f"- (no run to t = {t:g}; to t = {last:g} its cheapest cost {cheapest['grad_equivalents']:.0f}, "
                f"rtol {cheapest['rtol']:g})")
    return "-"


def race_markdown(res: dict[str, Any]) -> str:
    cpu = res["machine"].get("cpu") or {}
    refs = "; ".join(f"{r['method']} at rtol {r['rtol']:g} (to t = {r['t_end']:g}"
                     + (f", {r['source']}" if r.get("source") else "") + ")" for r in res["references"])
    lines = ["# Matched accuracy: energy error against cost (quickstart problem, N = 128, B = 128)", "",
             f"Measured by `python -m studies.race.time_to_solution --race METHOD:RTOL --t-end T` (one run "
             f"per process, `NUMBA_NUM_THREADS=1`) and gathered by `--race-render` on {cpu.get('model', '?')} "
             f"({res['machine'].get('cpu_count')} cores, the family/model of each run's CPU listed; shared with "
             f"other work: wall times are noisy, the load average of each run is listed; "
             f"gradient equivalents are the cost that does not depend on load). Every run starts from the same "
             f"initial state (data/configs/longtime.toml's problem). References, at each time the first that "
             f"reached it: {refs}."]
    if res["table"]["references"]:
        agree = "; ".join(f"at t = {r['t']:g}, {r['check']} against {r['reference']}: {r['difference']:.1e}"
                          for r in res["table"]["references"])
        lines += ["", f"Second, independent references, their energies' distance from the reference of their "
                      f"time: {agree}; errors well above these are resolved, errors near them are not."]
    lines += ["", "JVPs: exact (forward mode) at pdeflow.core.problem.JVP_COST grad Phi evaluations each "
                  "(cvode; the cost measured with each run is kept in its JSON); "
                  "difference JVPs count 1 (rkc's radius and dI/dt, rosenbrock, and every product of "
                  "cvode-difference: cvode with `solver.jacobian = \"difference\"`). cvode-plain (SUNDIALS set up "
                  "plainly: GMRES on CVODE's own difference quotients, no preconditioner) costs the right-hand-side "
                  "calls CVODE made, without the energy identity pdeflow's cvode keeps (shown apart in its "
                  "breakdown).", "",
              "| t | method | rtol | energy error | grad-equivalents | wall s | load (1 min) | CPU family/model "
              "| steps | source |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(res["table"]["rows"], key=lambda r: (r["t"], r["method"], -r["rtol"])):
        load = row["load_average"][0]
        load_text = f"{load[0]:.1f}" if isinstance(load, (list, tuple)) else "-"
        lines.append(f"| {row['t']:g} | {row['method']} | {row['rtol']:g} | {row['energy_error']:.2e} "
                     f"| {row['grad_equivalents']:.0f} | {row['wall']:.0f} | {load_text} | {row['cpu']} "
                     f"| {row['steps']:.0f} "
                     f"| {row['source']} |")
    for last in sorted({row["t"] for row in res["table"]["rows"]}):
        lines += race_summary(res, last)
    if res.get("notes"):
        lines += ["", res["notes"].strip()]
    return "\n".join(lines) + "\n"


def race_targets(rows: list[dict[str, Any]], t: float) -> dict[float, dict[str, dict[str, Any] | None]]:
    """For each of :data:`RACE_TARGETS`, each method's cheapest row at time ``t`` with an energy error at most the
    target (None when none reached it)."""
    methods = sorted({r["method"] for r in rows})
    out: dict[float, dict[str, dict[str, Any] | None]] = {}
    for target in RACE_TARGETS:
        out[target] = {}
        for method in methods:
            hits = [r for r in rows if r["method"] == method and r["t"] == t and r["energy_error"] <= target]
            out[target][method] = min(hits, key=lambda r: r["grad_equivalents"]) if hits else None
    return out


def race_fits(rows: list[dict[str, Any]], t: float) -> dict[str, dict[str, float]]:
    """Per method with runs at two or more tolerances at time ``t``: the power law ``cost = c err^-b`` through them
    (least squares in log-log; ``b``, ``c``) and the cost it gives at each of :data:`RACE_TARGETS` (an
    extrapolation beyond the measured errors, labelled so where it is shown)."""
    out = {}
    for method in sorted({r["method"] for r in rows}):
        mine = [r for r in rows if r["method"] == method and r["t"] == t and r["energy_error"] > 0]
        if len({r["rtol"] for r in mine}) < 2:
            continue
        errors, costs = [r["energy_error"] for r in mine], [r["grad_equivalents"] for r in mine]
        b = -loglog_exponent(errors, costs)
        c = float(np.exp(np.mean(np.log(costs) + b * np.log(errors))))
        out[method] = {"b": b, "c": c, **{f"{target:g}": c * target ** -b for target in RACE_TARGETS}}
    return out


def race_plot(res: dict[str, Any], path: Path) -> None:
    """The work-precision plot: energy error against gradient equivalents, one line per method, one panel per time
    the reference recorded."""
    from matplotlib.figure import Figure  # its own Agg canvas: a caller's backend and pyplot are left alone

    marks = sorted({row["t"] for row in res["table"]["rows"]})
    # one colour per method in every panel
    colour = {m: f"C{i}" for i, m in enumerate(sorted({r["method"] for r in res["table"]["rows"]}))}
    fig = Figure(figsize=(5.2 * len(marks), 4.4))
    axes = fig.subplots(1, len(marks), squeeze=False)
    for ax, t in zip(axes[0], marks):
        rows = [r for r in res["table"]["rows"] if r["t"] == t]
        for method in sorted({r["method"] for r in rows}):
            mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["grad_equivalents"])
            ax.loglog([r["grad_equivalents"] for r in mine], [max(r["energy_error"], 1e-16) for r in mine], "o-",
                      color=colour[method], label=method)
        for target in RACE_TARGETS:
            ax.axhline(target, color="0.6", lw=0.8, ls=":")
        for agree in (r for r in res["table"]["references"] if r["t"] == t):
            ax.axhline(agree["difference"], color="k", lw=0.8, ls="--", label="references' distance")
        ax.set_xlabel(f"cost to t = {t:g} (gradient equivalents)")
        ax.set_ylabel(f"|E({t:g}) - E_ref({t:g})|")
        ax.set_title(f"work-precision at t = {t:g} (quickstart problem, N = 128)", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def furthest_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One run per METHOD:RTOL: the one that got furthest (the first of equals), in the order first seen. A run
    repeated to a later time records the earlier marks again, and two rows of the same settings at one time would
    count it twice."""
    kept: dict[tuple[str, float], dict[str, Any]] = {}
    for run in runs:
        key = (run["method"], float(run["rtol"]))
        if key not in kept or run["final"]["t"] > kept[key]["final"]["t"]:
            kept[key] = run
    return list(kept.values())


def race_render(folder: Path, table_json: Path | None, references: list[str], checks: list[str],
                out: Path, notes: str = "") -> dict[str, Any]:
    """Gather the race runs in ``folder`` (of runs with the same settings the one that got furthest,
    :func:`furthest_runs`) and those of a saved time-to-solution JSON whose settings were not raced into
    ``matched_accuracy.json``/``.md``/``.png`` in ``out``; ``references`` and ``checks`` name runs as
    ``METHOD:RTOL``, in the order they are preferred at each time (:func:`race_table`); ``notes`` (markdown: what
    the measurements say, with the figures they rest on) close the table and are kept in the JSON."""
    runs = furthest_runs([json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))])
    if table_json is not None:
        # a race run of the same settings replaces the table's (it records the race's marks)
        raced = {(r["method"], float(r["rtol"])) for r in runs}
        runs += [r for r in race_runs_from_table(json.loads(table_json.read_text()))
                 if (r["method"], float(r["rtol"])) not in raced]

    def named(name: str) -> dict[str, Any]:
        method, rtol = name.split(":")
        found = [r for r in runs if r["method"] == method and math.isclose(r["rtol"], float(rtol))]
        if not found:
            raise SystemExit(f"no race run {name} in {folder}")
        return max(found, key=lambda r: r["final"]["t"])

    refs, chks = [named(n) for n in references], [named(n) for n in checks]

    def described(run: dict[str, Any]) -> dict[str, Any]:
        return {"method": run["method"], "rtol": run["rtol"], "source": run.get("source", ""),
                "t_end": run["final"]["t"]}

    res = {"references": [described(r) for r in refs], "checks": [described(r) for r in chks],
           "machine": runs[0]["machine"], "table": race_table(runs, refs, chks), "runs": runs, "notes": notes}
    out.mkdir(parents=True, exist_ok=True)
    (out / "matched_accuracy.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    (out / "matched_accuracy.md").write_text(race_markdown(res))
    race_plot(res, out / "matched_accuracy.png")
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.race.time_to_solution",
                                description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=128, help="particles and sequences (default 128, the quickstart's)")
    p.add_argument("--rtol", type=float, default=3e-5, help="rosenbrock tolerance (atol = rtol / 1000)")
    p.add_argument("--wall", type=float, default=600.0, help="wall-time limit of the rkc run to stationarity (s)")
    p.add_argument("--max-steps", type=int, help="step limit of the rkc run to stationarity (default: none)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--render", help="re-render the table of a saved time_to_solution.json instead of running")
    p.add_argument("--hvp", action="store_true", help="only measure the JVP costs at N = 128 and N = 1024")
    p.add_argument("--deflate", type=int, default=32, help="rosenbrock: solver.deflate (default 32)")
    p.add_argument("--deflate-every", type=int, default=50, help="rosenbrock: solver.deflate_every (default 50)")
    p.add_argument("--stage-solve", default="auto", choices=("auto", "minres"),
                   help="rosenbrock: solver.stage_solve (default auto)")
    p.add_argument("--race", metavar="METHOD:RTOL", help="one run of the matched-accuracy race (an entry of "
                   "RACE_SOLVERS, e.g. rkc, eserk4, cvode, cvode-difference, cvode-plain, cvode-heads, rosenbrock, "
                   "adaptive, or any registered error-controlled method such as bs23) to --t-end, saved as "
                   "race/METHOD-RTOL.json under --out")
    p.add_argument("--t-end", type=float, default=RACE_END, help="--race: final time (default 200)")
    p.add_argument("--race-render", metavar="FOLDER", help="gather the race runs in FOLDER into "
                   "matched_accuracy.json/.md/.png under --out")
    p.add_argument("--table", help="--race-render: also the runs of this saved time_to_solution.json")
    p.add_argument("--notes", help="--race-render: a markdown file closing the table (what the figures say)")
    p.add_argument("--race-wall", type=float, default=math.inf,
                   help="--race: stop the run after this many seconds, keeping where it got (default: none)")
    p.add_argument("--reference", action="append", help="--race-render: a reference run (METHOD:RTOL; repeat "
                   "for later times: at each time the first that recorded it; default adaptive:1e-10)")
    p.add_argument("--check", action="append", default=[],
                   help="--race-render: a second reference (METHOD:RTOL; repeatable like --reference)")
    args = p.parse_args(argv)
    if args.race:
        method, rtol = args.race.split(":")
        try:
            race_settings(method)
        except ValueError as exc:
            print(f"error: --race {args.race}: {exc}", file=sys.stderr)
            return 2
        res = race_run(method, float(rtol), args.n, args.t_end, args.race_wall,
                       log=lambda s: print(s, file=sys.stderr, flush=True))
        folder = Path(args.out) / "race"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{method}-{float(rtol):g}-t{args.t_end:g}.json").write_text(
            json.dumps(res, indent=2, default=float) + "\n")
        return 0
    if args.race_render:
        res = race_render(Path(args.race_render), Path(args.table) if args.table else None,
                          args.reference or ["adaptive:1e-10"], args.check, Path(args.out),
                          Path(args.notes).read_text() if args.notes else "")
        print(race_markdown(res))
        return 0
    if args.hvp:
        res = hvp_costs(log=lambda s: print(s, file=sys.stderr, flush=True))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "hvp_cost.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
        cpu = res["machine"].get("cpu") or {}
        lines = ["# Cost of a whole-system Jacobian-vector product", "",
                 f"Measured by `python -m studies.race.time_to_solution --hvp` on {cpu.get('model', '?')} "
                 f"(family {cpu.get('family', '?')} model {cpu.get('model_number', '?')}, "
                 f"{res['machine'].get('cpu_count')} cores, shared); medians of 5 interleaved repeats, so the "
                 "ratios of one row are taken under the same load. Exact JVP: `Problem.system_jvp` (forward mode, "
                 "pdeflow/core/kernels_jvp.py); complex step: `Problem.system_jvp_complex_step`; difference JVP: one "
                 "grad Phi at moved particles (not exact).", "",
                 "| problem | load (1 min) before/after | grad Phi ms | exact JVP ms | ratio | complex step ms "
                 "| ratio | difference JVP ms | ratio |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for name in ("quickstart", "bench-reference"):
            c = res[name]
            lines.append(f"| {name} | {c['load_average'][0][0]:.1f} / {c['load_average'][1][0]:.1f} "
                         f"| {1e3 * c['grad_phi']:.1f} "
                         f"| {1e3 * c['jvp_exact']:.1f} | {c['exact_over_grad']:.2f} "
                         f"| {1e3 * c['jvp_complex_step']:.1f} | {c['complex_step_over_grad']:.2f} "
                         f"| {1e3 * c['jvp_difference']:.1f} | {c['difference_over_grad']:.2f} |")
        (out / "hvp_cost.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
        return 0
    if args.render:
        res = json.loads(Path(args.render).read_text())
        res["table"] = table(res)
    else:
        res = benchmark(args.n, args.wall, args.rtol, args.deflate, args.deflate_every, args.stage_solve,
                        log=lambda s: print(s, file=sys.stderr, flush=True), max_steps=args.max_steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "time_to_solution.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    md = markdown(res)
    (out / "time_to_solution.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
