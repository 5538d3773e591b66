"""The ``[solver]`` keys as the stepper classes declare them, and the ``[solver]`` schema built from those declarations.

A stepper class lists the keys it reads in ``params`` (:attr:`pdeflow.solvers.base.Stepper.params`), each a
:class:`Param`: name, type, default, one-line doc and allowed values. Every method reads the common keys
:data:`COMMON` (``method``, ``dt``). A key several methods read is declared by each (often as one shared
:class:`Param`); their declarations must agree on type, default and allowed values, while the doc may say what the
key means to each method (``deflate``, ``epsilon``, ``inner_tol``): :func:`schema_keys` merges them, naming the
methods before each meaning, and raises when two declarations of a key disagree otherwise.

The config (core, below the steppers) validates ``[solver]`` against :class:`pdeflow.core.solver_config.SolverConfig`,
generated from :func:`schema_keys` by :func:`schema_source` (``python -m pdeflow.solvers.table --write``; ``--check``
fails while it differs), so core needs no import of the steppers and the declarations stay on the classes.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

# the generated module of the [solver] schema, relative to the checkout's root
SCHEMA_FILE = "pdeflow/core/solver_config.py"
# the generated module's fields wrap their docs at this width
_WIDTH = 100


@dataclass(frozen=True)
class Param:
    """A ``[solver]`` key a stepper reads: ``name``, its ``type`` (float, int or str), ``default``, one-line ``doc``
    and its allowed values: the bounds ``ge``, ``gt``, ``le`` of a number, or ``choices``."""
    name: str
    type: type
    default: Any
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None

    def agrees_with(self, other: Param) -> bool:
        """The same key in all but its doc (a default of nan counts equal to nan)."""
        same_default = self.default == other.default or (
            isinstance(self.default, float) and isinstance(other.default, float)
            and math.isnan(self.default) and math.isnan(other.default))
        return same_default and replace(self, doc="", default=None) == replace(other, doc="", default=None)


METHOD = Param("method", str, "rk4", "time stepper (the methods, and the keys below each reads: pdeflow config)")
DT = Param("dt", float, 0.01, "time step (initial step for adaptive methods)", gt=0)
# the keys of every method
COMMON = (METHOD, DT)


def schema_keys(declarations: Iterable[tuple[str, Iterable[Param]]]) -> tuple[Param, ...]:
    """The ``[solver]`` schema from ``(method, its params)`` pairs in registry order: :data:`COMMON`, then every
    declared key in the order first declared, its doc merged: the one doc when all declarations share it, else
    ``"m1, m2: doc; m3: other doc"`` in the order first declared. ValueError naming the methods when two declarations
    of a key disagree in more than their doc, or a method declares a common key."""
    by_key: dict[str, list[tuple[str, Param]]] = {}
    common = {p.name for p in COMMON}
    for method, params in declarations:
        for p in params:
            if p.name in common:
                raise ValueError(f"solver.method {method!r} declares solver.{p.name}, a key of every method")
            by_key.setdefault(p.name, []).append((method, p))
    keys = list(COMMON)
    for name, declared in by_key.items():
        first_method, first = declared[0]
        for method, p in declared[1:]:
            if not p.agrees_with(first):
                raise ValueError(f"solver.{name} is declared differently by solver.method {first_method!r} ({first}) "
                                 f"and {method!r} ({p}): a key's type, default and allowed values are one")
        docs: dict[str, list[str]] = {}
        for method, p in declared:
            docs.setdefault(p.doc, []).append(method)
        doc = first.doc if len(docs) == 1 else "; ".join(f"{', '.join(ms)}: {d}" for d, ms in docs.items())
        keys.append(replace(first, doc=doc))
    return tuple(keys)


def _literal(value: Any) -> str:
    """``value`` as Python source: ``math.inf``/``math.nan`` for the non-finite floats, double-quoted strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "math.nan" if math.isnan(value) else ("math.inf" if value > 0 else "-math.inf")
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "(" + ", ".join(_literal(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return repr(value)


def _wrapped(text: str, width: int = _WIDTH) -> list[str]:
    """``text`` cut at spaces into pieces of at most about ``width`` characters (each piece keeps its space)."""
    pieces, current = [], ""
    for word in text.split(" "):
        if current and len(current) + len(word) + 1 > width:
            pieces.append(current + " ")
            current = word
        else:
            current = f"{current} {word}" if current else word
    return pieces + [current]


def _field(p: Param) -> list[str]:
    """The source lines of one field of the generated ``SolverConfig``."""
    limits = [f"{k}={_literal(getattr(p, k))}" for k in ("ge", "gt", "le", "choices") if getattr(p, k) is not None]
    head = f"    {p.name}: {p.type.__name__} = spec("
    one = head + ", ".join([_literal(p.default), _literal(p.doc), *limits]) + ")"
    if len(one) <= 120:
        return [one]
    doc = _wrapped(p.doc)
    lines = [head, f"        {_literal(p.default)},"]
    lines += [f"        {_literal(piece)}" for piece in doc[:-1]]
    lines.append(f"        {_literal(doc[-1])}" + ("," if limits else ")"))
    if limits:
        lines.append("        " + ", ".join(limits) + ")")
    return lines


def schema_source(keys: tuple[Param, ...]) -> str:
    """The source of :data:`SCHEMA_FILE`: the frozen dataclass ``SolverConfig`` with one field per key of ``keys``
    (:func:`schema_keys`), declared by :func:`pdeflow.core.keys.spec`."""
    body = [line for p in keys for line in _field(p)]
    uses_math = any("math." in line for line in body)
    return "\n".join([
        '"""The ``[solver]`` section of a config: ``method``, ``dt`` and every key a stepper class declares it reads',
        "(``params`` of :class:`pdeflow.solvers.base.Stepper`), a key several methods read with what it means to each.",
        "",
        "GENERATED from the registry of steppers by ``python -m pdeflow.solvers.table --write``",
        "(:mod:`pdeflow.solvers.parameters`); ``--check`` (tests/methods/test_which_solver.py) fails while this file",
        "differs from the declarations. Do not edit it: edit the declaration on the stepper class and regenerate.",
        '"""',
        "from __future__ import annotations",
        "",
        *(["import math"] if uses_math else []),
        "from dataclasses import dataclass",
        "",
        "from .keys import spec",
        "",
        "",
        "@dataclass(frozen=True)",
        "class SolverConfig:",
        *body,
        "",
    ])


__all__ = ["Param", "COMMON", "METHOD", "DT", "SCHEMA_FILE", "schema_keys", "schema_source"]
