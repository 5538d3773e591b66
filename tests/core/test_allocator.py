"""pdeflow keeps freed memory for the next temporary of the same size (pdeflow/core/allocator.py): counted in minor
page faults, which do not depend on the machine's load. A loop making four 2 MiB temporaries at once and freeing them
(a step's pattern) faults their pages in at every turn under glibc's own thresholds (the freed heap top, 8 MiB, is
above its trim threshold, twice the largest block freed), and almost never once pdeflow is imported; a user's
``MALLOC_*_`` setting or ``PDEFLOW_ALLOCATOR=default`` leaves glibc's own. The time it saves:
benchmarks/allocator_cost.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TURNS, PAGES = 40, 4 * (2 << 20) // 4096
LOOP = f"""
import json, resource
import numpy as np
from pdeflow.core import allocator
x = np.ones(1 << 18)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({TURNS}):
    made = [x * float(i) for i in range(4)]   # 4 x 2 MiB made, written and freed
    del made
print(json.dumps({{"state": allocator.state,
                  "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}}))
"""


def loop(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "PDEFLOW_ALLOCATOR"}
    proc = subprocess.run([sys.executable, "-c", "import pdeflow\n" + LOOP], env={**clean, **env}, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_freed_arrays_are_reused_without_faulting_their_pages_in_again():
    ours = loop()
    if ours["state"].startswith("not glibc"):
        pytest.skip(f"the C library is not glibc ({ours['state']})")
    assert ours["state"] == "kept"
    glibc = loop(PDEFLOW_ALLOCATOR="default")
    assert glibc["state"].startswith("PDEFLOW_ALLOCATOR=default")
    assert glibc["faults"] >= TURNS * PAGES // 2, glibc     # every turn faults (most of) its 2,048 pages in
    assert ours["faults"] <= PAGES + 64, ours                # the first turn's pages, and a few more


def test_a_users_malloc_setting_wins():
    state = loop(MALLOC_TRIM_THRESHOLD_="131072")["state"]
    assert state == "the user's MALLOC_* settings" or state.startswith("not glibc")
