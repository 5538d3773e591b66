"""``/analysis`` in the trajectory file: write, read, and the analysis a finished run stores."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ...core.config import Config
from ...io.file_access import TrajectoryError, open_by_swmr_writer
from ...io.result_files import edit_trajectory
from ...io.trajectory import Trajectory, check_file, open_trajectory
from ..convergence.spectral import read_spectral_record, write_spectral_record
from .analysis import CLUSTER_ARRAYS, FRAME_ARRAYS, SCALARS, Analysis, analyse
from .clusters import HeadClusters

ANALYSIS_GROUP = "analysis"


def check_editable(path: str | Path) -> None:
    """TrajectoryError unless ``path`` is a trajectory no run is writing (one that can take /analysis)."""
    check_file(path)
    if open_by_swmr_writer(Path(path)):
        raise TrajectoryError(f"{path}: a run is writing this file (or died while writing it; resume it first), "
                              "so the analysis cannot be stored; use --no-write to print it only")


def write_analysis(path: str | Path, analysis: Analysis) -> None:
    """Store ``analysis`` as the group /analysis of a finished trajectory, replacing only that group.

    The edit goes through :func:`pdeflow.io.result_files.edit_trajectory` (on a copy renamed over the file when
    complete), so a kill leaves the previous file - frames, steps and any earlier /analysis - intact.
    TrajectoryError if a run is still writing the file (or died writing it: resume it first).
    """
    path = Path(path)
    check_editable(path)
    with edit_trajectory(path) as f:
        if ANALYSIS_GROUP in f:
            del f[ANALYSIS_GROUP]
        g = f.create_group(ANALYSIS_GROUP)
        for key in FRAME_ARRAYS:
            g.create_dataset(key, data=np.asarray(getattr(analysis, key)))
        for key in SCALARS:
            g.attrs[key] = getattr(analysis, key)
        g.attrs["kl_theta_range"] = np.asarray(analysis.kl_theta_range, dtype=float)
        g.attrs["notes"] = "\n".join(analysis.notes)
        c = analysis.clusters
        if c is not None:
            for key in CLUSTER_ARRAYS:
                g.create_dataset(f"cluster_{key}", data=np.asarray(getattr(c, key)))
            g.attrs["cluster_threshold"] = c.threshold
            g.attrs["cluster_frame"] = c.frame
        write_spectral_record(g, analysis.spectrum)


def read_analysis(traj: Trajectory) -> Analysis | None:
    """The analysis stored in a trajectory (``traj.analysis``), or None if it has none."""
    d = traj.analysis
    if not d or "time" not in d:
        return None
    kwargs: dict[str, Any] = {key: np.asarray(d[key]) for key in FRAME_ARRAYS if key in d}
    F = kwargs["time"].size      # files written before certificates: nothing certified
    kwargs.setdefault("gap_bound", np.full(F, np.nan))
    kwargs.setdefault("gap_certified", np.zeros(F, dtype=bool))
    kwargs.update({key: d[key] for key in SCALARS if key in d})
    for key in ("kl_status", "prediction", "gap_inputs"):
        kwargs[key] = str(kwargs.get(key, ""))
    for key in ("gap_computed", "gap_is_estimate"):
        kwargs[key] = bool(kwargs.get(key, False))
    # files written before the local exponent hold a bootstrap interval ("kl_theta_ci"), which is not this range
    span = np.asarray(d.get("kl_theta_range", (math.nan, math.nan)), dtype=float)
    kwargs["kl_theta_range"] = (float(span[0]), float(span[1]))
    kwargs["notes"] = [n for n in str(d.get("notes", "")).split("\n") if n]
    if "cluster_labels" in d:
        kwargs["clusters"] = HeadClusters(**{key: np.asarray(d[f"cluster_{key}"]) for key in CLUSTER_ARRAYS},
                                          threshold=float(d["cluster_threshold"]), frame=int(d["cluster_frame"]))
    kwargs["spectrum"] = read_spectral_record(d)
    return Analysis(**kwargs)


GAP_ON_REQUEST = ("the optimality gap is not searched after a run (its certified search of min Phi costs many times "
                  "a short run): pdeflow diagnose and pdeflow report compute it (diagnostics.gap), once")


def analyse_run(path: str | Path, cfg: Config, *, gap: bool = False) -> None:
    """Write the analysis of a finished run into its trajectory (the driver's ``on_finish``).

    Does nothing when ``diagnostics.enabled`` is false. The gap search runs only with ``gap`` (and
    ``diagnostics.gap``): after ``pdeflow run`` it is left to ``diagnose`` and ``report``, which ask for it and
    compute it once (:func:`pdeflow.analysis.diagnostics.analysis.analyse` reuses a stored gap whose inputs are
    unchanged). On a 6-head gain2 problem on a 77-character text the search was ~94 % of ``pdeflow run``'s wall time
    at t_end = 1 (studies/report/analysis_cost.py measures the share now: studies/report/ANALYSIS_COST.md).
    """
    if not cfg.diagnostics.enabled:
        return
    traj = open_trajectory(path)
    settings = cfg.diagnostics if gap else cfg.replace(diagnostics={"gap": False}).diagnostics
    analysis = analyse(traj, settings, run_stationary_tol=cfg.run.stationary_tol)
    if cfg.diagnostics.gap and not gap:
        analysis.notes.append(GAP_ON_REQUEST)
    write_analysis(path, analysis)
