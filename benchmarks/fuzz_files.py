"""``python -m pdeflow.benchmarks.fuzz_files [--files N] [--seed S] [--compare-every C] [--diagnose-every K]``:
``pdeflow validate`` and ``info`` (on every C-th file ``compare`` with the original, on every K-th ``diagnose
--no-write --no-gap``) on mutated copies of a reference trajectory.

Property: whatever the damage, each command ends with exit 0, or 1 / 2 and exactly one line on stderr (1 for the check
commands validate and compare, 2 for info and diagnose); never a traceback, a hang (the command runs in a child
process with a time limit) or an interpreter crash (the child dies of a signal). The mutations (:func:`mutations`):

- ``flip``: 1 to 4 bytes anywhere in the file XORed with a random non-zero byte;
- ``flip-data``: one byte inside a stored chunk of a /frames or /steps dataset (located by HDF5);
- ``flip-meta``: one byte outside every dataset's stored values (metadata, headers, free space);
- ``truncate``: the file cut at a random length; ``zero``: a random range of 1 to 4096 bytes zeroed;
- ``structure``: an edit through h5py - a dataset deleted, replaced by one of another type or shape, or by one
  declaring a huge size; NaN or inf written into a stored array; an attribute replaced by one of another kind.

Writes a JSON record of the outcome counts to ``--out`` (default benchmarks/results);
studies/robustness/FUZZ_FILES.md records a long run. tests/io/test_untrusted_files.py runs a sample of 25.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from .common import RESULTS

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference" / "particles-rk4.h5"
KINDS = ("flip", "flip-data", "flip-meta", "truncate", "zero", "structure")
OUTCOMES = ("ok", "exit 1", "exit 2", "exit 3", "not one line", "traceback", "hang", "crash")
EXPECTED = {"validate": 1, "compare": 1, "info": 2, "diagnose": 2}   # the exit code of a damaged file


def _stored_ranges(path: Path) -> list[tuple[int, int, str]]:
    """(start, end, dataset) of every stored chunk or contiguous block of values in the file."""
    out: list[tuple[int, int, str]] = []

    def visit(name: str, obj) -> None:
        if not isinstance(obj, h5py.Dataset):
            return
        if obj.chunks is not None:
            for i in range(obj.id.get_num_chunks()):
                info = obj.id.get_chunk_info(i)
                out.append((info.byte_offset, info.byte_offset + info.size, name))
        elif obj.id.get_offset() is not None:
            out.append((obj.id.get_offset(), obj.id.get_offset() + obj.id.get_storage_size(), name))

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def _xor(path: Path, offsets, rng: np.random.Generator) -> None:
    with open(path, "r+b") as fh:
        for at in offsets:
            fh.seek(int(at))
            byte = fh.read(1)
            fh.seek(int(at))
            fh.write(bytes([byte[0] ^ int(rng.integers(1, 256))]))


def _structure(path: Path, rng: np.random.Generator) -> str:
    """One hostile edit through h5py; returns what it did."""
    with h5py.File(path, "r+") as f:
        datasets: list[str] = []
        f.visititems(lambda n, o: datasets.append(n) if isinstance(o, h5py.Dataset) else None)
        name = datasets[int(rng.integers(len(datasets)))]
        parent, _, leaf = name.rpartition("/")
        group = f[parent] if parent else f
        choice = int(rng.integers(6))
        if choice == 0:
            del group[leaf]
            return f"deleted {name}"
        if choice == 1:
            del group[leaf]
            group.create_dataset(leaf, data=np.array([b"text"] * 3))
            return f"{name} as text"
        if choice == 2:
            shape = f[name].shape
            del group[leaf]
            group.create_dataset(leaf, data=np.zeros(tuple(s + 1 for s in shape) + (2,)))
            return f"{name} of another shape"
        if choice == 3:
            del group[leaf]
            group.create_dataset(leaf, shape=(10**12, 10**6), chunks=(1, 1024), dtype="f8", compression="gzip")
            return f"{name} declaring 8e18 bytes"
        if choice == 4:
            ds = f[name]
            if ds.dtype.kind == "f" and ds.size:
                values = ds[()]
                values.flat[int(rng.integers(values.size))] = [np.nan, np.inf, -np.inf][int(rng.integers(3))]
                ds[...] = values
                return f"non-finite value in {name}"
        objects = ["/"] + [n for n in f if isinstance(f[n], h5py.Group)]
        where = f[objects[int(rng.integers(len(objects)))]]
        keys = list(where.attrs)
        key = keys[int(rng.integers(len(keys)))] if keys else "schema"
        value = [np.arange(5.0), "text", np.int64(-7), np.array([b"a", b"b"]), np.float64(np.nan)][int(rng.integers(5))]
        where.attrs[key] = value
        return f"attribute {where.name}.{key} as {type(value).__name__}"


def mutations(source: Path, folder: Path, n: int, seed: int = 0) -> Iterator[tuple[str, Path]]:
    """``n`` mutated copies of ``source`` in ``folder``, (kind and what was done, path) each, cycling through
    :data:`KINDS`; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    size = source.stat().st_size
    stored = [r for r in _stored_ranges(source) if r[2].startswith(("frames/", "steps/"))]
    every = sorted(_stored_ranges(source))
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        path = folder / f"mutated-{i}.h5"
        shutil.copy(source, path)
        what = kind
        if kind == "flip":
            _xor(path, rng.integers(0, size, size=int(rng.integers(1, 5))), rng)
        elif kind == "flip-data":
            start, end, name = stored[int(rng.integers(len(stored)))]
            _xor(path, [int(rng.integers(start, end))], rng)
            what = f"flip-data in {name}"
        elif kind == "flip-meta":
            while True:
                at = int(rng.integers(0, size))
                if not any(a <= at < b for a, b, _ in every):
                    break
            _xor(path, [at], rng)
            what = f"flip-meta at byte {at}"
        elif kind == "truncate":
            cut = int(rng.integers(0, size))
            os.truncate(path, cut)
            what = f"truncate to {cut} bytes"
        elif kind == "zero":
            start, length = int(rng.integers(0, size)), int(rng.integers(1, 4097))
            with open(path, "r+b") as fh:
                fh.seek(start)
                fh.write(bytes(min(length, size - start)))
            what = f"zero {length} bytes at {start}"
        else:
            what = f"structure: {_structure(path, rng)}"
        yield what, path


