"""The layers of pdeflow, enforced: no module imports a module of a higher layer, and no modules import each
other in a cycle (function-local imports included, as they are imports all the same).

A module's layer is the folder it is in (:data:`FOLDERS`), from the bottom up:

1. ``core`` (``pdeflow/core/``): configuration, the jit helper, kernels, the model and tasks, the mean field, the
   problem, the grid measure and the communicator;
2. ``io`` (``pdeflow/io/``): the file formats (trajectory, checkpoints, result files, the sharded writer, reference
   files and validation);
3. ``steppers``: ``solvers/``, installed as ``pdeflow.solvers``;
4. ``analysis`` (``pdeflow/analysis/``): diagnostics, stability, chaos, figures;
5. ``interface`` (``pdeflow/interface/``): the command line, and the benchmarks (``benchmarks/``, installed as
   ``pdeflow.benchmarks``).

The package's own files at its root (:data:`ROOT_FILES`) are the front door ``pdeflow/__init__`` (io: it re-exports
the file reader), ``pdeflow/__main__`` (interface), ``pdeflow/_version`` (core) and ``pdeflow/reference`` (analysis:
the public name of the manufactured checks). A module may import its own layer
and those below it. A module in no layer folder fails the check until it is moved into one. Imports are read with
:mod:`ast` (strings given to ``importlib`` are not imports and are not seen). Importing ``a.b.c`` counts as
importing the deepest module of the scanned packages that it names, not its parent packages, whose ``__init__``
Python runs along the way.
"""
from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# folder (relative to the checkout) -> the import name of the package it holds (setup.cfg's package_dir installs
# solvers/ and benchmarks/ as subpackages of pdeflow).
PACKAGES = {"pdeflow": "pdeflow", "solvers": "pdeflow.solvers", "benchmarks": "pdeflow.benchmarks"}

# the layers, bottom up
LAYERS = ("core", "io", "steppers", "analysis", "interface")
# package -> its layer: every module in it (at any depth) is in that layer
FOLDERS = {"pdeflow.core": "core", "pdeflow.io": "io", "pdeflow.solvers": "steppers",
           "pdeflow.analysis": "analysis", "pdeflow.interface": "interface", "pdeflow.benchmarks": "interface"}
# the package's own files at its root
ROOT_FILES = {"pdeflow": "io", "pdeflow._version": "core", "pdeflow.__main__": "interface",
              "pdeflow.reference": "analysis"}


def module_files(packages: dict[str, str], root: Path) -> dict[str, Path]:
    """Import name -> file of every module of the packages (``pkg/__init__.py`` is ``pkg``)."""
    modules = {}
    for folder, name in packages.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([name, *parts])] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest scanned module that ``name`` names (None: not one of ours)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported scanned module, line) for every import statement of the file, at any depth."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import name` imports the module pkg.name when there is one, else a name of pkg
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            resolved = _resolve(target, modules)
            if resolved is not None and resolved != module:
                found.append((resolved, node.lineno))
    return found


def layer_of(module: str, folders: dict[str, str] = FOLDERS, root_files: dict[str, str] = ROOT_FILES) -> str | None:
    """The layer of ``module``: that of the deepest layer folder holding it, or of its root file; None if neither."""
    if module in root_files:
        return root_files[module]
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in folders:
            return folders[".".join(parts[:n])]
    return None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_violations(packages: dict[str, str], root: Path, layers: tuple[str, ...] = LAYERS,
                     folders: dict[str, str] = FOLDERS, root_files: dict[str, str] = ROOT_FILES) -> list[str]:
    """One line per module outside every layer folder, per upward import and per import cycle."""
    modules = module_files(packages, root)
    problems, graph = [], {}
    for module, path in modules.items():
        own = layer_of(module, folders, root_files)
        if own is None:
            problems.append(f"{module} ({path.relative_to(root)}) is in no layer: move it into the folder of its "
                            f"layer (tests/meta/test_layers.py, FOLDERS)")
        edges = imports_of(module, path, modules)
        graph[module] = {target for target, _ in edges}
        for target, line in sorted(set(edges)):
            other = layer_of(target, folders, root_files)
            if own is not None and other is not None and layers.index(other) > layers.index(own):
                problems.append(f"{path.relative_to(root)}:{line}: {module} ({own}) imports {target} "
                                f"({other}), a higher layer")
    for component in _cycles(graph):
        problems.append("import cycle among " + ", ".join(component))
    return problems


def test_pdeflow_has_no_upward_import_and_no_cycle() -> None:
    problems = layer_violations(PACKAGES, ROOT)
    assert not problems, "\n".join(problems)


