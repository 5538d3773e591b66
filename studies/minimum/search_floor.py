"""Where the structured route's time goes on longtime.toml, and what its search and certificate cannot shed.

``python -m studies.minimum.search_floor costs POINT [--out DIR]`` (POINT: a certified ``pdeflow stationary``
result): at POINT, the median wall time of

- one gradient (``Problem.evaluate``) on the live heads;
- one two-loop recursion (:func:`pdeflow.analysis.search.lbfgs.two_loop`) over
  :data:`pdeflow.analysis.stationary.stationary.LBFGS_MEMORY` pairs of the live heads' size;
- one L-BFGS iteration of the route's search (:func:`pdeflow.analysis.stationary.stationary._lbfgs_live_heads`, 400
  iterations from POINT moved by 1e-3 at random on its live heads, after 50 to warm up);

and one pass of each part of the Cholesky certificate there, timed apart: the Gauss-Newton factor W (``2 k``
forward passes are ``k`` of these), the whole structured assembly of C (W, its symmetric rank-R product, the frozen
blocks), and :func:`pdeflow.analysis.certificate.certificate.cholesky_bound` with its own walls (the factorisation of
C, the
shift-invert run, the shifted factorisation with its rounding bound).

``python -m studies.minimum.search_floor variant FLOW [--freeze F] [--handover N] [--out DIR]``: the structured
route (:func:`pdeflow.analysis.search.structured_minimum.structured_minimum`) from FLOW's last frame with the dead-head
threshold :data:`pdeflow.analysis.stationary.stationary.FREEZE` set to F, or with the search handing over to
Newton-PCG after
N L-BFGS iterations instead of at ``I <= SWITCH I(0)``: its transcript, E*, the verdict, counts and wall.

Both write JSON into DIR (default benchmarks/results) with the CPU model and the load average before and after.
Run each in a process of its own with the thread count fixed by NUMBA_NUM_THREADS.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np


def costs(point: Path) -> dict[str, Any]:
    """The per-operation walls of the module docstring at the point of ``point``."""
    from pdeflow.benchmarks.common import median, timed

    from pdeflow.analysis.certificate.certificate import (
        cholesky_bound,
        complement_basis,
        head_symmetries,
        symmetric_part,
    )
    from pdeflow.analysis.search.lbfgs import two_loop
    from pdeflow.analysis.stationary.stationary import LBFGS_MEMORY, Counter, _History, _lbfgs_live_heads
    from pdeflow.core.hessian_assembly import assemble_hessian, gauss_newton_factor
    from pdeflow.interface.cli_stationary import start_of

    start = start_of(point, -1)
    problem, omega, mass = start.problem, start.omega, start.mass
    live = np.any(omega != 0.0, axis=1)
    heads = np.flatnonzero(live)
    n = int(live.sum()) * problem.k
    res: dict[str, Any] = {"point": str(point), "live_heads": int(live.sum()), "unknowns": n}
    res["gradient"] = median([timed(lambda: problem.evaluate(omega[live], mass[live])) for _ in range(30)])
    rng = np.random.default_rng(0)
    pairs: deque = deque(maxlen=LBFGS_MEMORY)
    for _ in range(LBFGS_MEMORY):
        s, y = rng.standard_normal(n), rng.standard_normal(n)
        y += s
        pairs.append((s, y, 1.0 / float(s @ y)))
    g = rng.standard_normal(n)
    res["two_loop"] = median([timed(lambda: two_loop(g, pairs)) for _ in range(30)])

    moved = omega.copy()
    moved[live] += 1e-3 * rng.standard_normal(moved[live].shape)
    c = Counter(problem, mass, moved.shape)
    v = c.coordinates(moved)
    hist = _History(c)
    E, grad = c.energy_and_gradient(v)
    hist.add(E, float(grad @ grad))
    awake = np.zeros(moved.shape[0], dtype=bool)
    found, v = _lbfgs_live_heads(c, v, 0.0, 50, hist, None, lambda msg: None, awake)
    before = c.gradients
    t0 = time.perf_counter()
    found, v = _lbfgs_live_heads(c, v, 0.0, 400, hist, None, lambda msg: None, awake)
    res["lbfgs_iteration"] = (time.perf_counter() - t0) / max(found.nit, 1)
    res["lbfgs_gradients_per_iteration"] = (c.gradients - before) / max(found.nit, 1)

    t0 = time.perf_counter()
    gauss_newton_factor(problem, omega, mass, heads)
    res["gauss_newton_factor"] = time.perf_counter() - t0
    sym = head_symmetries(problem, omega[live])
    bases = [complement_basis(sym.blocks[i], int(sym.counts[i])) for i in range(heads.size)]
    t0 = time.perf_counter()
    C = assemble_hessian(problem, omega, mass, heads=heads, bases=bases)
    res["assembly"] = time.perf_counter() - t0
    res["certified_unknowns"] = int(C.shape[0])
    symmetric_part(C)
    t0 = time.perf_counter()
    bound = cholesky_bound(C)
    res["cholesky_bound"] = time.perf_counter() - t0
    res["cholesky_walls"] = dict(bound.walls) if bound is not None else {}
    res["lambda_min_bracket"] = [bound.lower, bound.upper] if bound is not None else None
    return res


def variant(flow: Path, freeze: float | None, handover: int) -> dict[str, Any]:
    """The structured route from ``flow``'s last frame with FREEZE = ``freeze`` (None: the package's) and, with
    ``handover > 0``, Newton-PCG after that many L-BFGS iterations."""
    import pdeflow.analysis.stationary.stationary as stationary

    package_freeze = stationary.FREEZE
    if freeze is not None:
        stationary.FREEZE = freeze
    try:
        return _variant(flow, stationary.FREEZE, handover)
    finally:
        stationary.FREEZE = package_freeze


def _variant(flow: Path, freeze: float, handover: int) -> dict[str, Any]:
    from pdeflow.analysis.search.structured_minimum import structured_minimum
    from pdeflow.core.problem import gradient_equivalents
    from pdeflow.interface.cli_stationary import start_of

    start = start_of(flow, -1)
    transcript: list[str] = []
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        line = f"{time.perf_counter() - t0:8.1f} s  {msg}"
        transcript.append(line)
        print(line, file=sys.stderr, flush=True)

    point = structured_minimum(start.problem, start.omega, start.mass, start.initial, max_iter=handover,
                               progress=say)
    wall = time.perf_counter() - t0
    return {"flow": str(flow), "freeze": freeze, "handover": handover, "wall": wall,
            "energy": float(point.energy), "verdict": point.verdict, "certificate": point.certificate.describe(),
            "lambda_min": float(point.lambda_min), "certify_wall": float(point.certify_wall),
            "message": point.message,
            "iterations": int(point.iterations), "gradients": int(point.gradients), "products": int(point.products),
            "equivalents": gradient_equivalents({"gradient": point.gradients,
                                                 "jvp_exact": point.products + point.certify_products}),
            "live_heads": int(np.sum(np.any(point.omega != 0.0, axis=1))), "transcript": transcript}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.minimum.search_floor", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    q = sub.add_parser("costs", help="per-operation walls at a certified point")
    q.add_argument("point", type=Path)
    q.add_argument("--out", default="benchmarks/results")
    q = sub.add_parser("variant", help="the structured route with another dead-head threshold or hand-over")
    q.add_argument("flow", type=Path)
    q.add_argument("--freeze", type=float, default=None)
    q.add_argument("--handover", type=int, default=0, help="L-BFGS iterations before Newton-PCG (0: at SWITCH)")
    q.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    from pdeflow.benchmarks.common import machine

    res: dict[str, Any] = {"machine": machine(), "load_before": list(os.getloadavg())}
    if args.what == "costs":
        res |= costs(args.point.resolve())
        name = "search_floor_costs.json"
    else:
        res |= variant(args.flow.resolve(), args.freeze, args.handover)
        name = f"search_floor_variant_freeze{res['freeze']:g}_handover{args.handover}.json"
    res["load_after"] = list(os.getloadavg())
    (out / name).write_text(json.dumps(res, indent=2, default=float) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k not in ("machine", "transcript")}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
