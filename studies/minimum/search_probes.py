"""Cheap probes of searches on longtime.toml before a whole route is run (issue 54): what each lowers E by per
gradient equivalent from the same iterates of the L-BFGS search, on a budget.

``python -m studies.minimum.search_probes checkpoint FLOW --iterations 1000 5000 [--out DIR]``: the L-BFGS search
of the routes (:func:`pdeflow.analysis.stationary.stationary._lbfgs_live_heads`) from FLOW's last frame, its
iterates [N, k] at those iterations saved as DIR/it<n>.npy (the route's own path: the same code, the same start).

``python -m studies.minimum.search_probes from FLOW POINT.npy --search S --budget G [--identity] [--radius R]``:
from the iterate in POINT.npy (the problem and masses of FLOW), the search S with the Counter's budget of G gradient
equivalents (:attr:`pdeflow.analysis.stationary.stationary.Counter.cost`): ``lbfgs`` (the routes' L-BFGS, memory
restarted), ``trust-region`` (:func:`pdeflow.analysis.search.trust_region.trust_region_search`, ``--identity``
without the block preconditioner) or ``trust-krylov`` (scipy's trust-krylov, the GLTR Lanczos subproblem, with the
exact ``Pi S Pi`` products on the live heads, restarted on fewer heads when one dies, its initial radius R). Prints
E, I and the cost after every iteration (every 100 for L-BFGS) and writes the rows as JSON beside POINT.

``python -m studies.minimum.search_probes heads POINT...``: the heads that could be merged: for each live head the
relative distance to its nearest neighbour, in coordinates and in the symmetry-invariant ``(W_Q W_K^T,
W_O W_V)`` of full coordinates, and the live heads' norms relative to the largest.

``python -m studies.minimum.search_probes precision FLOW POINT...``: the CPU seconds of one gradient on the live
heads in float64 and float32 (median of 40, process time: less sensitive to the machine's load than wall).

Run each in a process of its own with NUMBA_NUM_THREADS fixed; the machine and load go into the JSON.
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


def _start(flow: Path):
    from pdeflow.interface.cli_stationary import start_of

    return start_of(flow, -1)


def checkpoint(flow: Path, iterations: list[int], out: Path) -> dict[str, Any]:
    """The L-BFGS search's iterates at ``iterations`` (module docstring)."""
    from pdeflow.analysis.stationary.stationary import Counter, _History, _lbfgs_live_heads

    s = _start(flow)
    c = Counter(s.problem, s.mass, s.omega.shape)
    v = c.coordinates(s.omega)
    hist = _History(c)
    E, g = c.energy_and_gradient(v)
    hist.add(E, float(g @ g))
    saved: dict[str, Any] = {}

    def keep(omega: np.ndarray) -> None:
        n = len(hist.rows) - 1
        if n in iterations:
            np.save(out / f"it{n}.npy", omega)
            saved[str(n)] = {"gradients": c.gradients, "energy": hist.rows[-1][0], "dissipation": hist.rows[-1][1],
                             "live": int(np.sum(np.any(omega != 0.0, axis=1)))}
            print(f"iteration {n}: {saved[str(n)]}", flush=True)

    _lbfgs_live_heads(c, v, 0.0, max(iterations), hist, keep, lambda m: None, np.zeros(s.omega.shape[0], bool))
    return {"flow": str(flow), "saved": saved}


