"""pdeflow as a reference: golden trajectories reproduce, compare accepts/rejects, validate names problems."""
from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import h5py
import numpy as np
import pytest

from pdeflow import Problem, load_config
from pdeflow.cli import main
from pdeflow.reference import compare, validate
from solvers.driver import run

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference"
TOLERANCES = tomllib.loads((REFERENCE / "tolerances.toml").read_text())
GOLDEN = sorted(TOLERANCES)


def test_the_suite_covers_the_solvers():
    methods = {load_config(REFERENCE / f"{name}.toml").solver.method for name in GOLDEN}
    assert {"rk4", "adaptive", "sgd", "jko", "fv"} <= methods
    for name in GOLDEN:
        assert (REFERENCE / f"{name}.h5").stat().st_size < 2 * 2**20


@pytest.mark.parametrize("name", GOLDEN)
def test_rerunning_a_reference_config_reproduces_its_golden_file(name, tmp_path):
    cfg = load_config(REFERENCE / f"{name}.toml")
    out = tmp_path / f"{name}.h5"
    result = run(cfg, Problem.from_config(cfg), out, quiet=True)
    assert result.exit_code == 0
    tol = TOLERANCES[name]
    comparison = compare(out, REFERENCE / f"{name}.h5", rtol=tol["rtol"], atol=tol["atol"])
    assert comparison.ok, comparison.table()
    assert {"energy", "dissipation", "logits"} <= {r.quantity for r in comparison.rows}


@pytest.mark.parametrize("name", GOLDEN)
def test_validate_accepts_every_golden_file(name):
    assert validate(REFERENCE / f"{name}.h5") == []


def perturbed_copy(tmp_path: Path, eps: float) -> Path:
    copy = tmp_path / "perturbed.h5"
    shutil.copy(REFERENCE / "particles-rk4.h5", copy)
    with h5py.File(copy, "r+") as f:
        f["frames/omega"][-1] = f["frames/omega"][-1] + eps
    return copy


def test_compare_accepts_a_file_against_itself_and_rejects_a_perturbed_last_frame(tmp_path, capsys):
    golden = REFERENCE / "particles-rk4.h5"
    assert compare(golden, golden).ok
    assert main(["compare", str(golden), str(golden)]) == 0
    bad = compare(perturbed_copy(tmp_path, 1e-3), golden)
    assert not bad.ok
    last = max(r.time for r in bad.rows)
    failing = {r.quantity for r in bad.rows if not r.ok}
    assert failing and all(r.time == last for r in bad.rows if not r.ok)
    assert {"W2", "logits"} <= failing
    assert main(["compare", str(perturbed_copy(tmp_path, 1e-3)), str(golden)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_compare_with_a_tolerance_loose_enough_accepts_the_perturbation(tmp_path):
    golden = REFERENCE / "particles-rk4.h5"
    assert compare(perturbed_copy(tmp_path, 1e-3), golden, rtol=0.5, atol=0.1).ok


def test_compare_refuses_files_of_different_problems(tmp_path):
    def other_data(f):
        f["data/tokens"][0, 0] = (f["data/tokens"][0, 0] + 1) % f["model/embedding"].shape[0]
    result = compare(mutate(tmp_path, other_data), REFERENCE / "particles-rk4.h5")
    assert not result.ok
    assert "different problems (tokens differs)" in result.problems[0]


def mutate(tmp_path: Path, how) -> Path:
    copy = tmp_path / "mutated.h5"
    shutil.copy(REFERENCE / "particles-rk4.h5", copy)
    with h5py.File(copy, "r+") as f:
        how(f)
    return copy


def _wrong_weights(f):
    del f["data/weights"]
    f["data/weights"] = np.full(3, 1 / 3)


@pytest.mark.parametrize("how,expected", [
    (lambda f: f.__delitem__("frames/mass"), "missing dataset /frames/mass"),
    (lambda f: f.__delitem__("model/unembedding"), "missing dataset /model/unembedding"),
    (_wrong_weights, "/data/weights must have shape"),
    (lambda f: f.attrs.__setitem__("schema_version", 2), "schema_version must be 1"),
    (lambda f: f.attrs.__setitem__("schema", "other"), "schema must be"),
    (lambda f: f["model"].attrs.__delitem__("head_dim"), "missing attribute /model.head_dim"),
])
def test_validate_rejects_a_broken_file_naming_the_problem(tmp_path, capsys, how, expected):
    path = mutate(tmp_path, how)
    problems = validate(path)
    assert any(expected in p for p in problems), problems
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert expected in out


def test_validate_names_a_file_that_is_not_hdf5(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("not hdf5")
    assert "not a readable HDF5 file" in validate(path)[0]


def write_external_file(path: Path, golden: Path) -> None:
    """What another code writes (the README's example): the problem, and its frames at matching times.

    Here the 'other code' copies pdeflow's frames; a real one would integrate them itself."""
    with h5py.File(golden, "r") as g, h5py.File(path, "w") as f:
        f.attrs["schema"] = "pdeflow-trajectory"
        f.attrs["schema_version"] = 1
        for key in ("embedding", "positions", "unembedding", "theta0"):
            f[f"model/{key}"] = g[f"model/{key}"][()]
        for key in ("head_dim", "score_scale", "weight_decay"):
            f["model"].attrs[key] = g["model"].attrs[key]
        for key in ("tokens", "targets", "mask", "weights"):
            f[f"data/{key}"] = g[f"data/{key}"][()]
        n = g["checkpoint/slot%d/n_frames" % g["checkpoint/active"][()]][()]
        f["frames/time"] = g["frames/time"][:n]
        f["frames/omega"] = g["frames/omega"][:n]
        f["frames/mass"] = g["frames/mass"][:n]


def test_a_file_written_by_another_code_validates_and_compares(tmp_path):
    golden = REFERENCE / "particles-rk4.h5"
    external = tmp_path / "external.h5"
    write_external_file(external, golden)
    assert validate(external) == []
    result = compare(external, golden, rtol=1e-8, atol=1e-10)
    assert result.ok, result.table()
    # energies and dissipation were recomputed from the stored problem, not read
    assert any(r.quantity == "energy" for r in result.rows)
    with h5py.File(external, "r+") as f:
        f["frames/omega"][-1] += 1e-3
    assert not compare(external, golden).ok
