"""``python -m pdeflow.benchmarks.sigterm_loop [--runs 200] [--repo DIR] [--stop-on-failure]``: SIGTERM to
``mpiexec -n 2 pdeflow run`` again and again, each at another moment of the time loop.

Each run is tests/core/test_mpi.py::test_sigterm_stops_every_rank_after_the_same_step: a 2-rank run of the suite's tiny
problem (N = 11, rk4, dt = 0.01, t_end = 1e4) gets SIGTERM once a frame after t = 0 is committed, plus a random
delay of up to ``--jitter`` seconds; it passes when the launcher exits with 143 within ``--timeout`` seconds (the
test's 120 s), rank 0 reports "interrupted by SIGTERM" once and the file says "interrupted". A run that does not end
in time is killed and counted as a hang.

The ranks agree on a signal once per step (an allgather of what each has received). Before that agreement kept
signals arriving *during* its own allgather, it replaced them by the agreed value (lost, so both ranks ran on to
t_end) or, when the handler ran just after the agreement, acted on them on one rank alone (which then waited for
the other in a different collective): the CI hang. ``--repo`` runs another checkout's code (e.g. one before the
fix). Results: ``sigterm_loop-<time>.json`` in ``--out`` (default ``benchmarks/results``) and a summary line.

``--in-process`` runs the same cycle without a new ``mpiexec`` per run (whose start-up, seconds of imports and
MPI set-up, dominates the loop): one 2-rank job calls :func:`pdeflow.solvers.driver.run` again and again, and this
process sends SIGTERM to both ranks at once, as mpiexec forwards it, once each run has committed its second frame.
A run passes when both ranks return "interrupted" after the same step within ``--timeout`` seconds.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pdeflow.core.parallel import child_environment, find_mpiexec

from .common import RESULTS

# The suite's tiny problem (tests/conftest.py BASE) with tests/core/test_mpi.py's long rk4 run.
CONFIG = """[task]
name = "markov"
vocab_size = 3
seq_len = 3
exact = true
concentration = 0.7

[model]
d = 7
head_dim = 2
weight_decay = 0.05
family_scale = 3.0
family_seed = 1

[init]
n_particles = 11
scale = 1.0

[solver]
method = "rk4"
dt = 0.01

[run]
t_end = 10000.0
frame_interval = 0.1

