"""Stage records keyed by their inputs: a pipeline of pdeflow commands writing into one folder (``pdeflow report``)
runs each stage only when what it reads changed, and says which it reused.

A stage's ``key`` is the SHA-256 of the canonical JSON of its inputs (:meth:`Stages.inputs`): its options (paths of
the folder written ``DIR/<name>``, so a moved folder keeps its keys), the keys of the stages whose files it reads,
the pdeflow version and, for a first stage, its source (hashes of the files it reads from outside). Equal keys and
the stage's file present: reused; the same key unfinished: continued; else run again, and with it every stage that
reads it (their keys contain its key). :class:`Created` is what one invocation adds to the folder, removed whole
when a stage refuses its input.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ...core.exit_codes import EXIT_BAD_INPUT


class StageRefused(ValueError):
    """A stage refused its input (exit 2): one line; nothing of the stage was written."""


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def text_sha256(text: str) -> str:
    """The SHA-256 of ``text`` in UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Stages:
    """The stages' records in ``folder/stages.json``: per stage its command, the ``key`` of its inputs, wall time and
    status (``ok``, ``running``, or ``failed (exit N): message``), kept across reruns. ``upstream``: stage -> the
    stages whose files it reads. ``keys`` and ``reused`` are this invocation's."""

    def __init__(self, folder: Path, version: str, upstream: dict[str, tuple[str, ...]]) -> None:
        self.folder = folder
        self.path = folder / "stages.json"
        self.version = version
        self.upstream = upstream
        self.done: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            try:
                self.done = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self.done = {}
        self.keys: dict[str, str] = {}
        self.reused: list[str] = []
        self.spent = 0.0   # the wall time of the stages run by this invocation (already in their records)

    def portable(self, argv: list[str], target: Path | None = None) -> list[str]:
        """``argv`` as a key sees it: a file of the folder as ``DIR/<name>`` and ``target`` as ``TARGET`` (its
        content is hashed apart), so a moved folder or another working directory changes no key."""
        out = []
        for a in argv:
            p = Path(a)
            out.append(f"DIR/{p.name}" if p.parent == self.folder else "TARGET" if target and p == target else a)
        return out

    def inputs(self, name: str, options: list[str], source: dict[str, Any] | None = None) -> dict[str, Any]:
        """What stage ``name`` reads: its ``options``, the keys of its upstream stages in this invocation (None: not
        run), the pdeflow version, and for a first stage its ``source`` (what it reads from outside the folder)."""
        return {"stage": name, "options": options, "upstream": {u: self.keys.get(u) for u in self.upstream[name]},
                "pdeflow": self.version, **({"source": source} if source is not None else {})}

    @staticmethod
    def key(inputs: dict[str, Any]) -> str:
        """SHA-256 of the inputs' canonical JSON."""
        return text_sha256(json.dumps(inputs, sort_keys=True, default=str))

    def state(self, name: str, key: str, output: Path) -> str:
        """``reuse`` (same key, finished, file there), ``continue`` (same key, unfinished, file there) or ``new``."""
        rec = self.done.get(name, {})
        if rec.get("key") != key or not output.exists():
            return "new"
        return "reuse" if rec.get("status") == "ok" else "continue"

    def reuse(self, name: str, key: str) -> None:
        self.keys[name] = key
        self.reused.append(name)

    def run(self, name: str, argv: list[str], output: Path, inputs: dict[str, Any], extra: tuple[str, ...] = (),
            valid: bool = True) -> bool:
        """Run ``pdeflow argv`` (+ ``extra``, options that are not inputs) unless the stage is reusable (and
        ``valid``); True when it ended well with its ``output`` there. A stage that refuses its input (exit 2) raises
        :class:`StageRefused` (its record left as it was); any other failure is recorded."""
        key = self.key(inputs)
        if valid and self.state(name, key, output) == "reuse":
            self.reuse(name, key)
            return True
        command = "pdeflow " + " ".join([*argv, *extra])
        earlier = self.done.get(name)
        self.done[name] = {"stage": name, "command": command, "key": key, "inputs": inputs, "status": "running"}
        self.save()
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pdeflow", *argv, *extra], capture_output=True, text=True,
                              env=dict(os.environ))
        wall = time.perf_counter() - start
        self.spent += wall
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1][:300]
        if proc.returncode == EXIT_BAD_INPUT:   # nothing was written: the record stays what it was
            if earlier is None:
                self.done.pop(name)
            else:
                self.done[name] = earlier
            self.save()
            raise StageRefused(f"the {name} stage refused its input ({command}): {last}")
        ok = proc.returncode == 0 and output.exists()
        code = (f"exit {proc.returncode}" if proc.returncode >= 0 else f"killed by signal {-proc.returncode}")
        self.done[name].update(wall_s=wall, stdout_tail=proc.stdout.strip().splitlines()[-12:],
                               status="ok" if ok else f"failed ({code}): {last or 'no output file'}")
        self.keys[name] = key
        self.save()
        return ok

    def note(self, name: str, command: str, wall: float, inputs: dict[str, Any]) -> None:
        """Record a stage done in this process (the copy of a trajectory)."""
        self.spent += wall
        self.done[name] = {"stage": name, "command": command, "key": self.key(inputs), "inputs": inputs,
                           "wall_s": wall, "status": "ok"}
        self.keys[name] = self.done[name]["key"]
        self.save()

    def failure(self, name: str) -> str | None:
        """Why stage ``name`` failed in this invocation (None: it did not)."""
        status = self.done.get(name, {}).get("status", "")
        if name not in self.keys or not status.startswith("failed"):
            return None
        return f"the {name} stage ({self.done[name]['command']}) {status}"

    def save(self) -> None:
        self.path.write_text(json.dumps(self.done, indent=1), encoding="utf-8")


class Created:
    """What one invocation adds under DIR, so that bad input found by a stage leaves no folder and no file of it:
    the topmost folder it creates is removed whole, or else (DIR existed) every path that was not there before.
    Files an earlier report left are kept."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.top = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
        self.before = set(folder.rglob("*")) if self.top is None else set()

    def remove(self) -> None:
        if self.top is not None:
            shutil.rmtree(self.top, ignore_errors=True)
            return
        for p in sorted(set(self.folder.rglob("*")) - self.before, reverse=True):   # a folder after its files
            try:
                p.rmdir() if p.is_dir() else p.unlink()
            except OSError:
                pass


__all__ = ["Created", "StageRefused", "Stages", "file_sha256", "text_sha256"]
