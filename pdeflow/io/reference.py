"""pdeflow as a reference: validate a trajectory file against schema version 1, and compare two files.

:func:`validate` reports every departure from the schema table (:data:`pdeflow.io.schema.ITEMS`) and from the rules on
values, one line each. :func:`compare` checks file A (the candidate) against file B (the reference) at B's frame
times: coverage of B's span, a frame of A at each time of B (:data:`TIME_MATCH`), then energy, dissipation, logits and
the distance between the measures (exact W2 up to :data:`EXACT_W2_MAX` particles, else sliced W2; L1 between
densities), each within ``atol + rtol |b|``; it passes only what it has compared. The full rules: docs/design.md,
"Validating and comparing files".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from scipy.spatial.distance import cdist

from ..core.clock import same_time
from ..core.config import ConfigError, loads_config
from ..core.measure import Grid, free_energy
from ..core.problem import Problem
from . import schema
from .checkpoint import row_counts
from .file_access import TrajectoryError, error_reason, open_for_reading
from .schema import SCHEMA, SCHEMA_VERSION
from .trajectory import schema_error

EXACT_W2_MAX = 2000
# pdeflow.core.clock's rule at a looser tolerance: a compared file may come from another code (pdeflow's own runs land
# every frame exactly on its time)
TIME_MATCH = 1e-9


@dataclass(frozen=True)
class Dynamics:
    """The flow a file's measures follow (docs/model.md): the Wasserstein flow (``gamma = 0``) or the
    Wasserstein-Fisher-Rao flow of transport rate ``alpha`` and Fisher-Rao rate ``gamma``, its ``total_mass``
    ("fixed" or "free"), and the inverse temperature ``beta``. Two files hold the same problem only if these agree."""
    alpha: float = 1.0
    gamma: float = 0.0
    total_mass: str = "fixed"
    beta: float = math.inf

    @property
    def family(self) -> str:
        return "Wasserstein-Fisher-Rao" if self.gamma > 0 else "Wasserstein"

    def describe(self) -> str:
        """One phrase: the family with its rates, mass and temperature."""
        rates = f" (alpha {self.alpha:g}, gamma {self.gamma:g}, {self.total_mass} total mass)" if self.gamma > 0 else ""
        return f"{self.family}{rates}, beta {self.beta:g}"

    @classmethod
    def of(cls, config_text: str, beta: float) -> Dynamics:
        """The dynamics of a file from its ``/.config`` text (empty: a file from another code, taken to hold the
        Wasserstein flow) and ``/model.beta``. A method that does not read ``alpha``, ``gamma`` or ``total_mass``
        has them at their defaults, the Wasserstein flow's (:func:`pdeflow.solvers.check_config` refuses others)."""
        if not config_text:
            return cls(beta=beta)
        s = loads_config(config_text).solver
        return cls(alpha=s.alpha, gamma=s.gamma, total_mass=s.total_mass, beta=beta)

    def dissipation(self, problem: Problem, omega: np.ndarray, mass: np.ndarray) -> float:
        """``I = alpha int |grad Phi|^2 d rho + gamma int (Phi - <Phi>)^2 d rho`` at the measure ``omega`` [N, k],
        ``mass`` [N] (``<Phi> = int Phi d rho / int d rho``, 0 with a free total mass; the Wasserstein
        ``int |grad Phi|^2 d rho`` when ``gamma = 0``)."""
        ev = problem.evaluate(omega, mass)
        if self.gamma == 0.0:
            return self.alpha * ev.dissipation
        mean = float(mass @ ev.phi) / float(mass.sum()) if self.total_mass == "fixed" else 0.0
        return self.alpha * ev.dissipation + self.gamma * float(mass @ (ev.phi - mean) ** 2)


