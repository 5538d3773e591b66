"""Measures of a trajectory, attention maps and head clusters."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...core.measure import Grid
from ...core.model import split_theta
from ...core.problem import Problem
from ...io.file_access import TrajectoryError
from ...io.trajectory import Trajectory

MAX_CLUSTER_POINTS = 2048    # heads entering the linkage (the rest join the nearest cluster)


def trajectory_grid(traj: Trajectory) -> Grid | None:
    """The :class:`pdeflow.core.measure.Grid` of a grid run (from the /frames attributes), None for particles."""
    return Grid.from_frame_attrs(traj.frame_attrs) if "density" in traj.frames else None


def frame_measure(traj: Trajectory, index: int) -> tuple[np.ndarray, np.ndarray]:
    """The measure of frame ``index`` as weighted particles ``(omega [N, k], mass [N])``: the particles, or
    for a grid the cell centres with masses ``density * cell volume`` (:meth:`Grid.particles`)."""
    if "omega" in traj.frames:
        return np.asarray(traj.frames["omega"][index], dtype=float), np.asarray(traj.frames["mass"][index], dtype=float)
    grid = trajectory_grid(traj)
    if grid is None:
        raise TrajectoryError(f"{traj.path}: frames hold neither particles (omega, mass) nor a grid density")
    return grid.particles(traj.frames["density"][index])


def attention_pattern(problem: Problem, theta: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Causal attention of heads theta [H, p] on one sequence of tokens [T]: [H, T, T], rows summing to one,
    ``a[h, l, j] = softmax_{j <= l}(scale <WQ_h x_l, WK_h x_j>)``, zero above the diagonal (docs/model.md)."""
    a = problem.arrays()
    tokens = np.asarray(tokens, dtype=np.int64)
    x = a["embedding"][tokens] + a["positions"][:tokens.size]
    wq, wk, _, _ = split_theta(np.atleast_2d(np.asarray(theta, dtype=float)), problem.d, problem.head_dim)
    q, k = np.einsum("hcd,td->htc", wq, x), np.einsum("hcd,td->htc", wk, x)
    s = float(a["score_scale"]) * np.einsum("htc,hsc->hts", q, k)
    s = np.where(np.tril(np.ones((tokens.size, tokens.size), dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def probe_sequence(problem: Problem) -> np.ndarray:
    """The data set's heaviest sequence (first among equals): tokens [T], the probe of attention maps."""
    a = problem.arrays()
    return np.asarray(a["tokens"][int(np.argmax(a["weights"]))])


@dataclass(frozen=True)
class HeadClusters:
    """Heads grouped by single linkage in omega at distance ``threshold``, heaviest cluster first.

    ``labels`` [N]; per cluster ``mass``, ``size``, ``centre`` (mass-weighted mean, [C, k]) and
    ``representative`` (the member nearest the centre, an index into the frame's heads); ``attention``
    [A, T, T] of the representatives of the A heaviest clusters on the ``probe`` tokens [T].
    """
    labels: np.ndarray
    mass: np.ndarray
    size: np.ndarray
    centre: np.ndarray
    representative: np.ndarray
    attention: np.ndarray
    probe: np.ndarray
    threshold: float
    frame: int = -1


def head_clusters(problem: Problem, omega: np.ndarray, mass: np.ndarray, *, tol: float = 0.1,
                  attention_maps: int = 4, seed: int = 0, frame: int = -1, min_mass: float = 0.0,
                  min_distance: float = 0.0) -> HeadClusters:
    """Cluster heads omega [N, k] (masses [N]): single linkage cut at
    ``max(tol * sqrt(sum_i m_i |omega_i|^2 / sum_i m_i), min_distance)``.

    Heads of mass <= ``min_mass`` are left out (label -1): for a grid, cells below a fraction of the
    largest cell mass, with ``min_distance`` just above the cell diagonal so that neighbouring cells
    join (clusters are then the connected blobs of the density). With more than MAX_CLUSTER_POINTS heads
    a mass-weighted subsample is linked and every head joins its nearest cluster centre.
    """
    from scipy.cluster import hierarchy, vq

    omega, mass = np.atleast_2d(np.asarray(omega, dtype=float)), np.asarray(mass, dtype=float)
    live = np.flatnonzero(mass > max(min_mass, 0.0))
    labels = np.full(omega.shape[0], -1)
    rms = math.sqrt(float(np.dot(mass, np.einsum("ik,ik->i", omega, omega))) / max(float(mass.sum()), 1e-300))
    threshold = max(tol * max(rms, 1e-12), min_distance)
    if live.size == 1:
        labels[live] = 0
    elif live.size > 1:
        pts = omega[live]
        sub = np.arange(live.size)
        if live.size > MAX_CLUSTER_POINTS:
            rng = np.random.default_rng(seed)
            sub = np.sort(rng.choice(live.size, MAX_CLUSTER_POINTS, replace=False, p=mass[live] / mass[live].sum()))
        lab = hierarchy.fcluster(hierarchy.linkage(pts[sub], method="single"), t=threshold, criterion="distance") - 1
        if sub.size < live.size:
            centres = np.stack([pts[sub][lab == c].mean(axis=0) for c in range(lab.max() + 1)])
            lab = vq.vq(pts, centres)[0]
        labels[live] = lab
    n = int(labels.max()) + 1
    cmass = np.array([mass[labels == c].sum() for c in range(n)])
    order = np.argsort(-cmass, kind="stable")
    relabel = np.full(n + 1, -1)
    relabel[order] = np.arange(n)
    labels = relabel[labels]                         # -1 stays -1 (last entry)
    cmass = cmass[order]
    size = np.array([int(np.sum(labels == c)) for c in range(n)], dtype=np.int64)
    centre = np.array([np.average(omega[labels == c], axis=0, weights=mass[labels == c])
                       for c in range(n)]).reshape(n, -1)
    rep = np.array([np.flatnonzero(labels == c)[np.argmin(np.linalg.norm(omega[labels == c] - centre[c], axis=1))]
                    for c in range(n)], dtype=np.int64)
    probe = probe_sequence(problem)
    shown = rep[:min(attention_maps, n)]
    att = (attention_pattern(problem, problem.theta(omega[shown]), probe) if shown.size
           else np.zeros((0,) + (probe.size,) * 2))
    return HeadClusters(labels=labels, mass=cmass, size=size, centre=centre, representative=rep, attention=att,
                        probe=probe, threshold=threshold, frame=frame)
