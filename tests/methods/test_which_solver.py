"""The "which solver" table (:mod:`pdeflow.solvers.table`): one row per registered method, from the ``summary`` and
``use_when`` its class declares, and the README and docs/solvers.md hold exactly that table, so a stepper added or
changed without ``python -m pdeflow.solvers.table --write`` fails here."""
from __future__ import annotations

from pathlib import Path

import pytest
from pdeflow.solvers import STEPPERS
from pdeflow.solvers.methods import METHODS
from pdeflow.solvers.table import END, FILES, START, main, which_solver_table, with_table

ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_method_has_its_row_with_its_own_declaration():
    table = which_solver_table()
    rows = [line for line in table.splitlines()[2:]]
    assert [row.split("|")[1].strip() for row in rows] == [f"`{name}`" for name in sorted(STEPPERS)]
    assert {"`eserk4`", "`bs23`", "`cvode`"} <= {row.split("|")[1].strip() for row in rows}
    for name, cls in STEPPERS.items():
        # declared on the class itself, next to its name: a subclass does not inherit its parent's row
        assert cls.__dict__.get("summary") and cls.__dict__.get("use_when"), name
        assert f"| {cls.summary} | {cls.use_when} |" in table
        assert "|" not in cls.summary + cls.use_when and "\n" not in cls.summary + cls.use_when, name


@pytest.mark.parametrize("name", FILES)
def test_the_readme_and_the_solvers_page_hold_the_generated_table(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert with_table(text, which_solver_table()) == text, (
        f"{name}: the which-solver table is stale; run python -m pdeflow.solvers.table --write")


def test_a_method_without_a_summary_is_refused_and_a_stale_file_is_found(tmp_path, monkeypatch, capsys):
    name = next(iter(METHODS))
    monkeypatch.setitem(METHODS, name, METHODS[name].__class__(name, ("particles",)))
    with pytest.raises(ValueError, match=name):
        which_solver_table()
    monkeypatch.undo()
    for path in FILES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(f"intro\n{START}\n| old |\n{END}\noutro\n", encoding="utf-8")
    assert main(["--check", "--root", str(tmp_path)]) == 1
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert main(["--check", "--root", str(tmp_path)]) == 0
    assert (tmp_path / FILES[0]).read_text(encoding="utf-8") == f"intro\n{START}\n{which_solver_table()}{END}\noutro\n"
    (tmp_path / FILES[1]).write_text("no markers\n", encoding="utf-8")
    assert main(["--check", "--root", str(tmp_path)]) == 2
    assert "which-solver:start" in capsys.readouterr().err


def test_a_new_key_declared_on_a_class_goes_into_the_schema_by_regeneration(tmp_path, monkeypatch, capsys):
    """A stepper class declaring a key the config does not know yet: building it says to regenerate, ``--check``
    finds the schema stale, and ``--write`` puts the key, with its doc, into the generated [solver] section."""
    from pdeflow.solvers import check_config
    from pdeflow.solvers.base import Stepper
    from pdeflow.solvers.parameters import SCHEMA_FILE, Param

    from pdeflow.core.config import Config

    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["--check", "--root", str(tmp_path)]) == 1  # no schema file there yet
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert main(["--check", "--root", str(tmp_path)]) == 0
    assert (tmp_path / SCHEMA_FILE).read_text() == (ROOT / SCHEMA_FILE).read_text()
    try:
        class Planted(Stepper):
            name = "planted_schema"
            summary, use_when = "a planted method", "never"
            params = (Param("planted_knob", int, 3, "a planted knob", ge=1),)

            @classmethod
            def from_config(cls, problem, cfg):
                return cls(problem)
        with pytest.raises(RuntimeError, match="lacks solver.planted_knob.*table --write"):
            check_config(Config())
        capsys.readouterr()
        assert main(["--check", "--root", str(tmp_path)]) == 1
        assert SCHEMA_FILE in capsys.readouterr().err
        assert main(["--write", "--root", str(tmp_path)]) == 0
        assert '    planted_knob: int = spec(3, "a planted knob", ge=1)\n' in (tmp_path / SCHEMA_FILE).read_text()
    finally:
        del STEPPERS["planted_schema"], METHODS["planted_schema"]
