"""The layers of pdeflow, enforced: no module imports a module of a higher layer, and no modules import each
other in a cycle (function-local imports included, as they are imports all the same).

From the bottom up (the table :data:`LAYERS`; a module matches the first pattern that names it):

1. ``core``: configuration, the jit helper, kernels, the model and tasks, the mean field, the problem, the grid
   measure and the communicator;
2. ``io``: the file formats (trajectory, result files, the sharded writer, reference files and validation) and the
   package's front door ``pdeflow/__init__``, which re-exports the file reader;
3. ``steppers``: ``solvers/``, installed as ``pdeflow.solvers``;
4. ``analysis``: diagnostics, stability, chaos, plotting;
5. ``interface``: the command line and the benchmarks (``benchmarks/``, installed as ``pdeflow.benchmarks``).

A module may import its own layer and those below it. A new module matches no pattern until it is given a layer
here, and fails the check until then. Imports are read with :mod:`ast` (strings given to ``importlib`` are not
imports and are not seen). Importing ``a.b.c`` counts as importing the deepest module of the scanned packages that
it names, not its parent packages, whose ``__init__`` Python runs along the way.
"""
from __future__ import annotations

import ast
import fnmatch
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# folder (relative to the checkout) -> the import name of the package it holds (setup.cfg's package_dir installs
# solvers/ and benchmarks/ as subpackages of pdeflow).
PACKAGES = {"pdeflow": "pdeflow", "solvers": "pdeflow.solvers", "benchmarks": "pdeflow.benchmarks"}

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("pdeflow._version", "pdeflow.exit_codes", "pdeflow.methods", "pdeflow.config", "pdeflow.clock",
              "pdeflow.state", "pdeflow.jit",
              "pdeflow.kernels", "pdeflow.model", "pdeflow.tasks", "pdeflow.mean_field", "pdeflow.workers",
              "pdeflow.problem", "pdeflow.measure", "pdeflow.parallel", "pdeflow.kernels_jvp",
              "pdeflow.tuner")),
    ("io", ("pdeflow", "pdeflow.schema", "pdeflow.file_access", "pdeflow.checkpoint", "pdeflow.problem_file",
            "pdeflow.trajectory", "pdeflow.trajectory_writer", "pdeflow.recovery", "pdeflow.result_files",
            "pdeflow.resume", "pdeflow.sharded_writer", "pdeflow.reference")),
    ("steppers", ("pdeflow.solvers", "pdeflow.solvers.*")),
    ("analysis", ("pdeflow.diagnostics", "pdeflow.diagnostics.*", "pdeflow.stability", "pdeflow.spectrum",
                  "pdeflow.stationary", "pdeflow.chaos", "pdeflow.chaos_plots", "pdeflow.stability_plots",
                  "pdeflow.wfr_comparison", "pdeflow.plotting", "pdeflow.minimum_rates")),
    ("interface", ("pdeflow.cli", "pdeflow.cli_*", "pdeflow.__main__", "pdeflow.benchmarks", "pdeflow.benchmarks.*")),
]


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


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int | None:
    for index, (_, patterns) in enumerate(layers):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return index
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


def layer_violations(packages: dict[str, str], root: Path,
                     layers: list[tuple[str, tuple[str, ...]]]) -> list[str]:
    """One line per module without a layer, per upward import and per import cycle."""
    modules = module_files(packages, root)
    problems, graph = [], {}
    for module, path in modules.items():
        own = layer_of(module, layers)
        if own is None:
            problems.append(f"{module} ({path.relative_to(root)}) has no layer: add it to LAYERS in "
                            f"tests/test_layers.py")
        edges = imports_of(module, path, modules)
        graph[module] = {target for target, _ in edges}
        for target, line in sorted(set(edges)):
            other = layer_of(target, layers)
            if own is not None and other is not None and other > own:
                problems.append(f"{path.relative_to(root)}:{line}: {module} ({layers[own][0]}) imports {target} "
                                f"({layers[other][0]}), a higher layer")
    for component in _cycles(graph):
        problems.append("import cycle among " + ", ".join(component))
    return problems


def test_pdeflow_has_no_upward_import_and_no_cycle() -> None:
    problems = layer_violations(PACKAGES, ROOT, LAYERS)
    assert not problems, "\n".join(problems)


def test_every_layer_pattern_names_a_module() -> None:
    """A pattern matching nothing is a renamed or deleted module that the table still lists (the spellings kept
    for a later move, ``pdeflow.solvers`` and ``pdeflow.benchmarks``, excepted)."""
    modules = module_files(PACKAGES, ROOT)
    spare = {"pdeflow.solvers", "pdeflow.solvers.*", "pdeflow.benchmarks", "pdeflow.benchmarks.*"}
    unused = [p for _, patterns in LAYERS for p in patterns
              if p not in spare and not any(fnmatch.fnmatchcase(m, p) for m in modules)]
    assert not unused, unused


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


PLANTED_LAYERS = [("low", ("pkg.low", "pkg.low_*")), ("high", ("pkg", "pkg.high", "pkg.sub", "pkg.sub.*"))]


def test_the_check_catches_a_planted_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """A cycle hidden in a function-local relative import, an upward import through ``from pkg import module``,
    and a module with no layer: each is reported; the same package without them passes."""
    _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from . import low_helper\nx = 1\n",
        "pkg/low_helper.py": "def f():\n    from .low import g  # the cycle: low -> low_helper -> low\n",
        "pkg/high.py": "from pkg.sub import leaf\nimport numpy\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/leaf.py": "from ..low import x\n",
    })
    assert layer_violations({"pkg": "pkg"}, tmp_path, PLANTED_LAYERS) == ["import cycle among pkg.low, pkg.low_helper"]

    _package(tmp_path, {"pkg/low_helper.py": "from pkg import high\n", "pkg/extra.py": "import pkg.low\n"})
    problems = layer_violations({"pkg": "pkg"}, tmp_path, PLANTED_LAYERS)
    assert problems == [
        "pkg.extra (pkg/extra.py) has no layer: add it to LAYERS in tests/test_layers.py",
        "pkg/low_helper.py:1: pkg.low_helper (low) imports pkg.high (high), a higher layer",
        "import cycle among pkg.high, pkg.low, pkg.low_helper, pkg.sub.leaf",  # high -> sub.leaf -> low -> ...
    ], problems

    _package(tmp_path, {"pkg/low_helper.py": "x = 1\n", "pkg/extra.py": "from .sub.leaf import x\n"})
    planted = PLANTED_LAYERS + [("top", ("pkg.extra",))]
    assert layer_violations({"pkg": "pkg"}, tmp_path, planted) == []
    # the planted package imports as written: the check reads what Python runs
    run = subprocess.run([sys.executable, "-c", "import pkg.extra, pkg.high"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
