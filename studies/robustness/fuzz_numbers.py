"""``python -m studies.robustness.fuzz_numbers [--flips N] [--seed S] [--config CFG] [--out DIR]``: single-bit and
single-byte flips aimed at every class of stored number of a small run's trajectory, each copy validated by
``pdeflow validate`` in a child process with a time limit.

The question (issue 52): does ``validate`` see every change of a stored number, apart from those it lists as
unchecked? The file: ``pdeflow run CFG`` (default data/configs/tiny.toml) and ``pdeflow diagnose`` (its analysis with
the optimality gap). The classes, each
getting an equal share of the flips:

- ``frames``, ``steps``, ``analysis``, ``checkpoint``: a byte of one stored element of a dataset of that group
  (located by HDF5: chunk or contiguous offsets; inside a compressed chunk, any of its bytes);
- ``attributes``: a byte of one attribute's stored value (located by rewriting the attribute in a copy and diffing
  the two files);
- ``anywhere``: any byte of the file (headers, free space, unused rows of chunks, /model, /data).

A flip XORs one bit (half of them) or the whole byte with a random non-zero value. What changed is determined, not
assumed: every dataset and attribute is read before and after (in a child process), and the changed elements are
listed (a nan whose payload bits changed is still nan: "not computed", no number changed). The verdicts:

- ``caught``: validate exits 1 and something changed (or the file no longer reads);
- ``valid, nothing changed``: exit 0 and every value reads as before (padding, free space, unused rows);
- ``valid, unchecked``: exit 0 and every changed element is one validate lists as unchecked (for the original file:
  :class:`pdeflow.interface.recompute.Unchecked`);
- ``refused, nothing changed``: exit 1 although every value reads as before (a damaged header: HDF5 says so);
- ``FALSE VALID``: exit 0 with a changed element that validate claims to check - the failure this study looks for;
- ``traceback``, ``hang``, ``crash``, ``not one line``: the command broke (:mod:`pdeflow.benchmarks.fuzz_files`).

Writes ``fuzz_numbers.json`` (every flip, the counts per class, CPU, load, date) into ``--out``. The record of a
long run: studies/robustness/FUZZ_NUMBERS.md.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from pdeflow.benchmarks.common import machine
from pdeflow.benchmarks.fuzz_files import _context, run_command_output

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "data" / "configs" / "tiny.toml"
CLASSES = ("frames", "steps", "analysis", "checkpoint", "attributes", "anywhere")
BAD = ("FALSE VALID", "traceback", "hang", "crash", "not one line")
TIMEOUT = 300.0


@dataclass(frozen=True)
class Target:
    """Stored bytes ``[start, start + length)`` of ``item`` (a dataset path, or ``group.attribute``) at ``row`` (its
    first index; None: the whole item, or a compressed chunk's)."""
    cls: str
    item: str
    row: int | None
    start: int
    length: int


# ---- where the numbers are stored ---------------------------------------------------------------------------------
def dataset_targets(path: Path) -> list[Target]:
    """One target per stored element (row of a chunked column, element of a contiguous dataset) or compressed chunk
    of every dataset of /frames, /steps, /analysis and /checkpoint."""
    out: list[Target] = []

    def visit(name: str, ds: Any) -> None:
        if not isinstance(ds, h5py.Dataset):
            return
        cls = name.split("/")[0]
        if cls not in CLASSES or ds.shape is None or ds.size == 0:
            return
        item = "/" + name
        width = ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
        if ds.chunks is None:
            offset = ds.id.get_offset()
            if offset is None:          # compact: in the object header (found by diffing, as an attribute)
                return
            rows = ds.shape[0] if ds.ndim else 1
            out.extend(Target(cls, item, r if ds.ndim else None, offset + r * width, width) for r in range(rows))
            return
        filtered = ds.compression is not None or ds.fletcher32
        for i in range(ds.id.get_num_chunks()):
            info = ds.id.get_chunk_info(i)
            first = info.chunk_offset[0]
            if filtered:
                out.append(Target(cls, item, first, info.byte_offset, info.size))
                continue
            rows = min(ds.chunks[0], ds.shape[0] - first)
            out.extend(Target(cls, item, first + r, info.byte_offset + r * width, width) for r in range(rows))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def attribute_targets(path: Path, scratch: Path) -> tuple[list[Target], list[str]]:
    """One target per attribute whose stored value could be located, and the attributes that could not: each
    attribute rewritten (same type and size) in a copy, the copy diffed with the file; the run of changed bytes of
    the value's length that held the value is its place."""
    original = path.read_bytes()
    found: list[Target] = []
    missing: list[str] = []
    with h5py.File(path, "r") as f:
        owners = [("/", f)]
        f.visititems(lambda name, obj: owners.append(("/" + name, obj)))
        names = [(where, key) for where, obj in owners for key in obj.attrs.keys()]
    for where, key in names:
        item = f"{where.rstrip('/')}.{key}" if where != "/" else f"/.{key}"
        copy = scratch / "attribute.h5"
        shutil.copyfile(path, copy)
        try:
            value = _rewrite(copy, where, key)
        except (OSError, TypeError, ValueError) as exc:
            missing.append(f"{item} ({exc.__class__.__name__})")
            continue
        changed = np.flatnonzero(np.frombuffer(copy.read_bytes()[:len(original)], np.uint8)
                                 != np.frombuffer(original[:copy.stat().st_size], np.uint8))
        run = _value_run(changed, original, value)
        if run is None:
            # a variable-length text lives in the global heap: the rewrite moved it, so look for its bytes
            at = original.find(value) if len(value) >= 8 else -1
            if at < 0 or original.find(value, at + 1) >= 0:
                missing.append(item)
                continue
            run = (at, len(value))
        found.append(Target("attributes", item, None, run[0], run[1]))
    return found, missing


def _rewrite(copy: Path, where: str, key: str) -> bytes:
    """Rewrite one attribute of the file ``copy`` with other bytes of the same type and shape; its original bytes."""
    with h5py.File(copy, "r+") as f:
        obj = f[where]
        value = obj.attrs[key]
        dtype = obj.attrs.get_id(key).dtype
        if isinstance(value, str) or (isinstance(value, bytes) and dtype.kind == "O"):
            raw = value.encode() if isinstance(value, str) else value
            obj.attrs.modify(key, "".join(chr(ord("a") + (c + 1) % 26) for c in raw[:len(raw)]))
            return raw
        arr = np.asarray(value)
        raw = arr.astype(dtype, copy=False).tobytes()
        other = np.frombuffer(bytes((b + 1) % 256 for b in raw), dtype=dtype).reshape(arr.shape)
        obj.attrs.modify(key, other)
        return raw


def _value_run(changed: np.ndarray, original: bytes, value: bytes) -> tuple[int, int] | None:
    """The run of consecutive changed offsets that covers a place where ``original`` holds ``value``."""
    if not changed.size or not value:
        return None
    runs = np.split(changed, np.flatnonzero(np.diff(changed) > 1) + 1)
    for run in runs:
        for start in range(int(run[0]) - len(value) + 1, int(run[-1]) + 1):
            if start >= 0 and original[start:start + len(value)] == value and \
                    set(range(start, start + len(value))) & set(run.tolist()):
                return start, len(value)
    return None


# ---- what a file holds, read in a child process -------------------------------------------------------------------
def _snapshot(path: str, conn) -> None:
    """In the child: every dataset's values and every attribute (or the error reading it), sent as a dict."""
    out: dict[str, Any] = {}
    try:
        with h5py.File(path, "r") as f:
            owners = [("/", f)]
            f.visititems(lambda name, obj: owners.append(("/" + name, obj)))
            for where, obj in owners:
                for key in obj.attrs.keys():
                    item = f"{where.rstrip('/')}.{key}" if where != "/" else f"/.{key}"
                    try:
                        out[item] = obj.attrs[key]
                    except Exception as exc:  # noqa: BLE001 - a damaged attribute is an answer
                        out[item] = f"<unreadable: {exc.__class__.__name__}>"
                if isinstance(obj, h5py.Dataset):
                    try:
                        out[where] = obj[()]
                    except Exception as exc:  # noqa: BLE001
                        out[where] = f"<unreadable: {exc.__class__.__name__}>"
    except Exception as exc:  # noqa: BLE001
        out = {"<file>": f"<unreadable: {exc.__class__.__name__}: {str(exc)[:80]}>"}
    conn.send(out)


def snapshot(path: Path, timeout: float = TIMEOUT) -> dict[str, Any] | str:
    """What :func:`_snapshot` reads of ``path`` in a child process; "hang" or "crash" if it does not answer."""
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_snapshot, args=(str(path), send))
    child.start()
    send.close()
    if not receive.poll(timeout):
        child.kill()
        child.join()
        return "hang"
    try:
        value = receive.recv()
    except EOFError:
        value = "crash"
    child.join()
    return value


