"""One import name (issue 19): a wheel of pdeflow installs the single top-level package ``pdeflow`` - the
checkout's ``solvers/`` and ``benchmarks/`` folders become ``pdeflow.solvers`` and ``pdeflow.benchmarks``
(setup.cfg's ``package_dir``) - and, installed into a fresh virtual environment, ``pdeflow run`` and
``pdeflow bench --preset tiny`` work from a folder outside the checkout (the benchmark's reference problem is
package data).

The wheel is built from a copy of the tracked files (the build leaves nothing in the checkout) and installed
with ``--no-deps`` into a new venv; the venv then sees this interpreter's site-packages for the dependencies
only (a path file added after the install, whose own path files Python does not run, so the checkout's
editable install stays invisible)."""
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

import pytest

REPO = Path(__file__).resolve().parent.parent



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


def test_only_pdeflow_is_importable_from_the_install(installed) -> None:
    _, python, _, work = installed
    probe = ("import importlib.util, json, pdeflow, pdeflow.solvers, pdeflow.benchmarks.common as c; "
             "print(json.dumps({'solvers': importlib.util.find_spec('solvers') is not None, "
             "'benchmarks': importlib.util.find_spec('benchmarks') is not None, "
             "'files': [pdeflow.__file__, pdeflow.solvers.__file__, str(c.REFERENCE_CONFIG)], "
             "'config_exists': c.REFERENCE_CONFIG.is_file()}))")
    proc = subprocess.run([str(python), "-c", probe], cwd=work, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert not found["solvers"] and not found["benchmarks"], "a generic top-level name is installed"
    venv_root = str(python.parent.parent)
    assert all(f.startswith(venv_root) for f in found["files"]), found["files"]
    assert found["config_exists"]


@pytest.mark.slow
def test_run_and_bench_work_outside_the_checkout(installed) -> None:
    _, _, bindir, work = installed
    shutil.copy(REPO / "data" / "configs" / "quickstart.toml", work / "quickstart.toml")
    small = ["--set", "init.n_particles=4", "--set", "task.n_samples=8", "--set", "run.t_end=0.4",
             "--set", "run.frame_interval=0.2"]
    run = subprocess.run([str(bindir / "pdeflow"), "run", "quickstart.toml", "-o", "tiny.h5", "--quiet", *small],
                         cwd=work, env=_env(), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    import h5py

    with h5py.File(work / "tiny.h5", "r") as f:
        assert bytes(f.attrs["status"]).decode() == "finished"
        assert f["frames/time"][-1] == pytest.approx(0.4)
    bench = subprocess.run([str(bindir / "pdeflow"), "bench", "--preset", "tiny", "--out", "bench"], cwd=work,
                           env=_env(), capture_output=True, text=True, timeout=900)
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert len(list((work / "bench").glob("*.json"))) == 1
