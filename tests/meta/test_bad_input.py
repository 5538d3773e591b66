"""Bad input to the command line: every case exits with code 2 and exactly one line on stderr naming the
problem, never a traceback, and no file in the working folder is created or changed (bytes and mtime
compared, also for an existing output file with --force). Then hypothesis fuzzing of configs through
``pdeflow run``: whatever the values, the answer is a run (0), a one-line refusal (2) or a one-line
numerical failure (3), never an exception.

Configs are tiny (V = 3, T = 3, d = 4, N = 4). Cases for ``diagnose``, ``plot`` and ``compare`` are
included for the subcommands that exist in this pdeflow.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdeflow.core.config import SECTIONS, dumps_toml
from pdeflow.interface.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]
GOOD = {
    "task": {"name": "markov", "vocab_size": 3, "seq_len": 3, "n_samples": 8},
    "model": {"d": 4, "head_dim": 2},
    "init": {"n_particles": 4},
    "solver": {"method": "euler", "dt": 0.01},
    "run": {"t_end": 0.03, "frame_interval": 0.01},
    "diagnostics": {"enabled": False},
}


def config(**changes: dict) -> str:
    """GOOD with ``section={key: value}`` changes (a value None removes the key)."""
    data = {s: dict(v) for s, v in GOOD.items()}
    for section, values in changes.items():
        table = data.setdefault(section, {})
        for key, value in values.items():
            if value is None:
                table.pop(key, None)
            else:
                table[key] = value
    return dumps_toml(data)


TEXT = {"task": {"name": "text", "vocab_size": 0, "path": "corpus.txt"}, "model": {"d": 16}}

# (id, config text or None, extra arguments, where the output goes, text the one line must contain)
# Output: "new" = a file that does not exist (run twice: to a new file, and with --force onto a copy of a
# valid trajectory, which must stay as it was); "own" = the arguments name it.
RUN_CASES = [
    ("malformed-toml", "[task\nname = 1\n", [], "new", "malformed TOML"),
    ("duplicate-table", config() + "[run]\nt_end = 2.0\n", [], "new", "malformed TOML"),
    ("unknown-key", config(run={"t_ends": 2.0}), [], "new", "run.t_ends"),
    ("unknown-section", config() + "[runs]\nt_end = 2.0\n", [], "new", "runs"),
    ("mistyped-key", config(solver={"dtmin": 0.1}), [], "new", "solver.dt_min"),
    ("wrong-type-string", config(model={"d": "4"}), [], "new", "model.d"),
    ("wrong-type-bool", config(task={"exact": 1}), [], "new", "task.exact"),
    ("zero-dt", config(solver={"dt": 0.0}), [], "new", "solver.dt"),
    ("no-particles", config(init={"n_particles": 0}), [], "new", "init.n_particles"),
    ("negative-t_end", config(run={"t_end": -1.0}), [], "new", "run.t_end"),
    ("nan-t_end", config(run={"t_end": float("nan")}), [], "new", "run.t_end"),
    ("unknown-method", config(solver={"method": "leapfrog"}), [], "new", "solver.method"),
    ("onehot-d-below-V", config(task={"vocab_size": 8}), [], "new", "model.embedding"),
    ("lookback-lag-too-long", config(task={"name": "lookback", "lag": 3}), [], "new", "task.lag"),
    ("onehot-positions-too-narrow", config(model={"positions": "onehot"}, task={"seq_len": 4}), [], "new",
     "model.d"),
    ("enumeration-too-large", config(task={"exact": True, "vocab_size": 8, "seq_len": 8}, model={"d": 8}), [],
     "new", "exact enumeration"),
    ("frame-interval-above-t_end", config(run={"frame_interval": 1.0}), [], "new", "run.frame_interval"),
    ("too-many-frames", config(run={"frame_interval": 1e-12}), [], "new", "run.frame_interval"),
    ("grid-with-a-particle-method", config(init={"measure": "grid"}, model={"coordinates": "gain2"}), [], "new",
     "init.measure"),
    ("init-mean-wrong-length", config(init={"mean": [1.0, 2.0]}), [], "new", "init.mean"),
    ("out-of-memory", config(init={"n_particles": 10**9}), [], "new", "does not fit in memory"),
    ("too-many-particles", config(init={"n_particles": 10**12}), [], "new", "init.n_particles must be <="),
    ("text-file-missing", config(task={**TEXT["task"], "path": "missing.txt"}), [], "new", "missing.txt"),
    ("text-file-unreadable", config(task={**TEXT["task"], "path": "a_folder"}), [], "new", "cannot be read"),
    ("text-file-not-utf8", config(task={**TEXT["task"], "path": "latin1.txt"}), [], "new", "not valid UTF-8"),
    ("basis-file-missing", config(model={"coordinates": "basis_file", "basis_path": "missing.npz"}), [], "new",
     "model.basis_path"),
    ("basis-file-not-npz", config(model={"coordinates": "basis_file", "basis_path": "not_npz.npz"}), [], "new",
     "model.basis_path"),
    ("basis-wrong-shape", config(model={"coordinates": "basis_file", "basis_path": "wrong_shape.npz"}), [], "new",
     "model.basis_path"),
    ("basis-pickled-objects", config(model={"coordinates": "basis_file", "basis_path": "pickled.npz"}), [],
     "new", "model.basis_path"),
    ("sgd-noise-without-beta", config(solver={"method": "sgd"}, sgd={"noise": True}), [], "new", "sgd.noise"),
    ("set-without-equals", config(), ["--set", "run.t_end"], "new", "section.key=value"),
    ("set-unknown-key", config(), ["--set", "run.bogus=1"], "new", "run.bogus"),
    ("set-bad-value", config(), ["--set", "run.t_end=abc"], "new", "run.t_end"),
    ("output-in-missing-folder", config(), ["-o", "no_such_folder/out.h5"], "own", "does not exist"),
    ("output-exists-without-force", config(), ["-o", "existing.h5"], "own", "exists"),
    ("output-is-a-folder", config(), ["-o", "a_folder", "--force"], "own", "is a directory"),
    ("output-is-the-config", config(), ["-o", "{config}", "--force"], "own", "is the config file"),
    ("resume-missing-file", config(), ["-o", "none.h5", "--resume"], "own", "does not exist"),
    ("resume-other-config", config(solver={"dt": 0.02}), ["-o", "existing.h5", "--resume"], "own",
     "solver.dt differs"),
    ("resume-and-force", config(), ["-o", "existing.h5", "--resume", "--force"], "own", "exclude each other"),
    ("resume-foreign-hdf5", config(), ["-o", "foreign.h5", "--resume"], "own", "not a pdeflow trajectory"),
    ("resume-truncated", config(), ["-o", "half.h5", "--resume"], "own", "not a readable HDF5 file"),
    ("resume-wrong-version", config(), ["-o", "version2.h5", "--resume"], "own", "schema version 2"),
    ("resume-changed-text-file", config(**TEXT), ["-o", "text_run.h5", "--resume"], "own", "'tokens' array"),
]
BAD_FILES = ["notes.txt", "empty.h5", "foreign.h5", "half.h5", "version2.h5", "forged.h5", "wrong_shapes.h5",
             "bad_config.h5", "a_folder", "missing.h5"]
OTHER_CASES = [
    ("run-without-config", ["run"], "required"),
    ("unknown-option", ["run", "good.toml", "--bogus"], "unrecognized arguments"),
    ("unknown-command", ["frobnicate"], "invalid choice"),
    ("config-missing", ["run", "missing.toml"], "does not exist"),
    ("config-is-a-folder", ["run", "a_folder"], "cannot be read"),
    ("config-not-utf8", ["run", "latin1.toml"], "cannot be read"),
    *[(f"info-{name}", ["info", name], name) for name in BAD_FILES],
]


def subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(action.choices)


# The analysis commands, for the subcommands this pdeflow has. A check command (compare) that reads a file that is not
# a valid trajectory answers with a failed check, exit 1 (pdeflow.core.exit_codes); a path that does not exist is 2.
CHECK_CASES = []
for _cmd in ("diagnose", "plot", "compare"):
    if _cmd in subcommands():
        for _name in ("notes.txt", "foreign.h5", "half.h5", "version2.h5", "forged.h5"):
            _argv = [_cmd, _name, "existing.h5"] if _cmd == "compare" else [_cmd, _name]
            (CHECK_CASES if _cmd == "compare" else OTHER_CASES).append((f"{_cmd}-{_name}", _argv, _name))
        if _cmd == "compare":
            CHECK_CASES.append(("compare-second-bad", ["compare", "existing.h5", "half.h5"], "half.h5"))
            OTHER_CASES.append(("compare-missing", ["compare", "missing.h5", "existing.h5"], "no such file"))
            OTHER_CASES.append(("compare-one-file", ["compare", "existing.h5"], "takes two files"))


def test_the_table_is_large_enough():
    assert len(RUN_CASES) + len(OTHER_CASES) >= 30


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder with the configs, data files, a valid trajectory and damaged ones."""
    d = tmp_path_factory.mktemp("bad_input")
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    cwd = os.getcwd()
    os.chdir(d)
    try:
        Path("good.toml").write_text(config())
        assert main(["run", "good.toml", "-o", "existing.h5", "--quiet"]) == 0
        Path("corpus.txt").write_text("abracadabra, a cabal: abacab!\n" * 3)
        Path("text.toml").write_text(config(**TEXT))
        assert main(["run", "text.toml", "-o", "text_run.h5", "--quiet"]) == 0
        Path("corpus.txt").write_text("cabal abacab: abracadabra, a!\n" * 3)   # same characters, other text
        Path("a_folder").mkdir()
        Path("latin1.txt").write_bytes("caf\xe9 cr\xe8me br\xfbl\xe9e".encode("latin-1"))
        Path("latin1.toml").write_bytes(b"[task]\nname = \"caf\xe9\"\n")
        Path("notes.txt").write_text("not a trajectory\n")
        Path("empty.h5").write_bytes(b"")
        p = 4 * 4 * 2
        np.savez("not_npz.npz", basis=np.ones((p, 2)))
        Path("not_npz.npz").write_bytes(b"PK but not a zip")
        np.savez("wrong_shape.npz", basis=np.ones((p - 1, 2)))
        np.savez("pickled.npz", basis=np.array([{"a": 1}, None], dtype=object))
        with h5py.File("foreign.h5", "w") as f:
            f["x"] = np.arange(3)
        data = Path("existing.h5").read_bytes()
        Path("half.h5").write_bytes(data[:len(data) // 2])
        for name, damage in (("version2.h5", "version"), ("forged.h5", "groups"), ("wrong_shapes.h5", "shapes"),
                             ("bad_config.h5", "config")):
            shutil.copy("existing.h5", name)
            with h5py.File(name, "r+") as f:
                if damage == "version":
                    f.attrs["schema_version"] = 2
                elif damage == "groups":
                    for group in ("model", "data", "frames", "steps", "checkpoint"):
                        del f[group]
                    for group in ("model", "data", "frames", "steps"):
                        f.create_group(group)
                elif damage == "shapes":
                    del f["data/weights"]
                    f["data/weights"] = np.ones((2, 2))
                else:
                    f.attrs["config"] = "[task]\nname = 'nonsense'\n"
    finally:
        os.chdir(cwd)
        numba.set_num_threads(previous)
    return d


def snapshot(d: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else (b"", 0)
            for p in sorted(d.rglob("*"))}


def run_in(argv: list[str], folder: Path, capsys) -> tuple[int, object]:
    """``pdeflow argv`` run in ``folder``: its exit code and what it printed."""
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        got = main(argv)
    finally:
        os.chdir(cwd)
    return got, capsys.readouterr()


def refused(argv: list[str], folder: Path, capsys, code: int = 2) -> str:
    """Run ``pdeflow argv`` in ``folder``; check ``code``, one line on stderr, no file created or changed."""
    before = snapshot(folder)
    got, captured = run_in(argv, folder, capsys)
    lines = captured.err.strip().splitlines()
    assert got == code, captured
    assert len(lines) == 1 and lines[0].startswith("pdeflow: error: ") and "Traceback" not in captured.err, captured
    after = snapshot(folder)
    assert sorted(after) == sorted(before), set(after) ^ set(before)
    assert after == before, [k for k in before if before[k] != after[k]]
    return lines[0]


@pytest.mark.parametrize("name,text,extra,output,expected", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_run_refuses_bad_input(folder, capsys, name, text, extra, output, expected):
    cfg = folder / f"case-{name}.toml"
    cfg.write_text(text)
    extra = [a.replace("{config}", cfg.name) for a in extra]
    targets = [["-o", "new.h5"], ["-o", "existing.h5", "--force"]] if output == "new" else [[]]
    for target in targets:
        line = refused(["run", cfg.name, "--quiet", *extra, *target], folder, capsys)
        assert expected in line, line


@pytest.mark.parametrize("name,argv,expected", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_commands_refuse_bad_input(folder, capsys, name, argv, expected):
    line = refused(argv, folder, capsys)
    assert expected in line, line


@pytest.mark.parametrize("name,argv,expected", CHECK_CASES, ids=[c[0] for c in CHECK_CASES])
def test_a_check_command_answers_a_bad_file_with_a_failed_check(folder, capsys, name, argv, expected):
    """Exit 1 and one line naming the file: on stderr when the screen of untrusted files refuses it, on stdout
    ("FAIL: ...") when the file reads back intact and the check itself fails; no file created or changed."""
    before = snapshot(folder)
    got, captured = run_in(argv, folder, capsys)
    lines = (captured.out + captured.err).strip().splitlines()
    assert got == 1 and len(lines) == 1 and "Traceback" not in lines[0], captured
    assert lines[0].startswith(("FAIL: ", "pdeflow: error: ")) and expected in lines[0], lines
    assert snapshot(folder) == before


@pytest.mark.parametrize("case,argv,expected", [
    ("malformed-toml", ["run", "case-malformed-toml.toml", "-o", "new.h5"], "malformed TOML"),
    (None, ["info", "half.h5"], "half.h5"),
    ("resume-other-config", ["run", "case-resume-other-config.toml", "-o", "existing.h5", "--resume"],
     "solver.dt differs"),
], ids=["malformed", "truncated", "resume-other-config"])
def test_the_real_process_prints_one_line(folder, case, argv, expected):
    """The same through ``python -m pdeflow`` (warnings, imports and interpreter exit included). The config of the
    case is written here, so the test does not depend on which test of the module ran before it (pytest-xdist)."""
    if case is not None:
        (folder / f"case-{case}.toml").write_text(next(c[1] for c in RUN_CASES if c[0] == case))
    before = snapshot(folder)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pdeflow", *argv], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert snapshot(folder) == before


# ---- fuzzing ------------------------------------------------------------------------------------------

def _keys() -> list[tuple[str, str, str, tuple]]:
    """(section, key, type name, choices) of every config key."""
    import dataclasses
    return [(s, f.name, str(f.type), tuple(f.metadata["choices"] or ())) for s, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)]


EDGE_FLOATS = [0.0, -1.0, 1e-300, 1e-9, 0.01, 0.5, 1.0, 3.0, 1e300, float("inf"), float("nan")]
any_value = st.one_of(st.integers(min_value=-2, max_value=5), st.sampled_from(EDGE_FLOATS), st.booleans(),
                      st.text(max_size=5), st.lists(st.sampled_from([0.0, 1.0, -1.0]), max_size=3))


def value_for(key: tuple[str, str, str, tuple]) -> st.SearchStrategy:
    """Mostly values of the key's own type (small and edge values, its choices), sometimes anything."""
    _, name, kind, choices = key
    typed = {"int": st.integers(min_value=-1, max_value=5), "float": st.sampled_from(EDGE_FLOATS),
             "bool": st.booleans(), "list": st.lists(st.sampled_from(EDGE_FLOATS[:8]), max_size=4),
             "str": (st.sampled_from(choices) if choices
                     else st.sampled_from(["", "corpus.txt", "basis.npz", "x/y"]))}[kind]
    return st.one_of(typed, typed, typed, any_value)


mutations = st.lists(st.sampled_from(_keys()).flatmap(lambda k: st.tuples(st.just(k), value_for(k))),
                     min_size=1, max_size=4)


@pytest.fixture(scope="module")
def fuzz_folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    (d / "corpus.txt").write_text("abracadabra\n" * 4)
    np.savez(d / "basis.npz", basis=np.eye(32)[:, :2])
    return d


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(changes=mutations)
def test_fuzzed_configs_never_raise(fuzz_folder, capsys, changes):
    data = {s: dict(v) for s, v in GOOD.items()}
    for (section, key, _, _), value in changes:
        data.setdefault(section, {})[key] = value
    if data["task"].get("name") == "text":
        data["task"].setdefault("path", "corpus.txt")
    if data["model"].get("coordinates") == "basis_file":
        data["model"].setdefault("basis_path", "basis.npz")
    try:
        text = dumps_toml(data)
    except TypeError:
        return   # a value TOML cannot express
    cfg, out = fuzz_folder / "fuzz.toml", fuzz_folder / "fuzz.h5"
    cfg.write_text(text)
    out.unlink(missing_ok=True)
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        # a valid config runs at most 3 steps; a bad one is refused before any file exists
        code = main(["run", str(cfg), "-o", str(out), "--quiet", "--set", "run.max_steps=3",
                     "--set", "run.wall_time_limit=5.0", "--set", "diagnostics.enabled=false"])
    finally:
        numba.set_num_threads(previous)
    captured = capsys.readouterr()
    assert code in (0, 2, 3), (code, text, captured)
    if code != 0:
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in captured.err, (text, captured.err)
    if code == 2:
        assert not out.exists() and not (fuzz_folder / "fuzz.h5.partial").exists()