def _same_values(a: Any, b: Any) -> np.ndarray | bool:
    """Whether two stored values are the same numbers: per row for arrays of one shape (nan equal to nan)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.kind in "fc":
            equal = (a == b) | (np.isnan(a) & np.isnan(b))
        else:
            equal = a == b
        return equal.reshape(a.shape[0], -1).all(axis=1) if a.ndim else bool(equal)
    try:
        if isinstance(a, float) and isinstance(b, float):
            return a == b or (math.isnan(a) and math.isnan(b))
        return bool(np.all(a == b)) and type(a) is type(b)
    except (TypeError, ValueError):
        return False


def changes(before: dict[str, Any], after: dict[str, Any] | str) -> list[tuple[str, int | None, Any, Any]]:
    """The changed stored items: (item, row or None, old, new); unreadable items and a file that does not read count
    as changed."""
    if isinstance(after, str) or "<file>" in after:
        return [("<file>", None, None, after if isinstance(after, str) else after["<file>"])]
    out = []
    for item in sorted(set(before) | set(after)):
        if item not in before or item not in after:
            out.append((item, None, before.get(item), after.get(item)))
            continue
        equal = _same_values(before[item], after[item])
        if isinstance(equal, np.ndarray):
            out.extend((item, int(r), before[item][r], after[item][r]) for r in np.flatnonzero(~equal))
        elif not equal:
            out.append((item, None, before[item], after[item]))
    return out


# ---- the verdict ------------------------------------------------------------------------------------------------
def config_keys(old: Any, new: Any) -> list[str] | None:
    """The ``section.key`` of two config texts that differ; None when the new text does not parse."""
    from pdeflow.core.config import ConfigError, loads_config

    text = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in (old, new)]
    try:
        a, b = loads_config(text[0]).to_dict(), loads_config(text[1]).to_dict()
    except (ConfigError, ValueError):
        return None
    return [f"{s}.{k}" for s in a for k in a[s] if a[s][k] != b.get(s, {}).get(k)] + \
        ([] if loads_config(text[1]).to_toml() == text[1] else ["<text>"])


def unchecked_change(change: tuple[str, int | None, Any, Any], unchecked: list) -> bool:
    """Whether validate lists this change as one it does not check (relative entries: changes below their size)."""
    item, row, old, new = change
    if item == "/.config":
        keys = config_keys(old, new)
        return keys is not None and bool(keys) and all(
            any(u.covers(f"/.config:{k}") for u in unchecked) for k in keys)
    for u in unchecked:
        if not u.covers(item, row):
            continue
        if u.relative <= 0:
            return True
        try:
            if np.all(np.abs(np.asarray(new, float) - np.asarray(old, float))
                      <= u.relative * np.maximum(np.abs(np.asarray(old, float)), u.scale)):
                return True
        except (TypeError, ValueError):
            pass
    return False


def verdict(outcome: str, changed: list, unchecked: list) -> str:
    if outcome not in ("ok", "exit 1"):
        return outcome
    if outcome == "exit 1":
        return "caught" if changed else "refused, nothing changed"
    if not changed:
        return "valid, nothing changed"
    return "valid, unchecked" if all(unchecked_change(c, unchecked) for c in changed) else "FALSE VALID"


# ---- the study ---------------------------------------------------------------------------------------------------
def make_file(folder: Path, config: Path) -> Path:
    """``pdeflow run config`` then ``pdeflow diagnose`` (the analysis with the optimality gap, which a run's own
    analysis leaves to diagnose) into ``folder``: the file the flips are made in."""
    from pdeflow.interface.cli import main as pdeflow

    out = folder / "original.h5"
    for argv in (["run", str(config), "-o", str(out), "--quiet"], ["diagnose", str(out)]):
        with contextlib.redirect_stdout(io.StringIO()):
            code = pdeflow(argv)
        if code != 0:
            raise SystemExit(f"pdeflow {' '.join(argv)} failed with exit code {code}")
    return out


def flip(path: Path, target_offset: int, rng: np.random.Generator) -> str:
    """XOR the byte at ``target_offset`` with one bit (half the time) or a random non-zero byte; what was done."""
    with open(path, "r+b") as fh:
        fh.seek(target_offset)
        byte = fh.read(1)[0]
        mask = 1 << int(rng.integers(8)) if rng.random() < 0.5 else int(rng.integers(1, 256))
        fh.seek(target_offset)
        fh.write(bytes([byte ^ mask]))
    return f"0x{mask:02x}"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def study(flips: int, seed: int, config: Path, folder: Path, timeout: float = TIMEOUT,
          progress: bool = False, partial: Path | None = None) -> dict[str, Any]:
    """The flips (equal shares per class, in turn) and their verdicts; the record as a dict (``partial``: a file the
    verdicts so far are written to every 50 flips)."""
    from pdeflow.interface.recompute import recheck

    started, load0 = time.time(), _load()
    original = make_file(folder, config)
    found = recheck(original)
    if found.problems:
        raise SystemExit(f"the original file is not valid: {found.problems[0]}")
    scratch = folder / "scratch"
    scratch.mkdir(exist_ok=True)
    targets: dict[str, list[Target]] = {cls: [] for cls in CLASSES}
    for t in dataset_targets(original):
        targets[t.cls].append(t)
    attributes, unlocated = attribute_targets(original, scratch)
    targets["attributes"] = attributes
    size = original.stat().st_size
    targets["anywhere"] = [Target("anywhere", "<any byte>", None, 0, size)]
    before = snapshot(original, timeout)
    if isinstance(before, str) or "<file>" in before:
        raise SystemExit(f"the original file cannot be read: {before}")
    rng = np.random.default_rng(seed)
    records, counts = [], {cls: Counter() for cls in CLASSES}
    copy = scratch / "flipped.h5"
    for n in range(flips):
        cls = CLASSES[n % len(CLASSES)]
        items = sorted({t.item for t in targets[cls]})
        item = items[int(rng.integers(len(items)))]
        choices = [t for t in targets[cls] if t.item == item]
        target = choices[int(rng.integers(len(choices)))]
        offset = target.start + int(rng.integers(target.length))
        shutil.copyfile(original, copy)
        mask = flip(copy, offset, rng)
        outcome, out, err = run_command_output(["validate", str(copy)], timeout)
        changed = changes(before, snapshot(copy, timeout))
        v = verdict(outcome, changed, found.unchecked)
        counts[cls][v] += 1
        records.append({"class": cls, "item": target.item, "row": target.row, "offset": offset, "xor": mask,
                        "verdict": v, "changed": [f"{c[0]}" + (f"[{c[1]}]" if c[1] is not None else "")
                                                  for c in changed][:8],
                        "said": next((line.split(": ", 1)[1] for line in (out + err).splitlines()
                                      if ": " in line and "checked:" not in line and "unchecked:" not in line),
                                     "")[:200]})
        if progress and (n + 1) % 50 == 0:
            print(f"{n + 1}/{flips}: {dict(sum(counts.values(), Counter()))}", flush=True)
        if partial is not None and (n + 1) % 50 == 0:
            partial.write_text(json.dumps({"done": n + 1, "flips_list": records}, default=str))
    total = sum(counts.values(), Counter())
    return {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "config": str(config),
            "file_bytes": size, "flips": flips, "seed": seed, "seconds": round(time.time() - started, 1),
            "load_before": load0, "load_after": _load(), "machine": machine(), "commit": _commit(),
            "targets": {cls: len({t.item for t in targets[cls]}) for cls in CLASSES},
            "attributes_not_located": unlocated,
            "unchecked": [asdict(u) for u in found.unchecked],
            "counts": {cls: dict(counts[cls]) for cls in CLASSES}, "total": dict(total),
            "bad": sum(total[b] for b in BAD), "flips_list": records}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.robustness.fuzz_numbers",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--flips", type=int, default=1200, help="flips in all, shared equally by the classes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=TINY, help="the run whose file is flipped (default tiny.toml)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder of fuzz_numbers.json")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per validate (a hang beyond)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        record = study(args.flips, args.seed, args.config, Path(tmp), args.timeout, progress=True,
                       partial=args.out / "fuzz_numbers.partial.json")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fuzz_numbers.json").write_text(json.dumps(record, indent=1, default=str))
    print(json.dumps({"counts": record["counts"], "bad": record["bad"]}, indent=1))
    return 1 if record["bad"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