[diagnostics]
enabled = false
"""


def committed_frames(path: Path) -> int:
    """Frames committed so far (0 before the file exists or while it is unreadable)."""
    from pdeflow import open_trajectory
    try:
        return len(open_trajectory(path).time)
    except Exception:  # noqa: BLE001 - not created yet, or between its creation and its first commit
        return 0


def one_run(folder: Path, repo: Path, delay: float, timeout: float) -> dict[str, Any]:
    """One 2-rank run stopped by SIGTERM ``delay`` seconds after its second committed frame."""
    config, out = folder / "long.toml", folder / "long.h5"
    out.unlink(missing_ok=True)
    config.write_text(CONFIG)
    env = child_environment(threads=1)
    env["PYTHONPATH"] = os.pathsep.join([str(repo)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.Popen([find_mpiexec(), "-n", "2", sys.executable, "-m", "pdeflow", "run", str(config),
                             "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < timeout and committed_frames(out) < 2:
            time.sleep(0.05)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        try:
            _, stderr = proc.communicate(timeout=timeout)
            hang = False
        except subprocess.TimeoutExpired:
            proc.kill()
            _, stderr = proc.communicate()
            hang = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    status = None
    if not hang:
        from pdeflow import open_trajectory
        try:
            status = open_trajectory(out).attrs.get("status")
        except Exception as exc:  # noqa: BLE001 - recorded as a failure
            status = f"unreadable: {exc}"
    ok = (not hang and proc.returncode == 143 and stderr.count("interrupted by SIGTERM") == 1
          and status == "interrupted")
    return {"ok": ok, "hang": hang, "exit_code": proc.returncode, "delay": delay, "status": status,
            "seconds_to_exit": time.monotonic() - signalled, "stderr": "" if ok else stderr[-2000:]}


def worker(folder: Path, runs: int) -> None:
    """On each rank of the 2-rank job: ``runs`` runs of :data:`CONFIG`, each until a signal stops it; how each
    ended goes to ``rank<r>-<i>.json``."""
    from pdeflow.solvers.driver import run

    from pdeflow.core.config import loads_config
    from pdeflow.core.parallel import world
    from pdeflow.core.problem import Problem

    comm = world()
    cfg = loads_config(CONFIG)
    problem = Problem.from_config(cfg).with_comm(comm)
    (folder / f"pid{comm.rank}").write_text(str(os.getpid()))
    for i in range(runs):
        result = run(cfg, problem, folder / f"run{i}.h5", quiet=True)
        (folder / f"rank{comm.rank}-{i}.json").write_text(json.dumps(
            {"status": result.status, "step": result.state.step, "exit_code": result.exit_code}))
        comm.barrier()


def in_process_runs(repo: Path, runs: int, jitter: float, timeout: float, rnd: random.Random,
                    stop_on_failure: bool) -> list[dict[str, Any]]:
    """``runs`` signal cycles in one 2-rank job (see the module docstring); stops at the first hang."""
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pdeflow-sigterm-") as tmp:
        folder = Path(tmp)
        env = child_environment(threads=1)
        env["PYTHONPATH"] = os.pathsep.join([str(repo)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        job = subprocess.Popen([find_mpiexec(), "-n", "2", sys.executable, "-m", "pdeflow.benchmarks.sigterm_loop",
                                "--worker", str(folder), "--runs", str(runs)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
        pids: list[int] = []
        try:
            t0 = time.monotonic()
            while not all((folder / f"pid{r}").exists() for r in (0, 1)):
                if job.poll() is not None or time.monotonic() - t0 > 600:
                    raise RuntimeError(f"the 2-rank job did not start: {job.communicate()[0][-2000:]}")
                time.sleep(0.1)
            pids = [int((folder / f"pid{r}").read_text()) for r in (0, 1)]
            for i in range(runs):
                path = folder / f"run{i}.h5"
                t0 = time.monotonic()
                while committed_frames(path) < 2 and time.monotonic() - t0 < timeout:
                    time.sleep(0.02)
                delay = rnd.uniform(0.0, jitter)
                time.sleep(delay)
                for pid in pids:     # both ranks at once, as mpiexec forwards a signal
                    os.kill(pid, signal.SIGTERM)
                signalled = time.monotonic()
                ends = [folder / f"rank{r}-{i}.json" for r in (0, 1)]
                while not all(p.exists() for p in ends) and time.monotonic() - signalled < timeout:
                    time.sleep(0.01)
                done = all(p.exists() for p in ends)
                time.sleep(0.05)
                ranks = [json.loads(p.read_text()) for p in ends] if done else []
                ok = (done and all(r["status"] == "interrupted" and r["exit_code"] == 143 for r in ranks)
                      and ranks[0]["step"] == ranks[1]["step"])
                out.append({"ok": ok, "hang": not done, "delay": delay, "ranks": ranks,
                            "seconds_to_exit": time.monotonic() - signalled})
                print(f"run {i + 1}: {'ok' if ok else 'HANG' if not done else 'FAILED'} "
                      f"({out[-1]['seconds_to_exit']:.2f} s after SIGTERM)", flush=True)
                path.unlink(missing_ok=True)
                if not done or (not ok and stop_on_failure):
                    break
        finally:
            if job.poll() is None:
                for pid in pids:    # a hung rank, wherever the launcher put it
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.sigterm_loop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the checkout whose pdeflow the ranks import (default: this one)")
    parser.add_argument("--jitter", type=float, default=0.3, help="largest random delay after the second frame (s)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a run may take to exit after SIGTERM")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-on-failure", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--in-process", action="store_true", help="all runs in one 2-rank job (see above)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker, args.runs)
        return 0
    if find_mpiexec() is None:
        print("sigterm_loop: no mpiexec (pip install -e '.[mpi]')", file=sys.stderr)
        return 2
    rnd = random.Random(args.seed)
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    if args.in_process:
        runs = in_process_runs(args.repo, args.runs, args.jitter, args.timeout, rnd, args.stop_on_failure)
    else:
        runs = cli_runs(args, rnd)
    failures = [i + 1 for i, r in enumerate(runs) if not r["ok"]]
    summary = {"repo": str(args.repo), "mode": "in-process" if args.in_process else "cli", "runs": len(runs),
               "failures": failures, "hangs": [i + 1 for i, r in enumerate(runs) if r["hang"]],
               "wall_seconds": time.monotonic() - started, "load": os.getloadavg(),
               "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "results": runs}
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    (args.out / f"sigterm_loop-{stamp}.json").write_text(json.dumps(summary, indent=1))
    print(f"sigterm_loop: {len(runs) - len(failures)} of {len(runs)} runs ok, failures at {failures or 'none'}, "
          f"{summary['wall_seconds']:.0f} s, load {summary['load'][0]:.1f}")
    return 0 if not failures else 1


def cli_runs(args: argparse.Namespace, rnd: random.Random) -> list[dict[str, Any]]:
    """``args.runs`` runs of the test, each its own mpiexec."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pdeflow-sigterm-") as tmp:
        for i in range(args.runs):
            result = one_run(Path(tmp), args.repo, rnd.uniform(0.0, args.jitter), args.timeout)
            runs.append(result)
            print(f"run {i + 1}: {'ok' if result['ok'] else 'HANG' if result['hang'] else 'FAILED'} "
                  f"(exit {result['exit_code']}, {result['seconds_to_exit']:.1f} s after SIGTERM)", flush=True)
            if not result["ok"] and args.stop_on_failure:
                break
    return runs


if __name__ == "__main__":
    sys.exit(main())
