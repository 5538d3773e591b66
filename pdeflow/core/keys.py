"""Declaring a config key: :func:`spec` makes the dataclass field of a key of a config section, its default, its
one-line description and its allowed values in the field's metadata (what :mod:`pdeflow.core.config` validates and
``pdeflow config`` prints). The sections of :mod:`pdeflow.core.config` and the generated ``[solver]`` section
(:mod:`pdeflow.core.solver_config`) declare their keys with it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import field
from typing import Any


def spec(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
         le: float | None = None, choices: Iterable[Any] | None = None) -> Any:
    """Declare a config key: its default, a one-line description and its allowed values (``ge``, ``gt``, ``le``
    bounds of a number, ``choices`` of a value)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le,
            "choices": tuple(choices) if choices is not None else None}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


__all__ = ["spec"]
