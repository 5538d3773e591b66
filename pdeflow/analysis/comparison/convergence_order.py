"""The observed order of convergence of a candidate code: a family of its runs at decreasing step sizes against a
reference run (``pdeflow compare --order A1.h5 A2.h5 ... REF.h5 --expect P``).

Errors. For each run ``a_i`` and each quantity ``q`` (energy, dissipation, logits, and W2 between the measures, or
L1 between the densities of two grid runs) ``e_i[q] = max_t |q(a_i, t) - q(REF, t)|`` over the reference's frames,
each difference as :func:`pdeflow.io.reference.compare` measures it (the logits in the max norm over ``[B, T, V]``).

Step sizes. ``h_i`` is read from the file's ``/steps/time`` rows (row 0 the initial state, the step lengths their
successive differences): the largest step (``step = "max"``, the fixed ``dt`` of a fixed-step run) or the mean step
(``step = "mean"``). A file without two committed ``/steps`` rows has no step size to read: the family is refused.

Orders. With the runs sorted by decreasing ``h``, the successive orders are
``p_i = log(e_i / e_{i+1}) / log(h_i / h_{i+1})``; the least-squares slope of ``log e`` on ``log h`` comes with its
standard error (:func:`pdeflow.analysis.finite_heads.chaos.fit_power_law`; three runs or more). The *observed order*
is that of
the finest pair, the one nearest the asymptotic regime, and a quantity passes when
``|p_observed - P| <= order_tol``; the family passes when every quantity does.

The reference check. An order is only measured if the reference's own error is negligible against the finest run's
error: the reference's error is estimated by its difference from a tighter run, one given by the user or a pdeflow
rerun of the reference's own config (:func:`tighter_config`: ``rtol`` and ``atol`` / 10 and steps at most half the
reference's largest for an error-controlled method, ``dt`` / 2 for a fixed explicit step; any other method needs the
user's file). The estimate holds when the tighter run is itself several times more accurate; there is none when the
two do not differ at all.
The family is refused (:class:`OrderRefused`) when, for some quantity, that estimate exceeds
``e_finest / ACCURACY_MARGIN``.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...core.config import RTOL_RANGE, Config, ConfigError, loads_config
from ...io.checkpoint import row_counts
from ...io.file_access import open_for_reading
from ...io.reference import Comparison, compare
from ...solvers.methods import METHODS
from ..finite_heads.chaos import fit_power_law

ACCURACY_MARGIN = 10.0      # the reference must be this many times more accurate than the finest run
ORDER_TOL = 0.2             # default: |observed order - expected| allowed
MIN_STEP_RATIO = 1.1        # successive step sizes must differ by at least this factor
TIGHTER_TOL_FACTOR = 10.0   # the tighter run: rtol, atol / 10 ...
TIGHTER_DT_FACTOR = 2.0     # ... or dt / 2 for a fixed-step method


class OrderRefused(Exception):
    """The family cannot be judged (one line saying why): exit code 2 on the command line."""


@dataclass(frozen=True)
class StepSize:
    """The step sizes of one run read from its ``/steps/time`` rows: the largest, the mean, and their count."""
    largest: float
    mean: float
    count: int

    def value(self, step: str) -> float:
        return self.largest if step == "max" else self.mean


def step_size(path: str | Path) -> StepSize:
    """The steps of a trajectory file from its committed ``/steps/time`` rows (:class:`OrderRefused` without two)."""
    with open_for_reading(Path(path)) as f:
        n = row_counts(f)[1]
        time = np.asarray(f["steps"]["time"][:n], dtype=float) if n >= 2 else np.zeros(0)
    steps = np.diff(time)
    if len(steps) == 0 or not np.all(np.isfinite(steps)) or np.any(steps <= 0):
        raise OrderRefused(f"{path}: no step sizes to read (needs /steps/time with the initial state and at least one "
                           f"step, increasing)")
    return StepSize(float(steps.max()), float(steps.mean()), len(steps))


def largest_errors(comparison: Comparison) -> dict[str, float]:
    """Quantity -> the largest difference over the compared frames (the rows of :func:`compare`)."""
    out: dict[str, float] = {}
    for row in comparison.rows:
        out[row.quantity] = max(out.get(row.quantity, 0.0), float(row.value))
    return out


def family_errors(path: str | Path, reference: str | Path) -> dict[str, float]:
    """:func:`largest_errors` of one run against the reference; :class:`OrderRefused` when they cannot be compared
    (different problems, frames of the reference missing from the run)."""
    comparison = compare(path, reference, rtol=0.0, atol=0.0)
    if comparison.problems:
        raise OrderRefused(f"{path} against {reference}: {comparison.problems[0]}")
    return largest_errors(comparison)


def successive_orders(h: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``p_i = log(e_i / e_{i+1}) / log(h_i / h_{i+1})`` for runs sorted by decreasing ``h`` [n] -> [n - 1]
    (nan where an error is zero)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(e[:-1] / e[1:]) / np.log(h[:-1] / h[1:])


@dataclass
class QuantityOrder:
    """One quantity's convergence: errors [n] at the step sizes (decreasing), successive orders [n - 1], the
    least-squares slope and its standard error (nan with fewer than three runs), the reference's error estimate,
    and the verdict against ``expected`` within ``tol``."""
    quantity: str
    errors: np.ndarray
    orders: np.ndarray
    slope: float
    slope_stderr: float
    reference_error: float
    expected: float
    tol: float

    @property
    def observed(self) -> float:
        return float(self.orders[-1])

    @property
    def ok(self) -> bool:
        return bool(abs(self.observed - self.expected) <= self.tol)

    def line(self) -> str:
        """``energy: observed order 1.02, expected 1: pass`` with the slope and its spread."""
        spread = (f", standard error {self.slope_stderr:.2g}" if math.isfinite(self.slope_stderr)
                  else ", no standard error from 2 runs")
        return (f"{self.quantity}: observed order {self.observed:.2f}, expected {self.expected:g}: "
                f"{'pass' if self.ok else 'FAIL'} (least-squares slope {self.slope:.2f}{spread})")


@dataclass
class OrderStudy:
    """The verdict of :func:`order_study`: the runs (sorted by decreasing step), their step sizes, the quantities."""
    paths: list[Path]
    reference: Path
    steps: list[StepSize]
    step: str
    quantities: list[QuantityOrder]
    reference_check: str

    @property
    def h(self) -> np.ndarray:
        return np.array([s.value(self.step) for s in self.steps])

    @property
    def ok(self) -> bool:
        return all(q.ok for q in self.quantities)

    def table(self) -> str:
        """The step sizes, the error table with the successive orders, one verdict line per quantity, the verdict."""
        what = "largest step" if self.step == "max" else "mean step"
        lines = [f"step size h = the {what} of each file's /steps/time rows; error = the largest difference from "
                 f"{self.reference} over its frames",
                 f"{'run':<28} {'h':>10} {'steps':>6}  " + "  ".join(f"{q.quantity:>12}" for q in self.quantities)]
        for i, (path, s) in enumerate(zip(self.paths, self.steps)):
            lines.append(f"{path.name[-28:]:<28} {s.value(self.step):10.4g} {s.count:6d}  "
                         + "  ".join(f"{q.errors[i]:12.4g}" for q in self.quantities))
            if i + 1 < len(self.paths):
                lines.append(f"{'  order':<28} {'':>10} {'':>6}  "
                             + "  ".join(f"{q.orders[i]:12.3f}" for q in self.quantities))
        lines.append(f"{'reference error estimate':<28} {'':>10} {'':>6}  "
                     + "  ".join(f"{q.reference_error:12.3g}" for q in self.quantities))
        lines.append(f"reference check: {self.reference_check}")
        lines.extend(q.line() for q in self.quantities)
        good = sum(q.ok for q in self.quantities)
        q0 = self.quantities[0]
        lines.append(f"{'PASS' if self.ok else 'FAIL'}: {good}/{len(self.quantities)} quantities of observed order "
                     f"within {q0.tol:g} of {q0.expected:g}")
        return "\n".join(lines)


def tighter_config(cfg: Config, largest_step: float = math.inf) -> tuple[Config, str]:
    """The reference's config made tighter (module docstring) and one phrase saying how. An error-controlled method
    also gets ``dt_max`` at most half the reference's ``largest_step``: a tolerance alone may leave the steps as they
    were (steps held by the frame times or by ``dt``), and an identical rerun estimates nothing. :class:`OrderRefused`
    when pdeflow cannot tighten it by itself: an ``rtol`` already at its lower bound, or a method whose accuracy is set
    neither by ``rtol`` nor by a fixed explicit step (``fv``, ``jko``, ``sgd``, ...: a finer grid, ``tau`` or noise
    path is not one knob)."""
    method = METHODS.get(cfg.solver.method)
    text = cfg.to_toml()
    if method is not None and "rtol" in method.reads:
        rtol, atol = cfg.solver.rtol / TIGHTER_TOL_FACTOR, cfg.solver.atol / TIGHTER_TOL_FACTOR
        dt_max = min(cfg.solver.dt_max, largest_step / TIGHTER_DT_FACTOR)
        if rtol < RTOL_RANGE[0]:
            raise OrderRefused(f"the reference's solver.rtol = {cfg.solver.rtol:g} cannot be tightened "
                               f"{TIGHTER_TOL_FACTOR:g}x to check it; give --tighter FILE")
        limits = [f"solver.rtol={rtol!r}", f"solver.atol={atol!r}", "output.path=''"]
        if math.isfinite(dt_max):
            limits += [f"solver.dt_max={dt_max!r}", f"solver.dt={min(cfg.solver.dt, dt_max)!r}",
                       f"solver.dt_min={min(cfg.solver.dt_min, dt_max)!r}"]
        return (loads_config(text, limits), f"rtol {cfg.solver.rtol:g} -> {rtol:g}, atol {cfg.solver.atol:g} -> "
                f"{atol:g}" + (f", dt_max {dt_max:.4g}" if math.isfinite(dt_max) else ""))
    if method is not None and method.explicit and not method.reads:
        dt = cfg.solver.dt / TIGHTER_DT_FACTOR
        return loads_config(text, [f"solver.dt={dt!r}", "output.path=''"]), f"dt {cfg.solver.dt:g} -> {dt:g}"
    raise OrderRefused(f"pdeflow cannot tighten a solver.method = {cfg.solver.method!r} reference by itself (its "
                       f"accuracy is set neither by solver.rtol nor by a fixed explicit step); give --tighter FILE")


def stored_config(path: str | Path) -> Config:
    """The config a pdeflow file was run with (its root attribute ``config``); :class:`OrderRefused` without one."""
    with open_for_reading(Path(path)) as f:
        text = f.attrs.get("config", "")
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)
    if not text:
        raise OrderRefused(f"{path} holds no pdeflow config to rerun tighter; give --tighter FILE")
    try:
        return loads_config(text)
    except ConfigError as exc:
        raise OrderRefused(f"{path}: its stored config is invalid ({exc}); give --tighter FILE") from None


def run_tighter(reference: str | Path, folder: Path) -> tuple[Path, str]:
    """Run the reference's config tighter into ``folder``: the file and how it was tightened. The problem is the one
    the reference stores (``/model``, ``/data``), not rebuilt from its config: a relative ``task.path`` names a file
    beside the config the reference was run from, which need not be where this runs."""
    import pdeflow.solvers  # noqa: F401 - registers the methods tighter_config reads
    from pdeflow.solvers.driver import run

    from ...io.file_access import TrajectoryError
    from ...io.problem_file import stored_problem

    cfg, how = tighter_config(stored_config(reference), step_size(reference).largest)
    try:
        problem = stored_problem(reference)
    except TrajectoryError as exc:
        raise OrderRefused(f"{exc}; give --tighter FILE") from None
    out = folder / "tighter-reference.h5"
    result = run(cfg, problem, out, quiet=True)
    if result.exit_code != 0:
        raise OrderRefused(f"the tighter run of the reference's config ({how}) failed: {result.message}")
    return out, f"a pdeflow rerun of its config ({how})"


def order_study(paths: list[str | Path], reference: str | Path, expected: float, *, tol: float = ORDER_TOL,
                step: str = "max", tighter: str | Path | None = None) -> OrderStudy:
    """The convergence-order verdict of the runs ``paths`` against ``reference`` (module docstring).

    :class:`OrderRefused` (one line) for a family that cannot be judged: fewer than two runs, a run without step
    sizes, two step sizes closer than :data:`MIN_STEP_RATIO`, a run not comparable with the reference, a reference
    not :data:`ACCURACY_MARGIN` times more accurate than the finest run in some quantity, or a zero error."""
    if len(paths) < 2:
        raise OrderRefused("an order needs at least two runs at different step sizes (three give its spread)")
    runs = sorted(((step_size(p), Path(p)) for p in paths), key=lambda r: -r[0].value(step))
    steps, ordered = [r[0] for r in runs], [r[1] for r in runs]
    h = np.array([s.value(step) for s in steps])
    if np.any(h[:-1] / h[1:] < MIN_STEP_RATIO):
        raise OrderRefused(f"the step sizes {', '.join(f'{x:.6g}' for x in h)} must differ by a factor of at least "
                           f"{MIN_STEP_RATIO:g} from one run to the next")
    errors = [family_errors(p, reference) for p in ordered]
    if tighter is not None:
        ref_errors, how = family_errors(reference, tighter), f"the given tighter file {tighter}"
    else:
        with tempfile.TemporaryDirectory(prefix="pdeflow-order-") as folder:
            made, how = run_tighter(reference, Path(folder))
            ref_errors = family_errors(reference, made)
    quantities = []
    for name in (n for n in errors[-1] if all(n in err for err in errors)):
        e = np.array([err[name] for err in errors])
        if np.any(e <= 0):
            raise OrderRefused(f"{name}: an error is exactly zero ({', '.join(f'{x:.3g}' for x in e)}); no order "
                               f"can be measured")
        ref_err = ref_errors.get(name, 0.0)
        if not ref_err > 0:
            raise OrderRefused(f"{name}: the reference and {how} do not differ, so the reference's error is not "
                               f"established")
        if ref_err * ACCURACY_MARGIN > e[-1]:
            raise OrderRefused(f"the reference is not {ACCURACY_MARGIN:g}x more accurate than the finest run: "
                               f"{name} error of the reference ~{ref_err:.3g} (against {how}) against {e[-1]:.3g} for "
                               f"{ordered[-1]}; use a tighter reference or larger steps")
        try:
            fit = fit_power_law(h, e)
            slope, stderr = fit.slope, fit.stderr
        except ValueError:   # two runs: a slope but no spread
            slope, stderr = float(np.log(e[0] / e[1]) / np.log(h[0] / h[1])), math.nan
        quantities.append(QuantityOrder(name, e, successive_orders(h, e), slope, stderr, ref_err, expected, tol))
    check = (f"the reference's error estimated against {how}; every quantity's is below 1/{ACCURACY_MARGIN:g} of the "
             f"finest run's error")
    return OrderStudy(ordered, Path(reference), steps, step, quantities, check)


def plot_order(path: str | Path, study: OrderStudy) -> None:
    """The log-log figure (PNG): each quantity's error against h, with a line of the expected slope through the
    finest point; matplotlib's Agg canvas (no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    h = study.h
    for i, q in enumerate(study.quantities):
        color = f"C{i}"
        ax.loglog(h, q.errors, "o-", color=color, label=f"{q.quantity}: observed {q.observed:.2f}")
        ax.loglog(h, q.errors[-1] * (h / h[-1]) ** q.expected, ":", color=color, lw=1)
    ax.set_xlabel(f"step size h ({'largest' if study.step == 'max' else 'mean'} step)")
    ax.set_ylabel("largest error against the reference")
    expected = study.quantities[0].expected if study.quantities else math.nan
    ax.set_title(f"observed order (dotted: slope {expected:g}) - {'PASS' if study.ok else 'FAIL'}")
    ax.legend(fontsize=8)
    fig.savefig(str(path), dpi=100)


__all__ = ["OrderRefused", "OrderStudy", "QuantityOrder", "StepSize", "order_study", "plot_order", "step_size",
           "successive_orders", "tighter_config", "ACCURACY_MARGIN", "ORDER_TOL"]
