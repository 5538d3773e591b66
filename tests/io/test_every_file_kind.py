"""Every file pdeflow writes is readable by pdeflow: one of each kind written by the real commands on tiny configs
(a trajectory with /analysis, the WFR pair, a stationary point, rates at a minimum, Dirac stability, chaos), each
summarised by ``pdeflow info`` and called valid by ``pdeflow validate``; a file missing an entry of its table
(pdeflow.io.result_schema), or whose /analysis departs from its declared layout (pdeflow.io.schema), is not."""
from __future__ import annotations

import shutil

import h5py
import pytest

from pdeflow.interface.cli import main
from pdeflow.io.result_schema import CHAOS, KINDS, RATES, STABILITY, STATIONARY, markdown
from test_chaos import tiny_config, write_config
from test_stability import TINY

pytestmark = pytest.mark.usefixtures("one_numba_thread")

RUN = ["--set", "init.n_particles=2", "--set", "init.seed=3", "--set", "run.t_end=2.0", "--set", "run.n_frames=3",
       "--set", "diagnostics.gap=false"]


def info_and_validate(path, capsys, kind_line: str) -> None:
    capsys.readouterr()
    assert main(["info", str(path)]) == 0
    assert kind_line in capsys.readouterr().out
    assert main(["validate", str(path)]) == 0
    assert "valid" in capsys.readouterr().out


def test_info_and_validate_accept_every_kind_of_file_pdeflow_writes(tmp_path, capsys):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    files = {}
    traj = files["trajectory"] = tmp_path / "run.h5"
    assert main(["run", str(config), "-o", str(traj), "--quiet", *RUN, "--set", "diagnostics.enabled=true"]) == 0
    with h5py.File(traj, "r") as f:
        assert "analysis" in f
    info_and_validate(traj, capsys, "frames")

    files[STATIONARY] = tmp_path / "minimum.h5"
    assert main(["stationary", str(traj), "--kind", "minimum", "-o", str(files[STATIONARY]), "--quiet"]) == 0
    files[RATES] = tmp_path / "rates.h5"
    assert main(["stability", "--stationary", str(files[STATIONARY]), "-o", str(files[RATES]), "--random", "0",
                 "--quiet", "--no-plots"]) == 0
    files[STABILITY] = tmp_path / "stability.h5"
    assert main(["stability", str(config), "-o", str(files[STABILITY]), "--quiet", "--no-plots"]) == 0
    files[CHAOS] = tmp_path / "chaos.h5"
    assert main(["chaos", str(write_config(tmp_path, tiny_config())), "-o", str(files[CHAOS]), "--quiet"]) == 0
    for kind in (STATIONARY, RATES, STABILITY, CHAOS):
        with h5py.File(files[kind], "r") as f:
            assert f.attrs["schema"] == kind.schema
        info_and_validate(files[kind], capsys, "stationary" if kind is STATIONARY else kind.schema)

    wfr = tmp_path / "wfr.toml"
    wfr.write_text(TINY + '\n[solver]\nmethod = "wfr"\ngamma = 1.0\ndt = 0.05\n')
    assert main(["wfr", str(wfr), "-o", str(tmp_path / "wfr.h5"), "--quiet", "--no-plots", *RUN]) == 0
    for path in (tmp_path / "wfr.h5", tmp_path / "wfr-w2.h5"):
        info_and_validate(path, capsys, "frames")

    # /analysis has a declared layout: a per-frame array of another rank, or an attribute of another type, is caught
    for path, edit in (("/analysis/energy", "reshape"), ("/analysis.kl_points", "retype")):
        copy = tmp_path / f"analysis-{edit}.h5"
        shutil.copy(traj, copy)
        with h5py.File(copy, "r+") as f:
            if edit == "reshape":
                values = f["analysis/energy"][()]
                del f["analysis/energy"]
                f["analysis/energy"] = values.reshape(values.shape + (1,))
            else:
                f["analysis"].attrs["kl_points"] = "three"
        capsys.readouterr()
        assert main(["validate", str(copy)]) == 1
        assert path in capsys.readouterr().out

    # validate checks each table: a required dataset removed, or one of another shape, is one line and exit 1
    for kind in (STATIONARY, RATES, STABILITY, CHAOS):
        required = next(it for it in kind.items if it.kind == "dataset" and it.need == "required")
        for edit in ("delete", "reshape"):
            copy = tmp_path / f"{kind.group.strip('/')}-{edit}.h5"
            shutil.copy(files[kind], copy)
            with h5py.File(copy, "r+") as f:
                values = f[required.path][()]
                del f[required.path]
                if edit == "reshape":
                    f[required.path] = values.reshape(values.shape + (1,))
            capsys.readouterr()
            assert main(["validate", str(copy)]) == 1
            assert required.path in capsys.readouterr().out


def test_docs_schema_lists_every_result_file():
    from pathlib import Path

    from pdeflow.io.result_schema import BEGIN, END

    text = (Path(__file__).resolve().parents[2] / "docs" / "schema.md").read_text()
    assert text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n" == markdown(), \
        "docs/schema.md is stale: python -m pdeflow.io.result_schema docs/schema.md"
    for kind in KINDS:
        assert kind.schema in text