def test_every_layer_folder_exists() -> None:
    """Each layer package of the table is a folder of the checkout, and pdeflow/ holds nothing but the layer
    folders and its root files."""
    modules = module_files(PACKAGES, ROOT)
    assert set(FOLDERS) <= set(modules), set(FOLDERS) - set(modules)
    stray = sorted(p.name for p in (ROOT / "pdeflow").iterdir()
                   if p.suffix == ".py" and f"pdeflow.{p.stem}" not in ROOT_FILES and p.stem != "__init__")
    assert not stray, stray


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


PLANTED_LAYERS = ("low", "high")
PLANTED_FOLDERS = {"pkg.low": "low", "pkg.high": "high"}
PLANTED_ROOT = {"pkg": "high"}


def test_the_check_catches_a_planted_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """A cycle hidden in a function-local relative import, an upward import through ``from pkg import module``,
    and a module outside every layer folder: each is reported; the same package without them passes."""
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/base.py": "from . import helper\nx = 1\n",
        "pkg/low/helper.py": "def f():\n    from .base import g  # the cycle: base -> helper -> base\n",
        "pkg/high/__init__.py": "",
        "pkg/high/top.py": "from pkg.high.sub import leaf\nimport numpy\n",
        "pkg/high/sub/__init__.py": "",
        "pkg/high/sub/leaf.py": "from ...low.base import x\n",
    })
    check = {"layers": PLANTED_LAYERS, "folders": PLANTED_FOLDERS, "root_files": PLANTED_ROOT}
    assert layer_violations({"pkg": "pkg"}, tmp_path, **check) == [
        "import cycle among pkg.low.base, pkg.low.helper"]

    _package(tmp_path, {"pkg/low/helper.py": "from pkg.high import top\n", "pkg/extra.py": "import pkg.low.base\n"})
    problems = layer_violations({"pkg": "pkg"}, tmp_path, **check)
    assert problems == [
        "pkg.extra (pkg/extra.py) is in no layer: move it into the folder of its layer (tests/meta/test_layers.py, "
        "FOLDERS)",
        "pkg/low/helper.py:1: pkg.low.helper (low) imports pkg.high.top (high), a higher layer",
        # high.top -> high.sub.leaf -> low.base -> low.helper -> high.top
        "import cycle among pkg.high.sub.leaf, pkg.high.top, pkg.low.base, pkg.low.helper",
    ], problems

    _package(tmp_path, {"pkg/low/helper.py": "x = 1\n", "pkg/extra.py": "from .high.sub.leaf import x\n"})
    assert layer_violations({"pkg": "pkg"}, tmp_path, **check | {"root_files": PLANTED_ROOT | {"pkg.extra": "high"}}) \
        == []
    # the planted package imports as written: the check reads what Python runs
    run = subprocess.run([sys.executable, "-c", "import pkg.extra, pkg.high.top"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr


def test_a_command_starts_without_loading_optimal_transport_or_statistics() -> None:
    """Every ``pdeflow`` command imports the command line and the steppers: POT (whose import loads its backends,
    PyTorch among them where installed: seconds per command), scipy.stats and torch load only where a stepper or
    an analysis uses them."""
    code = ("import sys, pdeflow.interface.cli, pdeflow.solvers.driver; "
            "print(' '.join(sorted(m for m in ('ot', 'scipy.stats', 'torch', 'mpi4py') if m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "", f"imported at start: {proc.stdout.strip()}"


# a room of the analysis layer: one sub-package by concern, small enough to read whole
ROOM_LINES = 1000


def test_the_analysis_layer_is_rooms_by_concern_each_under_a_thousand_lines():
    """pdeflow/analysis/ holds sub-packages only (its own __init__ aside), each under ROOM_LINES lines of Python in
    total: a flat room of every concern, or one room that grows past what a maintainer reads whole, fails."""
    analysis = ROOT / "pdeflow" / "analysis"
    loose = sorted(p.name for p in analysis.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside a sub-package of pdeflow/analysis: {loose}"
    sizes = {room.name: sum(len(p.read_text(encoding="utf-8").splitlines()) for p in room.rglob("*.py"))
             for room in analysis.iterdir() if room.is_dir() and (room / "__init__.py").exists()}
    assert len(sizes) >= 8, sizes
    too_big = {name: n for name, n in sizes.items() if n >= ROOM_LINES}
    assert not too_big, f"rooms of {ROOM_LINES} lines or more: {too_big}"
