"""One counter (issue 53): the Problem counts every grad Phi evaluation and Jacobian-vector product it is asked for
(:attr:`pdeflow.core.problem.Problem.counts`); a share of them is read as the Problem's calls between a mark and now
(``Problem.mark``, ``since``, ``products_since``), not tallied by hand. This test reads every module of the package
(pdeflow/, solvers/, benchmarks/) and fails on an addition to a count outside pdeflow/core/problem.py: ``x += ...``
or ``x = x + ...`` whose target is an item of a ``counts`` mapping or a name that names products, gradients,
evaluations or a tally.

:data:`KNOWN` lists, with the reason each is not (yet) the Problem's, the additions that remain; the list can only
shrink (an entry that no longer occurs fails too), so a new tally is refused where it is written."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ("pdeflow", "solvers", "benchmarks")
COUNTER = Path("pdeflow/core/problem.py")
# a word of a target's name that makes it a count of calls (names split at "_" and ".")
WORDS = re.compile(r"^(counts?|products?|gradients?|grads|evals?|evaluations|jvps?|hvps?|tally|tallies)$")

# (module, target as written): why it is not the Problem's count. What remains counts things that are no call of
# the Problem's (a data set's token occurrences, the grid JKO step's kernel products) or carries the Problem's counts
# across a resumed run
KNOWN: dict[tuple[str, str], str] = {
    ("pdeflow/core/tasks.py", "counts[rows, r]"): "token occurrences of a data set, not a cost",
    ("solvers/jko.py", "products"): "the grid JKO step's conjugate-gradient products with the entropic transport's "
    "kernel, no call of the Problem's",
    ("solvers/accuracy.py", "self.products"): "the run's total of the stability checks' products (each check's "
    "share is the Problem's, lambda_max's mark), checkpointed so that a resumed run continues it",
}


def _target_words(node: ast.expr) -> list[str]:
    """The words of an assignment target's name and of its string keys: ``counts[kind]`` -> counts,
    ``c.direct_products`` -> c, direct, products, ``columns["gradient_evals"]`` -> columns, gradient, evals."""
    keys = []
    while isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            keys.append(node.slice.value)
        node = node.value
    return [w for name in (ast.unparse(node), *keys) for w in re.split(r"[._]", name) if w]


def additions(path: Path) -> list[tuple[int, str]]:
    """The (line, target) of every addition to a count in the module at ``path`` (module docstring)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        target = None
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            # x = x + y, also as one element of a tuple assignment (a, x = ..., x + y)
            pairs = ([(node.targets[0], node.value)] if not isinstance(node.targets[0], ast.Tuple) else
                     list(zip(node.targets[0].elts, node.value.elts)) if isinstance(node.value, ast.Tuple) else [])
            for left, value in pairs:
                if (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)
                        and ast.unparse(left) in (ast.unparse(value.left), ast.unparse(value.right))):
                    target = left
        if target is not None and any(WORDS.match(w) for w in _target_words(target)):
            found.append((node.lineno, ast.unparse(target)))
    return found


def test_no_count_is_added_to_outside_the_problem():
    seen, unexpected = set(), []
    for top in PACKAGE:
        for path in sorted((ROOT / top).rglob("*.py")):
            module = path.relative_to(ROOT)
            if module == COUNTER:
                continue
            for line, target in additions(path):
                key = (module.as_posix(), target)
                seen.add(key)
                if key not in KNOWN:
                    unexpected.append(f"{module}:{line}: {target} added to outside the Problem's counter")
    assert not unexpected, "\n".join(unexpected)
    stale = sorted(set(KNOWN) - seen)
    assert not stale, f"listed as known but no longer there (remove them from KNOWN): {stale}"


def test_the_check_finds_each_form_of_a_tally(tmp_path):
    """The rule on planted lines: each form of addition to a count is found, a stepper's other columns and a sum
    of squares are not."""
    module = tmp_path / "planted.py"
    module.write_text("def f(counts, c, columns, squares, problem):\n"
                      "    counts['gradient_evals'] += 1\n"
                      "    c.direct_products += 2\n"
                      "    problem.counts['jvp_exact'] += 3\n"
                      "    gradients = gradients + 1\n"
                      "    self.evaluations += 1\n"
                      "    v, self.products = w, self.products + 4\n"
                      "    columns['gradient_evals'] += 1\n"
                      "    columns['rejected'] += 1\n"
                      "    squares += 2.0\n")
    assert [line for line, _ in additions(module)] == [2, 3, 4, 5, 6, 7, 8]
