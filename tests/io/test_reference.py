"""pdeflow as a reference: golden trajectories reproduce, compare accepts/rejects, validate names problems."""
from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import h5py
import numpy as np
import pytest
from pdeflow.solvers.driver import run

from pdeflow import Problem, load_config
from pdeflow.interface.cli import main
from pdeflow.io.reference import compare, read_run, validate
from pdeflow.io.trajectory import open_trajectory

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "reference"
TOLERANCES = tomllib.loads((REFERENCE / "tolerances.toml").read_text())
GOLDEN = sorted(TOLERANCES)


def test_the_suite_covers_the_solvers():
    methods = {load_config(REFERENCE / f"{name}.toml").solver.method for name in GOLDEN}
    assert {"rk4", "adaptive", "sgd", "jko", "fv"} <= methods
    for name in GOLDEN:
        assert (REFERENCE / f"{name}.h5").stat().st_size < 2 * 2**20


@pytest.mark.parametrize("name", GOLDEN)
def test_rerunning_a_reference_config_reproduces_its_golden_file(name, tmp_path):
    """The shipped reference config, run at its shipped settings: it holds its own accuracy check (no false
    alarm, as every shipped config: tests/meta/test_shipped_configs.py) and reproduces its golden file."""
    cfg = load_config(REFERENCE / f"{name}.toml")
    out = tmp_path / f"{name}.h5"
    result = run(cfg, Problem.from_config(cfg), out, quiet=True)
    assert result.exit_code == 0
    traj = open_trajectory(out)
    assert traj.attrs["status"] == "finished" and np.isnan(traj.attrs["accuracy_lost_at"])
    assert traj.attrs["accuracy"].startswith(("held", "not checked")), traj.attrs["accuracy"]
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


def write_external_file(path: Path, golden: Path, frames: slice = slice(None)) -> None:
    """What another code writes (the example of docs/experiments.md): the problem, and its frames at matching times.

    Here the 'other code' copies pdeflow's frames (those selected by ``frames``); a real one would integrate
    them itself."""
    with h5py.File(golden, "r") as g, h5py.File(path, "w") as f:
        f.attrs["schema"] = "pdeflow-trajectory"
        f.attrs["schema_version"] = 1
        for key in ("embedding", "positions", "unembedding", "theta0"):
            f[f"model/{key}"] = g[f"model/{key}"][()]
        for key in ("head_dim", "score_scale", "weight_decay"):
            f["model"].attrs[key] = g["model"].attrs[key]
        for key in ("tokens", "targets", "mask", "weights"):
            f[f"data/{key}"] = g[f"data/{key}"][()]
        n = g[f"checkpoint/slot{int(g['checkpoint/active'][()])}/n_frames"][()]
        f["frames/time"] = g["frames/time"][:n][frames]
        f["frames/omega"] = g["frames/omega"][:n][frames]
        f["frames/mass"] = g["frames/mass"][:n][frames]


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


# ---- compare passes only what it compared --------------------------------------------------------
GOLDEN_RK4 = REFERENCE / "particles-rk4.h5"
GOLDEN_TIMES = [0.0, 0.5, 1.0, 1.5, 2.0]


def test_golden_rk4_has_the_frames_these_tests_assume():
    with h5py.File(GOLDEN_RK4, "r") as f:
        assert f["frames/time"][:5] == pytest.approx(GOLDEN_TIMES, abs=1e-12)


