"""One import name (issue 19): a wheel of pdeflow installs the single top-level package ``pdeflow`` - the
checkout's ``solvers/`` and ``benchmarks/`` folders become ``pdeflow.solvers`` and ``pdeflow.benchmarks``
(setup.cfg's ``package_dir``) - and, installed into a fresh virtual environment, ``pdeflow run`` works from a
folder outside the checkout and finds the benchmark's reference problem (package data).

The wheel is built from a copy of the tracked files (the build leaves nothing in the checkout) and installed
with ``--no-deps`` into a new venv; the venv then sees this interpreter's site-packages for the dependencies
only (a path file added after the install, whose own path files Python does not run, so the checkout's
editable install stays invisible). The installed package compiles its kernels afresh (numba's cache is kept
per source file), so it runs one short ``pdeflow run``: what the wheel changes is which files are there, not
the kernels.

The benchmark suite's smoke test (issue 4) is one run of ``pdeflow bench --preset tiny`` from a folder outside the
checkout, by this interpreter's pdeflow (the kernels it needs are then in numba's cache, but for the machine-code
report, which compiles them afresh in a child): every measurement at a tiny size - PyTorch baselines only where
torch is installed - with the kernel planner measuring too, a JSON record and a markdown table whose structure
is checked (the numbers are not: benchmarks stay out of the test suite).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]



def _tracked_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv python, the venv's bin folder, a working folder outside the checkout)."""
    if not (REPO / ".git").exists():
        pytest.fail("the packaging test builds from the git checkout's tracked files; run it in a checkout")
    root = tmp_path_factory.mktemp("packaging")
    src = _tracked_copy(root / "src")
    dist = root / "dist"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(src)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("pdeflow-*.whl")
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                              "--quiet", str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # this interpreter's site folders, also those it sees through path files (a venv layered on another)
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    deps |= {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")}
    (Path(purelib) / "_pdeflow_test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")
    work = root / "elsewhere"
    work.mkdir()
    return wheel, python, env_dir / "bin", work


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NUMBA_NUM_THREADS"] = "1"
    return env


def test_the_wheel_holds_one_top_level_package(installed) -> None:
    wheel, *_ = installed
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"pdeflow"}, sorted(top)
    assert "pdeflow/solvers/stiff.py" in names and "pdeflow/benchmarks/suite.py" in names
    assert "pdeflow/benchmarks/bench-reference.toml" in names
    assert "pdeflow/analysis/comparison/manufactured_cases/phi.json" in names and "pdeflow/reference.py" in names
    # the lab notebook (studies/: dated records and the code that made them) stays in the checkout
    records = [n for n in names if n.endswith((".md", ".png")) or "studies" in n or "time_to_" in n]
    assert not records, records


