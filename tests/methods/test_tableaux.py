"""Butcher tableaux check themselves when their class is defined (pdeflow.solvers.tableau, issue 53): the row sums,
the order conditions of b and of the embedded b_hat, first-same-as-last; ``stages`` derived. The generic conditions
(rooted trees and elementary weights) are checked against the 17 conditions up to order 5 written out by hand, in
exact rational arithmetic, on the published tableaux (Dormand & Prince 1980; Bogacki & Shampine 1989; RK4; Heun,
Euler); each kind of bad declaration is planted and refused where the class is defined, registering nothing."""
from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest
from pdeflow.solvers import STEPPERS, make_stepper
from pdeflow.solvers.explicit import RK4, EmbeddedRK, ExplicitRK, Heun
from pdeflow.solvers.heun_euler import HeunEuler
from pdeflow.solvers.methods import METHODS
from pdeflow.solvers.tableau import TableauError, density, elementary_weight, matrix, order_of, trees

from test_explicit import build

# the published tableaux in exact rationals: A (rows), b, the embedded b_hat (pairs), the orders of b and b_hat
PUBLISHED = {
    "euler": ([[]], [F(1)], None, 1, None),
    "heun": ([[], [F(1)]], [F(1, 2), F(1, 2)], None, 2, None),
    "rk4": ([[], [F(1, 2)], [F(0), F(1, 2)], [F(0), F(0), F(1)]], [F(1, 6), F(1, 3), F(1, 3), F(1, 6)], None, 4, None),
    "heun_euler": ([[], [F(1)], [F(1, 2), F(1, 2)]], [F(1, 2), F(1, 2), F(0)], [F(1), F(0), F(0)], 2, 1),
    "bs23": ([[], [F(1, 2)], [F(0), F(3, 4)], [F(2, 9), F(1, 3), F(4, 9)]], [F(2, 9), F(1, 3), F(4, 9), F(0)],
             [F(7, 24), F(1, 4), F(1, 3), F(1, 8)], 3, 2),
    "adaptive": ([[], [F(1, 5)], [F(3, 40), F(9, 40)], [F(44, 45), F(-56, 15), F(32, 9)],
                  [F(19372, 6561), F(-25360, 2187), F(64448, 6561), F(-212, 729)],
                  [F(9017, 3168), F(-355, 33), F(46732, 5247), F(49, 176), F(-5103, 18656)],
                  [F(35, 384), F(0), F(500, 1113), F(125, 192), F(-2187, 6784), F(11, 84)]],
                 [F(35, 384), F(0), F(500, 1113), F(125, 192), F(-2187, 6784), F(11, 84), F(0)],
                 [F(5179, 57600), F(0), F(7571, 16695), F(393, 640), F(-92097, 339200), F(187, 2100), F(1, 40)],
                 5, 4),
}
PUBLISHED["wfr"] = PUBLISHED["adaptive"]  # Dormand-Prince on (omega, m)


def hand_conditions(A: list, b: list) -> list[tuple[int, object, F]]:
    """The 17 order conditions up to order 5 written out (Hairer, Norsett & Wanner I, Table II.2.1): (order, the sum
    ``sum_i b_i ...``, 1/gamma), in the arithmetic of the entries (Fractions: exact)."""
    s = len(b)
    a = [[A[i][j] if j < len(A[i]) else 0 for j in range(s)] for i in range(s)]
    c = [sum(row) for row in A]

    def times(u: list) -> list:  # A u
        return [sum(a[i][j] * u[j] for j in range(s)) for i in range(s)]

    def dot(*vectors: list) -> object:  # sum_i b_i prod_k v_k[i]
        return sum(b[i] * np.prod([v[i] for v in vectors]) for i in range(s))
    one = [1] * s
    c2, c3, c4 = ([x ** p for x in c] for p in (2, 3, 4))
    Ac, Ac2, Ac3 = times(c), times(c2), times(c3)
    AAc, AAc2 = times(Ac), times(Ac2)
    cAc = [x * y for x, y in zip(c, Ac)]
    return [(1, dot(one), F(1)), (2, dot(c), F(1, 2)),
            (3, dot(c2), F(1, 3)), (3, dot(Ac), F(1, 6)),
            (4, dot(c3), F(1, 4)), (4, dot(c, Ac), F(1, 8)), (4, dot(Ac2), F(1, 12)), (4, dot(AAc), F(1, 24)),
            (5, dot(c4), F(1, 5)), (5, dot(c2, Ac), F(1, 10)), (5, dot(c, Ac2), F(1, 15)), (5, dot(c, AAc), F(1, 30)),
            (5, dot(Ac, Ac), F(1, 20)), (5, dot(Ac3), F(1, 20)), (5, dot(times(cAc)), F(1, 40)),
            (5, dot(AAc2), F(1, 60)), (5, dot(times(AAc)), F(1, 120))]


