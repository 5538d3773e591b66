"""Time to solution of the stiff stepper against Dormand-Prince and particle JKO (issue 17).

``python -m pdeflow.benchmarks.time_to_solution --hvp`` measures the exact JVP (forward mode, and the complex step
it replaced) against grad Phi at N = 128 and N = 1024 (``hvp_cost.json``/``.md``).
``python -m pdeflow.benchmarks.time_to_solution [--n N] [--out DIR] [--wall SECONDS]`` integrates the quickstart's
problem (data/configs/quickstart.toml; ``--n`` particles and sequences, default 32 of each - a reduced size,
stated in the output) and writes ``time_to_solution.json`` and ``time_to_solution.md``:

- **cost of a product**: seconds of one grad Phi at all particles (``Problem.grad_phi``), of one exact
  whole-system JVP (``Problem.system_jvp``, forward mode) and of one difference JVP (a real grad Phi),
  medians of interleaved repeats; their ratios convert products into gradient-evaluation equivalents;
- **rosenbrock** (``solver.method = "rosenbrock"``, ``--rtol``, difference Jacobian, ``--deflate`` carried
  eigenpairs refined every ``--deflate-every`` steps, ``--stage-solve``: ``auto`` for Krylov-free W-steps
  under the explicit bound of the complement, ``minres`` for MINRES on every stage) run to stationarity
  (dissipation <= 1e-9 x its initial value) or ``--wall`` seconds: wall time, gradient evaluations, JVPs
  and gradient equivalents at t = 40, t = 200 and at stationarity;
- **reference**: the same stepper at ``rtol / 100`` to t = 200, whose energies the others are compared with
  (its own error is estimated by its difference from the rtol / 10 run at t = 40... not run: the rosenbrock
  run's difference from it is the accuracy reported);
- **adaptive** (Dormand-Prince, rtol 1e-6) run to t = 200 (measured at t = 40 and t = 200). Beyond, it is
  held at its stability bound ``h ~ c / lambda_max(t)``: its gradient evaluations to the rosenbrock run's
  final time are **extrapolated** from t = 200 with lambda_max (Lanczos, exact JVPs, measured on the
  reference trajectory every 10 time units) held at its last value; the JSON says which figures are
  extrapolated;
- **jko** (particle JKO, tau = 2) to t = 40 (measured); its error is first order in tau, so the cost at the
  rosenbrock run's accuracy is **extrapolated** as ``evals x err_jko / err_target`` (steps scale with
  1/tau, the inner evaluations per step assumed unchanged).

JKO's ``inner_evaluations`` count its gradient evaluations and complex-step HVPs alike as one each, an
underestimate of its cost. Wall times depend on the machine's load (recorded as the load average).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .common import REFERENCE_CONFIG, RESULTS, interleaved, machine, median

# a study of the shipped quickstart problem: run from a checkout
QUICKSTART = Path(__file__).resolve().parent.parent / "data" / "configs" / "quickstart.toml"
MARKS = (40.0, 200.0)
STATIONARY = 1e-9  # dissipation relative to its initial value


def setup(n: int, *overrides: str):
    from pdeflow.config import load_config
    from pdeflow.problem import Problem

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
    from pdeflow.config import load_config
    from pdeflow.problem import Problem

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


def run_stepper(cfg, problem, t_end: float, marks=MARKS, wall: float = np.inf, probe=None) -> dict[str, Any]:
    """Step ``cfg``'s stepper to t_end (or stationarity, or the wall limit) without files, through the one time
    loop (:mod:`pdeflow.solvers.loop`); counts at each mark and at the state a stop leaves.

    ``probe(t, state, stepper)`` is called at t = 0 and at every multiple of 10 crossed (lambda_max sampling)."""
    from pdeflow.solvers import make_stepper
    from pdeflow.solvers.loop import Frames, Loop, Observer, Stationary, WallTime

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
            if probe is not None and state.t >= self.next_probe:
                probe(state.t, state, stepper)
                self.next_probe += 10.0

        def accept(self, step) -> None:
            totals["steps"] += 1
            for key, value in step.extra.items():
                if key == "explicit_margin":  # a per-step ratio, not a count: how many steps and the largest
                    finite = bool(np.isfinite(value))
                    totals["krylov_free_steps"] = totals.get("krylov_free_steps", 0.0) + finite
                    largest = totals.get("max_explicit_margin", 0.0)
                    totals["max_explicit_margin"] = max(largest, value) if finite else largest
                    continue
                totals[key] = totals.get(key, 0.0) + value

    stops = sorted(set([m for m in marks if m <= t_end] + [t_end]))
    observers = [Counts(), Frames(lambda index, state: row(state)),
                 WallTime(wall, lambda: time.perf_counter() - t0), Stationary(STATIONARY * d0["dissipation"])]
    state, stop = Loop(stepper, stops, observers, measure=True).run(state)
    if stop.status not in ("finished", "stationary", "wall_time"):
        raise RuntimeError(f"{cfg.solver.method}: {stop.message}")
    if f"{state.t:.6g}" not in at:
        row(state)
    result = {"status": stop.status, "initial_energy": d0["energy"], "initial_dissipation": d0["dissipation"]}
    result.update(at=at, final=at[list(at)[-1]])
    return result


def gradient_equivalents(row: dict[str, float], method: str, costs: dict[str, float], jacobian: str) -> float:
    """Gradient evaluations of a run, with each JVP counted at its measured cost."""
    if method == "rosenbrock":
        # a difference product is one grad Phi call (plus vector arithmetic): counted as 1
        ratio = costs["exact_over_grad"] if jacobian == "exact" else 1.0
        return row["gradient_evals"] + ratio * row["jvps"]
    if method == "adaptive":
        # six new stages per try (first-same-as-last), plus the first evaluation
        return 6.0 * (row["steps"] + row.get("rejected", 0.0)) + 1.0
    if method == "jko":
        return row["inner_evaluations"] + 1.0
    raise ValueError(method)


def energy_at(run: dict[str, Any], t: float) -> float | None:
    for row in run["at"].values():
        if abs(row["t"] - t) <= 1e-9 * max(1.0, t):
            return row["energy"]
    return None


def benchmark(n: int, rtol: float, wall: float, deflate: int = 32, deflate_every: int = 50,
              stage_solve: str = "auto", log=print) -> dict[str, Any]:
    from pdeflow.solvers.jko import euler_stability_limit

    cfg, problem = setup(n)
    res: dict[str, Any] = {"problem": f"quickstart task/model, N = {n} particles, B = {n} sequences",
                           "machine": machine(), "load_average": os.getloadavg()}
    costs = product_costs(problem, cfg)
    res["costs"] = costs
    log(f"costs: {costs}")

    def rosen(r: float, jacobian: str = "difference", **solver):
        return cfg.replace(solver={"method": "rosenbrock", "dt": 0.05, "rtol": r, "atol": r * 1e-3,
                                   "jacobian": jacobian, **solver}, run={"t_end": 1e6})

    lambdas: list[tuple[float, float]] = []

    def probe(t, state, stepper):
        limit = euler_stability_limit(problem, state.fields["omega"], state.fields["mass"], tol=1e-3)
        lambdas.append((t, 2.0 / limit))

    log("reference run (rosenbrock, rtol / 100) to t = 200 ...")
    ref = run_stepper(rosen(rtol / 100), problem, 200.0, probe=probe)
    res["reference"] = {"rtol": rtol / 100, **ref}
    res["lambda_max"] = lambdas
    log(f"  {ref['final']}")
    log(f"rosenbrock rtol {rtol:g} to stationarity (wall limit {wall:g} s) ...")
    solver = {"deflate": deflate, "deflate_every": deflate_every, "stage_solve": stage_solve}
    ros = run_stepper(rosen(rtol, **solver), problem, 1e6, wall=wall)
    res["rosenbrock"] = {"rtol": rtol, "jacobian": "difference", **solver, **ros}
    log(f"  {ros['final']} {ros['status']}")
    log("adaptive (Dormand-Prince, rtol 1e-6) to t = 200 ...")
    dp = run_stepper(cfg.replace(solver={"method": "adaptive", "dt": 0.05, "rtol": 1e-6, "atol": 1e-9}), problem, 200.0)
    res["adaptive"] = dp
    log(f"  {dp['final']}")
    log("jko (particles, tau = 2) to t = 40 ...")
    jko = run_stepper(cfg.replace(solver={"method": "jko", "dt": 2.0, "tau": 2.0}), problem, 40.0)
    res["jko"] = jko
    log(f"  {jko['final']}")

    res["table"] = table(res)
    return res


def table(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the time-to-solution table from the raw runs of :func:`benchmark` (also re-rendered from a
    saved JSON by ``--render``)."""
    costs, ref, ros, dp, jko = res["costs"], res["reference"], res["rosenbrock"], res["adaptive"], res["jko"]
    rows = []
    lam_t = np.array([t for t, _ in res["lambda_max"]])
    lam_v = np.array([v for _, v in res["lambda_max"]])

    def lam_integral(t_end: float) -> float:
        grid = np.linspace(0.0, t_end, 2001)
        return float(np.trapezoid(np.interp(grid, lam_t, lam_v), grid))

    for mark in MARKS:
        e_ref = energy_at(ref, mark)
        row: dict[str, Any] = {"t": mark, "reference_energy": e_ref}
        r = ros["at"].get(f"{mark:.6g}")
        if r is not None:
            row["rosenbrock"] = {"wall": r["wall"], "grad_equivalents": gradient_equivalents(r, "rosenbrock", costs,
                                                                                             "difference"),
                                 "steps": r["steps"], "energy_error": abs(r["energy"] - e_ref), "measured": True}
        d = dp["at"].get(f"{mark:.6g}")
        if d is not None:
            row["adaptive"] = {"wall": d["wall"], "grad_equivalents": gradient_equivalents(d, "adaptive", costs, ""),
                               "steps": d["steps"], "energy_error": abs(d["energy"] - e_ref), "measured": True}
        else:
            d = dp["at"]["40"]
            dp_equiv = gradient_equivalents(d, "adaptive", costs, "")
            factor = lam_integral(mark) / lam_integral(40.0)
            row["adaptive"] = {"wall": d["wall"] * factor, "grad_equivalents": dp_equiv * factor,
                               "steps": d["steps"] * factor, "energy_error": None, "measured": False,
                               "method": "extrapolated: x int_0^t lambda_max / int_0^40 lambda_max "
                                         f"= {factor:.3g}"}
        j = jko["at"]["40"]
        if mark == 40.0:
            err = abs(j["energy"] - e_ref)
            target = row.get("rosenbrock", {}).get("energy_error") or err
            scale = max(1.0, err / max(target, 1e-300))
            row["jko"] = {"wall": j["wall"], "grad_equivalents": gradient_equivalents(j, "jko", costs, ""),
                          "steps": j["steps"], "energy_error": err, "measured": True,
                          "at_matched_accuracy": {"grad_equivalents": gradient_equivalents(j, "jko", costs, "") * scale,
                                                  "wall": j["wall"] * scale, "measured": False,
                                                  "method": f"extrapolated: first order, tau / {scale:.3g}"}}
        rows.append(row)
    # the long run: stationary, or as far as the wall limit let it go
    f = ros["final"]
    label = "stationary" if ros["status"] == "stationary" else "reached"
    row = {"t": label, "rosenbrock": {
        "t": f["t"], "wall": f["wall"], "grad_equivalents": gradient_equivalents(f, "rosenbrock", costs, "difference"),
        "steps": f["steps"], "relative_dissipation": f["dissipation"] / ros["initial_dissipation"],
        "jvp_share": f["jvps"] / gradient_equivalents(f, "rosenbrock", costs, "difference"), "measured": True}}
    # Dormand-Prince beyond its last measured mark with lambda_max held at its last measured value
    d = dp["final"]
    last = float(lam_v[-1])
    factor = (lam_integral(float(lam_t[-1])) + last * (f["t"] - float(lam_t[-1]))) / lam_integral(d["t"])
    row["adaptive"] = {"wall": d["wall"] * factor,
                       "grad_equivalents": gradient_equivalents(d, "adaptive", costs, "") * factor,
                       "steps": d["steps"] * factor, "energy_error": None, "measured": False,
                       "method": f"extrapolated: lambda_max held at {last:.3g} (its value at t = {lam_t[-1]:.0f}) "
                                 f"beyond the sampled range, x {factor:.3g}"}
    rows.append(row)
    return rows


