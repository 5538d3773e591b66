"""``pdeflow validate`` checks every stored number it can (pdeflow.interface.recompute): a changed copy, a broken
relation between stored numbers, or a number that disagrees with its recomputation from the frame's checksummed
fields makes it exit 1 naming the dataset and the frame or row; what it cannot check it lists as unchecked."""
from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from pdeflow.interface.cli import main
from pdeflow.interface.recompute import RECOMPUTE_ULPS, recheck, tolerance

REPO = Path(__file__).resolve().parents[2]
FULL = REPO / "data" / "configs" / "full.toml"   # the quickstart of issue 52 (k = 256 per head)
TINY = REPO / "data" / "configs" / "tiny.toml"


def flip_bit(path: Path, dataset: str, row: int, bit: int) -> None:
    """XOR bit ``bit`` (0: the lowest of the mantissa, 52: the lowest of the exponent) of the float64 ``row`` of an
    unfiltered chunked column, in the file's bytes (as a damaged disk would)."""
    with h5py.File(path, "r") as f:
        ds = f[dataset]
        assert ds.compression is None and not ds.fletcher32
        offset = ds.id.get_chunk_info_by_coord((row,)).byte_offset + (row % ds.chunks[0]) * 8
    with open(path, "r+b") as fh:
        fh.seek(offset)
        value = struct.unpack("<Q", fh.read(8))[0] ^ (1 << bit)
        fh.seek(offset)
        fh.write(struct.pack("<Q", value))


def validate(path: Path, capsys) -> tuple[int, str]:
    code = main(["validate", str(path)])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The documentation's tiny run with its analysis (clusters, spectral record; the gap by diagnose)."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.h5"
    assert main(["run", str(TINY), "-o", str(path), "--quiet"]) == 0
    assert main(["diagnose", str(path)]) == 0
    return path


@pytest.fixture
def copy(tiny, tmp_path) -> Path:
    path = tmp_path / "copy.h5"
    shutil.copyfile(tiny, path)
    return path


def test_the_bit_that_doubles_the_first_energy_of_the_full_problem_is_found_and_named(tmp_path, capsys):
    """Issue 52, finding 4: one flipped bit of /frames/energy (E(0) = 2.1096 -> 4.2192) was called valid."""
    path = tmp_path / "full.h5"
    assert main(["run", str(FULL), "-o", str(path), "--quiet", "--set", "run.t_end=0.4",
                 "--set", "run.frame_interval=0.2"]) == 0
    capsys.readouterr()
    assert validate(path, capsys)[0] == 0
    with h5py.File(path, "r") as f:
        before = f["frames/energy"][0]
    flip_bit(path, "frames/energy", 0, 52)
    with h5py.File(path, "r") as f:
        after = f["frames/energy"][0]
    assert before == pytest.approx(2.1096, abs=1e-4) and after == 2 * before
    code, out = validate(path, capsys)
    assert code == 1
    named = [line for line in out.splitlines() if "frame 0 " in line and "/frames/energy = " in line]
    assert named and any("recomputation" in line for line in named) and any("/steps/energy[0]" in line
                                                                             for line in named), out


def test_a_run_as_written_is_valid_and_its_unchecked_numbers_are_listed(tiny, capsys):
    code, out = validate(tiny, capsys)
    assert code == 0 and out.rstrip().endswith("valid pdeflow trajectory (schema version 1)")
    unchecked = "\n".join(line for line in out.splitlines() if ": unchecked: " in line)
    for named in ("/frames/wall_time", "/steps/risk", "/.pdeflow_version", "/analysis/minimizer"):
        assert named in unchecked
    assert "checked: /frames/energy, dissipation and /steps/risk at frames: recomputed" in out


def test_the_lowest_mantissa_bit_of_a_step_energy_between_frames_breaks_the_identity_defect(copy, capsys):
    """No copy of /steps/energy[13] exists and no frame is there: the defects of steps 13 and 14, recomputed from the
    stored energies, tie it down to the last bit."""
    flip_bit(copy, "steps/energy", 13, 0)
    code, out = validate(copy, capsys)
    assert code == 1
    assert "/steps row 13 (t = 1.3): identity_defect" in out and "/steps row 14 (t = 1.4): identity_defect" in out


@pytest.mark.parametrize(("dataset", "row", "said"), [
    ("steps/time", 7, "/steps row 7 (t = 0.7"),                                 # dt[7] and dt[8] disagree
    ("steps/dt", 7, "/steps row 7 (t = 0.7): /steps/dt"),
    ("steps/dissipation_integral", 33, "/steps row 33 (t = 3.3): identity_defect"),
    ("frames/dissipation", 4, "frame 4 (t = 4): /frames/dissipation"),
    ("frames/time", 2, "frame 2: /frames/time"),
    ("steps/risk", 20, "frame 2 (t = 2): /steps/risk[20]"),                       # recomputed: a high bit
])
def test_a_flipped_bit_of_each_checked_column_is_named(copy, capsys, dataset, row, said):
    flip_bit(copy, dataset, row, 40 if dataset == "steps/risk" else 3)
    code, out = validate(copy, capsys)
    assert code == 1 and said in out, out


def test_the_same_change_to_every_copy_of_an_energy_is_found_by_the_recomputation(copy, capsys):
    """Frame 2's energy changed by 1e-9 relative in /frames, /steps and /analysis alike: the copies agree, the
    energy-identity defects of the steps around it move, and the recomputation from the frame's fields disagrees."""
    with h5py.File(copy, "r+") as f:
        value = f["frames/energy"][2] * (1 + 1e-9)
        for name, row in (("frames/energy", 2), ("steps/energy", 20), ("analysis/energy", 2)):
            f[name][row] = value
    found = recheck(copy)
    said = [p for p in found.problems if p.startswith("frame 2 (t = 2): /frames/energy")]
    assert said and "recomputation" in said[0]


