"""``python -m pdeflow.benchmarks.fuzz_config [--examples N] [--seconds S]``: ``pdeflow run`` on generated configs.

Property: whatever the config file (random bytes, random TOML, a small valid config with keys of every section
set to random values of random types, unknown sections and keys) and whatever the ``--set`` strings, ``pdeflow
run`` ends with exit code 0, or 2 with exactly one line on stderr; never a traceback, never 1 or 3. Two levels:

- ``parse``: up to the problem - :func:`pdeflow.core.config.load_config`, the overrides, the output checks - with
  ``Problem.from_config`` replaced by a stand-in that ends the command with exit 0 (the config was accepted);
- ``build``: configs whose sizes stay small, also through ``Problem.from_config`` and ``make_stepper``, with the
  time loop replaced by a stand-in (a config the parser accepts must build, or be refused in one line).

tests/core/test_fuzz_config.py runs both with a bounded number of examples; this script runs many more (hypothesis,
derandomized per seed, no example database) and writes ``fuzz_config-<time>.json`` to ``--out`` (default
``benchmarks/results``) with the examples tried and every failure found. Needs the ``test`` extra (hypothesis).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import io
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdeflow.core.config import SECTIONS

from .common import RESULTS

# A small valid config (the test suite's tiny problem), the starting point of most generated configs.
BASE: dict[str, dict[str, Any]] = {
    "task": {"name": "markov", "vocab_size": 3, "seq_len": 3, "n_samples": 4},
    "model": {"d": 4, "head_dim": 2},
    "init": {"n_particles": 3},
    "solver": {"method": "euler", "dt": 0.01},
    "run": {"t_end": 0.02, "frame_interval": 0.01},
    "diagnostics": {"enabled": False},
}
# Keys whose value sets an array size: kept small at the ``build`` level (the parser level takes any value).
SIZE_KEYS = {("task", "vocab_size"), ("task", "seq_len"), ("task", "n_samples"), ("task", "n_pairs"),
             ("task", "lag"), ("model", "d"), ("model", "head_dim"), ("init", "n_particles"), ("grid", "n"),
             ("solver", "deflate"), ("solver", "stages"), ("solver", "max_stages"), ("sgd", "batch_size")}
KEYS = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in SECTIONS.items()}
CHOICES = {(name, f.name): list(f.metadata["choices"]) for name, cls in SECTIONS.items()
           for f in dataclasses.fields(cls) if f.metadata.get("choices")}


# ---- TOML text of generated values ------------------------------------------------------------------
def toml_string(s: str) -> str:
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F or 0xD800 <= ord(c) <= 0xDFFF:
            out.append(f"\\u{ord(c):04x}" if ord(c) < 0xD800 or ord(c) > 0xDFFF else "?")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_text(data: dict[str, Any]) -> str:
    lines = []
    for section, table in data.items():
        if isinstance(table, dict):
            lines.append(f"[{toml_string(section)}]")
            lines.extend(f"{toml_string(k)} = {toml_value(v)}" for k, v in table.items())
        else:
            lines.insert(0, f"{toml_string(section)} = {toml_value(table)}")
    return "\n".join(lines) + "\n"


# ---- strategies -------------------------------------------------------------------------------------
EDGE_INTS = [0, 1, -1, 2, 3, 7, 2**31, -2**31, 2**53 + 1, 2**63 - 1, -2**63, 2**64, 10**400]
EDGE_FLOATS = [0.0, -0.0, 1e-300, 5e-324, 1e308, -1e308, math.inf, -math.inf, math.nan, 0.5, 1.0, 2.0]
text = st.text(st.characters(codec="utf-8"), max_size=12)
scalars = st.one_of(st.sampled_from(EDGE_INTS), st.integers(-5, 50), st.sampled_from(EDGE_FLOATS),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), text,
                    st.datetimes(), st.dates(), st.times())
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(text, inner, max_size=2)), max_leaves=5)
small_ints = st.one_of(st.integers(-2, 9), st.sampled_from([0, -1, 2**63, 10**400]))


@st.composite
def key_values(draw, section: str, small: bool) -> tuple[str, Any]:
    """A key of ``section`` (rarely an unknown one) with a value: one of its choices, or of any type."""
    key = draw(st.one_of(st.sampled_from(KEYS[section]), text, st.sampled_from(KEYS[section]).map(str.upper)))
    options = [values]
    if (section, key) in CHOICES:
        options.append(st.sampled_from(CHOICES[(section, key)]))
    if small and (section, key) in SIZE_KEYS:
        return key, draw(small_ints)
    return key, draw(st.one_of(*options))


@st.composite
def configs(draw, small: bool = False) -> dict[str, Any]:
    """BASE with 1 to 4 keys of random sections set to random values; now and then an unknown section or key,
    a section that is not a table, or a config from scratch."""
    data = {name: dict(table) for name, table in BASE.items()} if draw(st.integers(0, 9)) else {}
    for _ in range(draw(st.integers(1, 4))):
        section = draw(st.sampled_from(list(SECTIONS)))
        key, value = draw(key_values(section, small))
        data.setdefault(section, {})[key] = value
    if not small and draw(st.integers(0, 19)) == 0:
        data[draw(text)] = draw(values)
    return data


@st.composite
def overrides(draw, small: bool = False) -> list[str]:
    """``--set`` strings: random text, or ``section.key=value`` with a value of any type (TOML or not)."""
    out = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.integers(0, 4)) == 0:
            out.append(draw(st.text(max_size=20)))
            continue
        section = draw(st.one_of(st.sampled_from(list(SECTIONS)), text))
        key, value = draw(key_values(section, small)) if section in SECTIONS else (draw(text), draw(values))
        raw = draw(st.one_of(st.just(toml_value(value)), text)) if not small else toml_value(value)
        out.append(f"{section}.{key}={raw}")
    return [s.replace("\0", "") for s in out]


# ---- the property -------------------------------------------------------------------------------------
class _Accepted(Exception):
    """Raised in place of building the problem: the parser accepted the config."""


def _stub_run(cfg, problem, path, **kwargs):
    from pdeflow.solvers.driver import RunResult
    return RunResult("finished", "stand-in for the time loop", 0, None, Path(path))


def pdeflow_run(config: bytes | str, sets: list[str], build: bool) -> tuple[int, str]:
    """``pdeflow run CONFIG --set ...`` in-process with the time loop (and, unless ``build``, the problem)
    replaced by stand-ins; returns (exit code, stderr)."""
    from pdeflow.core.problem import Problem
    from pdeflow.interface.cli import main

    with tempfile.TemporaryDirectory(prefix="pdeflow-fuzz-") as tmp:
        path = Path(tmp) / "c.toml"
        path.write_bytes(config.encode("utf-8", "surrogatepass") if isinstance(config, str) else config)
        argv = ["run", str(path), "-o", str(Path(tmp) / "out.h5"), "--quiet"]
        for s in sets:
            argv += ["--set", s]
        err = io.StringIO()
        patches = [mock.patch("pdeflow.solvers.driver.run", _stub_run)]
        if not build:
            patches.append(mock.patch.object(Problem, "from_config", side_effect=_Accepted))
        with contextlib.ExitStack() as stack:
            for p in patches:
                stack.enter_context(p)
            stack.enter_context(contextlib.redirect_stderr(err))
            stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
            try:
                code = main(argv)
            except _Accepted:
                code = 0
        return code, err.getvalue()


def check(config: bytes | str, sets: list[str], build: bool) -> None:
    """AssertionError unless the command ends with 0, or 2 and one line (an exception propagates as is)."""
    code, err = pdeflow_run(config, sets, build)
    assert code in (0, 2), f"exit code {code}: {err[-500:]}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("pdeflow: error: "), repr(err)


PROPERTIES = {
    "bytes": (st.tuples(st.binary(max_size=200), overrides()), False),
    "text": (st.tuples(st.text(max_size=200), overrides()), False),
    "parse": (st.tuples(configs().map(toml_text), overrides()), False),
    "build": (st.tuples(configs(small=True).map(toml_text), overrides(small=True)), True),
}


def fuzz(name: str, examples: int, seed: int, failures: list[dict[str, Any]]) -> int:
    """Run one property for ``examples`` examples; records each distinct failure; returns examples tried."""
    strategy, build = PROPERTIES[name]
    tried = [0]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=False, report_multiple_bugs=True,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(example=strategy)
    def prop(example):
        tried[0] += 1
        config, sets = example
        check(config, sets, build)

    seeded = prop
    try:
        from hypothesis import seed as hypothesis_seed
        seeded = hypothesis_seed(seed)(prop)
        seeded()
    except Exception as exc:  # noqa: BLE001 - every failure is recorded
        failures.append({"property": name, "error": "".join(traceback.format_exception_only(exc))[-3000:]})
    return tried[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.fuzz_config", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000, help="examples per property and round")
    parser.add_argument("--seconds", type=float, default=1800.0, help="stop starting new rounds after this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    started = time.monotonic()
    tried: dict[str, int] = dict.fromkeys(PROPERTIES, 0)
    failures: list[dict[str, Any]] = []
    round_ = 0
    while time.monotonic() - started < args.seconds:
        for name in PROPERTIES:
            tried[name] += fuzz(name, args.examples, args.seed + round_, failures)
            print(f"round {round_}: {name} {tried[name]} examples, {len(failures)} failures "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
        round_ += 1
    summary = {"examples": tried, "total": sum(tried.values()), "failures": failures, "rounds": round_,
               "wall_seconds": time.monotonic() - started, "load": os.getloadavg(), "seed": args.seed,
               "finished": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    (args.out / f"fuzz_config-{stamp}.json").write_text(json.dumps(summary, indent=1))
    print(f"fuzz_config: {summary['total']} examples ({', '.join(f'{k} {v}' for k, v in tried.items())}), "
          f"{len(failures)} failures, {summary['wall_seconds']:.0f} s")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
