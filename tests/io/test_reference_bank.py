"""The reference data bank (data/reference, data/stationary): every shipped HDF5 file is read by HDF5's own tools,
the golden trajectories carry the current writer's checksums, and data/reference/README.md gives each one its
problem, method, measured accuracy and tolerances. Rerunning each problem and comparing: tests/io/test_reference.py."""
from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import h5py
import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "data").rglob("*.h5"))
REFERENCE = REPO / "data" / "reference"
GOLDEN = sorted(tomllib.loads((REFERENCE / "tolerances.toml").read_text()))


@pytest.mark.skipif(shutil.which("h5dump") is None, reason="h5dump (hdf5-tools) is not installed")
@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(REPO)) for p in SHIPPED])
def test_hdf5s_own_tools_read_every_shipped_file(path):
    for tool in (["h5dump", "-H"], ["h5ls", "-r"]):
        done = subprocess.run([*tool, str(path)], capture_output=True, text=True, timeout=120)
        # the failure on the old files: "h5dump error: internal error" on stderr (and exit 1)
        assert done.returncode == 0 and "error" not in done.stderr.lower(), (tool, done.stderr[-300:])


@pytest.mark.parametrize("name", GOLDEN)
def test_golden_files_carry_checksums_and_a_readme_entry(name):
    with h5py.File(REFERENCE / f"{name}.h5", "r") as f:
        fields = [key for key in ("omega", "mass", "density") if key in f["frames"]]
        assert fields and all(f["frames"][key].fletcher32 for key in fields), name
        assert all(ds.fletcher32 for group in ("model", "data") for ds in f[group].values() if ds.size > 1), name
        f["frames/omega" if "omega" in f["frames"] else "frames/density"][()]   # plain h5py reads every frame
    rows = [line for line in (REFERENCE / "README.md").read_text().splitlines() if line.startswith(f"| `{name}.h5`")]
    assert len(rows) == 1 and rows[0].count("|") == 7, name
    tolerance = tomllib.loads((REFERENCE / "tolerances.toml").read_text())[name]
    rtol, atol = (f"{tolerance[key]:g}".replace("e-0", "e-") for key in ("rtol", "atol"))
    assert f"{rtol} / {atol}" in rows[0], name
