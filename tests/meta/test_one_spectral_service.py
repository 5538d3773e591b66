"""One spectral service: the mass-weighted operator S is built in one module and Lanczos runs in one module.

Read with :mod:`ast` over every module of the package (``pdeflow/``, ``solvers/``, ``benchmarks/``):

- **a construction of S**: the sandwich ``r * product(x / r)`` (a product between a scaling and its inverse, the
  shape of ``M^{1/2} (-J) M^{-1/2}``), only in :data:`S_MODULE`; and a system Jacobian-vector product
  (``system_jvp``, ``system_jvp_difference``) called only there, or in a module of :data:`OTHER_PRODUCTS`, each
  with the reason it is not S;
- **a Lanczos loop**: a loop that orthogonalises against a basis it grows, ``Q @ (Q.T @ w)``, or a sparse
  eigen-solver of scipy (ARPACK's ``eigsh``, ``lobpcg``), only in :data:`LANCZOS_MODULE`.

The planted-copy test shows that a pasted copy of either is caught.
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("pdeflow", "solvers", "benchmarks")
S_MODULE = "pdeflow/core/system_jacobian.py"
LANCZOS_MODULE = "pdeflow/core/lanczos.py"
PRODUCTS = ("system_jvp", "system_jvp_difference")
# modules that call a system Jacobian-vector product for something other than S, and why
OTHER_PRODUCTS = {
    "pdeflow/core/problem.py": "defines the products (and the complex-step product checks the forward mode)",
    "solvers/particle_proximal.py": "the Hessian of the proximal objective at a shifted cloud, not S at a state",
    "benchmarks/suite.py": "times one product against one gradient",
}
ARPACK = ("eigsh", "eigs", "ArpackNoConvergence", "lobpcg")   # the sparse eigen-solvers, Lanczos-based or not


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _divisors(node: ast.AST) -> list[ast.AST]:
    return [n.right for n in ast.walk(node) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)]


def _is_sandwich(node: ast.AST) -> bool:
    """``r * f(... x / r ...)`` (either order): a call's argument divided by the factor that scales its result."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
        return False
    for scale, other in ((node.left, node.right), (node.right, node.left)):
        calls = [n for n in ast.walk(other) if isinstance(n, ast.Call)]
        if any(_same(scale, d) for call in calls for arg in call.args for d in _divisors(arg)):
            return True
    return False


def _is_reorthogonalisation(node: ast.AST) -> bool:
    """``Q @ (Q.T @ w)`` with the same ``Q`` (sliced or not) on both sides."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult)):
        return False
    inner = node.right
    return (isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.MatMult)
            and isinstance(inner.left, ast.Attribute) and inner.left.attr == "T" and _same(inner.left.value, node.left))


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Subscript | ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_lanczos_loop(loop: ast.For | ast.While) -> bool:
    """A loop that orthogonalises against a basis it grows (assigns to, or appends to, in the loop): a Lanczos or
    Arnoldi iteration. Projecting fixed vectors off a fixed basis in a loop is not one."""
    grown = set()
    for n in ast.walk(loop):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
        grown |= {_root_name(t) for t in targets}
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "extend"):
            grown.add(_root_name(n.func.value))
    return any(_is_reorthogonalisation(n) and _root_name(n.left) in grown for n in ast.walk(loop))


def findings(path: Path, relative: str) -> list[str]:
    """One line per construction of S, product call, Lanczos loop or ARPACK call the file holds outside its one
    module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), relative)
    found = []
    for node in ast.walk(tree):
        where = f"{relative}:{getattr(node, 'lineno', 0)}"
        if relative != S_MODULE and _is_sandwich(node):
            found.append(f"{where}: a construction of S (r * product(x / r)) outside {S_MODULE}")
        if (relative != S_MODULE and relative not in OTHER_PRODUCTS and isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute) and node.func.attr in PRODUCTS):
            found.append(f"{where}: a system Jacobian-vector product outside {S_MODULE} (use SystemJacobian)")
        if relative != LANCZOS_MODULE and isinstance(node, ast.For | ast.While):
            if _is_lanczos_loop(node):
                found.append(f"{where}: a Lanczos (orthogonalising) loop outside {LANCZOS_MODULE}")
        if relative != LANCZOS_MODULE:
            names = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom) else
                     [node.func.attr] if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else [])
            if any(name in ARPACK for name in names):
                found.append(f"{where}: ARPACK outside {LANCZOS_MODULE}")
    return found


def package_findings(root: Path) -> list[str]:
    found = []
    for folder in PACKAGE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            found += findings(path, path.relative_to(root).as_posix())
    return found


def test_one_construction_of_s_and_one_lanczos() -> None:
    found = package_findings(ROOT)
    assert not found, "\n".join(found)


def test_the_one_modules_hold_what_the_check_looks_for() -> None:
    """The check sees the one construction and the one loop where they are (so it is not blind to them)."""
    s_module = (ROOT / S_MODULE).read_text(encoding="utf-8")
    lanczos = (ROOT / LANCZOS_MODULE).read_text(encoding="utf-8")
    assert any(_is_sandwich(n) for n in ast.walk(ast.parse(s_module)))
    assert any(_is_lanczos_loop(loop) for loop in ast.walk(ast.parse(lanczos)) if isinstance(loop, ast.For))


def test_a_pasted_copy_is_caught(tmp_path: Path) -> None:
    """Mutations: a copy of S's construction (the old ``mass_weighted``, and inline), a direct product call, a
    Lanczos loop (the old ``krylov_ritz``'s), an Arnoldi-style one and an ARPACK import, planted in a stepper
    module, are each reported; the same file without them is not."""
    # a fixed basis projected off fixed vectors in a loop (minimum_rates' random directions) is no Lanczos
    clean = textwrap.dedent("""
        import numpy as np

        def directions(basis, rng, n):
            out = []
            for j in range(n):
                d = rng.standard_normal(basis.shape[0])
                d -= basis @ (basis.T @ d)
                out.append(d)
            return out
        """)
    planted = {
        "s": """
            def apply(v, root, problem, omega, mass):
                return (root * problem.product(v.reshape(omega.shape) / root)).ravel()
            """,
        "s_inline": """
            def apply(v, mass, jvp):
                return np.sqrt(mass)[:, None] * jvp(v / np.sqrt(mass)[:, None])
            """,
        "product": """
            def apply(problem, omega, mass, u):
                return problem.system_jvp(omega, mass, u)
            """,
        "lanczos": """
            def ritz(op, q, dims, basis):
                for j in range(dims):
                    basis[:, j] = q
                    w = op(q)
                    w -= basis[:, :j] @ (basis[:, :j].T @ w)
                    q = w / np.linalg.norm(w)
            """,
        "arnoldi": """
            def ritz(op, q, dims):
                Q = q[:, None]
                while Q.shape[1] < dims:
                    w = op(Q[:, -1])
                    w = w - Q @ (Q.T @ w)
                    Q = np.column_stack([Q, w / np.linalg.norm(w)])
            """,
        "arpack": """
            from scipy.sparse.linalg import eigsh
            """,
    }
    target = tmp_path / "solvers" / "planted.py"
    target.parent.mkdir()
    target.write_text(clean, encoding="utf-8")
    assert findings(target, "solvers/planted.py") == []
    for kind, code in planted.items():
        target.write_text(clean + textwrap.dedent(code), encoding="utf-8")
        assert len(findings(target, "solvers/planted.py")) == 1, kind