def test_only_pdeflow_is_importable_from_the_install(installed) -> None:
    _, python, _, work = installed
    probe = ("import importlib.util, json, pdeflow, pdeflow.solvers, pdeflow.benchmarks.common as c, "
             "pdeflow.reference as ref; "
             "print(json.dumps({'solvers': importlib.util.find_spec('solvers') is not None, "
             "'benchmarks': importlib.util.find_spec('benchmarks') is not None, "
             "'files': [pdeflow.__file__, pdeflow.solvers.__file__, str(c.REFERENCE_CONFIG)], "
             "'config_exists': c.REFERENCE_CONFIG.is_file(), 'manufactured': len(ref.load_cases()), "
             "'cases_file': str(pdeflow.analysis.comparison.manufactured.CASES_FOLDER)}))")
    proc = subprocess.run([str(python), "-c", probe], cwd=work, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert not found["solvers"] and not found["benchmarks"], "a generic top-level name is installed"
    venv_root = str(python.parent.parent)
    assert all(f.startswith(venv_root) for f in found["files"]), found["files"]
    assert found["config_exists"]
    assert found["manufactured"] == 4 and found["cases_file"].startswith(venv_root)   # package data, installed


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> tuple[dict, str, str]:
    """``pdeflow bench --preset tiny`` run outside the checkout with the kernel planner on (its plan file in a
    temporary folder, not the user's cache): (JSON record, markdown table, stdout)."""
    work = tmp_path_factory.mktemp("bench")
    plans = tmp_path_factory.mktemp("plans")
    env = {k: v for k, v in os.environ.items() if k not in ("PDEFLOW_TUNE", "PDEFLOW_VARIANT")}
    env.update(PDEFLOW_CACHE_DIR=str(plans), NUMBA_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "pdeflow", "bench", "--preset", "tiny", "--out", "bench"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (js,) = (work / "bench").glob("bench-tiny-*.json")
    (md,) = (work / "bench").glob("bench-tiny-*.md")
    res = json.loads(js.read_text())
    from pdeflow.core import tuner

    res["_plans_file"] = json.loads((plans / tuner.PLAN_FILE).read_text())
    return res, md.read_text(), proc.stdout


@pytest.mark.slow
def test_bench_runs_at_tiny_size_outside_the_checkout(bench) -> None:
    res, table, stdout = bench
    assert "| measurement | value | target | met |" in stdout
    assert table in stdout
    from pdeflow.benchmarks.common import REFERENCE_CONFIG

    assert Path(res["config"]) == REFERENCE_CONFIG
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
    assert {"_attention_units[float64]", "_attention_vjp_units[float64]"} <= set(cg["kernels"])
    if cg["avx512f"] and cg["features_chosen_by"] == "pdeflow":
        assert cg["prefer_256_bit"] == "-prefer-256-bit" and cg["vector_width"] == "zmm"
    # the host's widest vectors in both core kernels, float64 and float32, compiled afresh in the bench's child:
    # zmm on AVX-512 hosts (pdeflow.core.jit's choice), ymm on AVX2 hosts (the narrow compile's bit-identical
    # results: tests/core/test_codegen.py)
    if cg["features_chosen_by"] in ("pdeflow", "numba") and "+avx2" in cg["llvm_features"].split(","):
        assert cg["vector_width"] == ("zmm" if cg["avx512f"] else "ymm"), cg["vector_width"]
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
    assert len(res["_plans_file"][res["tuning"]["plans"]["machine"]]["shapes"]) == 2
    assert "Kernel variants (pdeflow.core.tuner" in table and res["tuning"]["float64"]["variant"] in table
    assert set(res["thread_speedup_passes"]) == {"logits_pass", "gradient_pass"}


def test_the_benchmark_module_writes_its_record_and_drops_the_partial_one(bench, tmp_path, monkeypatch,
                                                                          capsys) -> None:
    """``python -m pdeflow.benchmarks``: the record so far is kept in ``bench-<preset>-partial.json`` after every
    section (an interrupted run keeps it) and replaced by the time-stamped JSON and markdown at the end; the
    suite itself is the fixture's record (the measurements are the fixture's)."""
    import pdeflow.benchmarks.__main__ as entry

    record = {k: v for k, v in bench[0].items() if k != "_plans_file"}
    seen = []

    def measured(preset, config, log, checkpoint):
        assert preset == "tiny"
        checkpoint({"preset": record["preset"]})
        seen.append(json.loads((tmp_path / "bench-tiny-partial.json").read_text()))
        return record

    monkeypatch.setattr(entry, "run", measured)
    assert entry.main(["--preset", "tiny", "--out", str(tmp_path)]) == 0
    assert seen == [{"preset": record["preset"]}]
    (js,) = tmp_path.glob("bench-tiny-*.json")
    (md,) = tmp_path.glob("bench-tiny-*.md")
    assert json.loads(js.read_text()) == record
    table = md.read_text()
    assert "| measurement | value | target | met |" in table and table in capsys.readouterr().out


@pytest.mark.slow
def test_run_works_outside_the_checkout(installed) -> None:
    _, _, bindir, work = installed
    shutil.copy(REPO / "data" / "configs" / "full.toml", work / "quickstart.toml")
    small = ["--set", "init.n_particles=4", "--set", "task.n_samples=8", "--set", "run.t_end=0.4",
             "--set", "run.frame_interval=0.2"]
    run = subprocess.run([str(bindir / "pdeflow"), "run", "quickstart.toml", "-o", "tiny.h5", "--quiet", *small],
                         cwd=work, env=_env(), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    import h5py

    with h5py.File(work / "tiny.h5", "r") as f:
        assert bytes(f.attrs["status"]).decode() == "finished"
        assert f["frames/time"][-1] == pytest.approx(0.4)
