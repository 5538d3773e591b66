"""docs/layers.md and the README's tour show the layers as the tree holds them (tests/meta/test_layers.py): the page has
one section per layer, bottom up, and names every module in the section of its layer (a row of its own, or by its
short name in the row of a pattern such as ``pdeflow.solvers.*``; a module defining a registered method is named by
the generated which-solver table instead); every row names modules that exist; each module
of the README's tour sits in the layer the tour gives it."""
from __future__ import annotations

import fnmatch
import re

from test_layers import FOLDERS, LAYERS, PACKAGES, ROOT, layer_of, module_files


def _sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """``## layer`` -> the (first cell, second cell) of each row of its table."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif current and line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            sections[current].append((cells[0].strip("`"), cells[1]))
    return sections


def _page() -> dict[str, list[tuple[str, str]]]:
    return _sections((ROOT / "docs" / "layers.md").read_text(encoding="utf-8"))


def test_the_layers_page_has_a_section_per_layer():
    assert list(_page()) == list(LAYERS), "the page's sections are the layers, bottom up"


def test_the_layers_page_names_every_module_in_its_layer():
    """Every module, but a stepper's own (a module of pdeflow.solvers that defines a registered method): the "which
    solver" table, generated from the registry, lists those, so adding a stepper edits no page by hand."""
    from pdeflow.solvers import STEPPERS

    sections = _page()
    missing = []
    # a module that defines a registered method (a stepper class with a name) is named by the which-solver table,
    # generated from the registry: adding a method is its module and its test, with no row here
    methods = {cls.__module__ for cls in STEPPERS.values()}
    for module in module_files(PACKAGES, ROOT):
        if module in methods:
            continue
        if module in FOLDERS and module.count(".") == 1 and module not in ("pdeflow.solvers", "pdeflow.benchmarks"):
            continue   # a layer package itself (pdeflow.core, ...): its folder is its section
        rows = sections.get(layer_of(module) or "", [])
        named = any(entry == module for entry, _ in rows)
        for entry, text in rows:
            if "*" in entry and fnmatch.fnmatchcase(module, entry):
                short = module[len(entry) - 1:] if entry.endswith(".*") else module.rpartition(".")[2]
                named |= f"`{short}`" in text
        if not named:
            missing.append(f"{module} ({layer_of(module)})")
    assert not missing, missing


def test_every_row_of_the_layers_page_names_modules_that_exist():
    modules = module_files(PACKAGES, ROOT)
    stale = [entry for rows in _page().values() for entry, _ in rows
             if not any(fnmatch.fnmatchcase(m, entry) for m in modules)]
    assert not stale, stale


def test_the_readme_tour_puts_each_module_in_its_layer():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = text.split("## A tour", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| `([\w/.]+)` \|", tour, flags=re.M)
    assert {layer for layer, _ in rows} == set(LAYERS)
    for layer, path in rows:
        folder, _, rest = path.partition("/")
        module = ".".join([PACKAGES[folder], *rest.removesuffix(".py").removesuffix("/").split("/")])
        module = module.removesuffix(".__init__").rstrip(".")
        assert layer_of(module) == layer, f"{path}: the tour says {layer}, the tree says {layer_of(module)}"