def markdown(res: dict[str, Any]) -> str:
    c = res["costs"]
    lines = [f"# Time to solution ({res['problem']})", "",
             "Measured by `python -m pdeflow.benchmarks.time_to_solution`; "
             f"load average {res['load_average'][0]:.1f} on "
             f"{res['machine'].get('cpu_count', '?')} cores. One grad Phi {1e3 * c['grad_phi']:.2f} ms; exact JVP "
             f"(complex step) {c['exact_over_grad']:.2f} x grad Phi; "
             f"a difference JVP is one grad Phi call, counted as 1 "
             f"(timed at {c['difference_over_grad']:.2f} x under this load). "
             "The reference is rosenbrock at rtol / 100; "
             "its own error is of the order of the smallest errors shown. "
             f"rosenbrock: rtol {res['rosenbrock']['rtol']:g}, difference Jacobian, "
             f"deflate {res['rosenbrock'].get('deflate', 0)}, "
             f"deflate_every {res['rosenbrock'].get('deflate_every', 1)}, "
             f"stage_solve {res['rosenbrock'].get('stage_solve', 'minres')}.",
             "", "| target | method | wall s | grad-equivalents | steps | energy error | how |",
             "|---|---|---|---|---|---|---|"]
    for row in res["table"]:
        for method in ("rosenbrock", "adaptive", "jko"):
            r = row.get(method)
            if r is None:
                continue
            err = "-" if r.get("energy_error") is None else f"{r['energy_error']:.2e}"
            how = "measured" if r["measured"] else r["method"]
            target = row["t"]
            if isinstance(target, str):
                r0 = row["rosenbrock"]
                target = f"{target} t = {r0['t']:.4g} (I/I(0) = {r0['relative_dissipation']:.2g})"
            lines.append(f"| {target} | {method} | {r['wall']:.1f} | {r['grad_equivalents']:.0f} | {r['steps']:.0f} | "
                         f"{err} | {how} |")
            m = r.get("at_matched_accuracy")
            if m:
                lines.append(f"| {target} | {method} (matched accuracy) | {m['wall']:.1f} "
                             f"| {m['grad_equivalents']:.0f} "
                             f"| - | - | {m['method']} |")
    for row in res["table"]:
        if "rosenbrock" in row and "adaptive" in row:
            lines.append("")
            lines.append(f"t = {row['t']}: Dormand-Prince / rosenbrock gradient equivalents = "
                         f"{row['adaptive']['grad_equivalents'] / row['rosenbrock']['grad_equivalents']:.2f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.time_to_solution",
                                description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=32, help="particles and sequences (default 32)")
    p.add_argument("--rtol", type=float, default=1e-4, help="rosenbrock tolerance (atol = rtol / 1000)")
    p.add_argument("--wall", type=float, default=900.0, help="wall-time limit of the run to stationarity (s)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--render", help="re-render the table of a saved time_to_solution.json instead of running")
    p.add_argument("--hvp", action="store_true", help="only measure the JVP costs at N = 128 and N = 1024")
    p.add_argument("--deflate", type=int, default=32, help="rosenbrock: solver.deflate (default 32)")
    p.add_argument("--deflate-every", type=int, default=50, help="rosenbrock: solver.deflate_every (default 50)")
    p.add_argument("--stage-solve", default="auto", choices=("auto", "minres"),
                   help="rosenbrock: solver.stage_solve (default auto)")
    args = p.parse_args(argv)
    if args.hvp:
        res = hvp_costs(log=lambda s: print(s, file=sys.stderr, flush=True))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "hvp_cost.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
        cpu = res["machine"].get("cpu") or {}
        lines = ["# Cost of a whole-system Jacobian-vector product", "",
                 f"Measured by `python -m pdeflow.benchmarks.time_to_solution --hvp` on {cpu.get('model', '?')} "
                 f"(family {cpu.get('family', '?')} model {cpu.get('model_number', '?')}, "
                 f"{res['machine'].get('cpu_count')} cores, shared); medians of 5 interleaved repeats, so the "
                 "ratios of one row are taken under the same load. Exact JVP: `Problem.system_jvp` (forward mode, "
                 "pdeflow/kernels_jvp.py); complex step: `Problem.system_jvp_complex_step`; difference JVP: one "
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
        res = benchmark(args.n, args.rtol, args.wall, args.deflate, args.deflate_every, args.stage_solve,
                        log=lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "time_to_solution.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    md = markdown(res)
    (out / "time_to_solution.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
