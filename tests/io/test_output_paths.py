"""One output-path check for every command that writes a file (:func:`pdeflow.interface.cli.check_output_file`) or a
folder (:func:`pdeflow.interface.cli.check_output_folder`): each refusal is exit code 2 with one line, and nothing is
written."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pdeflow.interface.cli import UsageError, check_output_file, check_output_folder, main

REPO = Path(__file__).resolve().parents[2]
# command -> shipped config; every one checks its -o path before any work
COMMANDS = {"run": "quickstart.toml", "chaos": "chaos.toml", "stability": "stability.toml"}
CASES = [  # (id, -o argument, extra arguments, text of the one line)
    ("missing-folder", "no_such_folder/out.h5", [], "does not exist"),
    ("exists", "existing.h5", [], "exists; pass --force to overwrite it"),
    ("a-folder", "a_folder", ["--force"], "is a directory"),
    ("the-config", "{config}", ["--force"], "is the config file"),
]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), os.stat(p).st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case,output,extra,expected", CASES, ids=[c[0] for c in CASES])
def test_every_command_refuses_a_bad_output_path(tmp_path, monkeypatch, capsys, command, case, output, extra,
                                                 expected):
    config = tmp_path / COMMANDS[command]
    shutil.copy(REPO / "data" / "configs" / COMMANDS[command], config)
    (tmp_path / "existing.h5").write_bytes(b"not to be touched")
    (tmp_path / "a_folder").mkdir()
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    code = main([command, config.name, "-o", output.format(config=config.name), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expected in err[0], (code, err)
    assert _snapshot(tmp_path) == before


def test_run_names_resume_in_its_hint_and_resume_may_name_an_existing_file(tmp_path):
    out = tmp_path / "x.h5"
    out.write_bytes(b"")
    with pytest.raises(UsageError, match="pass --force to overwrite it or --resume to continue it"):
        check_output_file(out, resume=False)
    assert check_output_file(out, resume=True) == out
    assert check_output_file(out, force=True) == out
    assert check_output_file(tmp_path / "new.h5") == tmp_path / "new.h5"


def test_the_folder_check(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(UsageError, match="exists and is not a directory"):
        check_output_folder(tmp_path / "file")
    with pytest.raises(UsageError, match="does not exist"):
        check_output_folder(tmp_path / "missing" / "plots")
    assert check_output_folder(tmp_path / "plots") == tmp_path / "plots"
    assert check_output_folder(tmp_path) == tmp_path


@pytest.mark.parametrize("out,expected", [("a_file", "exists and is not a directory"),
                                          ("no_such_folder/results", "does not exist")])
def test_bench_checks_its_output_folder_before_measuring(tmp_path, monkeypatch, capsys, out, expected):
    """``pdeflow bench --out`` goes through the same folder check (exit code 2, one line, nothing written)."""
    (tmp_path / "a_file").write_bytes(b"not to be touched")
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    code = main(["bench", "--preset", "tiny", "--out", out])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and expected in err[0], (code, err)
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["out-gaps.csv", "out.png"])
def test_wfr_refuses_to_overwrite_its_csv_or_figure(tmp_path, monkeypatch, capsys, name):
    """``pdeflow wfr -o out.h5`` also writes out-gaps.csv and out.png: an existing one is overwritten only with
    --force, like the trajectories (checked before any run)."""
    shutil.copy(REPO / "data" / "configs" / "wfr.toml", tmp_path / "wfr.toml")
    (tmp_path / name).write_bytes(b"not to be touched")
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    code = main(["wfr", "wfr.toml", "-o", "out.h5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"'{name}' exists; pass --force" in err[0], (code, err)
    assert _snapshot(tmp_path) == before
