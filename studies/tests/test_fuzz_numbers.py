"""studies.robustness.fuzz_numbers on the tiny run: a few flips of each class, each validated in a child process,
give verdicts and no broken command; its parts find what changed (a flipped stored number) and what did not (a byte
of an unused row of a chunk)."""
from __future__ import annotations

import shutil

import h5py
import numpy as np

from studies.robustness.fuzz_numbers import CLASSES, TINY, changes, dataset_targets, make_file, snapshot, study


def test_the_flip_study_gives_a_verdict_per_flip_and_breaks_nothing(tmp_path):
    record = study(18, seed=3, config=TINY, folder=tmp_path)
    assert sum(record["total"].values()) == 18 and record["bad"] == 0, record["flips_list"]
    for cls in CLASSES:
        assert sum(record["counts"][cls].values()) == 3
    assert record["machine"]["cpu"] and len(record["load_before"]) == 3
    assert any(entry["path"] == "/frames/wall_time" for entry in record["unchecked"])


def test_what_changed_is_read_from_the_file(tmp_path):
    original = make_file(tmp_path, TINY)
    before = snapshot(original)
    energy = next(t for t in dataset_targets(original) if t.item == "/steps/energy" and t.row == 7)
    copy = tmp_path / "copy.h5"
    for offset, expected in ((energy.start, [("/steps/energy", 7)]), (energy.start + 8 * 200, [])):
        shutil.copyfile(original, copy)      # row 7 of the column, then a byte 200 rows beyond its 51 rows
        with open(copy, "r+b") as fh:
            fh.seek(offset)
            byte = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([byte ^ 1]))
        found = changes(before, snapshot(copy))
        assert [(c[0], c[1]) for c in found] == expected
    with h5py.File(original, "r") as f:
        assert f["steps/energy"].shape[0] < 200 and np.isfinite(before["/steps/energy"]).all()
