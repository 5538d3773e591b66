"""The structured route's searches from several starts of data/configs/longtime.toml (issue 54), through the commands.

``python -m studies.minimum.new_searches run --start T [--searches lbfgs float32 trust-region] [--threads 2]
[--out DIR]``: in DIR/start-T,

1. **flow**: ``pdeflow run data/configs/longtime.toml --set run.t_end=T --set run.wall_time_limit=1e9`` (the start
   frame fixed by the problem: T = 1 is FAST_MINIMUM.md's, T = 0.94906 where the recorded 10-s flow stopped,
   T = 2 one more);
2. **each search**: ``pdeflow stationary FLOW --kind minimum --search S`` (the structured route; a child process
   each, NUMBA_NUM_THREADS fixed), read back from its result file (:func:`studies.minimum.fast_minimum.result_summary`:
   gradients, products, gradient equivalents, E*, the verdict and the certificate) with the child's wall and CPU
   seconds (user + system, RUSAGE_CHILDREN: less sensitive to the machine's load than wall), its peak memory and the
   load average before and after. ``trust-region`` runs with ``--max-cost`` = the ``lbfgs`` search's own gradient
   equivalents from the same start (run first): stopped there, it is not faster at equal certification, whatever it
   would reach later. Each search's point is compared with the ``lbfgs`` search's: the same minimum when E* agrees to
   1e-10 and the sorted head norms (invariant under the heads' symmetries) to 1e-6 of the largest.

Writes DIR/start-T/new_searches.json (kept between calls: a search already in it is not run again).

``python -m studies.minimum.new_searches record DIR... --out studies/minimum/NEW_SEARCHES.json``: the starts' JSONs
in one record. ``python -m studies.minimum.new_searches table [--record R] [--write docs/experiments.md]``: the
which-route table rendered from the record (between ``<!-- which-route:start -->`` and ``<!-- which-route:end -->``
of the page with ``--write``, else printed).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from studies.minimum.fast_minimum import LONGTIME, ROOT, flow_summary, result_summary

SEARCHES = ("lbfgs", "float32", "trust-region")
RECORD = ROOT / "studies" / "minimum" / "NEW_SEARCHES.json"
PAGE = ROOT / "docs" / "experiments.md"
MARKERS = ("<!-- which-route:start -->", "<!-- which-route:end -->")
SAME_ENERGY = 1e-10     # the same minimum: E* to this, and ...
SAME_NORMS = 1e-6       # ... the sorted head norms to this share of the largest


def _child(argv: list[str], threads: int, transcript: Path) -> dict[str, float]:
    """``python -m pdeflow ARGV`` with NUMBA_NUM_THREADS = ``threads``, its output into ``transcript``: the threads,
    wall and CPU seconds, the largest child's peak memory (MB) and the load average before and after."""
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    import subprocess

    with transcript.open("w") as sink:
        proc = subprocess.run([sys.executable, "-m", "pdeflow", *argv], env=env, cwd=ROOT, stdout=sink,
                              stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"pdeflow {' '.join(argv)} failed ({proc.returncode}): "
                           f"{transcript.read_text().splitlines()[-1:]}")
    return {"threads": threads, "process_wall": wall,
            "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "peak_mb": after.ru_maxrss / 1024, "load_before": load_before, "load_after": list(os.getloadavg())}


def head_norms(path: Path) -> list[float]:
    """The sorted norms of a result file's heads (invariant under each head's symmetries)."""
    import numpy as np

    from pdeflow.analysis.stationary.stationary import read_stationary

    return sorted(float(x) for x in np.linalg.norm(read_stationary(path)["omega"], axis=1))


def phases(path: Path) -> dict[str, float]:
    """Where a result's search went, from its history (one row per iteration: cumulative gradients, products and
    wall): the rows before the first product (L-BFGS; with ``--search float32`` the rows up to the float32 phase's
    gradients, named in the message, are its float32 part) and after it (Newton-PCG, or every trust-region
    iteration), each with its wall seconds, gradients and products; the certification's products and wall."""
    import re

    import numpy as np

    from pdeflow.analysis.stationary.stationary import read_stationary

    r = read_stationary(path)
    h = r["history"]
    grads, prods, wall = (np.asarray(h[key], dtype=float) for key in ("gradients", "products", "wall"))
    first = int(np.argmax(prods > 0)) if np.any(prods > 0) else len(prods)
    before = first - 1 if first > 0 else 0  # the last row with no product yet
    out = {"first_order_gradients": float(grads[before]), "first_order_wall": float(wall[before]),
           "second_order_gradients": float(grads[-1] - grads[before]),
           "second_order_products": float(prods[-1] - prods[before]),
           "second_order_wall": float(wall[-1] - wall[before]),
           "certify_products": float(r["certify_products"]), "certify_wall": float(r["certify_wall"])}
    single = re.match(r"float32 L-BFGS \((\d+) gradients\)", str(r["message"]))
    if single:
        n = int(single.group(1)) + 1  # the start's evaluation (float64) before them
        row = int(np.searchsorted(grads, n, side="right")) - 1
        out |= {"float32_gradients": float(single.group(1)), "float32_wall": float(wall[max(row, 0)])}
    return out


def same_minimum(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs' points are one minimum (module docstring): both certified, E* and the head norms agree."""
    import numpy as np

    if not (a["certified"] and b["certified"]) or abs(a["energy"] - b["energy"]) > SAME_ENERGY:
        return False
    x, y = np.array(a["head_norms"]), np.array(b["head_norms"])
    return bool(np.max(np.abs(x - y)) <= SAME_NORMS * max(float(x.max()), float(y.max())))


def run_start(t_start: float, searches: list[str], threads: int, out: Path, config: Path = LONGTIME) -> dict[str, Any]:
    """Steps 1 and 2 of the module docstring from the flow of ``config`` to ``t_start``, kept in ``out``/start-T."""
    from pdeflow.benchmarks.common import machine

    where = out / f"start-{t_start:g}"
    where.mkdir(parents=True, exist_ok=True)
    target = where / "new_searches.json"
    res: dict[str, Any] = json.loads(target.read_text()) if target.exists() else {
        "config": config.name, "t_start": t_start, "threads": threads, "machine": machine(), "runs": {}}
    flow = where / "flow.h5"
    if "flow" not in res:
        cost = _child(["run", str(config), "-o", str(flow), "--force", "--quiet", "--set", f"run.t_end={t_start!r}",
                       "--set", "run.wall_time_limit=1e9"], threads, where / "flow.log")
        res["flow"] = flow_summary(flow) | cost
        target.write_text(json.dumps(res, indent=2) + "\n")
    for search in searches:
        if search in res["runs"]:
            continue
        point = where / f"minimum-{search}.h5"
        argv = ["stationary", str(flow), "--kind", "minimum", "--search", search, "-o", str(point), "--force"]
        if search == "trust-region" and "lbfgs" in res["runs"]:
            argv += ["--max-cost", repr(res["runs"]["lbfgs"]["search_equivalents"])]
        print(f"start t = {t_start:g}: pdeflow {' '.join(argv)}", file=sys.stderr, flush=True)
        cost = _child(argv, threads, where / f"minimum-{search}.log")
        run = result_summary(point) | cost | {"head_norms": head_norms(point), "phases": phases(point),
                                              "command": "pdeflow " + " ".join(argv)}
        if "lbfgs" in res["runs"] and search != "lbfgs":
            base = res["runs"]["lbfgs"]
            run["same_minimum_as_lbfgs"] = same_minimum(run, base)
            run["energy_minus_lbfgs"] = run["energy"] - base["energy"]
        res["runs"][search] = run
        target.write_text(json.dumps(res, indent=2) + "\n")
    return res


def record(dirs: list[Path], out: Path) -> dict[str, Any]:
    """The starts' JSONs (each ``DIR/start-T/new_searches.json``, or a DIR holding several) in one record; what else
    an existing record at ``out`` holds (the probes, its date and status) is kept."""
    starts = []
    for d in dirs:
        for f in [d] if d.is_file() else sorted(d.glob("**/new_searches.json")):
            start = json.loads(f.read_text())
            for search, run in start["runs"].items():
                if not run.get("phases"):  # a run made before the split was recorded: from its result file
                    run["phases"] = phases(f.parent / f"minimum-{search}.h5")
            starts.append(start)
    starts.sort(key=lambda s: s["t_start"])
    kept = json.loads(out.read_text()) if out.exists() else {}
    rec = kept | {"command": "python -m studies.minimum.new_searches run --start T (each start), then record",
                  "starts": starts}
    out.write_text(json.dumps(rec, indent=2) + "\n")
    return rec


def table(rec: dict[str, Any]) -> str:
    """The which-route table (markdown) of a record: per search and start, the search's gradients and products,
    its gradient equivalents, E*, the verdict, whether it is the lbfgs search's minimum, CPU and wall seconds."""
    lines = ["| search | start t | gradients | products | search gradient equivalents | E* | verdict | "
             "same minimum as lbfgs | CPU s | wall s (threads, load) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for search in SEARCHES:
        for start in rec["starts"]:
            run = start["runs"].get(search)
            if run is None:
                continue
            same = "-" if search == "lbfgs" else ("yes" if run.get("same_minimum_as_lbfgs") else
                                                  f"no (E* {run.get('energy_minus_lbfgs', float('nan')):+.3g})")
            verdict = run["verdict"] if run["certified"] or run["verdict"] != "not converged" else (
                f"not converged (I = {run['ratio']:.2g} I(0))")
            load = sum(run["load_before"][:1] + run["load_after"][:1]) / 2
            lines.append(f"| {search} | {start['t_start']:g} | {run['gradients']:,} | {run['products']:,} | "
                         f"{run['search_equivalents']:,.0f} | {run['energy']:.10f} | {verdict} | {same} | "
                         f"{run['cpu']:.0f} | {run['process_wall']:.0f} "
                         f"({run.get('threads', start['threads'])}, {load:.0f}) |")
    return "\n".join(lines)


def write_table(rec: dict[str, Any], page: Path) -> None:
    """Replace the table between the page's markers (:data:`MARKERS`) by :func:`table` of ``rec``."""
    text = page.read_text()
    head, rest = text.split(MARKERS[0], 1)
    _, tail = rest.split(MARKERS[1], 1)
    page.write_text(f"{head}{MARKERS[0]}\n{table(rec)}\n{MARKERS[1]}{tail}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.minimum.new_searches", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    q = sub.add_parser("run", help="the flow to one start and each search from it")
    q.add_argument("--start", type=float, required=True, help="the flow's end time T")
    q.add_argument("--searches", nargs="+", choices=SEARCHES, default=list(SEARCHES))
    q.add_argument("--threads", type=int, default=2)
    q.add_argument("--out", type=Path, default=Path("benchmarks/results/new_searches"))
    q.add_argument("--config", type=Path, default=LONGTIME, help="the problem (default data/configs/longtime.toml)")
    q = sub.add_parser("record", help="the starts' JSONs in one record")
    q.add_argument("dirs", type=Path, nargs="+")
    q.add_argument("--out", type=Path, default=RECORD)
    q = sub.add_parser("table", help="the which-route table of a record")
    q.add_argument("--record", type=Path, default=RECORD)
    q.add_argument("--write", type=Path, default=None, help=f"the page to write it into (e.g. {PAGE.name})")
    args = p.parse_args(argv)
    if args.what == "run":
        res = run_start(args.start, args.searches, args.threads, args.out.resolve(), args.config.resolve())
        for search, run in res["runs"].items():
            print(f"t = {args.start:g} {search}: {run['verdict']}, E* = {run['energy']!r}, {run['gradients']} "
                  f"gradients, {run['products']} products, CPU {run['cpu']:.0f} s, wall {run['process_wall']:.0f} s")
    elif args.what == "record":
        record(args.dirs, args.out)
    else:
        rec = json.loads(args.record.read_text())
        if args.write is None:
            print(table(rec))
        else:
            write_table(rec, args.write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
