"""Every run watches its own accuracy: the local energy-identity defect and the explicit stability margin.

Along the gradient flow (docs/model.md) ``dE/dt = -I``. After each accepted step ``t_n -> t_n + h`` the driver
records in ``/steps``: ``dissipation_integral`` ``Q_n`` (the step's quadrature of ``int I dt``: the RK method's own
``h sum_i b_i I(Y_i)``, else the trapezoid), ``identity_defect``
``delta_n = |E_{n+1} - E_n + Q_n| / max(|E_{n+1} - E_n|, floor)`` (``O(h^p)``; above ``run.identity_tol`` accuracy
is lost) and, for fixed-step explicit particle steppers, ``lambda_max_dt``
(:func:`pdeflow.core.system_jacobian.lambda_max`, warm-started from the previous check's vector, against
:attr:`Stepper.stability_bound`). ``run.accuracy`` = ``"stop"``,
``"warn"`` or ``"off"``. Details, check schedule and costs: docs/accuracy.md.
"""
from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pdeflow.core.problem import JVP_COST
from pdeflow.core.system_jacobian import TopPair, lambda_max
from pdeflow.io import schema

from .base import DefectSource, Setting, SolverError
from .loop import Observer, Step, Stop

if TYPE_CHECKING:
    from pdeflow.io.trajectory import Trajectory

    from .base import State, Stepper

# floor of the defect's denominator, in units of the kernels' machine epsilon times |E|
FLOOR_ULPS = 1000.0
# a check also follows a step whose dissipation grew by more than this factor
DISSIPATION_JUMP = 1.25
POLICIES = ("stop", "warn", "off")


def remedy(stepper: Stepper) -> str:
    """The change of ``stepper``'s own accuracy setting that makes its steps more accurate, as advice: the
    tolerances (and largest step) of an error-controlled method, the step ``tau`` of a minimizing movement, the
    CFL number and step of a finite-volume method, else the fixed step ``dt``."""
    if hasattr(stepper, "rtol"):
        return (f"tighten solver.rtol = {stepper.rtol:g} and solver.atol = {stepper.atol:g} or lower "
                f"solver.dt_max = {stepper.dt_max:g}")
    if hasattr(stepper, "tau"):
        return f"reduce solver.tau = {stepper.tau:g}"
    if hasattr(stepper, "cfl"):
        return f"lower solver.cfl = {stepper.cfl:g} or solver.dt = {stepper.dt:g}"
    return f"reduce solver.dt = {stepper.dt:g}"


# The advice after a loss aims at run.identity_tol / ADVICE_MARGIN up to t_end: its prediction is an estimate (the
# defect's growth extrapolated, the scalings below), and a factor 2 covers a model wrong by as much.
ADVICE_MARGIN = 2.0
# the defect's growth rate is fitted to the logarithms of the defects of the last GROWTH_WINDOW steps (at least 3)
GROWTH_WINDOW = 8
MAX_FACTOR = 1e6


@dataclass(frozen=True)
class Outlook:
    """Where a run stands when a step loses the energy identity, for advice that ends the run: the loss at ``t``,
    the run's ``t_end``, ``run.identity_tol`` and ``growth``, the rate at which the defect grew over the recent steps
    (``delta(t) ~ exp(growth t)``, fitted to their logarithms; 0 when it did not grow or ``points`` < 3 steps give
    no rate). Advice extrapolates the defect to t_end at that rate (:attr:`factor`): an estimate."""
    t: float
    t_end: float
    tol: float
    growth: float = 0.0
    points: int = 0

    @property
    def target(self) -> float:
        return self.tol / ADVICE_MARGIN

    @property
    def factor(self) -> float:
        """How much the defect grows by t_end at its recent rate."""
        return min(math.exp(min(self.growth * max(self.t_end - self.t, 0.0), 50.0)), MAX_FACTOR)

    def words(self) -> str:
        if self.t >= self.t_end:
            return "the loss is at t_end"
        if self.points < 3:
            return "too few steps before it to measure how the defect grows: taken as not growing"
        if self.growth <= 0.0:
            return f"the defect did not grow over the last {self.points} steps"
        return (f"the defect growing x{self.factor:.3g} by t_end = {self.t_end:g} at its rate over the last "
                f"{self.points} steps")


