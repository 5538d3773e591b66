"""What every time stepper shares: the state it advances and the interface the driver calls.

A stepper advances a measure ``rho_t`` of the flow ``d/dt rho = div(rho grad Phi) (+ (1/beta) Laplace rho)``
(docs/model.md). Its :class:`State` carries the measure's arrays (``fields``: ``omega`` [N,k] and ``mass`` [N]
for particles, ``density`` for a grid), the time, the step size to try next, the step count and, for
random steppers, the generator (:class:`pdeflow.core.state.State`). A stepper takes its parameters explicitly
(``RK4(problem, dt=0.01)``); :meth:`Stepper.from_config` reads them from a config's ``[solver]`` (and related)
keys. The loop (:mod:`pdeflow.solvers.loop`) advances it; the driver (:mod:`pdeflow.solvers.driver`) owns frames
and files; a file's checkpoint converts to a :class:`State` and back in :mod:`pdeflow.io.resume`.
"""
from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pdeflow.core.config import Config
from pdeflow.core.problem import COST_KINDS, Evaluation, Problem
from pdeflow.core.state import State, rng_from_state, rng_state

from .methods import Method, declare
from .parameters import Param


def hermite(h: float, i0: float, i1: float, slope0: float, slope1: float) -> float:
    """``int_0^h I dt`` by the Hermite rule ``h (I0 + I1) / 2 + h^2 (I0' - I1') / 12`` (exact for cubics): a step's
    quadrature of the dissipation whose error, ``O(h^5)``, stays below a second- or third-order method's, so the
    energy-identity defect shows the method's error rather than the quadrature's."""
    return 0.5 * h * (i0 + i1) + h * h * (slope0 - slope1) / 12.0


# the /steps column of each kind of call the Problem counts (pdeflow.core.problem.COST_KINDS): every stepper's cost
COST_COLUMN = {"gradient": "gradient_evals", "jvp_exact": "jvps_exact", "jvp_difference": "jvps_difference"}
COST_COLUMNS = tuple(COST_COLUMN[kind] for kind in COST_KINDS)

# solver.method -> the stepper class that declares it (Stepper.__init_subclass__)
STEPPERS: dict[str, type[Stepper]] = {}


@dataclass(frozen=True)
class Setting:
    """A config key that scales a share of a step's energy-identity defect: the share ~ ``value ** power`` (an order-p
    method's time step error ~ ``dt ** p`` relative to the step's energy change; an entropic blur ~ eps ~
    ``grid.n ** -2``), within ``[smallest, largest]`` (what the method takes); ``integer``: a count (grid.n)."""
    key: str
    value: float
    power: float
    smallest: float = 0.0
    largest: float = math.inf
    integer: bool = False

    def times(self, ratio: float) -> float:
        """The value ``ratio`` times this one, within the method's range (a count rounded up)."""
        value = min(max(self.value * ratio, self.smallest), self.largest)
        return float(math.ceil(value - 1e-9)) if self.integer else float(f"{value:.2g}")


@dataclass(frozen=True)
class DefectSource:
    """One estimated contribution to a step's energy-identity residual ``E1 - E0 + Q``: its ``name``, its signed size
    ``energy`` (in units of E) and ``remedy``, the change of settings that shrinks it (one phrase naming the config
    keys). A source fixed per step (an entropic blur) may carry ``setting`` (what shrinks it, and how) and
    ``trials``: ``(factor, defect from the lost step's start, defect from the initial state)`` of single steps with
    the step setting times ``factor`` (:func:`pdeflow.solvers.accuracy.advice` weighs them)."""
    name: str
    energy: float
    remedy: str
    setting: Setting | None = None
    trials: tuple[tuple[float, float, float], ...] = ()


def _always(stepper: Stepper) -> bool:
    return True


