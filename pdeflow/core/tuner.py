"""The kernel planner: which variant of the mean-field evaluation runs on this CPU, chosen by measurement once.

Like FFTW's planner: a few variants of the same computation are timed on the user's machine for a class of
problem shapes, and the fastest is remembered in a small JSON file, keyed by the CPU model, the numba
version and the shape class (:func:`shape_class`). A variant (:class:`Variant`) fixes

- ``tile_bytes``: the lanes of one kernel work unit (heads, the SIMD loop length of :mod:`pdeflow.core.kernels`),
- ``chunk_heads_bytes``: the heads of one chunk (one BLAS product per projection; a multiple of the tile),
- ``chunk_bytes``: the working memory of a chunk, which sets the sequences per chunk,
- ``vector_bits``: 512- or 256-bit vectors (AVX-512 hosts only). The width is a compile-time choice of
  numba's target (:mod:`pdeflow.core.jit`), made once per process before the kernels are compiled: it is taken
  from ``PDEFLOW_VARIANT`` or from the remembered width of this CPU, and measured in child processes.

Variants that differ only in the tile or the width do the same operations in the same order per head
(the kernels' lanes are heads, every sum is a fixed chain of fused multiply-adds): their results are bit
for bit the same. The chunk sizes change how BLAS products and the sums over chunks of heads and blocks of
sequences are grouped: those agree to rounding.

Environment: ``PDEFLOW_VARIANT="tile=256,heads=512,chunk=8M,width=512"`` forces a variant (any subset of
the keys; the rest default); ``PDEFLOW_TUNE=off`` ignores remembered plans (the defaults run);
``PDEFLOW_CACHE_DIR`` moves the plan file (default ``$XDG_CACHE_HOME/pdeflow`` or ``~/.cache/pdeflow``).
Nothing is measured implicitly: ``pdeflow tune`` and ``pdeflow bench`` measure and remember.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

PLAN_FILE = "plans.json"
_KEYS = {"tile": "tile_bytes", "heads": "chunk_heads_bytes", "chunk": "chunk_bytes", "width": "vector_bits"}
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


@dataclass(frozen=True)
class Variant:
    """One way to run the evaluation (see the module docstring); sizes in bytes of lanes or memory."""
    tile_bytes: int = 512
    chunk_heads_bytes: int = 512
    chunk_bytes: int = 8 * 2**20
    vector_bits: int | None = None  # None: pdeflow.core.jit's default (the widest, 512 on AVX-512 hosts)

    def __post_init__(self) -> None:
        if self.tile_bytes < 16 or self.tile_bytes & (self.tile_bytes - 1):
            raise ValueError(f"tile={self.tile_bytes}: a power of two >= 16 bytes")
        if self.chunk_heads_bytes < self.tile_bytes or self.chunk_heads_bytes % self.tile_bytes:
            raise ValueError(f"heads={self.chunk_heads_bytes}: a multiple of tile={self.tile_bytes}")
        if self.chunk_bytes < 1:
            raise ValueError(f"chunk={self.chunk_bytes}: a positive number of bytes")
        if self.vector_bits not in (None, 256, 512):
            raise ValueError(f"width={self.vector_bits}: 256 or 512")

    def tile(self, itemsize: int) -> int:
        """Heads per kernel work unit for elements of ``itemsize`` bytes (at least 4)."""
        return max(4, self.tile_bytes // itemsize)

    def chunk_heads(self, itemsize: int) -> int:
        """Heads per chunk: a whole number of tiles."""
        return self.tile(itemsize) * max(1, self.chunk_heads_bytes // self.tile_bytes)

    @property
    def label(self) -> str:
        """``tile=512,heads=512,chunk=8M[,width=512]``: the form ``PDEFLOW_VARIANT`` reads."""
        mib = self.chunk_bytes / 2**20
        chunk = f"{mib:g}M" if mib >= 1 else f"{self.chunk_bytes // 2**10}K"
        out = f"tile={self.tile_bytes},heads={self.chunk_heads_bytes},chunk={chunk}"
        return out + ("" if self.vector_bits is None else f",width={self.vector_bits}")


DEFAULT = Variant()


def parse(text: str) -> Variant:
    """A :class:`Variant` from ``key=value`` pairs (``tile``, ``heads``, ``chunk`` in bytes with an optional
    K/M/G suffix, ``width`` in bits); ValueError naming the bad part."""
    fields: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in _KEYS:
            raise ValueError(f"PDEFLOW_VARIANT: {part!r} is not one of {', '.join(k + '=...' for k in _KEYS)}")
        v = value.strip().upper()
        scale = _UNITS.get(v[-1:], 1)
        try:
            number = float(v[:-1] if scale > 1 else v) * scale
        except ValueError:
            raise ValueError(f"PDEFLOW_VARIANT: {part!r} is not a number") from None
        fields[_KEYS[key.strip()]] = int(number)
    if "tile_bytes" in fields and "chunk_heads_bytes" not in fields:
        fields["chunk_heads_bytes"] = max(fields["tile_bytes"], DEFAULT.chunk_heads_bytes)
    return Variant(**fields)


def candidates() -> list[Variant]:
    """The in-process variants a plan chooses from: the tile at fixed chunks (bit-identical results), then
    larger chunks of heads and smaller or larger chunks of sequences (results agree to rounding)."""
    d = DEFAULT
    return [d, replace(d, tile_bytes=256), replace(d, tile_bytes=128),
            replace(d, chunk_heads_bytes=1024), replace(d, tile_bytes=1024, chunk_heads_bytes=1024),
            replace(d, chunk_bytes=4 * 2**20), replace(d, chunk_bytes=16 * 2**20)]


# ---- the key: CPU model, numba version, shape class ----------------------------------------------------

def cpu_model() -> str:
    """``vendor family model: model name`` from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "cpu family", "model", "model name") and key not in info:
                info[key] = value.strip()
            if not line.strip() and info:
                break
    except OSError:
        pass
    if not info:
        return platform.processor() or platform.machine()
    return (f"{info.get('vendor_id', '?')} family {info.get('cpu family', '?')} model {info.get('model', '?')}: "
            f"{info.get('model name', '?')}")