def growth_rate(times: list[float], defects: list[float]) -> float:
    """The least-squares slope of ``log(defect)`` against time (>= 0; 0 for fewer than 3 points): [n], [n] -> rate."""
    t, d = np.asarray(times, dtype=float), np.asarray(defects, dtype=float)
    keep = np.isfinite(t) & np.isfinite(d) & (d > 0)
    t, d = t[keep], d[keep]
    if t.size < 3 or np.ptp(t) == 0:
        return 0.0
    return max(0.0, float(np.polyfit(t, np.log(d), 1)[0]))


def step_setting(stepper: Stepper) -> Setting:
    """The stepper's own accuracy setting (:func:`remedy`'s) and how the time step's share of the relative defect
    scales with it: ``dt ** p`` for a method of order p (a minimizing movement's tau: first order; a finite-volume
    method's cfl: its Runge-Kutta order), ``rtol ** (p / (q + 1))`` for an error-controlled method (its steps ~
    ``rtol ** (1 / (q + 1))``, q the order of its error estimate)."""
    order = float(getattr(stepper, "order", 1))
    if hasattr(stepper, "rtol"):
        return Setting("solver.rtol", float(stepper.rtol), order / (float(getattr(stepper, "error_order", order)) + 1))
    if hasattr(stepper, "tau"):
        return Setting("solver.tau", float(stepper.tau), 1.0)
    if hasattr(stepper, "cfl"):
        return Setting("solver.cfl", float(stepper.cfl), float(len(getattr(stepper, "alphas", (1, 1)))))
    return Setting("solver.dt", float(stepper.dt), order)


def _changed(stepper: Stepper, setting: Setting, ratio: float) -> str:
    """The change of the stepper's own setting by ``ratio``, in words (error-controlled: both tolerances)."""
    verb = "reduce" if ratio < 1 else "raise"
    if setting.key == "solver.rtol":
        return (f"tighten solver.rtol = {stepper.rtol:g} to {setting.times(ratio):g} and solver.atol = "
                f"{stepper.atol:g} to {float(f'{stepper.atol * ratio:.2g}'):g}")
    if setting.key == "solver.cfl":
        return (f"lower solver.cfl = {stepper.cfl:g} to {setting.times(ratio):g} and solver.dt = {stepper.dt:g} to "
                f"{float(f'{stepper.dt * ratio:.2g}'):g}")
    return f"{verb} {setting.key} = {setting.value:g} to {setting.times(ratio):g}"