@dataclass(frozen=True)
class Carried:
    """A value an accepted step hands to the next step (in :attr:`State.carry <pdeflow.core.state.State.carry>`),
    kept in checkpoints under its ``name``. Its ``shape``: ``"scalar"`` (a float), ``"int"``, ``"vector"`` ([n], n
    the measure's size, ``omega.size``), ``"values"`` ([m] at most) or ``"columns"`` ([n, m] at most), m the
    stepper's attribute named ``count``; ``like``: the ``"values"`` item whose held entries say which columns of a
    ``"columns"`` item are held (eigenvalues and their vectors); ``order``: the memory order (``"C"`` or ``"F"``) a
    ``"columns"`` item has while the stepper runs, given back by :meth:`unpack` (BLAS sums the products on it in an
    order that depends on it: a resumed run repeats the uninterrupted one bit for bit only with the same);
    ``when(stepper)``: whether this stepper carries it at all (its settings). A checkpoint holds it as a float array
    of the declared shape, nan where nothing is known (past the held entries, or no value): None in the carry it is
    restored to."""
    name: str
    shape: str = "scalar"
    count: str = ""
    like: str = ""
    order: str = "C"
    when: Callable[[Stepper], bool] = _always

    def size(self, stepper: Stepper, state: State) -> tuple[int, ...]:
        """The array shape of the checkpoint's dataset."""
        n = state.fields["omega"].size if "omega" in state.fields else 0
        m = int(getattr(stepper, self.count)) if self.count else 0
        return {"scalar": (), "int": (), "vector": (n,), "values": (m,), "columns": (n, m)}[self.shape]

    def pack(self, value: Any, shape: tuple[int, ...]) -> np.ndarray:
        """``value`` (None: not known) as the float array of ``shape``, nan-padded."""
        out = np.full(shape, math.nan)
        if value is None:
            return out
        if self.shape in ("scalar", "int", "vector"):
            out[...] = value
        elif self.shape == "values":
            out[:np.size(value)] = value
        else:
            out[:, :np.shape(value)[1]] = value
        return out

    def unpack(self, array: np.ndarray, held: np.ndarray | None = None) -> Any:
        """The value a checkpoint's ``array`` holds (None: not known): a float, an int, the vector, the finite
        entries of ``"values"``, the columns of ``"columns"`` that ``held`` marks (those of its ``like`` item)."""
        a = np.asarray(array, dtype=float)
        if self.shape in ("scalar", "int"):
            if not math.isfinite(float(a)):
                return None
            return int(a) if self.shape == "int" else float(a)
        if self.shape == "vector":
            return np.array(a) if np.all(np.isfinite(a)) else None
        if self.shape == "values":
            keep = np.isfinite(a)
            return np.array(a[keep]) if np.any(keep) else None
        keep = np.all(np.isfinite(a), axis=0) if held is None else held
        return np.array(a[:, keep], order=self.order) if np.any(keep) else None


class SolverError(RuntimeError):
    """A step could not be completed (a failed inner solve, a step size below its floor, ...)."""