def _trust_krylov(c, v: np.ndarray, radius: float, rows: list, say) -> None:
    """scipy's trust-krylov on the live heads with the exact products, restarted (radius kept) when a head dies."""
    import scipy.optimize

    from pdeflow.analysis.hessian.spectrum import hessian_operator
    from pdeflow.analysis.stationary.stationary import heads_at_origin

    problem, (n_heads, k) = c.problem, c.shape
    while not c.exhausted:
        live = ~heads_at_origin(c.omega(v))
        cols = np.repeat(live, k)
        root, mass = c.root[live], c.mass[live]
        ops: list = []
        died = [False]

        def whole(x: np.ndarray) -> np.ndarray:
            out = np.zeros(n_heads * k)
            out[cols] = x
            return out

        def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
            E, g = c.energy_and_gradient(whole(x))
            return E, g[cols]

        def hessp(x: np.ndarray, p: np.ndarray) -> np.ndarray:
            if not ops or not np.array_equal(ops[-1][0], x):
                ops.append((x.copy(), hessian_operator(problem, x.reshape(-1, k) / root, mass)))
            return ops[-1][1].matvec(p)

        def callback(x: np.ndarray) -> None:
            E, g = fun(x)
            rows.append(_row(c, E, float(g @ g), int(live.sum())))
            say(rows[-1])
            if c.exhausted:
                raise StopIteration
            if np.any(heads_at_origin(c.omega(whole(x)))[live]):
                died[0] = True
                raise StopIteration

        res = scipy.optimize.minimize(fun, v[cols], jac=True, hessp=hessp, method="trust-krylov", callback=callback,
                                      options={"gtol": 0.0, "maxiter": 10**6, "initial_trust_radius": radius})
        v = whole(res.x)
        if not died[0]:
            break


def _row(c, E: float, I: float, live: int) -> dict[str, Any]:
    return {"energy": E, "dissipation": I, "gradients": c.gradients, "products": c.products, "cost": c.cost,
            "wall": c.wall, "live": live}


def probe(flow: Path, point: Path, search: str, budget: float, identity: bool, radius: float) -> dict[str, Any]:
    """One search from ``point`` on a budget (module docstring)."""
    from pdeflow.analysis.search.trust_region import trust_region_search
    from pdeflow.analysis.stationary.stationary import Counter, _History, _lbfgs_live_heads

    s = _start(flow)
    omega = np.load(point)
    c = Counter(s.problem, s.mass, omega.shape, max_cost=budget)
    v = c.coordinates(omega)
    hist = _History(c)
    E, g = c.energy_and_gradient(v)
    hist.add(E, float(g @ g))
    rows: list[dict[str, Any]] = [_row(c, E, float(g @ g), int(np.sum(np.any(omega != 0.0, axis=1))))]

    def say(msg: Any) -> None:
        print(msg, flush=True)

    if search == "lbfgs":
        def keep(omega: np.ndarray) -> None:
            if (len(hist.rows) - 1) % 100 == 0:
                rows.append(_row(c, hist.rows[-1][0], hist.rows[-1][1], int(np.sum(np.any(omega != 0.0, axis=1)))))
                say(rows[-1])

        _lbfgs_live_heads(c, v, 0.0, 10**6, hist, keep, lambda m: None, np.zeros(omega.shape[0], bool))
    elif search == "trust-region":
        n = len(hist.rows)

        def progress(msg: str) -> None:
            say(msg)
            if len(hist.rows) > n:
                rows.append(_row(c, hist.rows[-1][0], hist.rows[-1][1], int(msg.split(" live heads")[0].split()[-1])))

        trust_region_search(c, v, 0.0, hist, progress, precondition=not identity)
    else:
        _trust_krylov(c, v, radius, rows, say)
    last = rows[-1]
    return {"flow": str(flow), "point": str(point), "search": search, "budget": budget, "identity": identity,
            "radius": radius, "start_energy": rows[0]["energy"], "energy": last["energy"], "cost": last["cost"],
            "decrease": rows[0]["energy"] - last["energy"], "rows": rows}


def heads(points: list[Path]) -> dict[str, Any]:
    """The mergeable heads of each point (module docstring)."""
    from pdeflow.analysis.stationary.stationary import is_stationary_file, read_stationary
    from pdeflow.core.model import split_theta

    out = {}
    for path in points:
        omega = read_stationary(path)["omega"] if is_stationary_file(path) else np.load(path)
        norms = np.linalg.norm(omega, axis=1)
        live = norms > 1e-6 * norms.max()
        w = omega[live]
        q, k, v, o = split_theta(w, *_dims(w.shape[1]))
        invariants = np.concatenate([np.einsum("nad,nae->nde", q, k).reshape(len(w), -1),
                                     np.einsum("nda,nae->nde", o, v).reshape(len(w), -1)], axis=1)

        def nearest(x: np.ndarray) -> np.ndarray:
            dist = np.linalg.norm(x[:, None] - x[None], axis=2)
            np.fill_diagonal(dist, np.inf)
            return dist.min(axis=1) / np.linalg.norm(x, axis=1)

        rel, rel_inv = nearest(w), nearest(invariants)
        out[str(path)] = {"live": int(live.sum()), "nearest_coordinates": [float(rel.min()), float(np.median(rel))],
                          "nearest_invariants": [float(rel_inv.min()), float(np.median(rel_inv))],
                          "pairs_within_0.1": [int(np.sum(rel < 0.1)), int(np.sum(rel_inv < 0.1))],
                          "relative_norms": sorted(float(x) for x in norms[live] / norms.max())}
        print(path, {key: val for key, val in out[str(path)].items() if key != "relative_norms"}, flush=True)
    return out