def advice(stepper: Stepper, old: State, new: State, residual: float, change: float | None = None,
           outlook: Outlook | None = None) -> str:
    """The setting to change after the step ``old -> new`` lost the energy identity with the signed residual
    ``R = E1 - E0 + Q`` = ``residual`` (``change`` = ``E1 - E0``), chosen so that the run, redone with it, reaches
    its t_end (``outlook``), as an estimate that says what it rests on.

    The stepper's estimated sources other than the time step (:meth:`~pdeflow.solvers.base.Stepper.defect_sources`:
    an entropic blur, inner solves, each signed) are weighed against what they leave to the step's own error,
    ``R - sum of the sources``, whose remedy is :func:`remedy`; the largest names the setting. The step's own error:
    the setting scaled so that the defect, scaled by :func:`step_setting`'s power and grown at its recent rate to
    t_end, is ``run.identity_tol / ADVICE_MARGIN``. A source fixed per step (an entropic blur, whose relative share
    grows as the energy change per step shrinks, so that a longer step only postpones the loss): the step setting
    whose trial steps (one from the lost step's start, grown to t_end; one from the initial state) stay below that
    target, the nearest to the present one; if none does, the advice says so and names the setting that shrinks
    the source (:attr:`~pdeflow.solvers.base.DefectSource.setting`: grid.n, solver.epsilon) with the value that
    would, by the source's scaling."""
    try:
        sources = stepper.defect_sources(old, new, residual)
    except SolverError as exc:  # the estimate's own solve failed: the step's setting, and why no more is said
        return f"{remedy(stepper)} (the residual's other sources could not be estimated: {exc})"
    if change is None or outlook is None or change == 0.0:
        return remedy(stepper) if not sources else _ranked(stepper, sources, residual, _largest(stepper, sources,
                                                                                                 residual))
    defect = abs(residual / change)
    own = step_setting(stepper)
    fixed = [s for s in sources if s.trials]
    if not fixed:
        ratio = min(1.0, (outlook.target / (defect * outlook.factor)) ** (1.0 / own.power))
        fix = (f"{_changed(stepper, own, ratio)}: an estimate that the run then reaches t_end = {outlook.t_end:g} with "
               f"its defect at most {outlook.target:g} (the defect {defect:.3g} ~ {own.key}^{own.power:.3g}; "
               f"{outlook.words()})")
        if sources and abs(residual - sum(x.energy for x in sources)) < max(abs(x.energy) for x in sources):
            fix = _largest(stepper, sources, residual)   # a source without trials dominates: its own remedy
        return fix if not sources else _ranked(stepper, sources, residual, fix)
    return _ranked(stepper, sources, residual, _fixed_source_advice(fixed[0], own, defect, residual, change, outlook))


def _fixed_source_advice(source: DefectSource, own: Setting, defect: float, residual: float, change: float,
                         outlook: Outlook) -> str:
    """:func:`advice` for a source fixed per step that carries trial steps (module docstring of
    :mod:`pdeflow.solvers.entropic_ot`)."""
    target, grow = outlook.target, outlook.factor
    measured = ", ".join(f"x{f:g}: {d:.3g}" for f, d, _ in source.trials)
    good = [(f, d, first) for f, d, first in source.trials if d * grow <= target and not first > target]
    if good:
        f, d, first = min(good, key=lambda item: abs(math.log(item[0])))
        verb = "raise" if f > 1 else "reduce"
        start = f"; its first step from the initial state: {first:.3g}" if math.isfinite(first) else ""
        return (f"{verb} {own.key} = {own.value:g} to {own.value * f:g}: an estimate that the run then reaches t_end = "
                f"{outlook.t_end:g} with its defect at most {target:g} (one step of it from here: defect {d:.3g}; "
                f"{outlook.words()}{start}); lowering {own.key} adds {source.name}")
    # the shares of the defect: the source's, fixed per step (~ 1 / step, ~ finer.value ** finer.power), and the
    # rest, the step's own (~ step ** own.power)
    blur, rest = abs(source.energy / change), abs((residual - source.energy) / change)
    shares = (f"the {source.name}'s share {blur:.3g} ~ 1/{own.key}, the step's own {rest:.3g} ~ "
              f"{own.key}^{own.power:g}")
    smaller = [r for r in (2.0 ** -k for k in range(2, 7)) if (rest * r ** own.power + blur / r) * grow <= target]
    if smaller and rest > blur:
        r = max(smaller)
        return (f"reduce {own.key} = {own.value:g} to {own.value * r:g}: an estimate that the run then reaches t_end = "
                f"{outlook.t_end:g} with its defect at most {target:g} ({shares}; {outlook.words()})")
    head = (f"no {own.key} reaches t_end = {outlook.t_end:g} with the defect at most {target:g} (one step from here "
            f"with {own.key} {measured}; {outlook.words()})")
    finer = source.setting
    if finer is None:
        return f"{head}; {source.remedy}"
    ratios = [2.0 ** k for k in range(-4, 5)]
    room = {r: (target / grow - rest * r ** own.power) * r / blur for r in ratios}
    r = max(ratios, key=lambda x: room[x])
    if room[r] <= 0.0:
        return f"{head}; nor does {finer.key}: the step's own share alone exceeds it ({shares})"
    value = finer.times(room[r] ** (1.0 / finer.power))
    reached = (rest * r ** own.power + blur / r * (value / finer.value) ** finer.power) * grow
    with_step = "" if r == 1.0 else f" with {own.key} = {own.value * r:g}"
    change_words = f"{'raise' if finer.power < 0 else 'lower'} {finer.key} = {finer.value:g} to {value:g}{with_step}"
    if reached > target:
        return (f"{head}; nor does {finer.key} up to {finer.largest:g}, what this method takes: {change_words} is "
                f"predicted to end with the defect {reached:.2g} ({shares})")
    return (f"{head}; {change_words}: an estimate that the run then reaches t_end with its defect at most {target:g} "
            f"({shares}, ~ {finer.key}^{finer.power:g})")


