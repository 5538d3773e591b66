"""What is generated from the registry of steppers: the "which solver" table, one row per registered method
(:data:`pdeflow.solvers.methods.METHODS`) from the ``summary`` and ``use_when`` its stepper class declares next to its
``name``, and the ``[solver]`` schema the config validates (:class:`pdeflow.core.solver_config.SolverConfig`, from the
keys the classes declare, :mod:`pdeflow.solvers.parameters`).

The README's "Solvers" section and docs/solvers.md's "Choosing" section hold the table between the lines
:data:`START` and :data:`END`; the schema is the whole of :data:`~pdeflow.solvers.parameters.SCHEMA_FILE`.
``python -m pdeflow.solvers.table --write`` rewrites them after a stepper is added or its declaration changes, and
``--check`` (tests/methods/test_which_solver.py) exits 1 when a file holds another table or schema.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdeflow.solvers.methods import METHODS, solver_schema
from pdeflow.solvers.parameters import SCHEMA_FILE, schema_source

START = "<!-- which-solver:start -->"
END = "<!-- which-solver:end -->"

# the checkout's files that hold the table, relative to its root
FILES = ("README.md", "docs/solvers.md")


def which_solver_table() -> str:
    """The markdown table of every registered method, sorted by name: ``solver.method``, the values of
    ``init.measure`` it evolves, what it is and when to use it. ValueError naming the methods whose class declares
    no ``summary`` or ``use_when``."""
    undeclared = sorted(name for name, m in METHODS.items() if not (m.summary and m.use_when))
    if undeclared:
        raise ValueError(f"stepper classes without a summary or use_when: {', '.join(undeclared)}")
    rows = ["| `solver.method` | `init.measure` | what it is | when to use it |", "| --- | --- | --- | --- |"]
    for name in sorted(METHODS):
        m = METHODS[name]
        measures = ", ".join(f"`{measure}`" for measure in m.measures)
        rows.append(f"| `{name}` | {measures} | {m.summary} | {m.use_when} |")
    return "\n".join(rows) + "\n"


def with_table(text: str, table: str) -> str:
    """``text`` with what lies between its :data:`START` and :data:`END` lines replaced by ``table``; ValueError when
    ``text`` does not hold each marker exactly once, in that order."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise ValueError(f"needs one line {START!r} followed by one line {END!r}")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Print the table, or (``--write``) put it into :data:`FILES` and the schema into
    :data:`~pdeflow.solvers.parameters.SCHEMA_FILE` under ``--root``, or (``--check``) exit 1 naming the files whose
    table or schema differs; a file without the markers is one line on stderr and exit 2."""
    parser = argparse.ArgumentParser(prog="python -m pdeflow.solvers.table", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the table in README.md and docs/solvers.md, "
                        f"and the [solver] schema {SCHEMA_FILE}")
    action.add_argument("--check", action="store_true", help="exit 1 when a file holds another table or schema")
    parser.add_argument("--root", type=Path, default=Path("."), help="the checkout's root (default: .)")
    args = parser.parse_args(argv)
    table = which_solver_table()
    if not (args.write or args.check):
        sys.stdout.write(table)
        return 0
    stale = []
    for name in FILES:
        path = args.root / name
        try:
            text = path.read_text(encoding="utf-8")
            updated = with_table(text, table)
        except (OSError, ValueError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
        if updated != text:
            stale.append(name)
            if args.write:
                path.write_text(updated, encoding="utf-8")
    schema, path = schema_source(solver_schema()), args.root / SCHEMA_FILE
    if not path.is_file() or path.read_text(encoding="utf-8") != schema:
        stale.append(SCHEMA_FILE)
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(schema, encoding="utf-8")
    if args.check and stale:
        print(f"the which-solver table or the [solver] schema is stale in {', '.join(stale)}: run "
              f"python -m pdeflow.solvers.table --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
