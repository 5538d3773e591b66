"""The one table of the trajectory file (pdeflow.io.schema.ITEMS) drives the writer, the reader's checks, ``validate``
and the tables of docs/schema.md: a file missing a required entry fails the reader and ``validate`` with the same
one-line message naming it, the writer writes exactly the table, and the document cannot drift from it."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from pdeflow.core.config import loads_config
from pdeflow.io import schema
from pdeflow.io.checkpoint import Checkpoint, row_counts
from pdeflow.io.file_access import TrajectoryError
from pdeflow.io.reference import validate
from pdeflow.io.resume import RESUMABLE_KEYS
from pdeflow.io.trajectory import open_trajectory
from pdeflow.io.trajectory_writer import TrajectoryWriter
from test_trajectory import frame_scalars, new_writer, problem_arrays, write_frames

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "data" / "reference" / "particles-rk4.h5"
GRID_GOLDEN = ROOT / "data" / "reference" / "grid-fv-entropy.h5"


def _copy(tmp_path: Path, golden: Path = GOLDEN) -> Path:
    path = tmp_path / golden.name
    shutil.copy(golden, path)
    return path


def _reader_error(path: Path) -> str:
    with pytest.raises(TrajectoryError) as info:
        open_trajectory(path)
    return str(info.value)


def _required(golden: Path, kind: str) -> list[str]:
    """The concrete paths of the entries of ``kind`` a file like ``golden`` must have."""
    with h5py.File(golden, "r") as f:
        grid = "density" in f["frames"]
        return [path for it, path in schema._expand(f) if it.kind == kind and it.name != "*"
                and it.need in (schema.REQUIRED, schema.GRID if grid else schema.PARTICLES)
                and path not in ("/.schema", "/.schema_version")]


@pytest.mark.parametrize("golden,path", [(GOLDEN, p) for p in _required(GOLDEN, "dataset")]
                         + [(GRID_GOLDEN, "/checkpoint/slot1/density")])
def test_a_missing_required_dataset_fails_reader_and_validate_with_one_message(tmp_path, golden, path):
    copy = _copy(tmp_path, golden)
    with h5py.File(copy, "r+") as f:
        del f[path]
    message = f"missing dataset {path}"
    assert validate(copy)[0] == message
    error = _reader_error(copy)
    assert error.startswith(f"{copy}: {message}") and "\n" not in error, error


@pytest.mark.parametrize("path", _required(GOLDEN, "attribute") + _required(GRID_GOLDEN, "attribute")[-3:])
def test_a_missing_required_attribute_fails_reader_and_validate_alike(tmp_path, path):
    copy = _copy(tmp_path, GRID_GOLDEN if path.startswith("/frames.") else GOLDEN)
    group, name = path.split(".")
    with h5py.File(copy, "r+") as f:
        del f[group or "/"].attrs[name]
    problem = validate(copy)[0]
    assert path.replace("/.", "root attribute ") in problem or path in problem, problem
    assert _reader_error(copy).startswith(f"{copy}: {problem}")


def test_a_wrong_shape_or_type_is_the_same_line_for_reader_and_validate(tmp_path):
    for change, expected in ((lambda f: (f.__delitem__("data/weights"),
                                         f.create_dataset("data/weights", data=np.ones(3))),
                              "/data/weights must have shape [B = 32], got [3]"),
                             (lambda f: (f.__delitem__("data/tokens"),
                                         f.create_dataset("data/tokens", data=np.zeros((32, 5)))),
                              "/data/tokens must be of integer type, got float64"),
                             (lambda f: (f.__delitem__("frames/omega"),
                                         f.create_dataset("frames/omega", data=np.zeros((2, 3)))),
                              "/frames/omega must have 3 dimensions, got shape [2, 3]")):
        copy = _copy(tmp_path)
        with h5py.File(copy, "r+") as f:
            change(f)
        assert validate(copy)[0] == expected
        assert _reader_error(copy).startswith(f"{copy}: {expected}")


def test_entries_pdeflow_writes_are_needed_by_the_reader_not_by_validate(tmp_path):
    """``pdeflow`` entries (/frames/step, /steps, the config) are what the reader needs; a file from another code
    may omit them and still validates."""
    written = [it for it in schema.ITEMS if it.need == schema.WRITTEN]
    assert {"/frames/step", "/steps", "/steps/time", "/.config"} <= {it.path for it in written}
    for it in written:
        copy = _copy(tmp_path)
        with h5py.File(copy, "r+") as f:
            if it.kind == "attribute":
                del f.attrs[it.name]
            else:
                del f[it.path]
        assert validate(copy) == [], it.path
        assert it.name in _reader_error(copy), it.path


def _file_entries(path: Path) -> dict[str, str]:
    """Every dataset of a file -> its numpy type."""
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__("/" + name, str(obj.dtype))
                     if isinstance(obj, h5py.Dataset) else None)
    return found


@pytest.mark.parametrize("measure", ["particles", "grid"])
def test_the_writer_writes_exactly_the_table(tmp_path, measure):
    """A new file has every entry the table needs for its measure, every dataset it holds is declared (the stepper
    columns under ``/steps/*``), in the declared type; and it passes the reader's and validate's checks."""
    path = tmp_path / "t.h5"
    if measure == "particles":
        w = new_writer(path)
        write_frames(w, 0, 2)
    else:
        density = np.ones((2, 3, 4))
        w = TrajectoryWriter.create(path, loads_config(""), problem_arrays(), {"density": density},
                                    extra_shapes={"stepper": (1,), "accuracy": (2, 2)},
                                    frame_attrs={"lower": -np.ones(3), "upper": np.ones(3), "shape": [2, 3, 4]})
        w.append_steps({"time": np.zeros(1)})
        w.append_frame({"density": density}, frame_scalars(0))
        w.write_checkpoint(Checkpoint(fields={"density": density}, t=0.0, dt=0.1, step=0, n_frames=1, n_steps=1,
                                      extra={"stepper": np.zeros(1), "accuracy": np.zeros((2, 2))}))
    w.close()
    entries = _file_entries(path)
    with h5py.File(path, "r") as f:
        declared = {p: it for it, p in schema._expand(f) if it.kind == "dataset"}
        assert schema.check(f, lambda: row_counts(f), needs=(schema.REQUIRED, schema.WRITTEN)) == []
    assert set(entries) <= set(declared), set(entries) - set(declared)
    for p, dtype in entries.items():
        assert dtype == schema.numpy_dtype(declared[p]), (p, dtype)
    needed = {p for p, it in declared.items() if it.need in (schema.REQUIRED, schema.WRITTEN, measure)}
    assert needed <= set(entries), needed - set(entries)
    assert validate(path) == []


def test_a_row_added_to_the_table_is_written_and_checked(tmp_path, monkeypatch):
    """The table drives both sides: a new required /data dataset is created by the writer from the problem's arrays,
    and a file without it fails validate naming it."""
    extra = schema._data("/data/lengths", ("B",), "int", schema.REQUIRED, "sequence lengths")
    index = schema.ITEMS.index(schema.item("/data/weights")) + 1
    monkeypatch.setattr(schema, "ITEMS", schema.ITEMS[:index] + (extra,) + schema.ITEMS[index:])
    arrays = dict(problem_arrays(), lengths=np.arange(6))
    fields = {"omega": np.zeros((2, 3)), "mass": np.ones(2) / 2}
    w = TrajectoryWriter.create(tmp_path / "t.h5", loads_config(""), arrays, fields)
    w.write_checkpoint(Checkpoint(fields=fields, t=0.0, dt=0.1, step=0, n_frames=0, n_steps=0))
    w.close()
    with h5py.File(tmp_path / "t.h5", "r") as f:
        np.testing.assert_array_equal(f["data/lengths"][()], np.arange(6))
        assert f["data/lengths"].dtype == np.int64
    assert validate(GOLDEN)[0] == "missing dataset /data/lengths"


def test_docs_schema_tables_are_the_table():
    """docs/schema.md holds :func:`pdeflow.io.schema.markdown` verbatim; after a change to the table, regenerate it with
    ``python -m pdeflow.io.schema docs/schema.md``."""
    block = schema.documented_block((ROOT / "docs" / "schema.md").read_text(encoding="utf-8"))
    assert block is not None, "docs/schema.md has no generated schema block"
    assert block == schema.markdown(), \
        "docs/schema.md disagrees with pdeflow.io.schema.ITEMS: python -m pdeflow.io.schema"
    # one row per entry (the top-level groups are the headings)
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert len(rows) == len(schema.ITEMS) - (len(schema.GROUPS) - 1)


def test_every_entry_is_well_formed():
    paths = [it.path for it in schema.ITEMS]
    assert len(paths) == len(set(paths))
    for it in schema.ITEMS:
        assert it.need in schema.NEEDS and it.kind in ("group", "dataset", "attribute"), it
        assert (it.dtype is None) == (it.kind == "group") and (it.shape is None) == (it.kind != "dataset"), it
        assert it.dtype is None or it.dtype in schema.DTYPES, it


def test_docs_list_the_keys_a_resumed_run_may_change():
    """docs/schema.md's resume section names exactly pdeflow.io.resume.RESUMABLE_KEYS."""
    text = (ROOT / "docs" / "schema.md").read_text(encoding="utf-8")
    section = text.split("## Resuming", 1)[1].split("\n## ", 1)[0]
    listed = {tuple(m.split(".")) for m in re.findall(r"`(\w+\.\w+)`", section)} - {("pdeflow", "resume")}
    assert listed == RESUMABLE_KEYS


def test_the_readme_file_table_agrees_with_the_schema_table():
    """README's short table of the file ("`name` [shape]" per group) gives each dataset the table's shape."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The trajectory file", 1)[1].split("\n## ", 1)[0]
    checked = 0
    for group, row in re.findall(r"^\| `/(\w+)` \| (.*) \|$", section, flags=re.M):
        for name, shape in re.findall(r"`(\w+)` \[([^\]]+)\]", row):
            symbols = tuple(s.strip() for s in shape.split(","))
            expected = schema.item(f"/{group}/{name}").shape
            if schema.GRID_AXES in expected:  # written out as n1(,n2,n3)
                symbols, expected = symbols[:1], expected[:1]
            assert symbols == expected, (group, name, shape, expected)
            checked += 1
    assert checked >= 15