def test_a_change_below_the_tolerance_of_a_recomputed_single_copy_is_listed_as_unseen(tiny):
    """/steps/risk at a frame has no copy: it is recomputed to RECOMPUTE_ULPS eps, and validate says so."""
    found = recheck(tiny)
    entry = next(u for u in found.unchecked if u.path == "/steps/risk" and u.relative > 0)
    assert entry.rows == (0, 10, 20, 30, 40, 50) and entry.relative == tolerance("float64")
    assert tolerance("float64") == RECOMPUTE_ULPS * np.finfo(float).eps


def _slot(f: h5py.File, active: bool) -> str:
    a = int(f["checkpoint/active"][()])
    return f"slot{a if active else 1 - a}"


@pytest.mark.parametrize(("edit", "said"), [
    (lambda f: f[f"checkpoint/{_slot(f, False)}/t"].write_direct(np.array(4.5)), "do not match its SHA-256"),
    (lambda f: f["checkpoint/active"].write_direct(np.array(7)), "/checkpoint/active = 7"),
    (lambda f: f.attrs.modify("final_time", 4.0), "root attribute final_time = 4"),
    (lambda f: f.attrs.modify("max_identity_defect", 1e-3), "root attribute max_identity_defect"),
    (lambda f: f["analysis/mean_phi"].write_direct(np.full(6, 0.5)), "/analysis/mean_phi = 0.5"),
    (lambda f: f["analysis/energy"].write_direct(np.full(6, 1.0)), "/analysis/energy = 1 but /frames/energy"),
    (lambda f: f["analysis"].attrs.modify("e_star_high", 1.0), "/analysis.e_star_high = 1"),
    (lambda f: f["analysis/cluster_mass"].write_direct(np.full(6, 0.2)), "/analysis/cluster_mass differs"),
    (lambda f: f["analysis"].attrs.modify("run_grad_equivalents", 199.0), "/analysis.run_grad_equivalents"),
    (lambda f: f["steps"].attrs.modify("identity_tol", 0.25), "attribute /steps.identity_tol = 0.25"),
    (lambda f: f["analysis/spectrum_lowest_ritz"].write_direct(np.full(3, 0.5)),
     "the spectral record holds spectrum_lowest_ritz where I > spectrum_near I(0)"),
])
def test_checkpoints_attributes_and_the_analysis_are_checked(copy, capsys, edit, said):
    with h5py.File(copy, "r+") as f:
        edit(f)
    code, out = validate(copy, capsys)
    assert code == 1 and said in out, out


def test_a_non_finite_stored_energy_is_named_in_one_line_each_and_nothing_else_is_printed(copy):
    """The fuzz of issue 52: bit 6 of /steps/energy[14]'s top byte made it NaN, and numpy's warning about the
    residuals computed from it reached stderr beside validate's lines."""
    flip_bit(copy, "steps/energy", 14, 62)  # 1.0959 -> a signalling NaN, on which numpy's arithmetic warns
    # the command itself: pytest would catch the warning in-process
    proc = subprocess.run([sys.executable, "-m", "pdeflow", "validate", str(copy)], capture_output=True, text=True)
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 1 and err == "", err
    assert "/steps row 14 (t = 1.4): identity_defect" in out and "/steps row 15 (t = 1.5): identity_defect" in out


def test_which_slot_is_active_is_listed_as_unchecked_when_both_commit_the_same_step(copy, capsys):
    """A finished run commits its last step to both slots: /checkpoint/active naming the other one changes no state a
    resume reads, so validate cannot call it wrong - and says so rather than claiming it checked."""
    with h5py.File(copy, "r+") as f:
        steps = {int(f[f"checkpoint/slot{i}/step"][()]) for i in (0, 1)}
        f["checkpoint/active"][()] = 1 - int(f["checkpoint/active"][()])
    assert len(steps) == 1
    code, out = validate(copy, capsys)
    assert code == 0 and f"unchecked: /checkpoint/active: both slots commit step {steps.pop()}" in out


def test_validate_without_recomputing_says_so(copy, capsys):
    with h5py.File(copy, "r+") as f:
        f["analysis/energy"][0] = 1.0
    assert main(["validate", "--no-recompute", str(copy)]) == 0
    assert "unchecked: the stored numbers were not recomputed (--no-recompute)" in capsys.readouterr().out


@pytest.mark.parametrize(("section", "key", "value", "said"), [
    ("model", "beta", 20.0, "attribute /model.beta = inf, but the config has model.beta = 20"),
    ("model", "precision", "float32", "attribute /model.precision = 'float64'"),
    ("model", "weight_decay", 0.06, "builds another problem than /model and /data (weight_decay differs)"),
    ("init", "scale", 0.6, "frame 0: /frames/omega is not the initial measure"),
    ("task", "n_samples", 300, None),     # not read with task.exact = true: listed as such
])
def test_a_changed_config_key_is_found_or_listed_as_unread(copy, section, key, value, said):
    from pdeflow.core.config import loads_config

    with h5py.File(copy, "r") as f:
        text = f.attrs["config"]
    with h5py.File(copy, "r+") as f:
        f.attrs["config"] = loads_config(text).replace(**{section: {key: value}}).to_toml()
    found = recheck(copy)
    if said is None:
        assert not found.problems and any(u.path == f"/.config:{section}.{key}" and "does not read it" in u.why
                                          for u in found.unchecked)
    else:
        assert any(said in p for p in found.problems), found.problems
