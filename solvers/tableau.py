"""Butcher tableaux that check themselves: an explicit Runge-Kutta method's coefficients against the conditions its
declaration claims, when its class is defined (:class:`pdeflow.solvers.explicit.ExplicitRK`).

An explicit s-stage method ``(A, b, c)`` (``A`` strictly lower triangular) has order p when its weights satisfy, for
every rooted tree ``t`` with at most p nodes (Butcher; Hairer, Norsett & Wanner I, II.2),

    ``sum_i b_i Phi_i(t) = 1 / gamma(t)``,

with the elementary weights ``Phi(leaf) = 1`` [s] and ``Phi([t_1 .. t_m]) = prod_k (A Phi(t_k))`` (elementwise), and
the density ``gamma(leaf) = 1``, ``gamma([t_1 .. t_m]) = |t| prod_k gamma(t_k)``: 1, 1, 2, 4, 9 trees of orders 1 to
5 (17 conditions up to order 5), 20 of order 6. :func:`trees` grows them from the single node, one leaf at a time.
The conditions assume the row sums ``c_i = sum_j a_ij`` (a method declares ``c`` and it is checked); a pair
with first-same-as-last reuse (FSAL) has ``A``'s last row equal to ``b`` (so ``b_s = 0`` and ``c_s = 1``): its last
stage is ``f(y_{n+1})``, the next step's first. The embedded weights ``b_hat = b - e`` of a pair are checked at their
own order. :func:`check` returns the first condition a declaration fails, in one line; :func:`order_of` the largest
order whose conditions all hold.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

# a rooted tree: the sorted tuple of its root's subtrees (the single node is ())
Tree = tuple
# relative tolerance of a condition, against the size of the sum it compares (the coefficients are doubles: the
# published tableaux satisfy their conditions to ~1e-16 of that size)
TOLERANCE = 1e-13
# the largest order order_of looks for (48 trees of order 7)
MAX_ORDER = 7


class TableauError(TypeError):
    """A tableau that does not satisfy what its class declares (raised where the class is defined)."""


def _grown(tree: Tree) -> set[Tree]:
    """The trees of one node more than ``tree``: a leaf attached to each of its nodes (canonical: sorted)."""
    out = {tuple(sorted((*tree, ())))}
    for i, child in enumerate(tree):
        for bigger in _grown(child):
            out.add(tuple(sorted((*tree[:i], bigger, *tree[i + 1:]))))
    return out


@functools.cache
def trees(order: int) -> tuple[Tree, ...]:
    """The rooted trees with ``order`` nodes (every tree of n > 1 nodes is one of n - 1 with a leaf attached)."""
    if order == 1:
        return ((),)
    return tuple(sorted(set().union(*(_grown(t) for t in trees(order - 1)))))


def size(tree: Tree) -> int:
    """``|t|``: the number of nodes."""
    return 1 + sum(size(child) for child in tree)


def density(tree: Tree) -> int:
    """``gamma(t) = |t| prod gamma(children)``: the order condition of t is ``b . Phi(t) = 1 / gamma(t)``."""
    return size(tree) * math.prod(density(child) for child in tree)


def elementary_weight(tree: Tree, A: np.ndarray) -> np.ndarray:
    """``Phi(t)`` [s]: 1 for the single node, ``prod_k (A Phi(t_k))`` over the root's subtrees t_k."""
    out = np.ones(A.shape[0])
    for child in tree:
        out = out * (A @ elementary_weight(child, A))
    return out


def formula(tree: Tree) -> str:
    """The condition's sum in matrix words: ``b.1``, ``b.c``, ``b.c^2``, ``b.(A c)``, ``b.(c (A c))``, ..."""
    def factors(t: Tree) -> list[str]:
        leaves = sum(1 for child in t if child == ())
        return ([("c" if leaves == 1 else f"c^{leaves}")] if leaves else []) + [
            f"(A {product(factors(child))})" for child in t if child != ()]

    def product(parts: list[str]) -> str:
        return "1" if not parts else parts[0] if len(parts) == 1 else f"({' '.join(parts)})"
    return f"b.{product(factors(tree))}"


