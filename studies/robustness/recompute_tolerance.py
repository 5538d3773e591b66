"""``python -m studies.robustness.recompute_tolerance [--configs A B ...] [--t-end T] [--out DIR]``: how closely
``pdeflow validate`` reproduces a file's stored energies, dissipations and risks, per shipped config and kernel
variant: the measurement behind :data:`pdeflow.interface.recompute.RECOMPUTE_ULPS`.

Each config of data/configs/ runs to ``--t-end`` (frames every quarter of it, no analysis) with the kernels' default
variant; then each frame's energy, dissipation and risk are recomputed from its stored fields by the run's stepper
(:meth:`pdeflow.solvers.base.Stepper.diagnostics` on the stored problem, as validate does) in a new process per
kernel variant (:data:`VARIANTS`, forced through ``PDEFLOW_VARIANT``: other chunks of heads and sequences group the
sums differently; tile and vector width do not change a result, pdeflow.core.tuner) and per thread count. The
record: the largest relative difference, in units of the kernels' eps, per config, quantity and variant.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "data" / "configs"
# (PDEFLOW_VARIANT, NUMBA_NUM_THREADS): the default plan, then the finest and the coarsest chunks
VARIANTS = (("", "1"), ("", "2"), ("tile=16,heads=16,chunk=1K", "1"), ("tile=64,heads=1024,chunk=64M", "2"))
QUANTITIES = ("energy", "dissipation", "risk")


def differences(path: Path) -> dict[str, float]:
    """In the child: the largest relative difference of each quantity over the file's frames, in eps."""
    from pdeflow.solvers import make_stepper

    from pdeflow.core.state import State
    from pdeflow.io.trajectory import open_trajectory

    traj = open_trajectory(path)
    problem = traj.problem()
    stepper = make_stepper(problem, traj.config)
    eps = float(np.finfo(np.float32 if problem.precision == "float32" else np.float64).eps)
    rows = traj.frames["step"]
    stored = {"energy": traj.frames["energy"], "dissipation": traj.frames["dissipation"],
              "risk": traj.steps["risk"][rows]}
    worst = dict.fromkeys(QUANTITIES, 0.0)
    for i in range(len(traj.time)):
        fields = {k: traj.frames[k][i] for k in ("omega", "mass", "density") if k in traj.frames}
        diag = stepper.diagnostics(State(t=float(traj.time[i]), step=0, dt=0.0, fields=fields))
        for q in QUANTITIES:
            s, x = float(stored[q][i]), float(diag[q])
            worst[q] = max(worst[q], abs(s - x) / max(abs(x), 1e-300) / eps)
    return worst


def measure(config: Path, t_end: float, folder: Path) -> dict:
    """Run ``config`` and recompute its frames under every variant (each in a new process)."""
    out = folder / f"{config.stem}.h5"
    started = time.time()
    run = subprocess.run([sys.executable, "-m", "pdeflow", "run", str(config), "-o", str(out), "--force", "--quiet",
                          "--set", f"run.t_end={t_end}", "--set", f"run.frame_interval={t_end / 4}",
                          "--set", "diagnostics.enabled=false"], capture_output=True, text=True)
    record: dict = {"config": config.name, "run_exit": run.returncode, "run_seconds": round(time.time() - started, 1)}
    if run.returncode != 0:
        record["error"] = (run.stderr.strip().splitlines() or ["?"])[-1]
        return record
    for variant, threads in VARIANTS:
        env = dict(os.environ, PDEFLOW_VARIANT=variant, NUMBA_NUM_THREADS=threads)
        child = subprocess.run([sys.executable, "-m", "studies.robustness.recompute_tolerance", "--child", str(out)],
                               capture_output=True, text=True, env=env, cwd=ROOT)
        key = f"{variant or 'default'} / {threads} thread(s)"
        record[key] = json.loads(child.stdout.strip().splitlines()[-1]) if child.returncode == 0 else \
            {"error": (child.stderr.strip().splitlines() or ["?"])[-1]}
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.robustness.recompute_tolerance",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="*", help="config names of data/configs (default: all)")
    parser.add_argument("--t-end", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=Path("."), help="folder of recompute_tolerance.json")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(differences(args.child)))
        return 0
    from pdeflow.benchmarks.common import machine

    names = args.configs or sorted(p.stem for p in CONFIGS.glob("*.toml"))
    load0, started = [round(x, 2) for x in os.getloadavg()], time.time()
    with tempfile.TemporaryDirectory() as tmp:
        records = []
        for name in names:
            records.append(measure(CONFIGS / f"{name}.toml", args.t_end, Path(tmp)))
            print(json.dumps(records[-1]), flush=True)
    worst = max((v for r in records for k, d in r.items() if isinstance(d, dict) and "error" not in d
                 for v in d.values()), default=0.0)
    result = {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "t_end": args.t_end,
              "seconds": round(time.time() - started), "load_before": load0,
              "load_after": [round(x, 2) for x in os.getloadavg()], "machine": machine(),
              "largest_eps": worst, "records": records}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recompute_tolerance.json").write_text(json.dumps(result, indent=1))
    print(f"largest difference: {worst:.3g} eps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