def _largest(stepper: Stepper, sources: list[DefectSource], residual: float) -> str:
    """The remedy of the largest share of the residual: a source's, or the time step's (:func:`remedy`)."""
    step = DefectSource("time step error", residual - sum(s.energy for s in sources), remedy(stepper))
    return max([step, *sources], key=lambda s: abs(s.energy)).remedy


def _ranked(stepper: Stepper, sources: list[DefectSource], residual: float, fix: str) -> str:
    """``fix``, with the residual's shares: the step's own error and each source, the largest first."""
    step = DefectSource("time step error", residual - sum(s.energy for s in sources), remedy(stepper))
    ranked = sorted([step, *sources], key=lambda s: abs(s.energy), reverse=True)
    shares = ", ".join(f"{s.name} {s.energy:+.2g}" for s in ranked)
    return f"{fix} (the {ranked[0].name} dominates the residual {residual:+.2g} = {shares})"


def identity_defect(energy0: float, energy1: float, integral: float, eps: float) -> float:
    """``|E1 - E0 + Q| / max(|E1 - E0|, FLOOR_ULPS eps max(|E0|, |E1|))`` (module docstring)."""
    change = energy1 - energy0
    floor = FLOOR_ULPS * eps * max(abs(energy0), abs(energy1), 1e-300)
    return abs(change + integral) / max(abs(change), floor)


# ---- the record a run keeps -----------------------------------------------------------------------
# the accuracy record's /steps columns: the named optional /steps datasets of the file's schema table
COLUMNS = schema.names("/steps", needs=(schema.OPTIONAL,))


@dataclass
class Assessment:
    """What a step's checks found, applied by :meth:`AccuracyMonitor.accept` once the step is recorded."""
    columns: dict[str, float]
    eigen: TopPair | None = None
    losses: list[tuple[str, str]] = field(default_factory=list)  # (kind, one-line description)