@dataclass(frozen=True)
class Condition:
    """One failed condition: ``what`` it is (in words) and the values found and wanted."""
    what: str
    found: float
    wanted: str

    def __str__(self) -> str:
        return f"{self.what} = {self.found:.10g}, not {self.wanted}"


def _order_condition(weights: np.ndarray, A: np.ndarray, order: int) -> Condition | None:
    """The first condition of order <= ``order`` the ``weights`` fail (None: all hold)."""
    absolute = np.abs(A)
    for p in range(1, order + 1):
        for tree in trees(p):
            value = float(weights @ elementary_weight(tree, A))
            wanted = Fraction(1, density(tree))
            scale = float(np.abs(weights) @ elementary_weight(tree, absolute)) + float(wanted)
            if abs(value - float(wanted)) > TOLERANCE * scale:
                return Condition(f"an order-{p} condition {formula(tree)}", value, str(wanted))
    return None


def order_of(weights: Sequence[float], A: np.ndarray) -> int:
    """The largest p <= :data:`MAX_ORDER` such that ``weights`` satisfy every condition of order <= p with ``A``."""
    w = np.asarray(weights, dtype=float)
    for p in range(1, MAX_ORDER + 1):
        if _order_condition(w, A, p) is not None:
            return p - 1
    return MAX_ORDER


def matrix(A: Sequence[Sequence[float]]) -> np.ndarray:
    """The s x s array of a strictly lower triangular ``A`` given by its rows (row i: its i entries left of the
    diagonal)."""
    s = len(A)
    out = np.zeros((s, s))
    for i, row in enumerate(A):
        out[i, :len(row)] = row
    return out


def check(A: Sequence[Sequence[float]], b: Sequence[float], c: Sequence[float], order: int, *,
          fsal: bool = False, e: Sequence[float] = (), error_order: int = 0) -> str:
    """What the tableau ``(A, b, c)`` fails of its declaration, in one phrase ("" when nothing): the shapes (row i of
    ``A`` has i entries), the row sums ``c_i = sum_j a_ij``, the order conditions of ``b`` up to ``order``, with
    ``fsal`` ``A``'s last row equal to ``b`` (``b_s = 0``, ``c_s = 1``), and with ``e`` (``b - b_hat``) those of the
    embedded weights ``b_hat`` up to ``error_order``."""
    s = len(b)
    if s == 0 or len(A) != s or len(c) != s or (e and len(e) != s):
        return f"A has {len(A)} rows, b {s} weights, c {len(c)} nodes" + (f", e {len(e)} entries" if e else "")
    for i, row in enumerate(A):
        if len(row) != i:
            return f"row {i + 1} of A has {len(row)} entries, not {i} (an explicit method's A is strictly lower)"
    a = matrix(A)
    for i in range(s):
        total = float(np.sum(a[i]))
        if abs(total - c[i]) > TOLERANCE * (1.0 + float(np.sum(np.abs(a[i])))):
            return f"row sum {i + 1}: sum_j a_{i + 1}j = {total:.10g}, not c_{i + 1} = {c[i]:.10g}"
    if order < 1:
        return f"order = {order}: a method has order >= 1"
    failed = _order_condition(np.asarray(b, dtype=float), a, order)
    if failed is not None:
        return f"order = {order}, but b fails {failed}"
    if fsal:
        last = np.asarray(A[-1], dtype=float)
        if s < 2 or not np.allclose(last, b[:-1], rtol=0.0, atol=TOLERANCE) or b[-1] != 0.0 or c[-1] != 1.0:
            return ("first-same-as-last claimed, but the last row of A is not b (with b_s = 0 and c_s = 1: "
                    f"A[-1] = {tuple(float(x) for x in A[-1])}, b = {tuple(float(x) for x in b)}, c_s = {c[-1]:g})")
    if e:
        if error_order < 1:
            return f"error_order = {error_order}: the embedded solution has order >= 1"
        b_hat = np.asarray(b, dtype=float) - np.asarray(e, dtype=float)
        failed = _order_condition(b_hat, a, error_order)
        if failed is not None:
            return f"error_order = {error_order}, but the embedded weights b_hat = b - e fail {failed}"
    return ""


__all__ = ["MAX_ORDER", "TOLERANCE", "Condition", "TableauError", "Tree", "check", "density", "elementary_weight",
           "formula", "matrix", "order_of", "size", "trees"]
