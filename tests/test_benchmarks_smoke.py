"""Smoke test of the benchmark suite (issue 4): ``python -m pdeflow.benchmarks --preset tiny`` runs every measurement
at a tiny size - PyTorch baselines only where torch is installed - and writes a JSON record and a markdown
table. The numbers are not checked (benchmarks stay out of the test suite); the structure is."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_benchmark_runs_at_tiny_size(tmp_path):
    # the kernel planner measures too (its plan file in a temporary directory, not the user's cache)
    env = {k: v for k, v in os.environ.items() if k not in ("PDEFLOW_TUNE", "PDEFLOW_VARIANT")}
    env["PDEFLOW_CACHE_DIR"] = str(tmp_path / "plans")
    proc = subprocess.run([sys.executable, "-m", "pdeflow.benchmarks", "--preset", "tiny", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| measurement | value | target | met |" in proc.stdout
    (js,) = tmp_path.glob("bench-tiny-*.json")
    (md,) = tmp_path.glob("bench-tiny-*.md")
    res = json.loads(js.read_text())
    assert md.read_text() in proc.stdout
    for key in ("grad_phi_seconds", "gflops_model", "fraction_of_matmul", "step_over_grad_phi", "float32_speedup",
                "thread_speedup_1_to_2", "peak_memory_mib", "exponent_N", "exponent_B", "exponent_T"):
        assert np.isfinite(res[key]) and res[key] > 0 or key.startswith("exponent"), key
    assert set(res["targets"]) >= {"speedup_vs_torch_float64", "fraction_of_matmul", "peak_memory_mib"}
    assert res["flops"]["model"] < res["flops"]["executed"]
    # the baselines compute the same numbers as pdeflow
    assert res["numpy"]["rel_error"] < 1e-10
    if "skipped" not in res["torch"]:
        assert res["torch"]["float64"]["rel_error"] < 1e-10
    assert res["machine"]["cpu_count"] >= 1
    # issue 18: what the kernels run on and were compiled for, per-pass rates, every target flagged
    assert res["machine"]["cpu"]["model"] and res["machine"]["cpu"]["vendor"]
    assert res["machine"]["caches"]["L1d"] > 0 and res["machine"]["caches"]["L2"] > res["machine"]["caches"]["L1d"]
    cg = res["codegen"]
    assert cg["llvm_cpu"] and isinstance(cg["llvm_features"], str)
    assert cg["features_chosen_by"] in ("pdeflow", "user", "numba")
    assert cg["vector_width"] in ("zmm", "ymm", "xmm") and cg["vector_bits"] in (512, 256, 128)
    assert {"_attention_units[float64]", "_attention_vjp_units[float64][accumulate=True]"} <= set(cg["kernels"])
    if cg["avx512f"] and cg["features_chosen_by"] == "pdeflow":
        assert cg["prefer_256_bit"] == "-prefer-256-bit" and cg["vector_width"] == "zmm"
    t64 = cg["tiles"]["float64"]
    assert t64["heads_per_work_unit"] >= 1 and t64["heads_per_chunk"] >= 1 and t64["sequences_per_chunk"] >= 1
    assert 0 < t64["scratch_forward_bytes"] < t64["scratch_backward_bytes"]
    for key in ("logits_pass", "gradient_pass", "system_jvp"):
        assert res["rates"][key]["seconds"] > 0 and res["rates"][key]["gflops_model"] > 0, key
    assert res["flops"]["model_logits_pass"] + res["flops"]["model_gradient_pass"] == res["flops"]["model"]
    assert res["flops"]["executed_logits_pass"] + res["flops"]["executed_gradient_pass"] == res["flops"]["executed"]
    assert set(res["targets"]) >= {"speedup_vs_torch_float64", "speedup_vs_torch_float32", "fraction_of_matmul",
                                   "fraction_of_matmul_executed", "exponent_N", "exponent_B",
                                   "thread_speedup_1_to_2", "float32_speedup"}
    missed = [k for k, v in res["targets"].items() if v["met"] is False]
    table = md.read_text()
    assert table.count("**MISSED**") == 2 * len(missed)  # in its row and in the closing list
    for key in missed:
        assert f"**MISSED** {key} (" in table
    assert f"`{cg['llvm_cpu']}`" in table and res["machine"]["cpu"]["model"] in table
    # what the planner chose and why, remembered under this machine's key
    from pdeflow.core import tuner

    labels = {v.label for v in tuner.candidates()}
    for dtype in ("float64", "float32"):
        rec = res["tuning"][dtype]
        assert rec["variant"] in labels and set(rec["seconds"]) == labels and rec["why"]
        assert rec["in_use"]["variant"] == rec["variant"] and rec["in_use"]["why"] == "measured"
    plans = json.loads((tmp_path / "plans" / tuner.PLAN_FILE).read_text())
    assert len(plans[res["tuning"]["plans"]["machine"]]["shapes"]) == 2
    assert "Kernel variants (pdeflow.core.tuner" in table and res["tuning"]["float64"]["variant"] in table
    assert set(res["thread_speedup_passes"]) == {"logits_pass", "gradient_pass"}


def test_bench_command_rejects_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nd = -3\n")
    proc = subprocess.run([sys.executable, "-m", "pdeflow", "bench", str(bad), "--out", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "d" in proc.stderr
    assert not (tmp_path / "out").exists()
