"""The mutation check's list (tests/mutations/run_mutations.py) cannot go stale silently: each mutation's text occurs
exactly once in its file and changes it, and each test it names exists; and the script restores a mutated file
whatever interrupts it. Fast: nothing is mutated in the checkout, no test is run."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import run_mutations as R

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("m", R.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_applies_and_names_existing_tests(m):
    assert R.stale(m) == "", f"{m.name}: {R.stale(m)}; update tests/mutations/run_mutations.py"
    assert m.new != m.old and m.tests and m.what
    for node in m.tests:
        path, _, name = node.partition("::")
        assert (ROOT / path).is_file(), node
        assert re.search(rf"^def {re.escape(name.split('[')[0])}\(", (ROOT / path).read_text(encoding="utf-8"),
                         flags=re.M), node


def test_the_list_covers_issue_52s_mutations():
    """At least the twelve of issue 52 (findings 1-3), names unique, over the certificate, the verdicts, the order."""
    names = [m.name for m in R.MUTATIONS]
    assert len(names) == len(set(names)) >= 12
    assert {m.file for m in R.MUTATIONS} >= {R.CERTIFICATE, R.SECTIONS, R.ORDER}


def test_a_mutated_file_is_restored_whatever_interrupts_the_tests(tmp_path, monkeypatch):
    """An interrupt while the tests run (SIGINT / SIGTERM raise Interrupted) leaves the file's original bytes and no
    backup; a backup a killed run left behind is restored by the next run."""
    target = tmp_path / "pdeflow" / "module.py"
    target.parent.mkdir()
    original = b"x = 1\ny = 2\n"
    target.write_bytes(original)
    m = R.Mutation("demo", "pdeflow/module.py", "y = 2", "y = 3", ("tests/test_demo.py::test_demo",), "demo")
    seen = []

    def interrupted(tests, root):
        seen.append(target.read_bytes())
        raise R.Interrupted("SIGTERM")

    monkeypatch.setattr(R, "run_tests", interrupted)
    with pytest.raises(R.Interrupted):
        R.apply(m, tmp_path)
    assert seen == [b"x = 1\ny = 3\n"] and target.read_bytes() == original
    assert not list(tmp_path.rglob("*" + R.BACKUP))
    # a run killed with SIGKILL mid-mutation: the backup is the original, the file mutated
    target.with_name(target.name + R.BACKUP).write_bytes(original)
    target.write_bytes(b"x = 1\ny = 3\n")
    monkeypatch.setattr(R, "MUTATIONS", (m,))
    assert R.restore_leftovers(tmp_path) == [target] and target.read_bytes() == original
    assert not list(tmp_path.rglob("*" + R.BACKUP))