@dataclass
class StoredRun:
    """The parts of a trajectory file that :func:`compare` needs, read with plain h5py."""
    path: Path
    arrays: dict[str, Any]
    beta: float
    time: np.ndarray
    frames: dict[str, np.ndarray]
    grid: Grid | None
    dynamics: Dynamics = field(default_factory=Dynamics)
    _problem: Problem | None = field(default=None, repr=False)

    @property
    def problem(self) -> Problem:
        if self._problem is None:
            self._problem = Problem.from_arrays(self.arrays, beta=self.beta)
        return self._problem

    def measure(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Frame i as weighted particles: omega [N,k], mass [N] (a grid: cell centres and masses)."""
        if self.grid is not None:
            return self.grid.particles(self.frames["density"][i])
        return self.frames["omega"][i], self.frames["mass"][i]

    def energy(self, i: int) -> float:
        if "energy" in self.frames:
            return float(self.frames["energy"][i])
        if self.grid is not None:
            return free_energy(self.problem, self.grid, self.frames["density"][i])
        return self.problem.energy(*self.measure(i))

    def dissipation(self, i: int) -> float:
        if "dissipation" in self.frames:
            return float(self.frames["dissipation"][i])
        return self.dynamics.dissipation(self.problem, *self.measure(i))


def read_run(path: str | Path) -> StoredRun:
    """Read a schema-1 file for comparison; TrajectoryError (one line) if :func:`validate` finds problems."""
    path = Path(path)
    problems = validate(path)
    if problems:
        raise schema_error(path, problems)
    try:
        return _read_valid_run(path)
    except (OSError, RuntimeError) as exc:   # h5py's report of damaged data (a checksum, a truncated chunk)
        raise TrajectoryError(f"{path}: damaged file ({error_reason(exc)})") from None


def _read_valid_run(path: Path) -> StoredRun:
    """:func:`read_run` of a file :func:`validate` accepted (its data may still fail HDF5's checksums on reading)."""
    with open_for_reading(path) as f:
        model, data, fr = f["model"], f["data"], f["frames"]
        arrays: dict[str, Any] = {k: model[k][()] for k in ("embedding", "positions", "unembedding", "theta0")}
        arrays["basis"] = model["basis"][()] if "basis" in model else None
        arrays.update({k: data[k][()] for k in ("tokens", "targets", "mask", "weights")})
        for key in ("head_dim", "score_scale", "weight_decay"):
            arrays[key] = model.attrs[key].item() if hasattr(model.attrs[key], "item") else model.attrs[key]
        beta = float(model.attrs.get("beta", np.inf))
        n = row_counts(f)[0]
        frames = {k: fr[k][:n] for k in ("time", "energy", "dissipation", "omega", "mass", "density") if k in fr}
        grid = Grid.from_frame_attrs(dict(fr.attrs)) if "density" in fr else None
        config = f.attrs.get("config", "")
    config = config.decode("utf-8", errors="replace") if isinstance(config, bytes) else str(config)
    try:
        dynamics = Dynamics.of(config, beta)
    except ConfigError as exc:
        raise TrajectoryError(f"{path}: stored config is invalid ({exc})") from None
    return StoredRun(path, arrays, beta, frames["time"], frames, grid, dynamics)


# ---- validate --------------------------------------------------------------------------------
def validate(path: str | Path) -> list[str]:
    """Every way ``path`` departs from schema version 1, one line each; an empty list means valid."""
    path = Path(path)
    if not path.is_file():
        return [f"no such file: {path}"]
    try:
        f = open_for_reading(path)
    except OSError as exc:
        return [f"not a readable HDF5 file ({str(exc).splitlines()[0][:80]})"]
    with f:
        try:
            return _validate_open(f)
        except (KeyError, ValueError, TypeError, OSError) as exc:
            return [f"damaged file: {str(exc).splitlines()[0][:100]}"]


def _validate_open(f: h5py.File) -> list[str]:
    out: list[str] = []
    if f.attrs.get("schema") != SCHEMA:
        out.append(f"root attribute schema must be {SCHEMA!r}, got {f.attrs.get('schema')!r}")
    version = f.attrs.get("schema_version")
    if version is None or int(version) != SCHEMA_VERSION:
        out.append(f"root attribute schema_version must be {SCHEMA_VERSION}, got {version!r}")
    problems = schema.check(f, lambda: row_counts(f), needs=(schema.REQUIRED,))
    out += [p.message for p in problems]
    bad = {p.path for p in problems}

    def read(path: str) -> np.ndarray | None:
        """The values of a dataset that has its table shape, for the rules on values (None: absent or reported)."""
        parents = [path[:i] for i in range(1, len(path)) if path[i] == "/"]
        if path in bad or any(p in bad for p in parents) or path.lstrip("/") not in f:
            return None
        return f[path][()]

    E, tokens, targets = read("/model/embedding"), read("/data/tokens"), read("/data/targets")
    V = None if E is None else E.shape[0]
    for name, arr in (("tokens", tokens), ("targets", targets)):
        if V is not None and arr is not None and arr.size and (arr.min() < 0 or arr.max() >= V):
            out.append(f"/data/{name} must lie in [0, V = {V})")
    mask = read("/data/mask")
    if mask is not None and np.any(mask.sum(axis=1) <= 0):
        out.append("/data/mask must have at least one 1 in every row")
    weights = read("/data/weights")
    if weights is not None and (np.any(weights < 0) or abs(weights.sum() - 1.0) > 1e-9):
        out.append("/data/weights must be >= 0 and sum to 1")
    time = read("/frames/time")
    if time is not None and np.any(np.diff(time[:row_counts(f)[0]]) < 0):
        out.append("/frames/time must be non-decreasing")
    return out


# ---- compare ---------------------------------------------------------------------------------
@dataclass
class Row:
    """One compared quantity at one time: the measured difference, the allowed one, and whether it passes."""
    time: float
    quantity: str
    value: float
    allowed: float

    @property
    def ok(self) -> bool:
        return bool(self.value <= self.allowed)


@dataclass
class Comparison:
    """The rows compared, the structural problems (different problems, uncovered span, unmatched reference
    frames: each fails the comparison), and the frame count: ``matched`` frames of the reference, of
    ``in_span`` reference frames inside the common time span ``span``, of ``reference_frames`` in all."""
    rows: list[Row]
    problems: list[str]
    matched: int = 0
    in_span: int = 0
    reference_frames: int = 0
    span: tuple[float, float] | None = None
    partial: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.rows) and all(r.ok for r in self.rows)

    def coverage(self) -> str:
        """One line: the matched fraction of the reference frames in the common span and in all."""
        if self.span is None:
            return f"matched 0/{self.reference_frames} reference frames (no common time span)"
        line = (f"matched {self.matched}/{self.in_span} reference frames in the common span "
                f"[{self.span[0]:.6g}, {self.span[1]:.6g}] ({self.matched / max(self.in_span, 1):.0%})")
        if self.in_span < self.reference_frames:
            line += (f"; {self.matched}/{self.reference_frames} of all reference frames "
                     f"({self.matched / self.reference_frames:.0%})"
                     f"{', partial comparison allowed' if self.partial else ''}")
        return line

    def verdict(self) -> str:
        """The last line: PASS or FAIL with the count of rows within tolerance and, on a FAIL with every row
        within it, what failed instead (the problems above, or nothing compared)."""
        good = sum(r.ok for r in self.rows)
        line = f"{'PASS' if self.ok else 'FAIL'}: {good}/{len(self.rows)} within tolerance"
        if not self.ok and good == len(self.rows):
            line += (f", but {len(self.problems)} problem(s) above" if self.problems
                     else ": nothing was compared")
        return line

    def table(self) -> str:
        lines = [f"{'time':>12}  {'quantity':<14} {'difference':>12} {'allowed':>12}  verdict"]
        for r in self.rows:
            lines.append(f"{r.time:12.6g}  {r.quantity:<14} {r.value:12.4g} {r.allowed:12.4g}  "
                         f"{'ok' if r.ok else 'FAIL'}")
        lines.extend(f"problem: {p}" for p in self.problems)
        lines.append(self.coverage())
        lines.append(self.verdict())
        return "\n".join(lines)


def _times(values) -> str:
    """At most eight times, then how many more."""
    values = list(values)
    shown = ", ".join(f"{t:.9g}" for t in values[:8])
    return shown + (f" and {len(values) - 8} more" if len(values) > 8 else "")


def match_frames(candidate: np.ndarray, reference: np.ndarray, allow_partial: bool = False
                 ) -> tuple[list[tuple[int, int, float]], list[str], dict[str, Any]]:
    """Pair the reference frame times [F_b] with candidate frame times [F_a] (docs/design.md).

    Returns the pairs (candidate index, reference index, reference time), the problems (one line each) and
    the counts of :class:`Comparison` (``matched``, ``in_span``, ``reference_frames``, ``span``)."""
    def close(t: float, u) -> np.ndarray:
        return same_time(np.asarray(u), t, TIME_MATCH)

    counts: dict[str, Any] = {"matched": 0, "in_span": 0, "reference_frames": len(reference), "span": None,
                              "partial": allow_partial}
    if not len(candidate) or not len(reference):
        return [], [f"no frames in the {'candidate' if not len(candidate) else 'reference'}"], counts
    problems = []
    lo, hi = max(candidate[0], reference[0]), min(candidate[-1], reference[-1])
    uncovered = [(f"[{reference[0]:.9g}, {candidate[0]:.9g})" if candidate[0] > reference[0]
                  and not close(reference[0], candidate[0]) else None),
                 (f"({candidate[-1]:.9g}, {reference[-1]:.9g}]" if candidate[-1] < reference[-1]
                  and not close(reference[-1], candidate[-1]) else None)]
    uncovered = [u for u in uncovered if u]
    if uncovered and not allow_partial:
        problems.append(f"the candidate's frames span [{candidate[0]:.9g}, {candidate[-1]:.9g}], not the reference's "
                        f"[{reference[0]:.9g}, {reference[-1]:.9g}] (uncovered {' and '.join(uncovered)}); "
                        f"--allow-partial compares the common span only")
    if lo > hi and not close(lo, hi):
        problems.append("no common time span")
        return [], problems, counts
    counts["span"] = (float(lo), float(hi))
    in_span = [j for j, t in enumerate(reference) if (lo <= t <= hi) or close(t, lo) or close(t, hi)]
    pairs, unmatched = [], []
    for j in in_span:
        t = float(reference[j])
        hits = np.flatnonzero(close(t, candidate))
        if len(hits):
            pairs.append((int(hits[np.argmin(np.abs(candidate[hits] - t))]), j, t))
        else:
            unmatched.append(t)
    if unmatched:
        problems.append(f"{len(unmatched)} reference frame(s) in the common span have no candidate frame at the "
                        f"same time (within {TIME_MATCH:g} max(1, |t|)): t = {_times(unmatched)}")
    counts.update(matched=len(pairs), in_span=len(in_span))
    return pairs, problems, counts


def measure_distance(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray],
                     seed: int = 0) -> tuple[float, str]:
    """W2 between weighted clouds: exact (``ot.emd2``) when both have <= EXACT_W2_MAX points, else sliced."""
    import ot

    (xa, ma), (xb, mb) = a, b
    ma, mb = ma / ma.sum(), mb / mb.sum()
    if len(ma) <= EXACT_W2_MAX and len(mb) <= EXACT_W2_MAX:
        # cdist differences coordinates before squaring: |x|^2 + |y|^2 - 2 x.y would lose ~1e-8 to cancellation
        cost = cdist(xa, xb, "sqeuclidean")
        return float(np.sqrt(max(ot.emd2(ma, mb, cost, numItermax=10_000_000), 0.0))), "W2"
    return float(ot.sliced_wasserstein_distance(xa, xb, ma, mb, n_projections=256, seed=seed)), "sliced W2"