def _dims(k: int) -> tuple[int, int]:
    """(d, dh) of full coordinates with k = 4 d dh (longtime.toml: d = 16, dh = 4)."""
    from pdeflow.core.config import loads_config

    cfg = loads_config((Path(__file__).resolve().parents[2] / "data" / "configs" / "longtime.toml").read_text())
    d, dh = cfg.model.d, cfg.model.head_dim
    if 4 * d * dh != k:
        raise ValueError(f"k = {k} is not longtime.toml's full coordinates (4 x {d} x {dh})")
    return d, dh


def precision(flow: Path, points: list[Path]) -> dict[str, Any]:
    """CPU seconds of one gradient in float64 and float32 at each point's live heads (module docstring)."""
    from pdeflow.analysis.search.structured_minimum import single_precision

    s = _start(flow)
    double, single = s.problem, single_precision(s.problem)
    out = {}
    for path in [flow, *points]:
        omega = s.omega if path == flow else np.load(path)
        norms = np.linalg.norm(omega, axis=1)
        live = norms > 1e-6 * norms.max()
        row = {"live": int(live.sum())}
        for name, problem in (("float64", double), ("float32", single)):
            problem.evaluate(omega[live], s.mass[live])
            cpu = []
            for _ in range(40):
                t0 = time.process_time()
                problem.evaluate(omega[live], s.mass[live])
                cpu.append(time.process_time() - t0)
            row[name] = float(np.median(cpu))
        out[str(path)] = row
        print(path, row, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.minimum.search_probes", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    q = sub.add_parser("checkpoint")
    q.add_argument("flow", type=Path)
    q.add_argument("--iterations", type=int, nargs="+", required=True)
    q.add_argument("--out", type=Path, default=Path("benchmarks/results/search_probes"))
    q = sub.add_parser("from")
    q.add_argument("flow", type=Path)
    q.add_argument("point", type=Path)
    q.add_argument("--search", choices=("lbfgs", "trust-region", "trust-krylov"), required=True)
    q.add_argument("--budget", type=float, required=True)
    q.add_argument("--identity", action="store_true")
    q.add_argument("--radius", type=float, default=1.0)
    q = sub.add_parser("heads")
    q.add_argument("points", type=Path, nargs="+")
    q = sub.add_parser("precision")
    q.add_argument("flow", type=Path)
    q.add_argument("points", type=Path, nargs="+")
    args = p.parse_args(argv)
    from pdeflow.benchmarks.common import machine

    res: dict[str, Any] = {"command": " ".join(sys.argv), "machine": machine(), "load_before": list(os.getloadavg())}
    if args.what == "checkpoint":
        args.out.mkdir(parents=True, exist_ok=True)
        res |= checkpoint(args.flow, args.iterations, args.out)
        target = args.out / "checkpoints.json"
    elif args.what == "from":
        res |= probe(args.flow, args.point, args.search, args.budget, args.identity, args.radius)
        tag = f"{args.search}{'-identity' if args.identity else ''}-{args.budget:g}"
        target = args.point.with_name(f"{args.point.stem}-{tag}.json")
    elif args.what == "heads":
        res |= {"points": heads(args.points)}
        target = args.points[0].with_name("heads.json")
    else:
        res |= {"points": precision(args.flow, args.points)}
        target = args.points[0].with_name("precision.json")
    res["load_after"] = list(os.getloadavg())
    target.write_text(json.dumps(res, indent=2) + "\n")
    print(f"-> {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
