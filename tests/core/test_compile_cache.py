"""Processes that share numba's cache compile each kernel once, one at a time (pdeflow.core.jit.compile_serially):
a process that needs a kernel another process is compiling waits for it and loads the machine code the other
saved, and two processes compiling different signatures of one kernel at once leave a cache whose every entry
holds its own signature's code (numba alone can pair an index entry with the other signature's data file).

Each test uses a cache folder of its own (``NUMBA_CACHE_DIR``) and the small kernel ``exp_array``.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]

# compile (or load) exp_array for the dtypes given, check it against np.exp, report cache hits and misses
_CHILD = r"""
import json, sys
import numpy as np
from pdeflow.core import jit, kernels
fn = kernels.exp_array
print(json.dumps({"lock": jit.compile_lock_path(fn)}), flush=True)
if sys.argv[1:] == ["--path-only"]:
    raise SystemExit
worst = 0.0
for name in sys.argv[1:]:
    x = np.linspace(-30.0, 30.0, 301).astype(name)
    out = np.empty_like(x)
    fn(x, out)
    ref = np.exp(x.astype(np.float64))
    worst = max(worst, float(np.max(np.abs(out - ref) / ref)))
print(json.dumps({"worst": worst, "hits": sum(fn.stats.cache_hits.values()),
                  "misses": sum(fn.stats.cache_misses.values())}), flush=True)
"""


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(NUMBA_CACHE_DIR=str(cache), NUMBA_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    return env


def _start(cache: Path, *dtypes: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, *dtypes], env=_env(cache), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    lines = [json.loads(line) for line in out.splitlines()]
    return {k: v for line in lines for k, v in line.items()}


def test_a_process_waits_for_the_kernel_another_is_compiling(tmp_path):
    cache = tmp_path / "cache"
    lock = _finish(_start(cache, "--path-only"))["lock"]
    assert lock.startswith(str(cache)) and lock.endswith(".lock") and "exp_array" in lock
    with open(lock, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)   # as a process compiling exp_array holds it
        proc = _start(cache, "float64")
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())  # imported, about to call (and so compile) the kernel
        time.sleep(2.0)
        assert proc.poll() is None, "compiled while another process held the kernel's lock"
    res = _finish(proc)
    assert res["worst"] < 1e-15 and res["misses"] == 1


def test_two_processes_compiling_two_signatures_at_once_leave_a_sound_cache(tmp_path):
    cache = tmp_path / "cache"
    first, second = _start(cache, "float64"), _start(cache, "float32")
    a, b = _finish(first), _finish(second)
    assert a["worst"] < 1e-15 and b["worst"] < 2e-7
    # a third process finds both signatures compiled, each entry with its own machine code
    both = _finish(_start(cache, "float64", "float32"))
    assert both["hits"] == 2 and both["misses"] == 0
    assert both["worst"] < 2e-7 and np.isfinite(both["worst"])


def test_the_second_of_two_processes_loads_what_the_first_compiled(tmp_path):
    cache = tmp_path / "cache"
    first, second = _start(cache, "float64"), _start(cache, "float64")
    results = [_finish(first), _finish(second)]
    assert sorted(r["misses"] for r in results) == [0, 1]   # one compiled, the other waited and loaded
    assert all(r["worst"] < 1e-15 for r in results)
