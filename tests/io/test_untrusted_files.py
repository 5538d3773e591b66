"""Files from other codes are untrusted input (pdeflow.io.untrusted): stored numbers carry Fletcher-32 checksums that
plain h5py and ``validate`` check, and damaged or hostile files give one line and exit 1 (validate, compare) or 2
(info, diagnose), never a traceback, a hang or a crash; a sample of the fuzz benchmark (benchmarks/fuzz_files.py)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from pdeflow.benchmarks.fuzz_files import answered, mutations, outcome, run_command

from pdeflow.interface.cli import FINITE, main
from pdeflow.io.untrusted import screen
from test_trajectory import new_writer, write_frames

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "data" / "reference" / "particles-rk4.h5"


def written(path: Path, compression: str | None) -> Path:
    writer = new_writer(path, compression=compression)
    write_frames(writer, 0, 3)
    writer.finish("finished", "test")
    return path


def flip_in_chunk(path: Path, dataset: str, row: int) -> None:
    """Change one byte in the middle of the stored chunk that holds ``row`` of ``dataset`` (located by HDF5)."""
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        info = ds.id.get_chunk_info_by_coord((row,) + (0,) * (ds.ndim - 1))
        offset, size = info.byte_offset, info.size
    with open(path, "r+b") as fh:
        fh.seek(offset + size // 2)
        byte = fh.read(1)
        fh.seek(offset + size // 2)
        fh.write(bytes([byte[0] ^ 0x10]))


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pdeflow: error: "), err
    return err[0]


@pytest.mark.parametrize(("compression", "dataset", "row"),
                         [(None, "frames/omega", 1), ("gzip", "frames/omega", 2), (None, "frames/mass", 0),
                          (None, "model/embedding", 1), (None, "data/weights", 0)])
def test_a_byte_flipped_inside_a_stored_frame_or_the_problem_is_an_error_for_h5py_and_validate(
        tmp_path, capsys, compression, dataset, row):
    path = written(tmp_path / "t.h5", compression)
    with h5py.File(path, "r") as f:
        assert f[dataset].fletcher32
        before = f[dataset][()]
    # the writer's test frames carry made-up energies: the schema and the stored bytes are checked, not the numbers
    assert main(["validate", "--no-recompute", str(path)]) == 0
    capsys.readouterr()
    flip_in_chunk(path, dataset, row)
    with h5py.File(path, "r") as f, pytest.raises(OSError):
        f[dataset][()]
    assert main(["validate", str(path)]) == 1
    assert f"/{dataset} cannot be read" in one_line(capsys)
    assert main(["info", str(path)]) == 2
    one_line(capsys)
    assert before.size  # the flipped chunk held stored numbers


def test_resume_and_recovery_keep_the_checksums(tmp_path):
    """A file continued after a reopen, and its recovered copy, still carry Fletcher-32 on every row dataset."""
    from pdeflow.io.recovery import copy_committed
    from pdeflow.io.trajectory_writer import TrajectoryWriter

    path = tmp_path / "t.h5"
    writer = new_writer(path)
    write_frames(writer, 0, 2)
    writer.close()
    writer, _ = TrajectoryWriter.reopen(path)
    write_frames(writer, 2, 4)
    writer.finish("finished", "test")
    copy_committed(path, tmp_path / "copy.h5")
    for p in (path, tmp_path / "copy.h5"):
        with h5py.File(p, "r") as f:
            assert len(f["frames/time"]) == 4
            assert f["frames/omega"].fletcher32 and f["frames/mass"].fletcher32 and f["model/embedding"].fletcher32
        assert screen(p) is None


def test_hostile_declared_sizes_nan_and_attribute_kinds_are_one_line(tmp_path, capsys):
    ref = REPO / "data" / "reference" / "particles-rk4.h5"
    cases = {}
    for name, edit in {
        "huge": lambda f: (f["frames"].__delitem__("omega"),
                           f["frames"].create_dataset("omega", shape=(10**9, 10**6, 64), chunks=(1, 1000, 64),
                                                      dtype="f8")),
        "nan": lambda f: f["model/embedding"].__setitem__((0, 0), np.nan),
        "attribute": lambda f: f["model"].attrs.__setitem__("head_dim", "two"),
        "schema": lambda f: f.attrs.__setitem__("schema", np.arange(3)),
    }.items():
        cases[name] = tmp_path / f"{name}.h5"
        shutil.copy(ref, cases[name])
        with h5py.File(cases[name], "r+") as f:
            edit(f)
    assert "more than this machine allows" in screen(cases["huge"])
    assert screen(cases["nan"], FINITE) == "/model/embedding holds NaN or inf"
    for path in cases.values():
        for command, code in (("validate", 1), ("info", 2), ("compare", 1)):
            argv = [command, str(path)] + ([str(ref)] if command == "compare" else [])
            assert main(argv) == code, (path.name, command)
            printed = capsys.readouterr()
            assert answered(printed.err, printed.out, str(path)), (path.name, command, printed)


def test_a_missing_path_is_bad_input_for_every_file_command(tmp_path, capsys):
    for argv in (["validate", "nope.h5"], ["info", "nope.h5"], ["compare", "nope.h5", "nope.h5"]):
        assert main([argv[0]] + [str(tmp_path / a) for a in argv[1:]]) == 2
        assert "no such file" in one_line(capsys)


def test_a_sample_of_the_fuzz_benchmark(tmp_path):
    """12 mutated copies of a reference file (benchmarks/fuzz_files.py; its record: studies/robustness/FUZZ_FILES.md),
    validate and info on each, compare on every sixth: no traceback, hang or crash; every answer is exit 0, or 1 / 2
    in lines."""
    assert run_command(["compare", str(REFERENCE), str(REFERENCE)], 600) == "ok"   # its kernels compiled (cached)
    counts: dict[str, int] = {}
    for i, (kind, path) in enumerate(mutations(REFERENCE, tmp_path, 12, seed=1)):
        for result in outcome(path, REFERENCE, timeout=300, compare=i % 6 == 0).values():
            counts[result] = counts.get(result, 0) + 1
            assert result in ("ok", "exit 1", "exit 2"), (i, kind, result)
    assert counts.get("exit 1", 0) > 0


def test_a_closed_pipe_ends_the_command_quietly():
    """``pdeflow info FILE | head``: the reader goes away before the command writes (its stdout closed at once):
    no traceback, exit 141 (128 + SIGPIPE)."""
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "pdeflow", "info", str(REFERENCE)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err


def test_the_last_resort_names_a_possible_bug_and_the_debug_switch_shows_it(tmp_path, capsys, monkeypatch):
    """A screened file on which a reader still fails unexpectedly: one line that names the file, the exception, both
    causes (the file, or pdeflow) and PDEFLOW_DEBUG; with PDEFLOW_DEBUG=1 the exception propagates (a bug is not
    hidden)."""
    import pdeflow.interface.cli as cli

    path = written(tmp_path / "t.h5", None)

    def broken(traj):
        raise ZeroDivisionError("a reader's bug")

    monkeypatch.setattr(cli, "format_info", broken)
    monkeypatch.delenv("PDEFLOW_DEBUG", raising=False)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "t.h5" in err[0] and "ZeroDivisionError: a reader's bug" in err[0]
    assert "bug of pdeflow's" in err[0] and "PDEFLOW_DEBUG=1" in err[0]
    monkeypatch.setenv("PDEFLOW_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["info", str(path)])