class Stepper(abc.ABC):
    """Base class: a particle measure evolving under the velocity ``-grad Phi(omega_i; rho_N)``.

    The contract of a stepper (as scipy's ``OdeSolver`` states its own). A stepper class MUST define:

    1. ``name``: the ``solver.method`` it answers to; setting it registers the class (:data:`STEPPERS`) and declares
       its row of :data:`pdeflow.solvers.methods.METHODS` from :attr:`measures`, :attr:`explicit_flow`, :attr:`params`,
       :attr:`summary` and :attr:`use_when` (:meth:`__init_subclass__`; the "which solver" table renders the last
       two). A class without a name is a base for others and registers nothing.
    2. :meth:`from_config` (a named class; checked when it is defined): the stepper a config's ``[solver]`` (and
       related) keys describe; its ``__init__`` takes the parameters explicitly, calls ``Stepper.__init__`` and
       sets ``dt``. An error-controlled stepper inherits :class:`~pdeflow.solvers.controller.AdaptiveStepper`'s:
       ``solver.dt``, its step-size controller (an object, built from the controller's keys) and its other
       declared keys (item 5), passed by name.
    3. :meth:`step` (abstract: a class without it cannot be instantiated): advance a :class:`State` by at most
       ``dt_limit``, returning the new state (``state.advanced``, with what it hands the next step in its carry,
       item 8) and its /steps columns. An error-controlled method subclasses
       :class:`pdeflow.solvers.controller.AdaptiveStepper` instead and defines ``order``, ``error_order`` (of its
       error estimate: the exponent its :class:`~pdeflow.solvers.step_size.StepSizeController` uses) and
       ``_step_impl`` (checked when a named class is defined); an explicit Runge-Kutta method, only its tableau
       (:class:`pdeflow.solvers.explicit.ExplicitRK`, checked when the class is defined).

    It MAY override:

    4. :attr:`measure`, :attr:`measures`: what it evolves (``particles`` or ``grid``; the ``init.measure`` values).
    5. :attr:`params`, :meth:`check_keys`: the method-specific ``[solver]`` keys it reads
       (:class:`~pdeflow.solvers.parameters.Param`: name, type, default, doc, allowed values; the ``[solver]`` schema
       and ``pdeflow config`` are generated from them, :mod:`pdeflow.solvers.parameters`), and whether they go
       together; :meth:`key_values` reads them from a config by name.
    6. :attr:`explicit_flow`: True for an explicit Runge-Kutta step of the particles' Wasserstein flow.
    7. :attr:`step_columns`: the extra /steps columns :meth:`step` returns. The cost columns (:data:`COST_COLUMNS`:
       grad Phi evaluations, exact and difference products) are the base's, counted by the Problem around each
       step (:meth:`cost_since`), for every stepper alike; a stepper's own tallies (``jvps`` of rkc, rosenbrock,
       cvode: what its decisions or its breakdown use) are columns of its own, not its cost.
    8. :attr:`carried`: what an accepted step hands to the next (:class:`Carried`: names and shapes), the solver
       state: the step reads it from the state it is given (``state.carry``, by name) and leaves its own on the
       state it returns (``new.carry``), so nothing of it lives on the stepper (the step takes the state in and
       returns it, as diffrax's ``step`` its solver state). The base keeps it in checkpoints (:meth:`extra_state`)
       and restores it (:meth:`restore`), so a resumed run repeats the uninterrupted one bit for bit. An entry not
       declared there (cvode's running solver) lives in memory only: a resumed run starts it afresh.
    9. :meth:`evaluate`, :meth:`diagnostics`, :meth:`frame_attrs`: how its measure is evaluated and described (grids).
    10. :attr:`energy_identity`, :meth:`identity_note`, :attr:`quadrature`, :meth:`dissipation_integral`,
        :meth:`defect_sources`: its energy-identity check (:mod:`pdeflow.solvers.accuracy`); a stepper whose
        :meth:`diagnostics` give the ``energy`` and ``dissipation`` gets the check with no code of its own.
    11. :attr:`stability_bound`, :attr:`stability_column`, :attr:`stages`: the ``lambda_max * dt`` check of a
        fixed-step explicit method, or the column where a stepper guarding its own stability records its margin
        (an explicit Runge-Kutta method's ``stages`` is derived from its tableau,
        :class:`pdeflow.solvers.explicit.ExplicitRK`).
    12. :attr:`sharded`: True when it runs split across MPI ranks.
    13. :meth:`likely_cause`, :meth:`is_finite`: what a non-finite state most likely came from.
    """
    name: ClassVar[str] = ""
    measure: ClassVar[str] = "particles"
    # the method's declaration: the values of init.measure it evolves (empty: its own measure), whether it is an
    # explicit Runge-Kutta step of the particles' Wasserstein flow (a reference flow of the chaos experiment), and
    # the method-specific [solver] keys it reads, declared (a non-default value of any other is refused)
    measures: ClassVar[tuple[str, ...]] = ()
    explicit_flow: ClassVar[bool] = False
    params: ClassVar[tuple[Param, ...]] = ()
    # one line each: what the method is and when to choose it (the "which solver" table, solvers/table.py)
    summary: ClassVar[str] = ""
    use_when: ClassVar[str] = ""
    step_columns: ClassVar[tuple[str, ...]] = ()
    # what an accepted step hands to the next in State.carry, checkpointed by the base (item 8)
    carried: ClassVar[tuple[Carried, ...]] = ()
    # True when a step needs of the other ranks' particles only what Problem sums over ranks (the aggregate
    # output, confinement, dissipation) and sum_over_ranks: the stepper runs split across MPI ranks
    sharded: ClassVar[bool] = False
    # the real-axis stability bound of lambda_max * dt of a fixed-step explicit method (nan: none applies)
    stability_bound: ClassVar[float] = math.nan
    # the /steps column where a stepper that guards its own stability records its margin ("": none)
    stability_column: ClassVar[str] = ""
    # gradient evaluations per step (sets the spacing of the stability checks)
    stages: ClassVar[int] = 1
    # the quadrature of int I dt over a step when the step leaves none of its own: "trapezoid", or "right"
    # (h I_new, the quadrature implicit Euler and minimizing movements carry: their defect stays below 1)
    quadrature: ClassVar[str] = "trapezoid"

    # what a named class must define beyond Stepper's (items 2-3 of the contract): its class attributes or methods
    required: ClassVar[tuple[str, ...]] = ("from_config",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register a class that sets ``name`` as ``solver.method = name`` (class docstring); TypeError when it
        lacks a member of :attr:`required`."""
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            missing = [member for member in cls.required if getattr(getattr(cls, member, None), "__isabstractmethod__",
                                                                      not hasattr(cls, member))]
            if missing:
                raise TypeError(f"stepper class {cls.__name__} (solver.method = {cls.name!r}) does not define "
                                f"{', '.join(missing)}: see the contract in pdeflow.solvers.base.Stepper")
            STEPPERS[cls.name] = cls
            # summary and use_when describe this class, not its parent: a subclass that leaves them out declares ""
            declare(Method(cls.name, cls.measures or (cls.measure,), cls.explicit_flow, tuple(cls.params),
                           cls.__dict__.get("summary", ""), cls.__dict__.get("use_when", "")))

    def __init__(self, problem: Problem) -> None:
        """A stepper's own ``__init__`` takes its parameters explicitly, calls this and sets ``dt``, the first
        step size of :meth:`initial_state`."""
        self.problem = problem
        self.dt = math.nan
        # the initial measure's fields when initial_state() is called without (make_stepper: the config's)
        self.initial_fields: Callable[[], dict[str, np.ndarray]] | None = None

    @classmethod
    def key_values(cls, cfg: Config) -> dict[str, Any]:
        """The values ``cfg.solver`` gives the keys of :attr:`params`, by name (the keyword arguments of a stepper
        whose ``__init__`` names its parameters after its keys)."""
        return {p.name: getattr(cfg.solver, p.name) for p in cls.params}

    @classmethod
    def check_keys(cls, cfg: Config) -> None:
        """ConfigError (one line) when the keys the method reads (:attr:`params`) do not go together; checked by
        :func:`pdeflow.solvers.check_config` (their ranges: by the config)."""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, problem: Problem, cfg: Config) -> Stepper:
        """The stepper with the parameters ``cfg`` sets (``solver.*`` and the sections the method reads)."""

    # ---- state --------------------------------------------------------------------------------
    def initial_state(self, fields: dict[str, np.ndarray] | None = None) -> State:
        """The state at t = 0 holding the measure ``fields`` (default: :attr:`initial_fields`, which
        :func:`pdeflow.solvers.make_stepper` sets from the config's ``init.*``), first step ``dt``, an empty carry
        (the first step starts afresh)."""
        if fields is None:
            if self.initial_fields is None:
                raise ValueError(f"{type(self).__name__}.initial_state: no initial measure given (pass its fields)")
            fields = self.initial_fields()
        return State(t=0.0, step=0, dt=self.dt, fields=fields)

    def known_initial_state(self) -> State | None:
        """The run's initial state when the stepper knows its initial measure (:func:`pdeflow.solvers.make_stepper`
        sets it), else None."""
        return None if self.initial_fields is None else self.initial_state()

    def frame_attrs(self) -> dict[str, Any]:
        """Attributes of ``/frames`` describing the measure (a grid's box and shape)."""
        return {}

    # ---- the carry ----------------------------------------------------------------------------
    def kept(self) -> tuple[Carried, ...]:
        """The items of :attr:`carried` this stepper carries (its settings: :attr:`Carried.when`)."""
        return tuple(c for c in self.carried if c.when(self))

    def extra_state(self, state: State) -> dict[str, np.ndarray]:
        """What a checkpoint keeps at ``state`` beyond its fields: each kept item of :attr:`carried` of
        ``state.carry`` as a float array of its declared shape (:meth:`Carried.pack`), nan where not known. The
        names and shapes depend only on the stepper's parameters and the measure's shape, so those at the start fix
        the file's datasets."""
        return {c.name: c.pack(state.carry.get(c.name), c.size(self, state)) for c in self.kept()}

    def restore(self, state: State, extra: dict[str, np.ndarray] | None = None) -> State:
        """``state`` (a resumed file's, :func:`pdeflow.io.resume.state_of`) with the carry the named arrays ``extra``
        of :meth:`extra_state` hold (empty when no value is known: the next step starts afresh)."""
        values: dict[str, Any] = {}
        if extra:
            values = {c.name: c.unpack(extra[c.name], np.isfinite(np.asarray(extra[c.like], dtype=float))
                                       if c.like else None)
                      for c in self.kept() if c.name in extra}
        state.carry = values if any(v is not None for v in values.values()) else {}
        return state

    # ---- evaluation ---------------------------------------------------------------------------
    def evaluate(self, state: State) -> Evaluation:
        """The Problem evaluation at the state's particles, cached on the state."""
        if state.evaluation is None:
            state.evaluation = self.problem.evaluate(state.fields["omega"], state.fields["mass"])
        return state.evaluation

    def diagnostics(self, state: State) -> dict[str, float]:
        """``energy``, ``risk`` and ``dissipation`` (the integral of |grad Phi|^2 d rho) at a state."""
        ev = self.evaluate(state)
        return {"energy": ev.energy, "risk": ev.risk, "dissipation": ev.dissipation}

    @property
    def energy_identity(self) -> bool:
        """Whether ``dE/dt = -dissipation`` holds for the recorded energy: not for particles with finite
        ``model.beta`` (their energy lacks the entropy term; :meth:`identity_note` says so)."""
        return self.measure != "particles" or not math.isfinite(self.problem.beta)

    def identity_note(self) -> str:
        """Why :attr:`energy_identity` is False, in one phrase."""
        return ("particles with finite model.beta: the recorded energy lacks the entropy term, so dE/dt = -I "
                "does not hold for it")

    def dissipation_integral(self, old: State, new: State, old_diag: dict[str, float],
                             new_diag: dict[str, float]) -> float:
        """``int I dt`` over the step ``old -> new``: the stepper's own quadrature when its step left one on
        the new state (``State.dissipation_integral``), else :attr:`quadrature`: the trapezoid
        ``h (I_old + I_new) / 2`` or the right rectangle ``h I_new``."""
        if new.dissipation_integral is not None:
            return new.dissipation_integral
        h = new.t - old.t
        if self.quadrature == "right":
            return h * new_diag["dissipation"]
        return 0.5 * h * (old_diag["dissipation"] + new_diag["dissipation"])

    def defect_sources(self, old: State, new: State, residual: float) -> list[DefectSource]:
        """Estimated shares (signed) of the step ``old -> new``'s energy-identity residual ``E1 - E0 + Q``
        (= ``residual``) that are not
        the time step's own error (an entropic blur, an inner solve stopped at its tolerance), each with the setting
        that shrinks it; called only when the step lost accuracy (:func:`pdeflow.solvers.accuracy.advice`). The
        default: none, the whole residual is the step's error."""
        return []

    def is_finite(self, state: State) -> bool:
        return all(bool(np.all(np.isfinite(v))) for v in state.fields.values())

    # ---- stepping -----------------------------------------------------------------------------
    @abc.abstractmethod
    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        """Advance by at most ``dt_limit``; return the new state and the stepper's /steps columns."""

    def cost_mark(self) -> dict[str, int]:
        """The Problem's counts of calls so far (:meth:`pdeflow.core.problem.Problem.mark`), for :meth:`cost_since`."""
        return self.problem.mark()

    def cost_since(self, mark: dict[str, int]) -> dict[str, float]:
        """The :data:`COST_COLUMNS`: the Problem's calls since ``mark`` (:meth:`cost_mark`) by kind; the loop marks
        before a step and reads after it and the new state's diagnostics (:mod:`pdeflow.solvers.loop`), so a step's
        cost includes the evaluation of its new state whoever makes it.
        :func:`pdeflow.core.problem.gradient_equivalents` of them is the cost in grad Phi evaluations."""
        return {COST_COLUMN[kind]: float(calls) for kind, calls in self.problem.since(mark).items()}

    def likely_cause(self, state: State) -> str:
        """What most likely made the state non-finite, named with the config key to change."""
        return (f"solver.dt = {self.dt:g} is likely above the stability limit of this problem; "
                f"reduce solver.dt or use solver.method = 'adaptive'")


__all__ = ["COST_COLUMN", "COST_COLUMNS", "Carried",
           "STEPPERS", "DefectSource", "Setting", "SolverError", "State", "Stepper", "hermite", "rng_state",
           "rng_from_state"]
