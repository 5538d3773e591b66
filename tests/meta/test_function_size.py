"""Functions a maintainer can read whole: no function of the package over :data:`FUNCTION_LINES` lines unless a
comment ``# one function: <why>`` on the lines just above its ``def`` says why it must be one, and no command
function of the interface layer (``cmd_*``) over :data:`COMMAND_LINES` lines: the command line is a thin shell around
the layers below (docs/layers.md)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("pdeflow", "solvers", "benchmarks")
FUNCTION_LINES = 120
COMMAND_LINES = 80
MARKER = "# one function:"


def _functions(root: Path = ROOT, folders: tuple[str, ...] = FOLDERS):
    """(path relative to ``root``, function node, whether the marker explains its length) of every function."""
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            for node in ast.walk(ast.parse("\n".join(lines), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    above = lines[max(0, first - 4):first - 1]
                    yield path.relative_to(root), node, any(MARKER in line for line in above)


def _unexplained(root: Path = ROOT, folders: tuple[str, ...] = FOLDERS) -> list[str]:
    return [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, node, explained in _functions(root, folders)
            if node.end_lineno - node.lineno + 1 > FUNCTION_LINES and not explained]


def test_no_function_is_longer_than_a_screenful_without_saying_why():
    long = _unexplained()
    assert not long, long


def test_command_functions_are_thin_shells():
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, node, _ in _functions()
            if path.parts[:2] == ("pdeflow", "interface") and node.name.startswith("cmd_")
            and node.end_lineno - node.lineno + 1 > COMMAND_LINES]
    assert not long, long


def test_the_rule_sees_a_long_function_and_the_marker_excuses_it(tmp_path):
    """The check itself, on a package of its own: a function one line over the limit is found, one at the limit is
    not, and the marker on the lines above the def excuses the long one."""
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "m.py"
    source.write_text(f"def long():\n{body}\n\n\ndef fits():\n{body[:body.rindex(chr(10))]}\n", encoding="utf-8")
    assert [row.split()[1] for row in _unexplained(tmp_path, ("pkg",))] == ["long"]
    source.write_text(f"{MARKER} a reason\ndef long():\n{body}\n", encoding="utf-8")
    assert _unexplained(tmp_path, ("pkg",)) == []
