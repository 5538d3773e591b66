"""Every figure and the animation of pdeflow.analysis.plots.plotting are written, headless, as non-blank images, for
particle runs (k = 1, 2 and 56) and grid runs (k = 1, 2, 3); the ``pdeflow plot`` command and its bad input."""
from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib import animation
from PIL import Image

from pdeflow.analysis import diagnostics as D
from pdeflow.analysis.plots import plotting as P
from pdeflow.core.config import DiagnosticsConfig
from pdeflow.interface.cli import main
from pdeflow.io.trajectory import open_trajectory
from test_diagnostics import one_numba_thread, run_config, write_grid_file  # noqa: F401 (autouse fixture)

REPO = Path(__file__).resolve().parents[2]
PARTICLE_FIGURES = {"energy.png", "identity.png", "gap.png", "pl.png", "kl.png", "particles.png", "attention.png",
                    "measure.gif"}


def assert_image(path: Path, frames: int | None = None) -> None:
    """A readable, non-empty image that is not a single colour (and has ``frames`` frames, for a GIF)."""
    assert path.exists() and path.stat().st_size > 1000, path
    with Image.open(path) as im:
        assert im.format == ("GIF" if path.suffix == ".gif" else "PNG")
        lo, hi = im.convert("L").getextrema()
        assert lo < hi, f"{path} is blank"
        if frames is not None:
            assert im.n_frames == frames


@pytest.fixture(scope="module")
def particle_file(tmp_path_factory) -> Path:
    """Full coordinates (k = 56): the particle figure uses principal axes."""
    tmp = tmp_path_factory.mktemp("particles")
    _, path = run_config(tmp, "full", on_finish=functools.partial(D.analyse_run, gap=True), init={"n_particles": 6},
                         run={"t_end": 1.0, "frame_interval": 0.25}, diagnostics={"gap_frames": 2, "n_starts": 2})
    # k = 56: the gap is an estimate and this short tail does not determine its limit, so E* is given (the
    # PL and KL figures need one)
    traj = open_trajectory(path)
    e_star = float(np.min(traj.frames["energy"])) - 1e-2
    D.write_analysis(path, D.analyse(traj, DiagnosticsConfig(gap_frames=2, n_starts=2, e_star=e_star)))
    return path


def test_every_particle_figure_and_the_gif_are_written(particle_file, tmp_path):
    traj = open_trajectory(particle_file)
    analysis = D.read_analysis(traj)
    written = P.plot_all(traj, analysis, tmp_path, fps=4)
    assert {p.name for p in written} >= PARTICLE_FIGURES
    for path in written:
        assert_image(path, frames=len(traj.time) if path.suffix == ".gif" else None)
    # an MP4 beside the GIF exactly where ffmpeg exists
    assert any(p.suffix == ".mp4" for p in written) == animation.FFMpegWriter.isAvailable()


@pytest.mark.parametrize("coordinates", ["output_gain", "gain2"])
def test_particle_figure_in_one_and_two_coordinates(coordinates, tmp_path):
    _, path = run_config(tmp_path, coordinates, model={"coordinates": coordinates}, init={"n_particles": 5},
                         run={"t_end": 0.5, "frame_interval": 0.25})
    traj = open_trajectory(path)
    analysis = D.analyse(traj, DiagnosticsConfig(gap_frames=1, grid_points=8, n_starts=1, radius=2.0))
    assert_image(P.plot_particles(traj, analysis, tmp_path / "p.png"))
    gif = P.animate_measure(traj, tmp_path / "m.gif", mp4=False)
    assert len(gif) == 1
    assert_image(gif[0], frames=len(traj.time))
    if coordinates == "gain2":
        origin, axes, labels = P.projection(traj)
        assert np.array_equal(axes, np.eye(2)) and labels == [r"$\omega_0$", r"$\omega_1$"]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_grid_density_heat_maps_and_animation(k, tmp_path):
    """k = 2 gets every figure; k = 1 (a curve) and k = 3 (a marginal) the density figure and the movie."""
    path = write_grid_file(tmp_path / f"grid{k}.h5", k=k, n=8)
    traj = open_trajectory(path)
    if k == 2:
        analysis = D.analyse(traj, DiagnosticsConfig(domain="grid", gap_frames=1, grid_points=6, n_starts=1))
        written = P.plot_all(traj, analysis, tmp_path)
        names = {p.name for p in written}
        assert names >= {"energy.png", "gap.png", "pl.png", "kl.png", "density.png", "attention.png", "measure.gif"}
        assert "particles.png" not in names
    else:
        written = [P.plot_density(traj, tmp_path / "density.png"), *P.animate_measure(traj, tmp_path / "m.gif")]
    for p in written:
        assert_image(p, frames=len(traj.time) if p.suffix == ".gif" else None)


def test_principal_axes_are_those_of_the_particle_cloud(particle_file):
    """The projection's axes are orthonormal, ordered by variance, and span the cloud's two leading directions."""
    traj = open_trajectory(particle_file)
    origin, axes, _ = P.projection(traj)
    assert np.allclose(axes.T @ axes, np.eye(2))
    pts = traj.frames["omega"].reshape(-1, traj.frames["omega"].shape[-1])
    w = traj.frames["mass"].reshape(-1)
    cov = ((pts - origin) * w[:, None]).T @ (pts - origin) / w.sum()
    top = np.linalg.eigh(cov)[1][:, ::-1][:, :2]
    assert np.allclose(np.abs(top.T @ axes), np.eye(2), atol=1e-8)


@pytest.mark.slow
def test_plot_command_headless_and_bad_input(particle_file, tmp_path, capsys):
    out = tmp_path / "figs"
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "MPLBACKEND", "WAYLAND_DISPLAY")}
    env.update(PYTHONPATH=str(REPO), NUMBA_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "pdeflow", "plot", str(particle_file), "-o", str(out),
                           "--coords", "0,5", "--no-animation"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert {Path(line).name for line in proc.stdout.split()} == PARTICLE_FIGURES - {"measure.gif"}
    assert_image(out / "particles.png")
    capsys.readouterr()
    (tmp_path / "afile").write_text("x")
    for argv, needle in [(["--coords", "0"], "--coords"), (["--coords", "0,999"], "--coords"),
                         (["-o", str(tmp_path / "afile")], "not a directory"), (["--frame", "99"], "--frame"),
                         (["-o", str(tmp_path / "no" / "such")], "does not exist"), (["--fps", "0"], "--fps")]:
        assert main(["plot", str(particle_file), *argv, "--no-animation"]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1


def test_no_module_switches_the_matplotlib_backend():
    """Figures are drawn on a matplotlib ``Figure`` with its own Agg canvas (as in pdeflow.analysis.plots.plotting):
    no module
    of pdeflow calls ``matplotlib.use`` or imports pyplot, so a caller's backend and pyplot's figures are left alone."""
    found = []
    for folder in ("pdeflow", "solvers", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else [])
                if any(n.startswith("matplotlib.pyplot") for n in names):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: imports pyplot")
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "use"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "matplotlib"):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: calls matplotlib.use")
    assert not found, found


def test_a_run_over_decades_gets_a_log_time_axis():
    from matplotlib.figure import Figure

    from pdeflow.analysis.plots.plotting import time_axis

    ax = Figure().subplots()
    assert time_axis(ax, np.array([0.0, 0.01, 1.0, 1e4])) == "symlog" and ax.get_xscale() == "symlog"
    ax = Figure().subplots()
    assert time_axis(ax, np.linspace(0.0, 20.0, 21)) == "linear" and ax.get_xscale() == "linear"
