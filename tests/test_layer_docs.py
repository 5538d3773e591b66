"""docs/layers.md and the README's tour show the layers as tests/test_layers.py enforces them: the page lists exactly
the entries of ``LAYERS``, layer by layer, and names every module a pattern such as ``pdeflow.solvers.*`` covers; each
module of the README's tour sits in the layer the tour gives it."""
from __future__ import annotations

import fnmatch
import re

from test_layers import LAYERS, PACKAGES, ROOT, layer_of, module_files


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


def test_the_layers_page_lists_exactly_the_layers_table():
    sections = _sections((ROOT / "docs" / "layers.md").read_text(encoding="utf-8"))
    assert list(sections) == [name for name, _ in LAYERS], "the page's sections are the layers, bottom up"
    for name, patterns in LAYERS:
        assert [entry for entry, _ in sections[name]] == list(patterns), name


def test_the_layers_page_names_every_module_a_pattern_covers():
    modules = module_files(PACKAGES, ROOT)
    rows = {entry: text for rows in _sections((ROOT / "docs" / "layers.md").read_text(encoding="utf-8")).values()
            for entry, text in rows}
    missing = []
    for pattern, text in rows.items():
        if "*" not in pattern:
            continue
        prefix = pattern.rstrip("*").rstrip(".")
        for module in modules:
            if fnmatch.fnmatchcase(module, pattern):
                short = module[len(prefix) + 1:] if pattern.endswith(".*") else module.rpartition(".")[2]
                if f"`{short}`" not in text:
                    missing.append(f"{module} ({pattern})")
    assert not missing, missing


def test_the_readme_tour_puts_each_module_in_its_layer():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = text.split("## A tour", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| `([\w/.]+)` \|", tour, flags=re.M)
    names = [name for name, _ in LAYERS]
    assert {layer for layer, _ in rows} == set(names)
    folders = {folder: name for folder, name in PACKAGES.items()}
    for layer, path in rows:
        folder, _, rest = path.partition("/")
        module = ".".join([folders[folder], *rest.removesuffix(".py").removesuffix("/").split("/")])
        module = module.removesuffix(".__init__").rstrip(".")
        index = layer_of(module, LAYERS)
        assert index is not None and names[index] == layer, f"{path}: the tour says {layer}, LAYERS says " \
            f"{names[index] if index is not None else 'none'}"