def _command(argv: list[str], conn) -> None:
    """In the forked child: ``pdeflow ARGV`` in-process; sends (exit code or 'traceback', stderr)."""
    from pdeflow.interface.cli import main

    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
        conn.send((code, err.getvalue(), out.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - the property is that nothing escapes main
        conn.send(("traceback", f"{exc.__class__.__name__}: {exc}", ""))


def _context():
    """Children forked from a server that imported pdeflow but ran no kernel: a fork of a process whose numba
    thread pool runs is not safe (its threads are missing in the child), so the caller itself is not forked."""
    from pdeflow.interface.cli import COMMAND_MODULES

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["pdeflow.interface.cli", "pdeflow.benchmarks.fuzz_files", "pdeflow.solvers.accuracy",
                                "pdeflow.interface.recompute", "pdeflow.interface.recompute_analysis",
                                *COMMAND_MODULES])
    return ctx


def run_command(argv: list[str], timeout: float) -> str:
    """The outcome (one of :data:`OUTCOMES`) of ``pdeflow ARGV`` in a child process, given ``timeout`` seconds."""
    return run_command_output(argv, timeout)[0]


def run_command_output(argv: list[str], timeout: float) -> tuple[str, str, str]:
    """(outcome, stdout, stderr) of ``pdeflow ARGV`` in a child process (:func:`run_command`)."""
    ctx = _context()
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_command, args=(argv, send))
    child.start()
    send.close()
    ready = receive.poll(timeout)
    if not ready:
        child.kill()
        child.join()
        return "hang", "", ""
    try:
        code, err, out = receive.recv()
    except EOFError:
        child.join()
        return "crash", "", ""
    child.join()
    if code == "traceback" or "Traceback" in err + out:
        return "traceback", out, err
    if code == 0:
        return "ok", out, err
    return (f"exit {code}" if answered(err, out, argv[1]) else "not one line"), out, err


def answered(err: str, out: str, path: str) -> bool:
    """Whether a failed command answered in lines: one ``pdeflow: error:`` line on stderr, or none there and on
    stdout validate's list of departures (one line per departure, each naming the file) or compare's one
    ``FAIL:`` line naming it."""
    lines = err.strip().splitlines()
    if lines:
        return len(lines) == 1 and lines[0].startswith("pdeflow: error: ")
    listed = out.strip().splitlines()
    if len(listed) == 1 and listed[0].startswith("FAIL: ") and path in listed[0]:
        return True
    return bool(listed) and all(line.startswith(f"{path}: ") for line in listed)


def outcome(path: Path, reference: Path, timeout: float = 300.0, compare: bool = True,
            diagnose: bool = False) -> dict[str, str]:
    """The outcomes of validate and info (and compare, diagnose) on the file ``path``, by command."""
    runs = {"validate": ["validate", str(path)], "info": ["info", str(path)]}
    if compare:
        runs["compare"] = ["compare", str(path), str(reference)]
    if diagnose:
        runs["diagnose"] = ["diagnose", str(path), "--no-write", "--no-gap"]
    return {command: run_command(argv, timeout) for command, argv in runs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.fuzz_files", description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-every", type=int, default=5, help="compare every K-th file (0: never)")
    parser.add_argument("--diagnose-every", type=int, default=20, help="diagnose every K-th file (0: never)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a command may take before it is a hang")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    start = time.time()
    table: dict[str, Counter] = {}
    valid: Counter = Counter()
    examples: list[dict] = []
    run_command(["compare", str(REFERENCE), str(REFERENCE)], args.timeout)   # the kernels compiled (cached) once
    with tempfile.TemporaryDirectory(prefix="pdeflow-fuzz-files-") as tmp:
        for i, (what, path) in enumerate(mutations(REFERENCE, Path(tmp), args.files, args.seed)):
            kind = what.split(" ")[0].rstrip(":")
            results = outcome(path, REFERENCE, args.timeout, bool(args.compare_every) and i % args.compare_every == 0,
                              bool(args.diagnose_every) and i % args.diagnose_every == 0)
            for command, result in results.items():
                table.setdefault(command, Counter())[result] += 1
                if result not in ("ok", "exit 1", "exit 2"):
                    examples.append({"file": i, "mutation": what, "command": command, "outcome": result})
            if results["validate"] == "ok":
                valid[kind] += 1
            path.unlink()
            if (i + 1) % 50 == 0:
                print(f"{i + 1} files, {time.time() - start:.0f} s", flush=True)
    record = {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "files": args.files,
              "seed": args.seed, "seconds": round(time.time() - start, 1), "cpu": platform.processor(),
              "load": os.getloadavg(), "outcomes": {c: dict(v) for c, v in table.items()},
              "called_valid": dict(valid), "failures": examples}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"fuzz_files-{_dt.datetime.now(_dt.UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps({k: record[k] for k in ("outcomes", "called_valid", "seconds")}, indent=1))
    print(f"-> {out}")
    return 0 if not examples else 1


if __name__ == "__main__":
    raise SystemExit(main())