def same_problem(a: StoredRun, b: StoredRun) -> str | None:
    """What differs between two runs' problems (the first stored array, or the dynamics), or None."""
    if a.dynamics != b.dynamics:
        return f"the dynamics: {a.dynamics.describe()} against {b.dynamics.describe()}"
    for key, va in a.arrays.items():
        vb = b.arrays.get(key)
        if va is None or vb is None:
            if (va is None) != (vb is None):
                return key
            continue
        va, vb = np.asarray(va), np.asarray(vb)
        if va.shape != vb.shape or not np.allclose(va, vb, rtol=1e-12, atol=1e-14):
            return key
    return None


def compare(path_a: str | Path, path_b: str | Path, rtol: float = 1e-6, atol: float = 1e-10,
            allow_partial: bool = False) -> Comparison:
    """Compare file A (candidate) against file B (the reference) at B's frame times (docs/design.md)."""
    a, b = read_run(path_a), read_run(path_b)
    diff = same_problem(a, b)
    if diff is not None:
        what = diff if diff.startswith("the dynamics") else f"{diff} differs"
        return Comparison([], [f"the files hold different problems ({what})"],
                          reference_frames=len(b.time))
    pairs, problems, counts = match_frames(np.asarray(a.time, dtype=float), np.asarray(b.time, dtype=float),
                                           allow_partial)
    rows: list[Row] = []
    for i, j, t in pairs:
        for name, fa, fb in (("energy", a.energy(i), b.energy(j)), ("dissipation", a.dissipation(i), b.dissipation(j))):
            rows.append(Row(t, name, abs(fa - fb), atol + rtol * abs(fb)))
        za, zb = a.problem.logits(*a.measure(i)), b.problem.logits(*b.measure(j))
        rows.append(Row(t, "logits", float(np.max(np.abs(za - zb))), atol + rtol * float(np.max(np.abs(zb)))))
        if a.grid is not None and b.grid is not None and a.grid == b.grid:
            from ..core.measure import l1_distance
            rows.append(Row(t, "L1 density", l1_distance(a.grid, a.frames["density"][i], b.frames["density"][j]),
                            atol + rtol))
        else:
            mb = b.measure(j)
            dist, name = measure_distance(a.measure(i), mb)
            radius = float(np.sqrt(np.dot(mb[1], np.einsum("ik,ik->i", mb[0], mb[0])) / mb[1].sum()))
            rows.append(Row(t, name, dist, atol + rtol * radius))
    return Comparison(rows, problems, **counts)
