"""TOML configuration: parsed with :mod:`tomllib`, validated into frozen dataclasses.

A config has the sections ``[task]``, ``[model]``, ``[init]``, ``[solver]``, ``[run]``, ``[output]``,
``[diagnostics]``, ``[grid]``, ``[sgd]``, ``[chaos]`` and ``[stability]``. Every key is declared once, as a
dataclass field with its type, default and allowed range (:func:`pdeflow.core.keys.spec`); that declaration is the
whole schema (``pdeflow config`` prints it). The keys are declared below, but for ``[solver]``'s: each stepper class
declares the keys it reads, and :class:`~pdeflow.core.solver_config.SolverConfig` is generated from those
declarations (:mod:`pdeflow.solvers.parameters`). Any problem - unknown key, wrong type, value out of
range, inconsistent shapes - raises :class:`ConfigError` with one line naming ``section.key`` and what
is allowed.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .keys import spec
from .solver_config import SolverConfig
from .tasks import TASK_NAMES, TASKS


class ConfigError(ValueError):
    """A configuration problem; the message is one line naming the key and what is allowed."""


# Keys of [task] that only some tasks read (pdeflow.core.tasks.TASKS); a key given for a task that ignores it is an
# error.
TASK_PARAMS = {name: task.params for name, task in TASKS.items()}
COORDINATES = ("full", "output_gain", "gain2", "gain3", "basis_file")


@dataclass(frozen=True)
class TaskConfig:
    name: str = spec("markov", "data distribution", choices=TASK_NAMES)
    vocab_size: int = spec(8, "vocabulary size V (text: 0, its default, means 'the file's characters')",
                           ge=0)
    seq_len: int = spec(8, "sequence length T", ge=1)
    exact: bool = spec(False, "enumerate every sequence and weight it by its probability")
    n_samples: int = spec(256, "number B of sampled sequences when exact = false", ge=1, le=10**8)
    seed: int = spec(0, "seed of the sampled data set", ge=0)
    concentration: float = spec(1.0, "markov: Dirichlet concentration of transition rows", gt=0)
    chain_seed: int = spec(-1, "markov: seed of the transition matrix (-1: task.seed)", ge=-1)
    lag: int = spec(1, "lookback: target is the token `lag` positions back", ge=1)
    n_pairs: int = spec(0, "associative: key-value pairs (0: (T - 1) // 2)", ge=0)
    path: str = spec("", "text: UTF-8 text file (relative paths are relative to the config)")


@dataclass(frozen=True)
class ModelConfig:
    # upper bounds catch typos that would otherwise try to allocate terabytes
    d: int = spec(16, "model width d (with onehot positions the last T columns are positions)", ge=1, le=8192)
    head_dim: int = spec(4, "head width dh", ge=1, le=4096)
    embedding: str = spec("onehot", "token embedding E", choices=("onehot", "gaussian"))
    positions: str = spec("none", "positional table P", choices=("none", "sinusoidal", "onehot"))
    unembedding: str = spec("tied", "unembedding U", choices=("tied", "gaussian", "identity", "zero"))
    score_scale: float = spec(0.0, "attention score scale (0: 1/sqrt(head_dim))", ge=0)
    coordinates: str = spec("full", "reduced coordinates omega -> theta", choices=COORDINATES)
    basis_path: str = spec("", "basis_file: .npz with arrays 'basis' [p,k] and optional 'theta0' [p]")
    family_seed: int = spec(0, "seed of the fixed directions of the named families and gaussian tables", ge=0)
    family_scale: float = spec(1.0, "norm of each fixed direction of the named families", gt=0)
    weight_decay: float = spec(0.0, "weight decay lam >= 0 in (lam/2)|omega|^2", ge=0)
    beta: float = spec(math.inf, "inverse temperature of the entropy term (inf: none)", gt=0)
    precision: str = spec("float64", "floating-point precision of the kernels", choices=("float64", "float32"))


@dataclass(frozen=True)
class InitConfig:
    measure: str = spec("particles", "discretization of rho: particles, or a grid on reduced coordinates (k <= 3)",
                        choices=("particles", "grid"))
    n_particles: int = spec(64, "number N of particles (heads)", ge=1, le=10**9)
    seed: int = spec(0, "seed of the initial particles", ge=0)
    distribution: str = spec("gaussian", "law of the initial particles", choices=("gaussian", "uniform", "point"))
    scale: float = spec(0.5, "gaussian: standard deviation; uniform: half-width; per coordinate", ge=0)
    mean: list = spec([], "centre of the initial law: empty (zero), one number, or k numbers")


# the relative tolerances an error-controlled stepper can deliver in float64: from 100 machine epsilons (below it the
# error estimate is rounding noise and the steps shrink without end) to 1 (an error as large as the solution)
RTOL_RANGE = (100.0 * sys.float_info.epsilon, 1.0)


@dataclass(frozen=True)
class RunConfig:
    t_end: float = spec(1.0, "final time", gt=0)
    frame_interval: float = spec(0.1, "time between stored frames (linear spacing)", gt=0)
    frame_spacing: str = spec("linear", "frame times", choices=("linear", "log"))
    n_frames: int = spec(20, "log spacing: number of frames after t = 0", ge=1)
    max_steps: int = spec(10_000_000, "largest number of steps", ge=1)
    stationary_tol: float = spec(0.0, "stop when dissipation falls below this (0: never)", ge=0)
    wall_time_limit: float = spec(math.inf, "stop after this many seconds of wall time", gt=0)
    checkpoint_interval: float = spec(60.0, "also checkpoint between frames after this many seconds of wall time "
                                            "(a kill loses at most this much work)", gt=0)
    accuracy: str = spec("stop", "what a loss of accuracy does (energy-identity defect above run.identity_tol, or "
                                 "lambda_max * dt above an explicit method's stability bound; solvers/accuracy.py): "
                                 "'stop' ends the run there (exit 3, every frame kept, resumable), 'warn' prints one "
                                 "line and continues, 'off' only records. Default 'stop': the frames after a loss "
                                 "are not the gradient flow, and a run that went on would hand them to the "
                                 "analysis as if they were", choices=("stop", "warn", "off"))
    identity_tol: float = spec(0.5, "largest energy-identity defect |dE + int I dt| / |dE| of a step before accuracy "
                                    "counts as lost. Default 0.5: more than half of a step's energy change unexplained "
                                    "by the dissipation is a qualitative failure, while first-order steps (JKO at "
                                    "large tau) stay below it; tighten it to certify accuracy (the run's cumulative "
                                    "residual is at most this times the total energy change)", gt=0)
    stability_interval: int = spec(100, "largest number of gradient evaluations between estimates of lambda_max "
                                        "(the stability check of fixed-step explicit methods; sooner when the "
                                        "last two estimates approach the bound)", ge=1)


@dataclass(frozen=True)
class OutputConfig:
    path: str = spec("", "trajectory file (empty: <config name>.h5 in the current directory)")
    compression: str = spec("gzip", "HDF5 compression of frames", choices=("none", "gzip", "lzf"))


@dataclass(frozen=True)
class DiagnosticsConfig:
    enabled: bool = spec(True, "write the rate analysis into the trajectory when a run ends")
    gap: bool = spec(True, "search min Phi for the optimality gap in pdeflow diagnose and report, once (a run's own "
                           "analysis leaves it to them; off for huge runs)")
    gap_frames: int = spec(3, "frames where the gap is computed, spread evenly (the last always, the first from 2 on)",
                           ge=0)
    domain: str = spec("ball", "parameter set Omega of the gap search (grid: the box of a grid run)",
                       choices=("ball", "box", "grid"))
    radius: float = spec(5.0, "radius (ball) or half-width (box) of Omega", gt=0)
    n_starts: int = spec(32, "random starts of the gap search besides the particles", ge=0)
    grid_points: int = spec(32, "k <= 3: exhaustive grid points per axis before polishing (k = 3 costs its cube)",
                            ge=2)
    seed: int = spec(0, "seed of the random starts of the gap search", ge=0)
    e_star: float = spec(math.nan, "known optimal energy for PL/KL (nan: a certified lower bound "
                                   "or the limit fitted from the tail, whichever is known more narrowly)")
    kl_window: float = spec(0.5, "fraction of the time span (the end) used for the KL fit", gt=0, le=1)
    stationary_tol: float = spec(0.0, "dissipation below which (to the end) the flow counts as stationary "
                                      "(0: run.stationary_tol, else 1e-8 times the initial dissipation)", ge=0)
    cluster_tol: float = spec(0.1, "heads closer than this times the rms |omega| share a cluster", gt=0)
    attention_maps: int = spec(4, "attention maps stored for the heaviest head clusters", ge=0)
    spectrum_every: int = spec(4, "ends of the spectrum of the mass-weighted Hessian S (lambda_min, lambda_max, "
                                  "Morse index) at every n-th frame and the last; 0: off (particles only)", ge=0)
    spectrum_near: float = spec(1e-3, "dissipation at most this times I(0): an analysed frame is near a stationary "
                                      "point (a saddle or a minimum by lambda_min; its spectrum is computed), "
                                      "above: descent (not computed)", gt=0)


@dataclass(frozen=True)
class GridConfig:
    n: int = spec(64, "grid cells per axis", ge=2)
    lower: list = spec([], "lower corner of the box (one number or k numbers; empty: -radius)")
    upper: list = spec([], "upper corner of the box (one number or k numbers; empty: +radius)")
    radius: float = spec(3.0, "half-width of the default box", gt=0)
    time_order: int = spec(2, "fv: order of the SSP Runge-Kutta time stepping", choices=(2, 3))


@dataclass(frozen=True)
class SGDConfig:
    batch_size: int = spec(32, "minibatch size (resample: >= the data set size B is full-batch gradient descent)", ge=1)
    sampling: str = spec("resample", "minibatches: 'fresh' samples from the task, or 'resample' the data set",
                         choices=("fresh", "resample"))
    seed: int = spec(0, "seed of the minibatch stream and the Langevin noise", ge=0)
    noise: bool = spec(False, "add Langevin noise sqrt(2 eta / beta) xi")


@dataclass(frozen=True)
class ChaosConfig:
    n_ref: int = spec(8192, "particles of the reference flow (keep >= 16 max N: its own fluctuation adds 1/n_ref)",
                      ge=1)
    n_list: list = spec([16, 32, 64, 128, 256, 512], "finite head counts N (at least 3 distinct)")
    seeds: int = spec(24, "independent sets of initial points per N", ge=1)
    eta_list: list = spec([0.1, 0.05, 0.025], "SGD steps eta in mean-field time (at least 2 distinct)")
    probe_size: int = spec(32, "fresh task sequences in the logit probe set", ge=1)
    static_draws: int = spec(32, "static approximation: i.i.d. draws of N heads from the converged reference, "
                                     "per N", ge=2)
    converge_time: float = spec(0.0, "static approximation: time the reference flow runs to (0: the horizon; "
                                      "else >= the horizon)",
                                ge=0)
    t_end: float = spec(0.0, "horizon of the coupling, where its rates are fitted (0: run.t_end): a long run's "
                             "config keeps the experiment's cost (the reference flow of n_ref particles) at a short "
                             "horizon", ge=0)


@dataclass(frozen=True)
class StabilityConfig:
    n_starts: int = spec(8, "random starts of the search for Dirac stationary points", ge=0)
    start_scale: float = spec(1.0, "standard deviation of the random starts, per coordinate", gt=0)
    seed: int = spec(0, "seed of the starts and of the spread perturbations", ge=0)
    grad_tol: float = spec(1e-9, "a point is stationary when |grad e| is at most this", gt=0)
    tol: float = spec(1e-8, "eigenvalues within this of zero are inconclusive (absolute)", gt=0)
    gap_tol: float = spec(1e-8, "a Dirac with optimality gap at most this is a global minimizer", gt=0)
    weight_decays: list = spec([], "weight decays of the zero-head sweep (empty: no sweep)")
    n_modes: int = spec(2, "simulated modes per point: the n least stable of Htr (mean) and of H0 (spread)", ge=0)
    eps: float = spec(1e-5, "size of the perturbations in the simulation check", gt=0)
    n_particles: int = spec(8, "particles in the simulation check", ge=2)
    t_end: float = spec(40.0, "longest simulation (a run stops earlier once its faster mode changed by e^4)", gt=0)
    dt: float = spec(0.0, "RK4 step of the simulations (0: 0.2 / largest |eigenvalue|)", ge=0)


SECTIONS: dict[str, type] = {
    "task": TaskConfig, "model": ModelConfig, "init": InitConfig, "solver": SolverConfig,
    "run": RunConfig, "output": OutputConfig, "diagnostics": DiagnosticsConfig, "grid": GridConfig,
    "sgd": SGDConfig, "chaos": ChaosConfig, "stability": StabilityConfig,
}


@dataclass(frozen=True)
class Config:
    """A validated configuration. ``source`` is the TOML file (None when built from a dict)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    init: InitConfig = field(default_factory=InitConfig)
    solver: SolverConfig = field(default_factory=SolverConfig)
    run: RunConfig = field(default_factory=RunConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    grid: GridConfig = field(default_factory=GridConfig)
    sgd: SGDConfig = field(default_factory=SGDConfig)
    chaos: ChaosConfig = field(default_factory=ChaosConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    source: str | None = None

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The config as nested plain values (sections -> keys), the inverse of :func:`config_from_dict`.

        ``[task]`` holds only the keys its task reads."""
        data = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        unused = {k for ks in TASK_PARAMS.values() for k in ks} - set(TASK_PARAMS[self.task.name])
        data["task"] = {k: v for k, v in data["task"].items() if k not in unused}
        return data

    def to_toml(self) -> str:
        """The full config (every key, defaults included) as TOML text; parses back to an equal config."""
        return dumps_toml(self.to_dict())

    def resolve_path(self, value: str) -> Path:
        """A path from the config, relative to the config file's folder when it is relative."""
        p = Path(value).expanduser()
        if not p.is_absolute() and self.source is not None:
            p = Path(self.source).parent / p
        return p

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some keys changed, validated: ``cfg.replace(run={"t_end": 2.0})``."""
        data = self.to_dict()
        for name, values in sections.items():
            if name not in SECTIONS:
                raise ConfigError(f"unknown section [{_short(name)}]; sections are {', '.join(SECTIONS)}")
            data[name].update(values)
        return config_from_dict(data, source=self.source)


def _short(value: Any, limit: int | None = 60) -> str:
    """A value or name for a one-line message: control characters escaped, at most ``limit`` characters."""
    text = value if isinstance(value, str) else repr(value)
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            list: "a list"}.get(tp, str(tp))


def _check_value(section: str, key: str, f: dataclasses.Field, value: Any) -> Any:
    name = f"{section}.{key}"
    tp = {"int": int, "float": float, "bool": bool, "str": str, "list": list}[str(f.type)]
    meta = f.metadata
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > 2**1023:
            raise ConfigError(f"{name} must be a finite number, got an integer of {len(str(value))} digits")
        value = float(value)
    if tp is float and isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "infinity"):
        value = math.inf
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{name} must be {_type_name(tp)}, got {_short(value)}")
    if tp is list:
        for item in value:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise ConfigError(f"{name} must be a list of numbers, got {_short(value)}")
            if isinstance(item, int) and abs(item) > 2**53:
                raise ConfigError(f"{name} must hold numbers below 2**53, got an integer of {len(str(item))} digits")
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{name} must hold finite numbers, got {item!r}")
    if tp in (int, float):
        if tp is float and math.isnan(value) and not math.isnan(f.default):
            raise ConfigError(f"{name} must be a number, got nan")
        if tp is float and math.isinf(value) and math.isfinite(f.default):
            raise ConfigError(f"{name} must be finite, got {value!r}")
        if meta["ge"] is not None and not value >= meta["ge"]:
            raise ConfigError(f"{name} must be >= {meta['ge']}, got {value!r}")
        if meta["gt"] is not None and not value > meta["gt"]:
            raise ConfigError(f"{name} must be > {meta['gt']}, got {value!r}")
        if meta["le"] is not None and not value <= meta["le"]:
            raise ConfigError(f"{name} must be <= {meta['le']}, got {value!r}")
    if meta["choices"] is not None and value not in meta["choices"]:
        allowed = ", ".join(repr(c) for c in meta["choices"])
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def _section(name: str, cls: type, values: Any) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"[{_short(name)}] must be a table of keys, got {_short(values)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in fields:
            close = [k for k in fields if k.replace("_", "") == key.replace("_", "").lower()]
            hint = f" (did you mean {name}.{close[0]}?)" if close else ""
            raise ConfigError(f"unknown key {name}.{_short(key)}{hint}; keys of [{name}]: {', '.join(fields)}")
        kwargs[key] = _check_value(name, key, fields[key], value)
    return cls(**kwargs)


def _check_consistency(cfg: Config, given_task_keys: Iterable[str] = ()) -> None:
    """Cross-key rules that do not need the task data (those are checked when the Problem is built)."""
    t, m = cfg.task, cfg.model
    if t.name != "text" and t.vocab_size < 2:
        raise ConfigError(f"task.vocab_size must be >= 2 for task {t.name!r}, got {t.vocab_size}")
    used = {k for ks in TASK_PARAMS.values() for k in ks}
    defaults = TaskConfig()
    for key in used - set(TASK_PARAMS[t.name]):
        if key in given_task_keys or getattr(t, key) != getattr(defaults, key):
            raise ConfigError(f"task.{key} is not used by task {t.name!r}; its keys are "
                              f"{', '.join(TASK_PARAMS[t.name]) or 'none beyond the common ones'}")
    if t.name == "text" and not t.path:
        raise ConfigError("task.path is required for task 'text' (a UTF-8 text file)")
    if t.name == "lookback" and t.lag >= t.seq_len:
        raise ConfigError(f"task.lag must be < task.seq_len = {t.seq_len}, got {t.lag}")
    if m.positions == "onehot" and m.d <= t.seq_len:
        raise ConfigError(f"model.d must exceed task.seq_len = {t.seq_len} with onehot positions "
                          f"(the last T columns hold positions), got {m.d}")
    if m.coordinates == "basis_file" and not m.basis_path:
        raise ConfigError("model.basis_path is required when model.coordinates = 'basis_file'")
    if m.coordinates != "basis_file" and m.basis_path:
        raise ConfigError("model.basis_path is only read when model.coordinates = 'basis_file'")
    r = cfg.run
    if r.frame_spacing == "linear" and r.frame_interval > r.t_end:
        raise ConfigError(f"run.frame_interval must be <= run.t_end = {r.t_end}, got {r.frame_interval}")
    # the method's own rules (known, its measure, the keys it reads and how they combine): pdeflow.solvers.check_config
    s = cfg.solver
    if cfg.diagnostics.domain == "grid" and cfg.init.measure != "grid":
        raise ConfigError("diagnostics.domain = 'grid' is the box of a grid run: set init.measure = 'grid' "
                          "or use 'ball' or 'box'")
    if cfg.init.measure == "grid" and m.coordinates == "full":
        raise ConfigError("init.measure = 'grid' needs reduced coordinates (model.coordinates with k <= 3)")
    if s.dt_min > s.dt_max:
        raise ConfigError(f"solver.dt_min must be <= solver.dt_max = {s.dt_max}, got {s.dt_min}")
    if not RTOL_RANGE[0] <= s.rtol <= RTOL_RANGE[1]:
        raise ConfigError(f"solver.rtol must be in [{RTOL_RANGE[0]:.1e}, {RTOL_RANGE[1]:g}] (from 100 float64 machine "
                          f"epsilons, below which rounding errors swamp the error estimate, to 1), got {s.rtol!r}")
    for key in ("n_list", "eta_list"):
        values = getattr(cfg.chaos, key)
        if not values or any(v <= 0 for v in values):
            raise ConfigError(f"chaos.{key} must be a non-empty list of positive numbers, got {values!r}")
    if any(not (isinstance(v, int) or float(v).is_integer()) for v in cfg.chaos.n_list):
        raise ConfigError(f"chaos.n_list must hold whole numbers, got {cfg.chaos.n_list!r}")
    if any(v < 0 for v in cfg.stability.weight_decays):
        raise ConfigError(f"stability.weight_decays must be >= 0, got {cfg.stability.weight_decays!r}")
    for key in ("lower", "upper"):
        if any(not math.isfinite(v) for v in getattr(cfg.grid, key)):
            raise ConfigError(f"grid.{key} must hold finite numbers, got {getattr(cfg.grid, key)!r}")


def config_from_dict(data: Mapping[str, Any], source: str | None = None) -> Config:
    """Validate nested ``{section: {key: value}}`` into a :class:`Config`."""
    if not isinstance(data, Mapping):
        raise ConfigError("a config must be a table of sections")
    sections = {}
    for name, values in data.items():
        if name not in SECTIONS:
            raise ConfigError(f"unknown section [{_short(name)}]; sections are {', '.join(SECTIONS)}")
        sections[name] = _section(name, SECTIONS[name], values)
    task = data.get("task", {})
    if "task" in sections and sections["task"].name == "text" and "vocab_size" not in task:
        sections["task"] = dataclasses.replace(sections["task"], vocab_size=0)   # text: V is the file's alphabet
    cfg = Config(**sections, source=source)
    _check_consistency(cfg, task.keys() if isinstance(task, Mapping) else ())
    return cfg


def parse_override(text: str) -> tuple[str, str, Any]:
    """``"section.key=value"`` -> (section, key, value); the value is read as TOML, else as a string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"override {_short(text)!r} must look like section.key=value")
    lhs, raw = text.split("=", 1)
    section, key = (s.strip() for s in lhs.split(".", 1))
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        value = raw.strip()
    return section, key, value


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> Config:
    """Read a TOML file, apply ``section.key=value`` overrides and validate.

    Raises ConfigError (one line) for a missing or unreadable file, malformed TOML or any bad key.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(p)!r} cannot be read: {exc.__class__.__name__}") from None
    return loads_config(text, overrides, source=str(p))


def loads_config(text: str, overrides: Iterable[str] = (), source: str | None = None) -> Config:
    """Like :func:`load_config` for TOML text."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        where = f" in {_short(source, None)!r}" if source else ""
        reason = str(exc).splitlines()[0] if isinstance(exc, tomllib.TOMLDecodeError) else "nested too deeply"
        raise ConfigError(f"malformed TOML{where}: {reason}") from None
    for item in overrides:
        section, key, value = parse_override(item)
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{_short(section)}] must be a table of keys")
        table[key] = value
    return config_from_dict(data, source=source)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_char(c: str) -> str:
    if c in _TOML_ESCAPES:
        return _TOML_ESCAPES[c]
    if ord(c) < 0x20 or ord(c) == 0x7F:
        return f"\\u{ord(c):04x}"
    return c


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(_toml_char(c) for c in value) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def dumps_toml(data: Mapping[str, Mapping[str, Any]]) -> str:
    """Nested sections of plain values as TOML text (the subset pdeflow configs use)."""
    lines = []
    for name, values in data.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {_toml_value(v)}" for key, v in values.items())
        lines.append("")
    return "\n".join(lines)


def describe_schema(methods: tuple[str, ...] = (),
                    readers: Callable[[str], tuple[str, ...]] = lambda key: ()) -> str:
    """Every section and key with its default and meaning, for ``pdeflow config``; given the declared ``methods``
    (:func:`pdeflow.solvers.methods.schema_text` passes the method table) the choices of ``solver.method`` and, for
    each method-specific ``[solver]`` key, ``readers(key)``: the methods that read it."""
    out = []
    for name, cls in SECTIONS.items():
        out.append(f"[{name}]")
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            choices = methods if (name, f.name) == ("solver", "method") and methods else f.metadata["choices"]
            allowed = f" (one of {', '.join(map(repr, choices))})" if choices else ""
            read = readers(f.name) if name == "solver" else ()
            by = f" [read by {', '.join(read)}]" if read else ""
            out.append(f"  {f.name} = {_toml_value(default)}  # {f.metadata['doc']}{allowed}{by}")
    return "\n".join(out)
