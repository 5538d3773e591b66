"""The HDF5 trajectory file, schema version 1, as one declarative table: every group, dataset and attribute with
its shape, type, whether a file must have it, and its meaning.

The writer (:mod:`pdeflow.io.trajectory`) creates its datasets from :data:`ITEMS`, the reader checks a file against it
(:func:`pdeflow.io.trajectory.check_file`), :func:`pdeflow.io.reference.validate` reports every departure from it, and
the tables of docs/schema.md are generated from it (``python -m pdeflow.io.schema docs/schema.md`` rewrites them; a test
fails when they disagree).

Shapes are written in symbols bound by the file itself: ``V``, ``d`` (``/model/embedding``), ``T``
(``/model/positions``), ``p = 4 d dh`` (``dh`` the ``head_dim`` attribute), ``k`` (the columns of
``/model/basis``, else ``p``), ``B`` (``/data/tokens``), ``N`` (``/frames/omega``), ``n...`` (the ``k`` grid axes
of the ``shape`` attribute of ``/frames``), ``R`` (:data:`RNG_BYTES`), ``H`` (:data:`CHECKSUM_BYTES`), and
``/analysis``'s own ``A`` (analysed frames), ``C`` (head clusters), ``h`` (clustered heads), ``Am`` and ``Tp``
(attention maps and probe tokens), bound by the first entry naming them, and the row axes ``F`` (frames) and ``S``
(steps), which count the committed rows: a dataset may hold more rows (written by a run that has not committed them
yet), never fewer.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

SCHEMA = "pdeflow-trajectory"
SCHEMA_VERSION = 1
RNG_BYTES = 2048  # the generator state of a checkpoint slot, JSON, zero-padded
CHECKSUM_BYTES = 32  # the SHA-256 of a checkpoint slot

# Whether a file must hold an item (when the group holding it is present).
REQUIRED = "required"    # every schema-1 file, from pdeflow or any other code
WRITTEN = "pdeflow"      # pdeflow's writer always writes it and its reader needs it; another code's file may omit it
OPTIONAL = "optional"    # may be absent; readers treat it as absent
PARTICLES = "particles"  # required in a particle file (one without /frames/density)
GRID = "grid"            # required in a grid file (one with /frames/density)
NEEDS = (REQUIRED, WRITTEN, OPTIONAL, PARTICLES, GRID)

# The element types: what the writer stores and which numpy kinds a reader accepts.
DTYPES: dict[str, tuple[str, str]] = {"float": ("float64", "f"), "int": ("int64", "iu"), "number": ("float64", "fiu"),
                                      "bytes": ("uint8", "u"), "bool": ("bool", "b"), "text": ("", ""), "any": ("", "")}
# The numpy kinds an attribute of each type may have (an attribute is also checked for its type, a dataset for its rank,
# type and shape): a text attribute is a fixed-length or variable-length string.
ATTRIBUTE_KINDS = {"float": "fiu", "int": "iu", "number": "fiu", "bytes": "u", "bool": "biu", "text": "SUO", "any": ""}
ROW_AXES = ("F", "S")
GRID_AXES = "n..."


@dataclass(frozen=True)
class Item:
    """One entry of the file: ``path`` of a group or dataset (``#`` stands for either checkpoint slot, ``*`` for any
    other dataset of the group), or ``group.name`` of an attribute (``/.name`` at the root); ``shape`` in the symbols
    of the module docstring (None: a group or attribute); ``dtype`` a key of :data:`DTYPES` (None: a group)."""
    kind: str
    path: str
    shape: tuple[str, ...] | None
    dtype: str | None
    need: str
    meaning: str

    @property
    def group(self) -> str:
        """The group holding the item ("/" at the root)."""
        return self.path.rpartition(".")[0] if self.kind == "attribute" else (self.path.rpartition("/")[0] or "/")

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2] if self.kind == "attribute" else self.path.rpartition("/")[2]


def _group(path: str, need: str, meaning: str) -> Item:
    return Item("group", path, None, None, need, meaning)


def _data(path: str, shape: tuple[str, ...], dtype: str, need: str, meaning: str) -> Item:
    return Item("dataset", path, shape, dtype, need, meaning)


def _attr(path: str, dtype: str, need: str, meaning: str) -> Item:
    return Item("attribute", path, None, dtype, need, meaning)


# /analysis (pdeflow.analysis.diagnostics writes and reads it through these names): per-frame arrays [F] (NaN where
# not computed), name -> (shape, type); the rates and their provenance as attributes, name -> type; the head
# clusters (``cluster_<name>``: labels [h] of the clustered frame's heads, per cluster [C], attention maps [Am, Tp, Tp]
# on the probe tokens [Tp]); a particle run's spectral record over the analysed frames [A] (``spectrum_<name>`` for
# the Ritz columns; absent in older files).
ANALYSIS_FRAME_ARRAYS: dict[str, tuple[tuple[str, ...], str]] = {
    **{name: (("F",), "float") for name in ("time", "energy", "dissipation", "gap", "lower_bound", "min_phi",
                                            "mean_phi", "outside_mass")},
    "minimizer": (("F", "k"), "float"), "gap_exhaustive": (("F",), "any"),
    **{name: (("F",), "float") for name in ("pl_mu", "energy_identity_residual", "kl_predicted", "gap_bound")},
    "gap_certified": (("F",), "bool")}
ANALYSIS_SCALARS: dict[str, str] = {
    "e_star": "float", "e_star_source": "text", "e_star_low": "float", "e_star_high": "float", "kl_status": "text",
    **dict.fromkeys(("kl_fitted", "kl_theta", "kl_constant"), "float"), "kl_points": "int",
    **dict.fromkeys(("kl_window_start", "kl_window_end", "kl_decay_error", "kl_theta_first", "kl_theta_last",
                     "kl_t_first", "kl_t_last", "kl_tolerance", "pl_mu_min", "pl_mu_first", "pl_mu_last",
                     "predicted_theta", "predicted_mu"), "float"),
    "prediction": "text", "stationary_time": "float", "stationary_tol": "float", "gap_computed": "bool",
    "gap_is_estimate": "bool", "gap_domain": "text", "gap_radius": "float", "gap_inputs": "text"}
ANALYSIS_CLUSTER_ARRAYS: dict[str, tuple[tuple[str, ...], str]] = {
    "labels": (("h",), "number"), "mass": (("C",), "float"), "size": (("C",), "number"),
    "centre": (("C", "k"), "float"), "representative": (("C",), "number"), "attention": (("Am", "Tp", "Tp"), "float"),
    "probe": (("Tp",), "number")}
SPECTRAL_ARRAYS: dict[str, str] = {
    "spectrum_frame": "number", "spectrum_time": "float", "lambda_min": "float", "lambda_min_residual": "float",
    "lambda_max": "float", "lambda_max_residual": "float", "morse_index_lower": "number", "spectrum_products": "number"}
SPECTRAL_RITZ = ("lowest_ritz", "lowest_ritz_residual")
SPECTRAL_SCALARS: dict[str, str] = {
    "spectrum_every": "int", "spectrum_near": "float", "n_symmetry": "int", "jvp_cost": "float",
    "spectrum_grad_equivalents": "float", "run_grad_equivalents": "float"}


def _analysis_items() -> tuple[Item, ...]:
    """The rows of /analysis, from the declarations above."""
    rows = [_data(f"/analysis/{name}", shape, dtype, OPTIONAL, "per frame (pdeflow.analysis.diagnostics.Analysis)")
            for name, (shape, dtype) in ANALYSIS_FRAME_ARRAYS.items()]
    rows += [_attr(f"/analysis.{name}", dtype, OPTIONAL, "a rate or its provenance (Analysis)")
             for name, dtype in ANALYSIS_SCALARS.items()]
    rows += [_attr("/analysis.kl_theta_range", "float", OPTIONAL, "the local exponent's range over the window"),
             _attr("/analysis.notes", "text", OPTIONAL, "notes, one a line")]
    rows += [_data(f"/analysis/cluster_{name}", shape, dtype, OPTIONAL, "head clusters (HeadClusters)")
             for name, (shape, dtype) in ANALYSIS_CLUSTER_ARRAYS.items()]
    rows += [_attr("/analysis.cluster_threshold", "float", OPTIONAL, "the clusters' linkage distance"),
             _attr("/analysis.cluster_frame", "int", OPTIONAL, "the clustered frame")]
    rows += [_data(f"/analysis/{name}", ("A",), dtype, OPTIONAL, "the spectral record per analysed frame")
             for name, dtype in SPECTRAL_ARRAYS.items()]
    rows += [_data(f"/analysis/spectrum_{name}", ("A",), "float", OPTIONAL, "the lowest Ritz value, converged or not")
             for name in SPECTRAL_RITZ]
    rows += [_data("/analysis/spectrum_phase", ("A",), "text", OPTIONAL, "the phase of each analysed frame")]
    rows += [_attr(f"/analysis.{name}", dtype, OPTIONAL, "the spectral record's settings and cost")
             for name, dtype in {"spectrum_i0": "float", **SPECTRAL_SCALARS, "spectrum_cost_fraction": "float"}.items()]
    return tuple(rows)


ITEMS: tuple[Item, ...] = (
    _attr("/.schema", "text", REQUIRED, f'"{SCHEMA}"'),
    _attr("/.schema_version", "int", REQUIRED, f"{SCHEMA_VERSION}"),
    _attr("/.pdeflow_version", "text", OPTIONAL, "the version that wrote the file"),
    _attr("/.created", "text", OPTIONAL, "ISO 8601 time, UTC"),
    _attr("/.seed", "int", OPTIONAL, "init.seed"),
    _attr("/.config", "text", WRITTEN, "the whole config as TOML text (every key, defaults included)"),
    _attr("/.method", "text", OPTIONAL, "solver.method"),
    _attr("/.measure", "text", OPTIONAL, '"particles" or "grid"'),
    _attr("/.status", "text", OPTIONAL, '"running" while the run goes on or if its process died; once it ended one '
                                        'of "finished", "stationary", "wall_time", "max_steps", "interrupted", '
                                        '"non_finite", "accuracy_lost", "error" (fixed-length UTF-8: h5py returns '
                                        'bytes)'),
    _attr("/.message", "text", OPTIONAL, "one line saying why the run ended (fixed-length UTF-8)"),
    _attr("/.final_time", "float", OPTIONAL, "time at the end (nan while running)"),
    _attr("/.steps", "int", OPTIONAL, "accepted steps at the end (-1 while running)"),
    _attr("/.accuracy", "text", OPTIONAL, 'the accuracy verdict, one line: "held: ...", "LOST at t = ...: ..." or '
                                          '"not checked ..." (fixed-length UTF-8)'),
    _attr("/.accuracy_lost_at", "float", OPTIONAL, "time accuracy was lost (nan when it held)"),
    _attr("/.max_identity_defect", "float", OPTIONAL, "largest energy-identity defect of a step"),
    _attr("/.max_stability_ratio", "float", OPTIONAL, "largest lambda_max dt / bound"),
    _attr("/.stability_products", "int", OPTIONAL, "cost of the stability checks in Hessian-vector products"),

    _group("/model", REQUIRED, "the fixed layer and the coordinates"),
    _data("/model/embedding", ("V", "d"), "float", REQUIRED, "token embedding E"),
    _data("/model/positions", ("T", "d"), "float", REQUIRED, "positional table P"),
    _data("/model/unembedding", ("V", "d"), "float", REQUIRED, "unembedding U"),
    _data("/model/theta0", ("p",), "float", REQUIRED, "offset of the coordinate map, p = 4 d dh"),
    _data("/model/basis", ("p", "k"), "float", OPTIONAL, "basis B_m of the coordinate map; absent in full coordinates "
                                                        "(B_m = I, theta0 = 0, k = p)"),
    _attr("/model.head_dim", "int", REQUIRED, "dh"),
    _attr("/model.score_scale", "float", REQUIRED, "the attention score scale used (never 0)"),
    _attr("/model.weight_decay", "float", REQUIRED, "lam"),
    _attr("/model.beta", "float", OPTIONAL, "inverse temperature (inf when absent)"),
    _attr("/model.precision", "text", OPTIONAL, 'precision of the kernels ("float64" when absent)'),
    _attr("/model.k", "int", OPTIONAL, "number of coordinates k"),

    _group("/data", REQUIRED, "the data set"),
    _data("/data/tokens", ("B", "T"), "int", REQUIRED, "input tokens, in [0, V)"),
    _data("/data/targets", ("B", "T"), "int", REQUIRED, "target tokens, in [0, V)"),
    _data("/data/mask", ("B", "T"), "number", REQUIRED, "0/1 loss mask, at least one 1 per row"),
    _data("/data/weights", ("B",), "float", REQUIRED, "sequence weights, >= 0, summing to one"),

    _group("/frames", REQUIRED, "the measure at the frame times"),
    _attr("/frames.lower", "float", GRID, "lower corner of the grid box [k]"),
    _attr("/frames.upper", "float", GRID, "upper corner of the grid box [k]"),
    _attr("/frames.shape", "int", GRID, "cells per axis [k]"),
    _data("/frames/time", ("F",), "float", REQUIRED, "mean-field time of the frame, non-decreasing"),
    _data("/frames/step", ("F",), "int", WRITTEN, "number of accepted steps before it"),
    _data("/frames/dt", ("F",), "float", WRITTEN, "the step size in force"),
    _data("/frames/wall_time", ("F",), "float", WRITTEN, "seconds since the start of the run"),
    _data("/frames/energy", ("F",), "float", WRITTEN, "free energy E of the frame (recomputed when absent)"),
    _data("/frames/dissipation", ("F",), "float", WRITTEN, "dissipation I of the frame (recomputed when absent)"),
    _data("/frames/omega", ("F", "N", "k"), "float", PARTICLES, "particle positions"),
    _data("/frames/mass", ("F", "N"), "float", PARTICLES, "particle masses"),
    _data("/frames/density", ("F", GRID_AXES), "float", GRID, "cell-average densities, C order"),

    _group("/steps", WRITTEN, "one row per accepted step; row 0 is the initial state"),
    _attr("/steps.stability_bound", "float", OPTIONAL, "the explicit method's bound on lambda_max dt"),
    _attr("/steps.identity_tol", "float", OPTIONAL, "run.identity_tol"),
    _attr("/steps.accuracy_note", "text", OPTIONAL, "why a check did not run"),
    _data("/steps/time", ("S",), "float", WRITTEN, "time after the step"),
    _data("/steps/dt", ("S",), "float", WRITTEN, "its length"),
    _data("/steps/energy", ("S",), "float", WRITTEN, "free energy E"),
    _data("/steps/risk", ("S",), "float", WRITTEN, "the risk (cross-entropy) part of E"),
    _data("/steps/dissipation", ("S",), "float", WRITTEN, "dissipation I"),
    _data("/steps/wall_time", ("S",), "float", WRITTEN, "seconds since the start of the run"),
    _data("/steps/dissipation_integral", ("S",), "float", OPTIONAL, "the step's quadrature of int I dt"),
    _data("/steps/identity_defect", ("S",), "float", OPTIONAL,
          "the part of the step's energy change the dissipation does not account for, relative to it (nan: unchecked)"),
    _data("/steps/lambda_max_dt", ("S",), "float", OPTIONAL, "lambda_max times the step, fixed-step explicit particle "
                                                             "steppers (nan: not checked)"),
    _data("/steps/*", ("S",), "float", OPTIONAL, "the stepper's own columns (rejected, inner_iterations, ...)"),

    _group("/checkpoint", OPTIONAL, "what --resume restarts from; rows are committed by it"),
    _data("/checkpoint/active", (), "int", REQUIRED, "the complete slot, 0 or 1 (-1 before the first commit)"),
    _group("/checkpoint/slot#", REQUIRED, "a resumable state (two slots: slot0 and slot1)"),
    _data("/checkpoint/slot#/t", (), "float", REQUIRED, "time of the state"),
    _data("/checkpoint/slot#/dt", (), "float", REQUIRED, "step size in force"),
    _data("/checkpoint/slot#/step", (), "int", REQUIRED, "accepted steps"),
    _data("/checkpoint/slot#/n_frames", (), "int", REQUIRED, "rows of /frames committed with this state"),
    _data("/checkpoint/slot#/n_steps", (), "int", REQUIRED, "rows of /steps committed with this state"),
    _data("/checkpoint/slot#/rng", ("R",), "bytes", REQUIRED, "the generator state as JSON bytes, zero-padded"),
    _data("/checkpoint/slot#/checksum", ("H",), "bytes", OPTIONAL, "SHA-256 of the slot's other datasets (in name "
          "order: name, type, shape, bytes); all zeros while never written. --resume uses a slot only when it "
          "matches, else the other slot, and refuses when neither does"),
    _group("/checkpoint/slot#/extra", OPTIONAL, "named state beyond the fields, one dataset per name: a run's "
           "`stepper.<name>` (its stepper's controller state, e.g. rkc's `stepper.rho`) and `accuracy` (its accuracy "
           "record's)"),
    _data("/checkpoint/slot#/extra/*", ("...",), "float", OPTIONAL, "one named array, of any shape"),
    _data("/checkpoint/slot#/omega", ("N", "k"), "float", PARTICLES, "particle positions of the state"),
    _data("/checkpoint/slot#/mass", ("N",), "float", PARTICLES, "particle masses of the state"),
    _data("/checkpoint/slot#/density", (GRID_AXES,), "float", GRID, "densities of the state"),

    _group("/analysis", OPTIONAL, "the diagnostics of a finished run (pdeflow.analysis.diagnostics.Analysis; "
           "--resume drops it, the run's end writes it anew)"),
    *_analysis_items(),
)
SLOTS = ("slot0", "slot1")
# Groups that files of an earlier pdeflow hold as one dataset: readers accept it (``--resume`` refuses it).
FLAT_BEFORE = ("/checkpoint/slot#/extra",)


def item(path: str) -> Item:
    """The entry of a group, dataset (``/frames/omega``) or attribute (``/model.head_dim``); KeyError if none."""
    for it in ITEMS:
        if it.path == path:
            return it
    raise KeyError(f"{path!r} is not in the trajectory schema (pdeflow.io.schema.ITEMS)")


def items_in(group: str, kind: str = "dataset", needs: tuple[str, ...] = NEEDS) -> tuple[Item, ...]:
    """The named entries of ``kind`` directly in ``group``, in table order (no ``*`` entries)."""
    return tuple(it for it in ITEMS if it.kind == kind and it.group == group and it.name != "*" and it.need in needs)


def names(group: str, shape: tuple[str, ...] | None = None, needs: tuple[str, ...] = NEEDS) -> tuple[str, ...]:
    """The dataset names of ``group`` (with that symbolic ``shape``, if given), in table order."""
    return tuple(it.name for it in items_in(group, "dataset", needs) if shape is None or it.shape == shape)


def numpy_dtype(it: Item) -> str:
    """The numpy type the writer stores the item with."""
    return DTYPES[it.dtype][0]


# ---- checking a file against the table ----------------------------------------------------------------------------
@dataclass
class Departure:
    """A departure from the table: the path it concerns and one line naming it."""
    path: str
    message: str


class _Sizes:
    """The symbols of the module docstring as bound by the file, in the order the table meets them."""

    def __init__(self, f, rows: Callable[[], tuple[int, int]]) -> None:
        self.f, self.rows, self.values = f, rows, {}

    def get(self, symbol: str) -> int | tuple[int, ...] | None:
        if symbol in self.values:
            return self.values[symbol]
        value = None
        if symbol.isdigit():       # a fixed size (the columns of a result file's table)
            value = int(symbol)
        elif symbol in ROW_AXES:
            value = self.rows()[ROW_AXES.index(symbol)]
        elif symbol == "p" and self.values.get("d") is not None and "head_dim" in self.f["model"].attrs:
            value = 4 * int(self.values["d"]) * int(self.f["model"].attrs["head_dim"])
        elif symbol == "k" and not ("model" in self.f and "basis" in self.f["model"]):
            value = self.get("p")  # no /model/basis: full coordinates, k = p
        elif symbol == "R":
            value = RNG_BYTES
        elif symbol == "H":
            value = CHECKSUM_BYTES
        elif symbol == GRID_AXES and "frames" in self.f and "shape" in self.f["frames"].attrs:
            value = tuple(int(v) for v in np.atleast_1d(self.f["frames"].attrs["shape"]))
        if value is not None:
            self.values[symbol] = value
        return value


def _expand(f, items: tuple[Item, ...] | None = None) -> Iterator[tuple[Item, str]]:
    """(entry, concrete path) for every entry of ``items`` (default :data:`ITEMS`), with ``#`` and ``*`` resolved
    against the file."""
    items = ITEMS if items is None else items
    for it in items:
        for path in [it.path.replace("slot#", slot) for slot in SLOTS] if "#" in it.path else [it.path]:
            if it.name != "*":
                yield it, path
                continue
            where = path.rpartition("/")[0] or "/"
            group = f.get(where) if where in f else None
            if group is not None and hasattr(group, "keys"):
                named = {other.name for other in items if other.kind == "dataset" and other.group == it.group}
                for key in group.keys():
                    if key not in named and isinstance(group[key], h5py.Dataset):
                        yield it, f"{where.rstrip('/')}/{key}"


def _shape_text(shape: tuple[str, ...], sizes: _Sizes, rows: dict[str, int]) -> str:
    parts = []
    for s in shape:
        value = sizes.values.get(s) if s not in ROW_AXES else rows.get(s)
        if s == GRID_AXES:
            parts.append(", ".join(map(str, value)) if value is not None else s)
        else:
            parts.append(f"{s} = {value}" if value is not None else s)
    return "[" + ", ".join(parts) + "]"


def check(f, rows: Callable[[], tuple[int, int]], needs: tuple[str, ...] = (REQUIRED,),
          items: tuple[Item, ...] | None = None) -> list[Departure]:
    """Every departure of the open file ``f`` from :data:`ITEMS` (or the table ``items`` of another kind of file,
    :mod:`pdeflow.io.result_schema`), except the root ``schema`` and ``schema_version`` (the callers name those in
    their own words first). ``rows()`` gives the committed rows (F, S); ``needs`` the levels a missing entry is
    reported for (besides :data:`PARTICLES` or :data:`GRID`, after ``/frames/density``). Reads shapes and types
    only, no data."""
    out: list[Departure] = []
    grid = "frames" in f and "density" in f["frames"]
    needed = set(needs) | {GRID if grid else PARTICLES}
    sizes = _Sizes(f, rows)
    absent: set[str] = set()   # groups not in the file: their entries are not looked at
    bad: set[str] = set()
    counted: dict[str, int] = {}
    opened: dict[str, Any] = {}   # the objects whose attributes are checked, each opened once (an open is ~50 us)

    def owner(parent: str) -> Any:
        if parent not in opened:
            opened[parent] = f[parent]
        return opened[parent]

    def count(symbol: str) -> int | None:
        if symbol not in counted:
            try:
                counted[symbol] = int(sizes.get(symbol))
            except (KeyError, TypeError, ValueError, OSError):
                return None
        return counted[symbol]

    for it, path in _expand(f, items):
        parent = path.rpartition(".")[0] if it.kind == "attribute" else (path.rpartition("/")[0] or "/")
        if parent in absent or any(parent.startswith(a + "/") for a in absent) or parent in bad:
            continue
        if it.kind == "attribute":
            if path in ("/.schema", "/.schema_version"):
                continue
            where = f"root attribute {it.name}" if parent == "/" else f"attribute {path}"
            attrs = owner(parent).attrs
            if it.name not in attrs:
                if it.need in needed:
                    out.append(Departure(path, f"missing {where}" + (" (the grid of /frames/density)"
                                                                      if it.need == GRID else "")))
                continue
            kind = attrs.get_id(it.name).dtype.kind
            if ATTRIBUTE_KINDS[it.dtype] and kind not in ATTRIBUTE_KINDS[it.dtype]:
                out.append(Departure(path, f"{where} must be of {it.dtype} type, got numpy kind {kind!r}"))
            continue
        node = f.get(path) if path.lstrip("/") in f else None
        if node is None:
            if it.kind == "group":
                absent.add(path)
            if it.need in needed:
                out.append(Departure(path, f"missing {it.kind} {path}"))
                bad.add(path)
            continue
        if it.kind == "group":
            if not isinstance(node, h5py.Group) and not (it.path in FLAT_BEFORE and isinstance(node, h5py.Dataset)):
                out.append(Departure(path, f"{path} must be a group"))
                bad.add(path)
            continue
        if not isinstance(node, h5py.Dataset):
            out.append(Departure(path, f"{path} must be a dataset"))
            bad.add(path)
            continue
        message = _check_dataset(it, path, node, sizes, count)
        if message:
            out.append(Departure(path, message))
            bad.add(path)
    return out


def _check_dataset(it: Item, path: str, ds, sizes: _Sizes, count: Callable[[str], int | None]) -> str | None:
    """One line if the dataset departs from its entry's rank, type or shape (binding the symbols it is first to
    name), else None."""
    if it.shape == ("...",):
        return None
    kinds = DTYPES[it.dtype][1]
    axes = sizes.get(GRID_AXES) if GRID_AXES in it.shape else ()
    if axes is None:  # the grid attributes are missing (reported with them): only the type can be checked
        return f"{path} must be of floating type, got {ds.dtype}" if ds.dtype.kind not in kinds else None
    symbols = [s for symbol in it.shape for s in ((GRID_AXES,) * len(axes) if symbol == GRID_AXES else (symbol,))]
    if ds.ndim != len(symbols):
        return f"{path} must have {len(symbols)} dimensions, got shape {list(ds.shape)}"
    if kinds and ds.dtype.kind not in kinds:
        return f"{path} must be of {'integer' if kinds == 'iu' else 'floating'} type, got {ds.dtype}"
    rows: dict[str, int] = {}
    wrong = False
    for symbol, got in zip(symbols, ds.shape):
        if symbol in ROW_AXES:
            need = count(symbol)
            if need is not None:
                rows[symbol] = need
                wrong |= got < need
        elif symbol != GRID_AXES:
            known = sizes.get(symbol)
            if known is None:
                sizes.values[symbol] = got
            wrong |= known is not None and known != got
    if wrong or (axes and tuple(ds.shape[len(symbols) - len(axes):]) != axes):
        return f"{path} must have shape {_shape_text(it.shape, sizes, rows)}, got {list(ds.shape)}"
    k = sizes.get("k")
    if axes and k is not None and len(axes) != k:
        return f"the grid has {len(axes)} axes but the coordinates have k = {k}"
    return None


# ---- the tables of docs/schema.md ---------------------------------------------------------------------------------
BEGIN, END = "<!-- schema table: generated by python -m pdeflow.io.schema -->", "<!-- end of the schema table -->"
GROUPS = ("/", "/model", "/data", "/frames", "/steps", "/checkpoint", "/analysis")


def markdown() -> str:
    """The table as markdown: one table per group (its attributes, datasets and subgroups)."""
    lines = []
    for group in GROUPS:
        own = [it for it in ITEMS if it.path == group]
        inside = [it for it in ITEMS if it.path not in GROUPS
                  and (it.group == group or (group != "/" and it.group.startswith(group + "/")))]
        title = "Root attributes" if group == "/" else f"`{group}`: {own[0].meaning}"
        lines += [f"### {title}", ""]
        if own:
            lines += [f"The group itself is *{own[0].need}*.", ""]
        lines += ["| entry | kind | shape | type | needed | meaning |", "| --- | --- | --- | --- | --- | --- |"]
        for it in inside:
            entry = it.name if it.kind == "attribute" else it.path[len(group) + 1:] if group != "/" else it.path
            shape = "" if it.shape is None else "[" + ", ".join(it.shape) + "]"
            lines.append(f"| `{entry}` | {it.kind} | {shape} | {it.dtype or ''} | {it.need} | "
                         f"{it.meaning.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def documented_block(text: str) -> str | None:
    """The generated block of a document (between :data:`BEGIN` and :data:`END`), or None."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def write_doc(path: str | Path) -> None:
    """Replace the generated block of ``path`` (docs/schema.md) with :func:`markdown`."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if documented_block(text) is None:
        raise SystemExit(f"{path}: no block between {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown()}{END}{rest.split(END, 1)[1]}", encoding="utf-8")


if __name__ == "__main__":
    write_doc(sys.argv[1] if len(sys.argv) > 1 else "docs/schema.md")