def test_compare_fails_a_file_holding_only_the_first_frame(tmp_path, capsys):
    first = tmp_path / "first.h5"
    write_external_file(first, GOLDEN_RK4, slice(0, 1))
    assert validate(first) == []
    result = compare(first, GOLDEN_RK4)
    assert not result.ok
    assert result.matched == 1 and result.reference_frames == 5
    assert any("not the reference's [0, 2]" in p and "--allow-partial" in p for p in result.problems), result.problems
    assert main(["compare", str(first), str(GOLDEN_RK4)]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "1/5 of all reference frames (20%)" in out


def test_compare_fails_time_shifted_frames_naming_the_unmatched_times(tmp_path, capsys):
    def shift(f):
        n = f["frames/time"].shape[0]
        f["frames/time"][1:n] = f["frames/time"][1:n] + 0.01
        f["frames/omega"][1:n] = f["frames/omega"][1:n] + 5.0
    shifted = mutate(tmp_path, shift)
    result = compare(shifted, GOLDEN_RK4)
    assert not result.ok
    assert (result.matched, result.in_span) == (1, 5)
    assert [r.time for r in result.rows if r.quantity == "energy"] == [0.0]   # the one comparable frame
    assert all(r.ok for r in result.rows)                                     # ... agrees: the FAIL is the match
    unmatched = [p for p in result.problems if "have no candidate frame" in p]
    assert len(unmatched) == 1 and "4 reference frame(s)" in unmatched[0]
    assert "t = 0.5, 1, 1.5, 2" in unmatched[0]
    assert main(["compare", str(shifted), str(GOLDEN_RK4)]) == 1
    out = capsys.readouterr().out
    assert "matched 1/5 reference frames in the common span [0, 2] (20%)" in out and "FAIL" in out


def test_compare_passes_an_exact_copy_and_an_external_file_with_every_frame(tmp_path, capsys):
    copy = tmp_path / "copy.h5"
    shutil.copy(GOLDEN_RK4, copy)
    result = compare(copy, GOLDEN_RK4)
    assert result.ok and not result.problems and (result.matched, result.in_span) == (5, 5)
    external = tmp_path / "external.h5"
    write_external_file(external, GOLDEN_RK4)
    result = compare(external, GOLDEN_RK4)
    assert result.ok, result.table()
    assert (result.matched, result.in_span, result.reference_frames) == (5, 5, 5)
    assert main(["compare", str(external), str(GOLDEN_RK4)]) == 0
    out = capsys.readouterr().out
    assert "matched 5/5 reference frames in the common span [0, 2] (100%)" in out and "PASS" in out


def test_allow_partial_compares_a_prefix_and_reports_its_fraction(tmp_path, capsys):
    prefix = tmp_path / "prefix.h5"
    write_external_file(prefix, GOLDEN_RK4, slice(0, 3))                    # t = 0, 0.5, 1
    assert not compare(prefix, GOLDEN_RK4).ok
    result = compare(prefix, GOLDEN_RK4, allow_partial=True)
    assert result.ok, result.table()
    assert (result.matched, result.in_span, result.reference_frames) == (3, 3, 5)
    assert main(["compare", str(prefix), str(GOLDEN_RK4), "--allow-partial"]) == 0
    out = capsys.readouterr().out
    assert "matched 3/3 reference frames in the common span [0, 1] (100%); 3/5 of all reference frames (60%)" in out
    # a prefix whose frames differ from the reference still fails
    with h5py.File(prefix, "r+") as f:
        f["frames/omega"][-1] += 1e-3
    assert not compare(prefix, GOLDEN_RK4, allow_partial=True).ok


def test_candidate_frames_between_the_references_are_ignored_but_every_reference_frame_is_needed():
    from pdeflow.io.reference import match_frames

    ref = np.array(GOLDEN_TIMES)
    finer = np.linspace(0.0, 2.0, 9)
    pairs, problems, counts = match_frames(finer, ref)
    assert not problems and [j for _, j, _ in pairs] == [0, 1, 2, 3, 4] and [i for i, _, _ in pairs] == [0, 2, 4, 6, 8]
    # within the tolerance 1e-9 max(1, |t|) a time matches, beyond it does not
    pairs, problems, _ = match_frames(ref + np.array([0, 0, 0, 0, 1.5e-9]), ref)
    assert not problems and len(pairs) == 5
    pairs, problems, _ = match_frames(ref + np.array([0, 0, 0, 0, 3e-9]), ref)
    assert len(pairs) == 4 and any("t = 2" in p for p in problems)
    # a candidate longer than the reference is fine; one starting later is partial
    assert not match_frames(np.linspace(0, 3, 7), ref)[1]
    pairs, problems, counts = match_frames(ref[2:], ref)
    assert counts["matched"] == 3 and any("uncovered [0, 1)" in p for p in problems)
    assert not match_frames(ref[2:], ref, allow_partial=True)[1]


# ---- the dynamics are part of the problem -------------------------------------------------------------------
def _tiny_run(tmp_path, name: str, method: str, *overrides: str) -> Path:
    from test_every_method import tiny_config

    cfg = tiny_config(method, *overrides)
    out = tmp_path / f"{name}.h5"
    assert run(cfg, Problem.from_config(cfg), out, quiet=True).exit_code == 0
    return out


def _strip(path: Path, out: Path, *items: str) -> Path:
    """A copy of ``path`` without the given datasets / root attributes (as another code might write it)."""
    shutil.copyfile(path, out)
    with h5py.File(out, "r+") as f:
        for item in items:
            if item.startswith("."):
                del f.attrs[item[1:]]
            else:
                del f[item]
    return out


def test_compare_recomputes_the_dissipation_its_dynamics_define(tmp_path):
    """A WFR file without its stored energies and dissipations (its /.config kept) against the original: the
    recomputed dissipation is alpha int |grad Phi|^2 + gamma int (Phi - <Phi>)^2 (the stored one to 1e-10), so it
    passes; the Wasserstein int |grad Phi|^2 alone would differ by the Fisher-Rao term, far beyond that."""
    wfr = _tiny_run(tmp_path, "wfr", "wfr", "solver.gamma=1.0", "solver.alpha=0.5")
    bare = _strip(wfr, tmp_path / "bare.h5", "frames/energy", "frames/dissipation")
    result = compare(bare, wfr, rtol=1e-10, atol=1e-12)
    assert result.ok, result.table()
    assert {r.quantity for r in result.rows} >= {"energy", "dissipation"}
    a = read_run(bare)
    omega, mass = a.measure(1)
    transport = a.problem.evaluate(omega, mass).dissipation
    assert abs(a.dissipation(1) - transport) > 1e-3 * a.dissipation(1)
    # the same file with a free total mass: <Phi> = 0 in the Fisher-Rao term
    free = _tiny_run(tmp_path, "free", "wfr", "solver.gamma=1.0", "solver.total_mass='free'")
    result = compare(_strip(free, tmp_path / "free-bare.h5", "frames/dissipation"), free, rtol=1e-10, atol=1e-12)
    assert result.ok, result.table()


def test_compare_refuses_runs_of_different_dynamics(tmp_path, capsys):
    """Two runs that differ only in gamma hold the same measure at t = 0 but not the same problem; a copy of a WFR
    run without /.config (another code's file: the Wasserstein flow) neither. Each is one line, exit 1."""
    a = _tiny_run(tmp_path, "g1", "wfr", "solver.gamma=1.0")
    b = _tiny_run(tmp_path, "g2", "wfr", "solver.gamma=2.0")
    for candidate in (b, _strip(a, tmp_path / "external.h5", ".config", "frames/dissipation")):
        assert main(["compare", str(candidate), str(a)]) == 1
        out = capsys.readouterr().out
        problems = [line for line in out.splitlines() if line.startswith("problem:")]
        assert len(problems) == 1 and "different problems (the dynamics: " in problems[0], out
        assert "gamma 1" in problems[0] and "FAIL: 0/0 within tolerance, but 1 problem(s) above" in out
    # beta is part of the dynamics too
    assert "beta" in read_run(a).dynamics.describe()


def test_compare_of_a_file_holding_only_t0_says_what_failed(tmp_path):
    """A run stopped after its first step (frames at t = 0 and 0.05) against the full run, which shares only
    t = 0 with it: every compared row is within
    tolerance, the uncovered span fails it, and the verdict says both (never "FAIL: 4/4 within tolerance" alone);
    against itself it passes."""
    full = _tiny_run(tmp_path, "full", "rk4")
    cfg_short = tmp_path / "short.h5"
    from test_every_method import tiny_config

    cfg = tiny_config("rk4", "run.max_steps=1")
    run(cfg, Problem.from_config(cfg), cfg_short, quiet=True)
    result = compare(cfg_short, full)
    assert len(result.rows) == 4 and all(r.ok for r in result.rows) and not result.ok
    assert result.table().splitlines()[-1] == "FAIL: 4/4 within tolerance, but 1 problem(s) above"
    itself = compare(cfg_short, cfg_short)
    n = len(itself.rows)
    assert itself.ok and itself.table().splitlines()[-1] == f"PASS: {n}/{n} within tolerance"


# ---- what compare checks, and its exit codes (the rule validate shares) -------------------------------------
def test_compare_help_states_what_it_checks_and_the_tolerances(capsys):
    assert main(["compare", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("|a - b| <= atol + rtol |b|", "W2 <= atol + rtol * radius", "max|z_a - z_b| <= atol + rtol max|z_b|",
                   "the same problem", "--order", "10x more accurate", "0 pass; 1 a check failed, or a file is not a "
                   "valid pdeflow trajectory", "2 bad input: a path that does not exist"):
        assert phrase in text, phrase


@pytest.mark.parametrize("damage", ["missing dataset", "wrong shape", "truncated", "not hdf5", "flipped data"])
def test_compare_fails_an_invalid_file_with_exit_1_in_one_line(tmp_path, capsys, damage):
    """A file that exists but is no valid trajectory is a failed check for compare as for validate (exit 1, one
    line, no traceback), whichever of the two files it is."""
    bad = tmp_path / "bad.h5"
    if damage == "missing dataset":
        bad = mutate(tmp_path, lambda f: f.__delitem__("frames/omega"))
    elif damage == "wrong shape":
        bad = mutate(tmp_path, _wrong_weights)
    elif damage == "truncated":
        data = GOLDEN_RK4.read_bytes()
        bad.write_bytes(data[:len(data) // 2])
    elif damage == "not hdf5":
        bad.write_text("not a trajectory\n")
    else:   # a stored frame of a checksummed file with a byte flipped: h5py's read fails (Fletcher-32)
        with h5py.File(bad, "w") as f:
            with h5py.File(GOLDEN_RK4, "r") as g:
                for group in ("model", "data"):
                    g.copy(group, f)
                f.attrs.update({k: g.attrs[k] for k in ("schema", "schema_version")})
                f.create_dataset("frames/time", data=g["frames/time"][:5])
                f.create_dataset("frames/mass", data=g["frames/mass"][:5])
                f.create_dataset("frames/omega", data=g["frames/omega"][:5], chunks=True, fletcher32=True)
            offset = f["frames/omega"].id.get_chunk_info(0).byte_offset
        raw = bytearray(bad.read_bytes())
        raw[offset + 8] ^= 0xFF
        bad.write_bytes(bytes(raw))
    for argv in (["compare", str(bad), str(GOLDEN_RK4)], ["compare", str(GOLDEN_RK4), str(bad)]):
        assert main(argv) == 1, damage
        captured = capsys.readouterr()
        lines = (captured.out + captured.err).strip().splitlines()
        # the screen of untrusted files answers on stderr, the check itself on stdout: one line either way
        assert len(lines) == 1 and lines[0].startswith(("FAIL: ", "pdeflow: error: ")), captured
        assert "Traceback" not in lines[0]
        assert str(bad) in lines[0] or damage != "flipped data", lines


def test_compare_bad_command_lines_are_exit_2(tmp_path, capsys):
    golden = str(GOLDEN_RK4)
    for argv in (["compare", golden, str(tmp_path / "missing.h5")], ["compare", golden],
                 ["compare", golden, golden, golden], ["compare", "--order", golden, golden],
                 ["compare", golden, golden, "--rtol", "-1"], ["compare", golden, golden, "--expect", "1"],
                 ["compare", "--order", golden, golden, "--expect", "1", "--rtol", "1e-3"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("pdeflow: error: "), (argv, err)