def numba_version() -> str:
    from importlib.metadata import version  # not numba itself: pdeflow.core.jit reads plans before numba starts

    return version("numba")


def machine_key() -> str:
    return f"{cpu_model()} | numba {numba_version()}"


def _octave(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def shape_class(dtype: Any, B: int, T: int, d: int, dh: int, N: int, factored: bool) -> str:
    """The class of problem shapes one plan serves: dtype, T, d and dh exactly, B and N to the next power of
    two, and whether the projections are factored (:func:`pdeflow.core.mean_field.factored_projections`)."""
    import numpy as np

    return (f"{np.dtype(dtype).name} B<={_octave(B)} T={T} d={d} dh={dh} N<={_octave(N)} "
            f"{'factored' if factored else 'inputs'}")


# ---- the plan file -----------------------------------------------------------------------------------------

def cache_dir() -> Path:
    env = os.environ.get("PDEFLOW_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pdeflow"


def _load() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / PLAN_FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # no plans yet, or an unreadable file: the defaults, and a new file when one is measured


def _store(update: Callable[[dict[str, Any]], None]) -> Path:
    """Read the plan file, apply ``update`` and write it back atomically (a temporary file renamed)."""
    path = cache_dir() / PLAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _load()
    update(data)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    _plans.clear()
    return path


def remembered(shape: str | None = None) -> dict[str, Any] | None:
    """The remembered plan of a shape class on this machine (None), or with ``shape`` None the width plan."""
    entry = _load().get(machine_key(), {})
    return entry.get("width") if shape is None else entry.get("shapes", {}).get(shape)


def tuning_off() -> bool:
    return os.environ.get("PDEFLOW_TUNE", "").strip().lower() in ("off", "0", "no", "false")


# ---- the variant in use ------------------------------------------------------------------------------------

_plans: dict[str, tuple[Variant, str]] = {}
_forced_all: Variant | None = None


@contextmanager
def forced(variant: Variant) -> Iterator[None]:
    """Run every evaluation of this process with ``variant``'s chunks and tile while the block runs (process
    wide: the evaluation's worker threads must see it too; for measuring and tests, not for concurrent use)."""
    global _forced_all
    previous = _forced_all
    _forced_all = variant
    try:
        yield
    finally:
        _forced_all = previous


def plan(shape: str) -> tuple[Variant, str]:
    """(variant, why) for a shape class: ``forced`` by :func:`forced`, ``PDEFLOW_VARIANT``, ``measured`` (the
    remembered plan) or ``default`` (no plan, or ``PDEFLOW_TUNE=off``)."""
    if _forced_all is not None:
        return _forced_all, "forced"
    env = os.environ.get("PDEFLOW_VARIANT", "").strip()
    if env:
        return parse(env), "PDEFLOW_VARIANT"
    if tuning_off():
        return DEFAULT, "default (PDEFLOW_TUNE=off)"
    if shape not in _plans:
        entry = remembered(shape)
        try:
            _plans[shape] = (parse(entry["variant"]), "measured") if entry else (DEFAULT, "default (not tuned)")
        except (KeyError, TypeError, ValueError):
            _plans[shape] = (DEFAULT, "default (unreadable plan)")
    return _plans[shape]


def vector_bits_choice() -> tuple[int | None, str]:
    """The vector width for this process, before numba compiles: (bits or None for the default, who chose)."""
    env = os.environ.get("PDEFLOW_VARIANT", "").strip()
    if env:
        bits = parse(env).vector_bits
        if bits is not None:
            return bits, "PDEFLOW_VARIANT"
    if tuning_off():
        return None, "default"
    entry = remembered()
    if entry and entry.get("bits") in (256, 512):
        return int(entry["bits"]), "measured"
    return None, "default"


# ---- measuring ---------------------------------------------------------------------------------------------

def measure(evaluate: Callable[[], Any], variants: list[Variant], repeats: int = 3) -> dict[str, list[float]]:
    """Wall seconds of ``evaluate()`` under each variant (:func:`forced`), rounds interleaved (every variant
    once per round, after one untimed warm-up each) so that a busy machine slows all alike."""
    times: dict[str, list[float]] = {v.label: [] for v in variants}
    for v in variants:
        with forced(v):
            evaluate()
    for _ in range(repeats):
        for v in variants:
            with forced(v):
                t0 = time.perf_counter()
                evaluate()
                times[v.label].append(time.perf_counter() - t0)
    return times


def choose(times: dict[str, list[float]], margin: float = 0.03, base: str | None = None) -> tuple[str, str]:
    """(label, why): the variant that replaces the default ``base`` (:data:`DEFAULT`'s label), or ``base``.

    ``times[label][r]`` is round r of :func:`measure`, in which every variant ran once, so the ratio
    ``times[v][r] / times[base][r]`` compares calls made under the same state of the machine. A variant
    replaces the default only if the median of its ratios is below ``1 - margin`` and it was faster in every
    round: on a shared machine single calls vary by tens of percent, and a choice that does not hold round by
    round would be remembered noise. Of the variants that qualify, the least median ratio wins."""
    base = base or DEFAULT.label
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    if base not in times:
        best = min(med, key=med.get)
        return best, f"least median time ({med[best]:.4g} s; the default was not measured)"
    ratios = {k: [a / b for a, b in zip(v, times[base])] for k, v in times.items() if k != base}
    mid = {k: sorted(r)[len(r) // 2] for k, r in ratios.items() if r}
    better = {k: m for k, m in mid.items() if m < 1.0 - margin and max(ratios[k]) < 1.0}
    if not better:
        return base, (f"default kept: median {med[base]:.4g} s, no variant faster by > {margin:.0%} "
                      f"in the median of the per-round ratios and in every round")
    best = min(better, key=better.get)
    return best, (f"{1.0 / better[best]:.3f}x faster than the default (median of {len(ratios[best])} per-round "
                  f"ratios; {med[best]:.4g} s vs {med[base]:.4g} s)")


def tune(evaluate: Callable[[], Any], shape: str, repeats: int = 3,
         variants: list[Variant] | None = None) -> dict[str, Any]:
    """Measure the candidates (:func:`candidates`) on ``evaluate`` and remember the choice for ``shape``;
    returns the record written (variant, why, per-variant median seconds, date)."""
    times = measure(evaluate, variants or candidates(), repeats)
    label, why = choose(times)
    rec = {"variant": label, "why": why, "seconds": {k: sorted(v)[len(v) // 2] for k, v in times.items()},
           "repeats": repeats, "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}

    def update(data: dict[str, Any]) -> None:
        data.setdefault(machine_key(), {}).setdefault("shapes", {})[shape] = rec

    rec["file"] = str(_store(update))
    return rec


def remember_width(bits: int, why: str, seconds: dict[str, float]) -> Path:
    """Remember this machine's vector width (read by :mod:`pdeflow.core.jit` in the next process)."""
    rec = {"bits": int(bits), "why": why, "seconds": seconds,
           "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}

    def update(data: dict[str, Any]) -> None:
        data.setdefault(machine_key(), {})["width"] = rec

    return _store(update)


def summary() -> dict[str, Any]:
    """This machine's key, the plan file and its remembered plans (for ``pdeflow bench``)."""
    entry = _load().get(machine_key(), {})
    return {"machine": machine_key(), "file": str(cache_dir() / PLAN_FILE), "tuning_off": tuning_off(),
            "forced": os.environ.get("PDEFLOW_VARIANT") or None, "width": entry.get("width"),
            "shapes": entry.get("shapes", {}), "default": asdict(DEFAULT)}
