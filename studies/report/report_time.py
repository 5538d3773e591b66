"""The wall time of ``pdeflow report`` on the quickstart with its defaults (the target: at most 10 minutes on 2 cores).

``python -m studies.report.report_time [--config FILE] [--skip A,B] [--out DIR]``: runs
``pdeflow report CONFIG -o <fresh folder>`` once in a subprocess (so the first run's numba compilation is counted, as
a new user meets it, unless the cache is warm), and records the total wall time, each stage's wall time from the
report's ``stages.json``, every section's verdict, the CPU model and the load average before and after. Writes
``report_time.json`` and ``report_time.md`` into DIR (default benchmarks/results).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pdeflow.benchmarks.common import RESULTS, machine

QUICKSTART = Path(__file__).resolve().parents[2] / "data" / "configs" / "quickstart.toml"
TARGET_S = 600.0


def measure(config: Path, skip: str) -> dict[str, Any]:
    """One timed report of ``config`` into a fresh folder; the stages' costs and the verdicts it wrote."""
    folder = Path(tempfile.mkdtemp(prefix="pdeflow-report-"))
    argv = [sys.executable, "-m", "pdeflow", "report", str(config), "-o", str(folder / "R"), "--quiet"]
    if skip:
        argv += ["--skip", skip]
    load_before = os.getloadavg()
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - start
    res: dict[str, Any] = {"command": " ".join(["pdeflow", *argv[3:]]), "wall_s": wall, "exit": proc.returncode,
                           "target_s": TARGET_S, "load_before": load_before, "load_after": os.getloadavg(),
                           "machine": machine(), "stdout": proc.stdout.strip().splitlines()[-12:]}
    report = folder / "R" / "report.json"
    if report.exists():
        data = json.loads(report.read_text(encoding="utf-8"))
        res["stages"] = {s["stage"]: round(s["wall_s"], 1) for s in data["provenance"]["stages"]}
        res["verdicts"] = {s["key"]: s["verdict"] for s in data["sections"]}
    return res


def render(res: dict[str, Any]) -> str:
    cpu = res["machine"].get("cpu", {}).get("model", "?")
    lines = [f"# pdeflow report on the quickstart: {res['wall_s']:.0f} s (target <= {res['target_s']:.0f} s)", "",
             f"Measured by `python -m studies.report.report_time` on {cpu}, {res['machine'].get('cpu_count')} "
             f"cores, load average {res['load_before'][0]:.1f} before and {res['load_after'][0]:.1f} after.", "",
             f"Command: `{res['command']}` (exit {res['exit']}).", "", "| stage | wall (s) |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in res.get("stages", {}).items()]
    lines += ["", "| section | verdict |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in res.get("verdicts", {}).items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.report.report_time", description=__doc__)
    p.add_argument("--config", default=str(QUICKSTART), help="the config reported (default: the quickstart)")
    p.add_argument("--skip", default="", help="stages to skip, as pdeflow report --skip")
    p.add_argument("--out", default=str(RESULTS), help="folder of report_time.json and .md")
    args = p.parse_args(argv)
    res = measure(Path(args.config), args.skip)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report_time.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    text = render(res)
    (out / "report_time.md").write_text(text)
    print(text)
    return 0 if res["exit"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
