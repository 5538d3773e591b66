"""The benchmark command's input checks. The smoke test of the suite itself (``pdeflow bench --preset tiny``: every
measurement at a tiny size, the JSON record and the markdown table) runs the installed wheel outside the checkout
in tests/meta/test_packaging.py, and ``python -m pdeflow.benchmarks``' record files are checked there too."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_command_rejects_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nd = -3\n")
    proc = subprocess.run([sys.executable, "-m", "pdeflow", "bench", str(bad), "--out", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "d" in proc.stderr
    assert not (tmp_path / "out").exists()
