"""Time to a certified local minimum on data/configs/longtime.toml: the flow, then ``stationary --kind minimum``.

``python -m studies.minimum.time_to_minimum [--wall SECONDS] [--n N] [--t-end T] [--max-iter M] [--out DIR]``:

1. **flow**: the shipped long run (rkc) from t = 0 with ``run.wall_time_limit = --wall`` (default 300 s; ``--t-end``
   bounds it in time instead, for a toy run), written to ``DIR/flow.h5``; or ``--flow FILE``, such a run made
   before (its own wall time and counts are this step's);
2. **solve**: :func:`pdeflow.analysis.stationary.stationary.minimum` (``--method``: L-BFGS by default, or trust-region
   Newton-Krylov; restarted along negative curvature) from its last frame, until ``I <= 1e-12 I(0)``, at most
   ``--max-iter`` iterations per attempt;
3. **certification**: the spectrum ends there (:func:`pdeflow.analysis.hessian.spectrum.spectrum_ends`), part of step
  2's
   result, reported separately: certified when the lowest Ritz value off the symmetry directions has converged and
   is positive by more than its residual;
4. **the flow at the same wall time**: the run continued (``--resume`` on a copy) for the wall time the solve and the
   certification took, so the energy the flow alone reaches in the same total wall time stands beside E*.

Costs in gradient evaluations (the one formula :func:`pdeflow.core.problem.gradient_equivalents`: an exact JVP at
:data:`pdeflow.core.problem.JVP_COST`, a difference product at 1; the flow's from its /steps cost columns:
:func:`pdeflow.analysis.convergence.spectral.run_gradient_equivalents`) and wall seconds, with the CPU
model and the load average before and after. Writes ``time_to_minimum.json`` and ``time_to_minimum.md`` into DIR
(default benchmarks/results). ``--n`` sets the particles and the sequences (``init.n_particles``, ``task.n_samples``),
``--set`` any other key (toy runs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from pdeflow.benchmarks.common import RESULTS, machine

LONGTIME = Path(__file__).resolve().parents[2] / "data" / "configs" / "longtime.toml"


def _load() -> list[float]:
    return list(os.getloadavg())


def flow(cfg, problem, path: Path, *, resume: bool = False, run_it: bool = True) -> dict[str, Any]:
    """Run (or continue) the flow into ``path`` (``run_it`` False: only read a run already there); its status,
    reach, energy and cost (``wall``: this call's, or the file's own wall time of a run read)."""
    from pdeflow.solvers.driver import run

    from pdeflow.analysis.convergence.spectral import run_gradient_equivalents
    from pdeflow.io.trajectory import open_trajectory

    t0 = time.perf_counter()
    status = run(cfg, problem, path, resume=resume, quiet=True).status if run_it else None
    wall = time.perf_counter() - t0
    traj = open_trajectory(path)
    if not run_it:
        status, wall = str(traj.attrs.get("status")), float(traj.frames["wall_time"][-1])
    return {"status": status, "wall": wall, "wall_in_file": float(traj.frames["wall_time"][-1]),
            "t": float(traj.time[-1]), "energy": float(traj.frames["energy"][-1]),
            "dissipation": float(traj.frames["dissipation"][-1]),
            "initial_dissipation": float(traj.frames["dissipation"][0]), "frames": len(traj.time),
            "grad_equivalents": run_gradient_equivalents(traj.steps), "steps": len(traj.steps.get("time", ())) - 1}


def benchmark(n: int | None = None, *, wall: float = 300.0, t_end: float | None = None, max_iter: int = 0,
              method: str = "lbfgs", solve_wall: float = math.inf,
              out: Path = RESULTS, compare: bool = True, overrides: tuple[str, ...] = (),
              flow_file: Path | None = None, log=print, save=None) -> dict[str, Any]:
    """The four steps of the module docstring; the result as a JSON-able dict. ``flow_file``: a run of the same
    config from t = 0 already made (its own wall time and counts are step 1's). ``save(res)`` is called after the
    solve and again at the end (a killed comparison keeps the rest)."""
    from pdeflow.analysis.stationary.stationary import minimum, write_stationary
    from pdeflow.core.config import load_config
    from pdeflow.core.problem import JVP_COST, Problem, gradient_equivalents
    from pdeflow.io.trajectory import open_trajectory

    out.mkdir(parents=True, exist_ok=True)
    overrides = [f"run.wall_time_limit={wall}"] + ([f"run.t_end={t_end}"] if t_end is not None else []) + \
        list(overrides)
    if n is not None:
        overrides += [f"init.n_particles={n}", f"task.n_samples={n}"]
    cfg = load_config(LONGTIME, overrides)
    problem = Problem.from_config(cfg)
    res: dict[str, Any] = {"config": str(LONGTIME.name), "overrides": overrides, "machine": machine(),
                           "load_before": _load(), "jvp_gradients": JVP_COST}
    path = out / "flow.h5"
    log(f"flow: longtime.toml with {' '.join(overrides)}" + (f", read from {flow_file}" if flow_file else ""))
    if flow_file is not None:
        path = Path(flow_file)
        res["flow_file"] = str(path)
        res["flow"] = flow(cfg, problem, path, run_it=False)
    else:
        path.unlink(missing_ok=True)  # this benchmark's own scratch file
        res["flow"] = flow(cfg, problem, path)
    f = res["flow"]
    log(f"flow: {f['status']} at t = {f['t']:.6g}, E = {f['energy']:.10g}, I = {f['dissipation']:.3e}, "
        f"{f['grad_equivalents']:.0f} gradient equivalents, {f['wall']:.1f} s")
    traj = open_trajectory(path)
    omega = np.asarray(traj.frames["omega"][-1], dtype=float)
    mass = np.asarray(traj.frames["mass"][-1], dtype=float)
    point = minimum(problem, omega, mass, f["initial_dissipation"], max_iter=max_iter, method=method,
                    max_wall=solve_wall, progress=lambda msg: log(f"minimum: {msg}"))
    write_stationary(out / "minimum.h5", point, cfg, problem, source=str(path), frame=len(traj.time) - 1,
                     time_of_frame=float(traj.time[-1]), ratio=point.target / f["initial_dissipation"])
    s = point.spectrum
    # point.wall is the whole search, the certification's certify_wall included
    res["solve"] = {"method": method, "wall": point.wall - point.certify_wall, "gradients": point.gradients,
                    "products": point.products,
                    "grad_equivalents": gradient_equivalents({"gradient": point.gradients,
                                                              "jvp_exact": point.products}),
                    "iterations": point.iterations, "message": point.message}
    res["certification"] = {"wall": point.certify_wall, "products": point.certify_products,
                            "grad_equivalents": gradient_equivalents({"jvp_exact": point.certify_products})}
    res["minimum"] = {"verdict": point.verdict, "certified": point.certified, "converged": point.converged,
                      "certificate": point.certificate.describe(),
                      "energy": point.energy, "dissipation": point.dissipation,
                      "dissipation_ratio": point.dissipation / f["initial_dissipation"],
                      "lambda_min": s.lambda_min, "lambda_min_residual": float(s.lowest_residual[0])
                      if s.lowest.size else float("nan"), "lambda_max": s.lambda_max,
                      "morse_index_lower": point.morse_index_lower, "n_symmetry": s.n_symmetry}
    total_wall = f["wall"] + point.wall
    res["total"] = {"wall": total_wall, "grad_equivalents": f["grad_equivalents"] + res["solve"]["grad_equivalents"]
                    + res["certification"]["grad_equivalents"]}
    log(f"minimum: {point.verdict}, E = {point.energy:.10g}, I = {point.dissipation:.3e}; solve "
        f"{res['solve']['wall']:.1f} s, certification {point.certify_wall:.1f} s")
    if save is not None:
        res["load_after"] = _load()
        save(res)
    if compare:
        longer = out / "flow_same_wall.h5"
        shutil.copyfile(path, longer)  # the flow continued on a copy: flow.h5 stays the solve's start
        same = cfg.replace(run={"wall_time_limit": f["wall_in_file"] + point.wall})
        res["flow_same_wall"] = flow(same, problem, longer, resume=True)
        g = res["flow_same_wall"]
        log(f"flow to the same wall time: t = {g['t']:.6g}, E = {g['energy']:.10g}, I = {g['dissipation']:.3e}")
    res["load_after"] = _load()
    return res


SEARCHES = {"lbfgs": "L-BFGS", "trust-region": "trust-region Newton-Krylov"}


def markdown(res: dict[str, Any]) -> str:
    """The result as a short markdown report."""
    cpu = res["machine"].get("cpu") or {}
    f, m = res["flow"], res["minimum"]
    lines = ["# Time to a local minimum (data/configs/longtime.toml)", "",
             f"Measured by `python -m studies.minimum.time_to_minimum` ({' '.join(res['overrides'])}) on "
             f"{cpu.get('model', '?')} (family {cpu.get('family', '?')} model {cpu.get('model_number', '?')}, "
             f"{res['machine'].get('cpu_count')} cores, NUMBA threads {res['machine'].get('numba_threads')}), load "
             f"average (1, 5, 15 min) {', '.join(f'{x:.1f}' for x in res['load_before'])} before and "
             f"{', '.join(f'{x:.1f}' for x in res['load_after'])} after: wall times depend on the load, the counts "
             f"do not. A JVP counts as {res['jvp_gradients']:g} gradient evaluations.", "",
             "| step | wall s | gradient equivalents | what |", "|---|---|---|---|",
             f"| flow (rkc{', ' + res['flow_file'] if 'flow_file' in res else ''}) | {f['wall']:.1f} | "
             f"{f['grad_equivalents']:.0f} | {f['status']} at t = {f['t']:.6g}, "
             f"E = {f['energy']:.10g}, I = {f['dissipation']:.3e} |",
             f"| solve ({SEARCHES[res['solve'].get('method', 'trust-region')]}) | {res['solve']['wall']:.1f} | "
             f"{res['solve']['grad_equivalents']:.0f} | {res['solve']['iterations']} iterations, "
             f"{res['solve']['products']} JVPs, {res['solve']['gradients']} gradients; {res['solve']['message']} |",
             f"| certification (spectrum ends) | {res['certification']['wall']:.1f} | "
             f"{res['certification']['grad_equivalents']:.0f} | {res['certification']['products']} JVPs |",
             f"| total | {res['total']['wall']:.1f} | {res['total']['grad_equivalents']:.0f} | |", "",
             f"Result: **{m['verdict']}**, {'E*' if m['certified'] else 'E'} = {m['energy']:.10g}, "
             f"I = {m['dissipation']:.3e} = "
             f"{m['dissipation_ratio']:.3g} I(0); lambda_min = {m['lambda_min']:.6g} (residual "
             f"{m['lambda_min_residual']:.1e}), lambda_max = {m['lambda_max']:.6g}, Morse index >= "
             f"{m['morse_index_lower']}, {m['n_symmetry']} symmetry directions removed."]
    if "flow_same_wall" in res:
        g = res["flow_same_wall"]
        lines += ["", f"The flow alone in the same total wall time ({g['wall_in_file']:.1f} s): t = {g['t']:.6g}, "
                  f"E = {g['energy']:.10g}, I = {g['dissipation']:.3e} ({g['grad_equivalents']:.0f} gradient "
                  f"equivalents); E - E* = {g['energy'] - m['energy']:.4g}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.minimum.time_to_minimum",
                                description=__doc__.splitlines()[0])
    p.add_argument("--wall", type=float, default=300.0, help="wall-time limit of the flow (s, default 300)")
    p.add_argument("--t-end", type=float, help="stop the flow at this time instead (toy runs)")
    p.add_argument("--n", type=int, help="particles and sequences (default: longtime.toml's 128)")
    p.add_argument("--max-iter", type=int, default=0,
                   help="iterations of each search at most "
                        "(default: MAX_ITER of pdeflow.analysis.stationary.stationary)")
    p.add_argument("--method", choices=("lbfgs", "trust-region"), default="lbfgs",
                   help="the descent search of the minimum (default lbfgs)")
    p.add_argument("--solve-wall", type=float, default=0.0, metavar="SECONDS",
                   help="stop the search after this many seconds: the point reached is reported, not "
                   "converged (default: no limit)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="change a key of longtime.toml (repeatable; toy runs)")
    p.add_argument("--no-compare", action="store_true", help="do not continue the flow for the solve's wall time")
    p.add_argument("--flow", metavar="FILE", help="a run of longtime.toml (with the same --set keys) from t = 0 "
                   "already made: step 1 read from it (its wall time and counts), not run")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    out = Path(args.out)

    def save(res: dict[str, Any]) -> str:
        (out / "time_to_minimum.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
        text = markdown(res)
        (out / "time_to_minimum.md").write_text(text)
        return text

    res = benchmark(args.n, wall=args.wall, t_end=args.t_end, max_iter=args.max_iter, method=args.method,
                    solve_wall=args.solve_wall if args.solve_wall > 0 else math.inf, out=out,
                    compare=not args.no_compare, overrides=tuple(args.set),
                    flow_file=Path(args.flow) if args.flow else None,
                    log=lambda s: print(s, file=sys.stderr, flush=True), save=save)
    print(save(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