def hand_order(A: list, b: list) -> int:
    """The largest p <= 5 whose hand-written conditions all hold exactly (Fractions)."""
    failed = [p for p, value, wanted in hand_conditions(A, b) if value != wanted]
    return min(failed) - 1 if failed else 5


# ---- the generic conditions against the hand-written ones ------------------------------------------------------

def test_the_trees_are_the_rooted_trees_and_their_conditions_the_hand_written_ones():
    """1, 1, 2, 4, 9, 20, 48 rooted trees of 1..7 nodes (OEIS A000081), 17 up to order 5; on a random 6-stage
    tableau the generic residuals ``b . Phi(t) - 1/gamma(t)`` of orders 1..5 are the hand-written conditions'."""
    assert [len(trees(p)) for p in range(1, 8)] == [1, 1, 2, 4, 9, 20, 48]
    rng = np.random.default_rng(5)
    A = [list(rng.standard_normal(i)) for i in range(6)]
    b = list(rng.standard_normal(6))
    a = matrix(A)
    for p in range(1, 6):
        generic = sorted(float(np.asarray(b) @ elementary_weight(t, a)) - 1 / density(t) for t in trees(p))
        hand = sorted(float(value) - float(wanted) for q, value, wanted in hand_conditions(A, b) if q == p)
        np.testing.assert_allclose(generic, hand, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", sorted(PUBLISHED))
def test_every_shipped_tableau_is_the_published_one_and_has_its_order(method):
    """The class's numbers are the published rationals, which have (by the hand-written conditions, exactly) the
    orders the class declares for b and b_hat and no more (up to 5); the generic check finds the same orders on the
    floats, and the class's ``stages`` is s, less one for first-same-as-last."""
    cls = STEPPERS[method]
    A, b, b_hat, order, error_order = PUBLISHED[method]
    assert [list(row) for row in cls.A] == [[float(x) for x in row] for row in A]
    assert list(cls.b) == [float(x) for x in b]
    assert list(cls.c) == [float(sum(row)) for row in A]
    assert hand_order(A, b) == order == cls.order
    assert order_of(cls.b, matrix(cls.A)) == order
    if b_hat is None:
        assert not issubclass(cls, EmbeddedRK)
    else:
        assert hand_order(A, b_hat) == error_order == cls.error_order
        assert [float(x) for x in b_hat] == pytest.approx(np.subtract(cls.b, cls.e), abs=1e-16)
        assert order_of(np.subtract(cls.b, cls.e), matrix(cls.A)) == error_order
    fsal = A[-1] == b[:-1] and b[-1] == 0
    assert cls.fsal == fsal and cls.stages == len(b) - fsal


def test_every_registered_explicit_method_has_a_checked_tableau():
    assert sorted(name for name, cls in STEPPERS.items() if issubclass(cls, ExplicitRK)) == sorted(PUBLISHED)


# ---- each kind of error, planted, refused where the class is defined ------------------------------------------

def refused(match: str, **tableau) -> None:
    """Defining a named class with ``tableau`` over Heun's or a pair's raises TableauError matching ``match`` in one
    line naming the method, and registers nothing."""
    base = EmbeddedRK if "e" in tableau else ExplicitRK
    with pytest.raises(TableauError, match=match) as info:
        type("Planted", (base,), {"name": "planted", "summary": "", "use_when": "", **tableau})
    assert "\n" not in str(info.value) and "tableau of Planted (solver.method = 'planted')" in str(info.value)
    assert "planted" not in STEPPERS and "planted" not in METHODS


BS = {key: getattr(STEPPERS["bs23"], key) for key in ("A", "b", "c", "e", "order", "error_order", "fsal")}
DP = {key: getattr(STEPPERS["adaptive"], key) for key in ("A", "b", "c", "e", "order", "error_order", "fsal")}


def test_order_two_weights_declared_order_three_are_refused():
    """The planted error of issue 53: second-order weights under ``order = 3``, a fixed-step method (Heun's) and a
    pair (Bogacki-Shampine's b replaced by its second-order b_hat, and that b_hat's error order kept)."""
    refused(r"order = 3, but b fails an order-3 condition b.c\^2 = 0.5, not 1/3", A=Heun.A, b=Heun.b, c=Heun.c,
            order=3)
    b_hat = tuple(np.subtract(BS["b"], BS["e"]))
    refused(r"order = 3, but b fails an order-3 condition",
            **{**BS, "b": b_hat, "e": tuple(np.subtract(b_hat, BS["b"]))})
    refused(r"order = 5, but b fails an order-5 condition b.c\^4 = 0.2083333333, not 1/5", A=RK4.A, b=RK4.b,
            c=RK4.c, order=5)


def test_an_embedded_solution_below_its_error_order_is_refused():
    """b_hat = b - e is checked at its own declared order: Dormand-Prince's e off in one entry, or its error order
    claimed 5."""
    e = list(DP["e"])
    e[2] *= 1.01
    refused(r"error_order = 4, but the embedded weights b_hat = b - e fail an order-1 condition b.1",
            **{**DP, "e": tuple(e)})
    refused(r"error_order = 5, but the embedded weights b_hat = b - e fail an order-5 condition",
            **{**DP, "error_order": 5})


def test_a_wrong_row_sum_is_refused():
    refused(r"row sum 3: sum_j a_3j = 0.5, not c_3 = 0.6", A=RK4.A, b=RK4.b, c=(0.0, 0.5, 0.6, 1.0), order=4)
    A = [list(row) for row in DP["A"]]
    A[3][1] += 1e-6
    refused(r"row sum 4: sum_j a_4j = 0.800001, not c_4 = 0.8", **{**DP, "A": tuple(map(tuple, A))})


def test_a_false_first_same_as_last_claim_is_refused():
    """FSAL claimed where the last row of A is not b: RK4 (its last row is (0, 0, 1)), and a Heun-Euler pair whose
    last stage is another point of the step (row sum and orders intact)."""
    refused("first-same-as-last claimed, but the last row of A is not b", A=RK4.A, b=RK4.b, c=RK4.c, order=4,
            fsal=True)
    refused("first-same-as-last claimed, but the last row of A is not b",
            A=((), (1.0,), (0.25, 0.75)), b=(0.5, 0.5, 0.0), c=(0.0, 1.0, 1.0), e=(-0.5, 0.5, 0.0), order=2,
            error_order=1, fsal=True)


def test_stages_declared_by_hand_and_a_pair_without_its_embedded_weights_are_refused():
    refused("stages is derived from the tableau, not declared", A=RK4.A, b=RK4.b, c=RK4.c, order=4, stages=4)
    with pytest.raises(TableauError, match="an embedded pair declares e = b - b_hat"):
        type("Planted", (EmbeddedRK,), {"name": "planted", "A": Heun.A, "b": Heun.b, "c": Heun.c, "order": 2,
                                        "error_order": 1})
    assert "planted" not in STEPPERS


def test_a_pair_without_first_same_as_last_takes_the_same_steps():
    """``fsal`` is what the step does, not a label: Heun-Euler without its last stage (b and e over two stages, fsal
    False) takes the same steps as ``heun_euler`` bit for bit, and its ``stages`` is 2 either way."""
    class NoReuse(EmbeddedRK):  # no name: not registered
        A, b, c, e = ((), (1.0,)), (0.5, 0.5), (0.0, 1.0), (-0.5, 0.5)
        order, error_order = 2, 1

    assert NoReuse.stages == HeunEuler.stages == 2 and not NoReuse.fsal
    cfg, problem = build()
    cfg = cfg.replace(solver={"method": "heun_euler", "dt": 0.1, "rtol": 1e-5, "atol": 1e-8})
    reusing = make_stepper(problem, cfg)
    plain = NoReuse(problem, 0.1, controller=reusing.controller)
    a = b = reusing.initial_state()
    for _ in range(8):
        a, columns_a = reusing.step(a, 1.0)
        b, columns_b = plain.step(b, 1.0)
        assert np.array_equal(a.fields["omega"], b.fields["omega"]) and a.dt == b.dt and columns_a == columns_b
        assert a.dissipation_integral == b.dissipation_integral
