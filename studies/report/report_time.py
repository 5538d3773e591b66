"""The wall time of README command 1, ``pdeflow report data/configs/quickstart.toml -o DIR`` (issue 51: at most 3
minutes on 2 cores, the run included), with numba's one-time compilation measured apart.

``python -m studies.report.report_time [--config FILE] [--skip A,B] [--no-cold] [--out DIR]`` runs the command in a
subprocess, as a new user meets it, into a fresh folder each time:

1. ``cold``: with ``NUMBA_CACHE_DIR`` set to a new empty folder, so every kernel the report needs is compiled (once:
   numba caches it on disk);
2. ``warm``: the same command again with that folder, now holding the compiled kernels: the cost of the command
   itself, every later time (``--no-cold`` runs this one only, with numba's cache where it is).

Records for each the wall time, the CPU time of the command's processes (``RUSAGE_CHILDREN``), each stage's wall time
from the report's ``stages.json``, every section's verdict and the summary the command printed; the compilation's cost
is ``cold - warm``. With the CPU model, the core count and the load average before and after. Writes
``report_time.json`` and ``report_time.md`` into DIR (default benchmarks/results); the record is
studies/report/REPORT_TIME.md.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pdeflow.benchmarks.common import RESULTS, machine

QUICKSTART = Path(__file__).resolve().parents[2] / "data" / "configs" / "quickstart.toml"
TARGET_S = 180.0


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(config: Path, skip: str, cache: Path | None) -> dict[str, Any]:
    """One timed report of ``config`` into a fresh folder (numba's cache in ``cache`` when given); the stages'
    costs, the verdicts and the summary it printed."""
    folder = Path(tempfile.mkdtemp(prefix="pdeflow-report-"))
    argv = [sys.executable, "-m", "pdeflow", "report", str(config), "-o", str(folder / "R"), "--quiet"]
    if skip:
        argv += ["--skip", skip]
    env = dict(os.environ, **({"NUMBA_CACHE_DIR": str(cache)} if cache is not None else {}))
    load_before, cpu_before = os.getloadavg(), children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    res: dict[str, Any] = {"command": " ".join(["pdeflow", *argv[3:]]), "wall_s": wall,
                           "cpu_s": children_cpu() - cpu_before, "exit": proc.returncode,
                           "numba_cache": "a new folder" if cache is not None else "numba's default",
                           "load_before": load_before, "load_after": os.getloadavg(),
                           "stdout": proc.stdout.strip().splitlines()[-12:]}
    report = folder / "R" / "report.json"
    if report.exists():
        data = json.loads(report.read_text(encoding="utf-8"))
        res["stages"] = {s["stage"]: round(s["wall_s"], 1) for s in data["provenance"]["stages"]}
        res["verdicts"] = {s["key"]: s["verdict"] for s in data["sections"]}
    return res


def render(res: dict[str, Any]) -> str:
    cpu = res["machine"].get("cpu", {}).get("model", "?")
    warm = res["warm"]
    lines = [f"## {res['date']}: {warm['wall_s']:.0f} s wall, {warm['cpu_s']:.0f} s CPU (target <= "
             f"{res['target_s']:.0f} s wall)", "",
             f"Measured by `python -m studies.report.report_time` on {cpu}, {res['machine'].get('cpu_count')} cores "
             f"(numba threads {res['machine'].get('numba_threads')}).", "",
             f"Command: `{warm['command']}`.", "",
             "| run | numba's cache | wall (s) | CPU (s) | load before, after | exit |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name in ("cold", "warm"):
        r = res.get(name)
        if r:
            lines.append(f"| {name} | {r['numba_cache']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                         f"{r['load_before'][0]:.1f}, {r['load_after'][0]:.1f} | {r['exit']} |")
    if res.get("cold"):
        lines += ["", f"numba's one-time compilation (cold - warm): {res['compile_wall_s']:.0f} s wall, "
                      f"{res['compile_cpu_s']:.0f} s CPU."]
    lines += ["", "| stage | wall (s), warm |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in warm.get("stages", {}).items()]
    lines += ["", "| section | verdict |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in warm.get("verdicts", {}).items()]
    lines += ["", "The summary it printed (warm):", ""] + [f"    {line}" for line in warm["stdout"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.report.report_time", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(QUICKSTART), help="the config reported (default: the main job)")
    p.add_argument("--skip", default="", help="stages to skip, as pdeflow report --skip")
    p.add_argument("--no-cold", action="store_true", help="no cold run: numba's cache where it is, one timed run")
    p.add_argument("--out", default=str(RESULTS), help="folder of report_time.json and .md")
    args = p.parse_args(argv)
    res: dict[str, Any] = {"target_s": TARGET_S, "machine": machine(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if args.no_cold:
        res["warm"] = measure(Path(args.config), args.skip, None)
    else:
        cache = Path(tempfile.mkdtemp(prefix="pdeflow-numba-cache-"))
        res["cold"] = measure(Path(args.config), args.skip, cache)
        res["warm"] = measure(Path(args.config), args.skip, cache)
        res["compile_wall_s"] = res["cold"]["wall_s"] - res["warm"]["wall_s"]
        res["compile_cpu_s"] = res["cold"]["cpu_s"] - res["warm"]["cpu_s"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report_time.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    text = render(res)
    (out / "report_time.md").write_text(text)
    print(text)
    return 0 if res["warm"]["exit"] == 0 and res["warm"]["wall_s"] <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
