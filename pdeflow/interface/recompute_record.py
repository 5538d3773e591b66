"""What ``pdeflow validate``'s recheck of stored numbers found, and the rules its checks share: the tolerance of a
recomputation, the equality of two copies, the file read for checking (:class:`Stored`), a checkpoint slot's
SHA-256. The checks: :mod:`pdeflow.interface.recompute` (frames, /steps), :mod:`pdeflow.interface.recompute_metadata`
(attributes, config, checkpoint), :mod:`pdeflow.interface.recompute_analysis` (/analysis)."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..core.config import Config
from ..core.problem import Problem
from ..io.checkpoint import CHECKSUM, slot_digest
from ..io.trajectory import Trajectory

# A recomputed energy, dissipation or risk agrees with the stored one within RECOMPUTE_ULPS units of the kernels'
# machine epsilon, relative (dissipation: see tolerance()). The evaluation is bit for bit the same whatever the thread
# count; another kernel variant (pdeflow.core.tuner: other chunks of heads and sequences, another grouping of the
# sums) changed the frames of the 15 shipped configs by at most 41 eps (9.1e-15), so 4096 eps (9.1e-13 in float64)
# leaves a margin of 100 for other CPUs and MPI's sums over ranks (studies/robustness/RECOMPUTE_TOLERANCE.md).
RECOMPUTE_ULPS = 4096.0
# validate recomputes by default the files up to this size; larger ones with --recompute (the cost is one
# evaluation per frame, and a file's size grows with its frames)
RECOMPUTE_MAX_BYTES = 64 << 20
# the ends a run records (/.status once it ended); "running" while it goes on or after its process died
ENDED = ("finished", "stationary", "wall_time", "max_steps", "interrupted", "non_finite", "accuracy_lost", "error")


@dataclass(frozen=True)
class Unchecked:
    """Stored numbers :func:`recheck` does not determine: ``path`` (a dataset, ``group.attribute``, or
    ``/.config:section.key``), ``rows`` (the rows or elements concerned; None: all), ``why`` (one phrase) and
    ``relative``: > 0 when the values are recomputed to that tolerance only, ``relative * max(|value|, scale)``
    (a smaller change is not seen)."""
    path: str
    why: str
    rows: tuple[int, ...] | None = None
    relative: float = 0.0
    scale: float = 0.0

    def covers(self, path: str, row: int | None = None) -> bool:
        """Whether a change of ``path`` at ``row`` (None: the whole item) is one this entry leaves unchecked."""
        return path == self.path and (self.rows is None or (row is not None and row in self.rows))


@dataclass
class Recheck:
    """What :func:`recheck` found: ``problems`` (one line each, naming dataset and frame or row), ``unchecked``
    (:class:`Unchecked`) and ``checked`` (one line per group of checks that ran)."""
    problems: list[str] = field(default_factory=list)
    unchecked: list[Unchecked] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def unchecked_lines(self) -> list[str]:
        """:attr:`unchecked` as lines, the entries that share a reason on one line."""
        grouped: dict[str, list[Unchecked]] = {}
        for entry in self.unchecked:
            grouped.setdefault(entry.why, []).append(entry)
        lines = []
        for why, entries in grouped.items():
            what = ", ".join(e.path + ("" if e.rows is None else f" (rows {_rows_text(e.rows)})") for e in entries)
            lines.append(f"unchecked: {what}: {why}")
        return lines

    def unseen(self, path: str, why: str, rows: Iterable[int] | None = None, relative: float = 0.0,
               scale: float = 0.0) -> None:
        rows = None if rows is None else tuple(int(r) for r in rows)
        if rows is None or rows:
            self.unchecked.append(Unchecked(path, why, rows, relative, scale))


def _rows_text(rows: tuple[int, ...]) -> str:
    """Row indices compactly: ``0-9, 11, 13-20``."""
    parts, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def tolerance(precision: str) -> float:
    """The relative tolerance of a recomputed energy, dissipation or risk: :data:`RECOMPUTE_ULPS` eps of the
    kernels' ``precision``."""
    return RECOMPUTE_ULPS * float(np.finfo(np.float32 if precision == "float32" else np.float64).eps)


def allowed(recomputed: float, tol: float, scale: float = 0.0) -> float:
    """``tol max(|x|, sqrt(|x| scale))``: the difference allowed a stored value whose recomputation is ``x``.

    ``scale`` (0: none) is for a sum of squares ``I = sum_i m_i |g_i|^2``: each ``g_i`` is a difference of terms of
    the size of the gradients at the run's start, so its rounding is ``eps |g(0)|`` and ``I``'s is
    ``2 eps sqrt(I I(0))``, which near a stationary point exceeds ``eps I``; ``scale`` is then the largest ``I``."""
    x = abs(float(recomputed))
    return tol * max(x, math.sqrt(x * scale)) if scale > 0 else tol * x


def same(a: float, b: float) -> bool:
    """Two stored copies of one number are equal: the same float, or both nan (not computed)."""
    return bool(a == b or (math.isnan(a) and math.isnan(b)))


def _g(x: float) -> str:
    return f"{float(x):.17g}"


# ---- the file's parts ----------------------------------------------------------------------------------------------
@dataclass
class Stored:
    """A trajectory read for rechecking: the :class:`Trajectory` (committed rows), its config (None: a file from another
    code, or a config that does not parse), its problem, the run's stepper (None when it cannot be rebuilt: why in
    ``no_stepper``), and the raw checkpoint slots."""
    path: Path
    traj: Trajectory
    cfg: Config | None
    problem: Problem
    stepper: Any = None
    no_stepper: str = ""
    slots: dict[str, dict[str, np.ndarray] | None] = field(default_factory=dict)
    slot_errors: dict[str, str] = field(default_factory=dict)
    active: int | None = None
    writer_alive: bool = False

    @property
    def status(self) -> str:
        return str(self.traj.attrs.get("status", ""))

    @property
    def ended(self) -> bool:
        return self.status in ENDED

    @property
    def n_frames(self) -> int:
        return len(self.traj.time)

    @property
    def n_steps(self) -> int:
        return len(self.traj.steps.get("time", ()))

    def frame(self, i: int) -> dict[str, np.ndarray]:
        return {k: self.traj.frames[k][i] for k in ("omega", "mass", "density") if k in self.traj.frames}




def _digest_ok(arrays: dict[str, np.ndarray]) -> bool:
    stored = arrays.get(CHECKSUM)
    body = {k: v for k, v in arrays.items() if k != CHECKSUM}
    return stored is not None and bool(np.any(stored)) and np.array_equal(slot_digest(body), stored)
