"""Every numba kernel is compiled through pdeflow.core.jit.jit, and none is a ``prange`` loop: numba compiles such a
loop into a function of its own that re-optimizes every kernel it calls, which made a fresh install's compilation on
two threads 2.39 times that on one (docs/design.md, "The causal attention kernels"); one item's work units go to
pdeflow's threads instead (tests/core/test_workers.py)."""
from __future__ import annotations

import re
from pathlib import Path

import numba

from pdeflow.core import kernels, kernels_jvp

ROOT = Path(__file__).resolve().parents[2]
JIT_HELPER = ROOT / "pdeflow" / "core" / "jit.py"
# numba's compiling decorators and its parallel loop, however imported
COMPILING = re.compile(r"\b(njit|prange|vectorize|guvectorize|cfunc|stencil)\b|numba\.jit\b"
                       r"|from numba import[^\n]*\bjit\b")


def test_no_module_compiles_outside_the_jit_helper():
    offenders = []
    for folder in ("pdeflow", "solvers", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == JIT_HELPER:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                if COMPILING.search(code) and not code.lstrip().startswith(('"', "'")):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_kernel_is_compiled_serial():
    dispatchers = [obj for module in (kernels, kernels_jvp) for obj in vars(module).values()
                   if isinstance(obj, numba.core.registry.CPUDispatcher)]
    assert len(dispatchers) >= 19
    assert not [d.py_func.__name__ for d in dispatchers if d.targetoptions.get("parallel")]


def test_no_kernel_assigns_into_a_slice():
    """``a[..., i:j] = b[..., :w]`` in a kernel makes numba compile its broadcasting setitem, whose size-mismatch error
    formats a message: with the unicode machinery it pulls in, 5.7 of the forward kernel's 15.8 s of compilation
    (measured by numba's compile events, float64, an empty cache). The kernels copy element by element instead,
    which LLVM vectorizes alike."""
    import ast
    import inspect

    offenders = []
    for module in (kernels, kernels_jvp):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Subscript) and any(isinstance(n, ast.Slice) for n in ast.walk(target.slice)):
                    offenders.append(f"{module.__name__}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not offenders, "\n".join(offenders)