class AccuracyMonitor:
    """The per-step accuracy record of one run (module docstring): columns, warnings, stop and summary.

    Its state is the last check's eigenvector and the product count (kept in the checkpoint,
    :meth:`checkpoint_vector`) and what :meth:`restore` recomputes from the committed /steps rows."""

    def __init__(self, stepper: Stepper, comm: Any, run: Any, n_particles: int) -> None:
        """``run``: the ``[run]`` settings (``accuracy``, ``identity_tol``, ``stability_interval``);
        ``n_particles``: of the whole measure (the size of the checkpointed eigenvector)."""
        self.stepper, self.problem, self.comm = stepper, stepper.problem, comm
        self.policy, self.tol = run.accuracy, run.identity_tol
        self.t_end = float(run.t_end)
        self.recent: deque[tuple[float, float]] = deque(maxlen=GROWTH_WINDOW - 1)  # (t, defect) of the last steps
        self.dt = stepper.dt  # the fixed step of the methods with a stability bound
        self.n_particles = int(n_particles)
        self.identity = bool(stepper.energy_identity)
        self.bound = float(stepper.stability_bound)
        self.serial = comm.size == 1
        self.stability = math.isfinite(self.bound) and self.serial and stepper.measure == "particles"
        self.every = max(1, run.stability_interval // max(1, stepper.stages))
        self.eps = float(np.finfo(np.float32 if self.problem.precision == "float32" else np.float64).eps)
        self.vector: np.ndarray | None = None
        self.products = 0
        self.checks = 0
        self.last_checks: list[tuple[int, float]] = []  # (step, ratio) of the last two checks
        self.first_check: tuple[float, float] | None = None  # (t, lambda_max dt) of the run's first stability check
        self.max_defect = math.nan
        self.max_ratio = math.nan
        self.lost_at = math.nan
        self.loss_text = ""
        self.warned: set[str] = set()

    # ---- what the file says about the checks ---------------------------------------------------
    def notes(self) -> dict[str, Any]:
        """Attributes of ``/steps``: the stability bound and why a check does not apply."""
        why = []
        if not self.identity:
            why.append(f"identity_defect not recorded: {self.stepper.identity_note()}")
        if not math.isfinite(self.bound) and self.stepper.stability_column:
            why.append(f"lambda_max_dt not recorded: {self.stepper.name!r} guards its own stability (margin in "
                       f"/steps/{self.stepper.stability_column})")
        elif not math.isfinite(self.bound):
            why.append(f"lambda_max_dt not recorded: {self.stepper.name!r} is not a fixed-step explicit particle "
                       f"method with a stability bound")
        elif not self.stability:
            why.append("lambda_max_dt not recorded: the check runs only in serial runs (not under MPI)")
        return {"stability_bound": self.bound, "identity_tol": self.tol,
                "accuracy_note": "; ".join(why) or "all checks apply"}

    @property
    def checkpoint_size(self) -> int:
        """Length of :meth:`checkpoint_vector`: the eigenvector [N k] (serial stability runs) and the count."""
        n = self.n_particles * self.problem.k if self.stability else 0
        return n + 1

    def checkpoint_vector(self) -> np.ndarray:
        out = np.zeros(self.checkpoint_size)
        if self.vector is not None and self.vector.size == out.size - 1:
            out[:-1] = self.vector
        out[-1] = self.products
        return out

    def restore(self, vector: np.ndarray | None, rows: dict[str, np.ndarray]) -> None:
        """Continue a resumed run: the checkpoint's vector (None in files written before these checks: the
        next check starts cold) and the committed /steps rows (row i is step i), re-judged with the current
        thresholds (a resume may change run.identity_tol); losses found there are not warned about again."""
        if vector is not None and vector.size == self.checkpoint_size:
            self.products = int(vector[-1])
            self.vector = np.array(vector[:-1]) if self.stability and np.any(vector[:-1]) else None
        times = rows.get("time", np.zeros(0))
        defect = rows.get("identity_defect", np.full(len(times), np.nan))
        lam = rows.get("lambda_max_dt", np.full(len(times), np.nan))
        for i in range(len(times)):
            self._update(float(times[i]), {"identity_defect": float(defect[i]), "lambda_max_dt": float(lam[i])},
                         step=i, replay=True)

    # ---- per step --------------------------------------------------------------------------------
    def _due(self, step: int, dissipation0: float, dissipation1: float) -> bool:
        if not self.stability:
            return False
        if not self.last_checks or dissipation1 > DISSIPATION_JUMP * dissipation0:
            return True
        return step - self.last_checks[-1][0] >= self.gap()

    def gap(self) -> int:
        """Steps from the last check to the next: half the predicted distance to r = 1, at most ``every``."""
        if len(self.last_checks) < 2:
            return self.every
        (s0, r0), (s1, r1) = self.last_checks
        if not 0 < r0 < r1 < 1 or s1 <= s0:
            return self.every
        growth = math.log(r1 / r0) / (s1 - s0)
        return int(min(self.every, max(1, 0.5 * math.log(1 / r1) / growth)))

    def assess(self, old: State | None, new: State, diag0: dict[str, float] | None,
               diag1: dict[str, float]) -> Assessment:
        """The checks of the step ``old -> new`` (``old`` None: the initial state), without changing the
        record: an interrupted step is discarded with its checks."""
        columns = {c: math.nan for c in COLUMNS}
        fix = ""
        if self.identity and old is not None:
            q = self.stepper.dissipation_integral(old, new, diag0, diag1)
            columns["dissipation_integral"] = q
            columns["identity_defect"] = identity_defect(diag0["energy"], diag1["energy"], q, self.eps)
            if columns["identity_defect"] > self.tol and self._reported("identity"):
                # only a loss that is reported pays for the estimate of its sources (a stepper's extra solves)
                times, defects = zip(*self.recent, (new.t, columns["identity_defect"]))
                outlook = Outlook(new.t, self.t_end, self.tol, growth_rate(times, defects), len(times))
                change = diag1["energy"] - diag0["energy"]
                fix = advice(self.stepper, old, new, change + q, change, outlook)
        eigen = None
        d0 = diag1["dissipation"] if diag0 is None else diag0["dissipation"]
        # zero-mass (tracer) particles have no place in M^{1/2} J M^{-1/2}: no check for such clouds
        if self._due(new.step, d0, diag1["dissipation"]) and np.all(new.fields["mass"] > 0):
            try:
                eigen = lambda_max(self.problem, new.fields["omega"], new.fields["mass"], self.vector)
            except np.linalg.LinAlgError:  # the Rayleigh-Ritz eigenproblem broke down (non-finite products): no figure
                eigen = None
            else:
                columns["lambda_max_dt"] = eigen.value * self.dt
        return Assessment(columns, eigen, self._losses(new.t, columns, fix))

    def _reported(self, kind: str) -> bool:
        """Whether a loss of this kind now would be printed or stop the run (the first of its kind, not "off")."""
        return self.policy == "stop" or (self.policy == "warn" and kind not in self.warned)

    def _losses(self, t: float, columns: dict[str, float], fix: str = "") -> list[tuple[str, str]]:
        """The losses of a step's columns; ``fix``: the advice for an identity loss (default :func:`remedy`: a
        replayed row has no states to estimate the defect's sources from)."""
        out = []
        defect, lam_dt = columns["identity_defect"], columns["lambda_max_dt"]
        if defect > self.tol:
            out.append(("identity", f"at t = {t:.6g} the energy-identity defect {defect:.3g} exceeds "
                                    f"run.identity_tol = {self.tol:g} (the step's energy change and the integral of "
                                    f"the dissipation disagree); {fix or remedy(self.stepper)}"))
        if lam_dt > self.bound:
            # the step that the bound allows at this lambda_max is necessary, not sufficient: lambda_max may keep
            # rising along the rest of the run, as it did since the first check
            rise = ""
            if self.first_check is not None and lam_dt > self.first_check[1] > 0:
                rise = (f"; lambda_max rose {lam_dt / self.first_check[1]:.3g}-fold since t = {self.first_check[0]:.6g}"
                        f" and may rise further")
            out.append(("stability", f"at t = {t:.6g} lambda_max * dt = {lam_dt:.4g} exceeds {self.stepper.name}'s "
                                     f"stability bound {self.bound:.4g} (lambda_max = {lam_dt / self.dt:.4g}, "
                                     f"solver.dt = {self.dt:g}{rise}); reduce solver.dt below "
                                     f"{self.bound / (lam_dt / self.dt):.3g}, the bound at this lambda_max, or use "
                                     f"solver.method = 'adaptive'"))
        return out

    def accept(self, t: float, step: int, a: Assessment) -> list[str]:
        """Apply an assessment to the record; the one-line warnings to print now."""
        if a.eigen is not None:
            self.vector, self.products = a.eigen.vector, self.products + a.eigen.products
        return self._update(t, a.columns, step, losses=a.losses)

    def _update(self, t: float, columns: dict[str, float], step: int, replay: bool = False,
                losses: list[tuple[str, str]] | None = None) -> list[str]:
        defect, lam_dt = columns["identity_defect"], columns["lambda_max_dt"]
        if math.isfinite(defect):
            self.max_defect = defect if not defect <= self.max_defect else self.max_defect
            self.recent.append((t, defect))
        if math.isfinite(lam_dt):
            if self.first_check is None:
                self.first_check = (t, lam_dt)
            ratio = lam_dt / self.bound
            self.max_ratio = ratio if not ratio <= self.max_ratio else self.max_ratio
            self.last_checks = (self.last_checks + [(step, ratio)])[-2:]
            self.checks += 1
        losses = self._losses(t, columns) if losses is None else losses
        lines = []
        for kind, text in losses:
            if math.isnan(self.lost_at):
                self.lost_at, self.loss_text = t, text
            if kind not in self.warned:
                self.warned.add(kind)
                if not replay and self.policy == "warn":
                    lines.append(f"pdeflow: accuracy lost: {text} (run.accuracy = 'off' silences this check)")
        return lines

    def should_stop(self, a: Assessment) -> bool:
        return self.policy == "stop" and bool(a.losses)

    # ---- the verdict -----------------------------------------------------------------------------
    def verdict(self, steps: int) -> str:
        """One line: held / lost at t = ... / not checked, with the largest figures and, for the stability
        check, its cost against the ``steps`` steps' gradient evaluations."""
        line = summary_line(self.max_defect, self.max_ratio, self.tol, self.bound, self.lost_at, self.loss_text,
                            self.policy)
        if self.stability and steps > 0:
            evaluations = steps * self.stepper.stages
            line += (f"; stability checks cost {self.products} Hessian-vector products, ~"
                     f"{JVP_COST * self.products / evaluations:.2g} of the steps' {evaluations} gradient "
                     f"evaluations (a product ~ {JVP_COST:g} evaluations)")
        return line

    def end_attrs(self, steps: int) -> dict[str, Any]:
        return {"accuracy": self.verdict(steps), "accuracy_lost_at": self.lost_at,
                "max_identity_defect": self.max_defect,
                "max_stability_ratio": self.max_ratio, "stability_products": self.products}


def summary_line(max_defect: float, max_ratio: float, tol: float, bound: float, lost_at: float, loss_text: str,
                 policy: str) -> str:
    """The accuracy verdict of a run in one line (used by the run's end and by ``pdeflow info``)."""
    parts = []
    if math.isfinite(max_defect):
        parts.append(f"largest identity defect {max_defect:.3g} (run.identity_tol {tol:g})")
    if math.isfinite(max_ratio):
        parts.append(f"largest lambda_max*dt/bound {max_ratio:.3g} (bound {bound:.4g})")
    figures = ", ".join(parts)
    if not parts:
        return "not checked: no check applies to this run"
    if math.isfinite(lost_at):
        return f"LOST at t = {lost_at:.6g}: {loss_text}; {figures}"
    held = "held" if policy != "off" else "held (run.accuracy = 'off')"
    return f"{held}: {figures}"


def file_lost_at(traj: Trajectory) -> float:
    """The time a trajectory's run lost accuracy (nan: it held, or no check was recorded): the root attribute
    ``accuracy_lost_at`` its run wrote when it ended, else (running, or killed) the first committed /steps row
    whose checks exceed the thresholds the run started with (:func:`file_verdict`)."""
    if "identity_defect" not in traj.steps:
        return math.nan
    if traj.attrs.get("status") != "running" and traj.attrs.get("accuracy"):
        return float(traj.attrs.get("accuracy_lost_at", math.nan))
    lost = _lost_rows(traj)
    return float(traj.steps["time"][np.argmax(lost)]) if lost.any() else math.nan


def _lost_rows(traj: Trajectory) -> np.ndarray:
    """Which committed /steps rows of a trajectory lost accuracy, by the thresholds its run started with."""
    notes = getattr(traj, "steps_attrs", {})
    tol = float(notes.get("identity_tol", traj.config.run.identity_tol))
    bound = float(notes.get("stability_bound", math.nan))
    return (traj.steps["identity_defect"] > tol) | (traj.steps["lambda_max_dt"] > bound)


def file_verdict(traj: Trajectory) -> str:
    """The accuracy line of a trajectory (:class:`pdeflow.io.trajectory.Trajectory`): the verdict its run wrote
    when it ended (root attribute ``accuracy``), else (running, or killed) one from its committed /steps rows
    with the thresholds it started with; "not recorded" for files written before the checks."""
    steps, notes = traj.steps, getattr(traj, "steps_attrs", {})
    if "identity_defect" not in steps:
        return "not recorded (the file was written before pdeflow checked accuracy)"
    if traj.attrs.get("status") != "running" and traj.attrs.get("accuracy"):
        return str(traj.attrs["accuracy"])
    tol = float(notes.get("identity_tol", traj.config.run.identity_tol))
    bound = float(notes.get("stability_bound", math.nan))
    defect, lam_dt, times = steps["identity_defect"], steps["lambda_max_dt"], steps["time"]
    lost = _lost_rows(traj)
    lost_at = float(times[np.argmax(lost)]) if lost.any() else math.nan
    text = ""
    if lost.any():
        i = int(np.argmax(lost))
        text = (f"energy-identity defect {defect[i]:.3g} > run.identity_tol {tol:g}" if defect[i] > tol else
                f"lambda_max * dt = {lam_dt[i]:.4g} > stability bound {bound:.4g}")
    finite_d, finite_l = defect[np.isfinite(defect)], lam_dt[np.isfinite(lam_dt)]
    line = summary_line(float(finite_d.max()) if finite_d.size else math.nan,
                        float(finite_l.max()) / bound if finite_l.size else math.nan, tol, bound, lost_at, text,
                        traj.config.run.accuracy)
    return line if notes.get("accuracy_note", "all checks apply") == "all checks apply" else \
        f"{line} [{notes['accuracy_note']}]"


class AccuracyRecord(Observer):
    """The accuracy record as an observer of the time loop (:mod:`pdeflow.solvers.loop`, which computes the
    diagnostics): each step assessed with it (its columns on the step), entered in the :class:`AccuracyMonitor`
    once taken (warnings printed on rank 0), and with ``run.accuracy = "stop"`` the loop stopped before the step
    after a loss, or at the end if the last step lost it (``accuracy_lost``)."""

    def __init__(self, monitor: AccuracyMonitor) -> None:
        self.monitor = monitor
        self.stop_reason: str | None = None  # the loss that stops the run

    def record(self, t: float, step: int, checks: Assessment) -> None:
        """Enter a step's checks in the record; print its warnings; note a loss that stops the run."""
        for line in self.monitor.accept(t, step, checks):
            if self.monitor.comm.is_root:
                print_warning(line)
        if self.monitor.should_stop(checks):
            self.stop_reason = checks.losses[0][1]

    def check(self, state: State) -> Stop | None:
        if self.stop_reason is not None:
            return Stop("accuracy_lost", f"accuracy lost {self.stop_reason}; every frame before is kept "
                                         f"(run.accuracy = 'stop'; to continue anyway: pdeflow run --resume "
                                         f"--set run.accuracy=warn)")
        return None

    def assess(self, step: Step) -> None:
        checks = self.monitor.assess(step.old, step.new, self.monitor.stepper.diagnostics(step.old), step.diagnostics)
        step.data["checks"] = checks
        step.columns.update(checks.columns)

    def accept(self, step: Step) -> None:
        self.record(step.new.t, step.new.step, step.data["checks"])

    def finish(self, state: State) -> Stop | None:
        if self.stop_reason is not None:  # the last step lost accuracy: the same stop, at t_end
            return Stop("accuracy_lost", f"accuracy lost {self.stop_reason}; every frame is kept "
                                         f"(run.accuracy = 'stop')")
        return None


def print_warning(line: str) -> None:
    """A warning line on stderr (through tqdm, so that a progress bar stays intact)."""
    from tqdm import tqdm
    tqdm.write(line, file=sys.stderr)
