"""A fourth-order stabilized explicit particle stepper: ESERK4, Richardson extrapolation of damped first-order
Chebyshev sub-integrations, with error control and an optional deflation of the Jacobian's top eigenpairs.

The particle system ``y' = f(y)``, ``y = omega`` [N, k], ``f(y)_i = -grad Phi(omega_i; rho_N)`` (masses fixed,
docs/model.md) has a real spectrum (``S = M^{1/2} (-J) M^{-1/2}`` symmetric). The base method is the s-stage
first-order Chebyshev step (SERK1): it multiplies an eigencomponent ``z = tau lambda`` by
``P_s(z) = T_s(w0 + w1 z) / T_s(w0)``, ``w0 = 1 + eps / s^2``, ``w1 = T_s(w0) / T_s'(w0)``, with the strong damping
``eps = 2`` (:data:`DAMPING`): ``|P_s| <= 1 / T_s(w0) ~ 1 / cosh 2 = 0.27`` on ``[-beta(s), 0]``,
``beta(s) = (1 + w0) / w1 ~ 0.97 s^2``. One step of size h integrates with ``j`` sub-steps of ``h / j`` for
``j = 1..4``, the same s stages in each (the fewest with ``beta(s) >= 1.2 h rho``; ``f(y_n)`` shared), and
combines the four results ``Y_j`` with the weights ``(-1/6, 4, -27/2, 32/3)`` that cancel the ``h^2, h^3, h^4``
terms of a first-order method's local error (Martin-Vaquero & Kleefeld, ESERK4): order 4, ``10 s - 3`` gradient
evaluations a step (about ``10 sqrt(1.2 h rho / 0.97)``). The damping is what keeps the extrapolated polynomial
``R(z) = sum_j w_j P_s(z / j)^j`` within 1 on ``[-beta(s), 0]`` (``sum_j |w_j| = 28.3``; with RKC's damping 2/13
``|R|`` reaches 17 there); checked numerically in tests/methods/test_extrapolated.py. Error control by the
difference to the order-3 extrapolation ``(1/2, -4, 9/2)`` of ``Y_1..Y_3`` (``O(h^4)``) and the PI controller; the
spectral radius ``rho`` and its schedule, the Hermite quadrature of the dissipation and the checkpointed carry are
rkc's (:mod:`pdeflow.solvers.chebyshev`).

Deflation (``solver.deflate = m > 0``): the stiffness of a long particle run sits in a few outlying eigenvalues.
Each sub-integration of step ``tau`` then runs on the field ``(I - tau A)^{-1} f``, ``A = -M^{-1/2} V diag(lam) V^T
M^{1/2}`` from the m largest eigenpairs of S (ARPACK on difference products), solved exactly (a rank-m update): a
linearly implicit first-order method, so the extrapolation keeps order 4 whatever A is (a W-method; A is frozen
over the step). A deflated eigencomponent ``lambda`` sees ``z = -tau lambda / (1 + tau lambda)`` in ``(-1, 0)``; the
stages are sized by the largest eigenvalue of S outside span V (``rho`` on the projected operator, estimated on
rkc's schedule and after every rejected step). The pairs are recomputed at a cold start and when that value has grown
by :data:`PAIRS_DRIFT` since they were.
Details: docs/solvers.md, "Long runs at tight tolerances: eserk4".
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from pdeflow.core.problem import Problem
from pdeflow.core.system_jacobian import SystemJacobian, complement_projection, deflation_inverse

from .base import Carried, State
from .chebyshev import RADIUS_EVERY, RADIUS_START, RKC, RadiusPlan
from .controller import CONTROLLER_PARAMS
from .parameters import Param
from .step_size import StepSizeController

# the damping of the first-order Chebyshev polynomials: |P_s| <= 1 / T_s(w0) ~ 0.27 inside [-beta(s), 0], small
# enough that the extrapolation's weights (sum of moduli 28.3) keep |R| <= 1 there
DAMPING = 2.0
# the extrapolation of Y_j (j sub-steps of h / j) to order 4, and to order 3 from Y_1..Y_3 (the error estimate)
WEIGHTS = (-1.0 / 6.0, 4.0, -27.0 / 2.0, 32.0 / 3.0)
WEIGHTS_THIRD = (0.5, -4.0, 4.5)
# stages of one sub-integration at most; a longer step is cut to beta(MAX_STAGES) / (RADIUS_SAFETY rho)
MAX_STAGES = 500
DEFLATE = Param("deflate", int, 0, "largest eigenpairs of the Jacobian treated linearly implicitly, the stages "
                "chosen for the rest of the spectrum (0: none)", ge=0, le=1000)
ORDER = 4  # of the extrapolated y_{n+1}
ERROR_ORDER = 3  # of the order-3 extrapolation the estimate measures: O(h^4)
# deflation: the pairs are recomputed when the complement's top eigenvalue exceeds this factor times its value at
# their computation (they have drifted off the top of the spectrum)
PAIRS_DRIFT = 1.5
# the complement's top pair starts as rkc's radius does, and cold also when the warm start lies in span V
COMPLEMENT_START = dataclasses.replace(RADIUS_START, fall_back=True)

Field = Callable[[np.ndarray], np.ndarray]
# (r, tau) -> (I - tau A)^{-1} r: the deflated linearly implicit field of a sub-step tau (None: no deflation)
Precondition = Callable[[np.ndarray, float], np.ndarray]


@dataclass(frozen=True)
class Serk:
    """The s-stage damped first-order Chebyshev step: ``w0 = 1 + eps / s^2``, ``w1 = T_s(w0) / T_s'(w0)``, ``T``
    [s+1] the values ``T_j(w0)`` and the stability boundary ``beta = (1 + w0) / w1``."""
    s: int
    w0: float
    w1: float
    T: np.ndarray
    beta: float


@functools.cache
def serk(s: int) -> Serk:
    """The :class:`Serk` coefficients of ``s >= 1`` stages (three-term recurrences of T_j and T_j')."""
    w0 = 1.0 + DAMPING / s ** 2
    T, dT = np.zeros(s + 1), np.zeros(s + 1)
    T[0], T[1], dT[1] = 1.0, w0, 1.0
    for j in range(2, s + 1):
        T[j] = 2.0 * w0 * T[j - 1] - T[j - 2]
        dT[j] = 2.0 * T[j - 1] + 2.0 * w0 * dT[j - 1] - dT[j - 2]
    w1 = T[s] / dT[s]
    return Serk(s, w0, w1, T, (1.0 + w0) / w1)


def stages_for(x: float) -> int:
    """The fewest stages ``s >= 1`` with ``beta(s) >= x`` (``MAX_STAGES + 1`` when even MAX_STAGES is short)."""
    if x > serk(MAX_STAGES).beta:
        return MAX_STAGES + 1
    s = max(1, math.ceil(math.sqrt(max(x, 0.0) / 0.97)))
    while s > 1 and serk(s - 1).beta >= x:
        s -= 1
    while serk(s).beta < x:
        s += 1
    return s


def serk_substep(f: Field, y: np.ndarray, fy: np.ndarray, tau: float, s: int) -> np.ndarray:
    """One s-stage first-order Chebyshev step of size tau from ``y`` (``fy = f(y)``), s - 1 evaluations of f:
    ``Y_1 = y + (w1 / w0) tau f(y)``, ``Y_j = mu_j Y_{j-1} + nu_j Y_{j-2} + mu~_j tau f(Y_{j-1})`` with
    ``mu_j = 2 w0 T_{j-1} / T_j``, ``nu_j = -T_{j-2} / T_j``, ``mu~_j = 2 w1 T_{j-1} / T_j`` (the recurrence of
    ``T_j(w0 + w1 z) / T_j(w0)``); returns ``Y_s``."""
    c = serk(s)
    previous, current = y, y + (c.w1 / c.w0 * tau) * fy
    for j in range(2, s + 1):
        ratio = c.T[j - 1] / c.T[j]
        nxt = ((2.0 * c.w0 * ratio) * current - (c.T[j - 2] / c.T[j]) * previous
               + (2.0 * c.w1 * ratio * tau) * f(current))
        previous, current = current, nxt
    return current


def eserk4_step(f: Field, y: np.ndarray, fy: np.ndarray, h: float, s: int,
                precondition: Precondition | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(y4, y3)``: the order-4 extrapolation :data:`WEIGHTS` of the four sub-integrations (j sub-steps of
    ``h / j``, s stages each, from ``y``, ``fy = f(y)``) and the order-3 one of the first three
    (:data:`WEIGHTS_THIRD`). ``precondition`` (deflation): each sub-step tau runs on ``(I - tau A)^{-1} f``.
    :func:`evaluations` of f (f(y) is shared). The same s in every sub-integration: the extrapolation cancels the
    error terms of one method, and P_s's own (``P_s(z) = 1 + z + c_s z^2 + ...``) depend on s."""
    results = []
    for j in range(1, len(WEIGHTS) + 1):
        tau = h / j
        if precondition is None:
            g, gy = f, fy
        else:
            def g(x: np.ndarray, tau: float = tau) -> np.ndarray:
                return precondition(f(x), tau)
            gy = precondition(fy, tau)
        x = serk_substep(g, y, gy, tau, s)
        for _ in range(j - 1):
            x = serk_substep(g, x, g(x), tau, s)
        results.append(x)
    y4 = sum(w * r for w, r in zip(WEIGHTS, results))
    y3 = sum(w * r for w, r in zip(WEIGHTS_THIRD, results))
    return y4, y3


def evaluations(s: int) -> int:
    """New evaluations of f in one :func:`eserk4_step` of s stages (f(y) given): ``sum_j (j s - 1) = 10 s - 4``."""
    return sum(j * s - 1 for j in range(1, len(WEIGHTS) + 1))


@dataclass
class _Pairs:
    """The deflated eigenpairs ``lam`` [p] > 0, ``V`` [n, p] (orthonormal) of S and the complement's top eigenvalue
    ``rho`` when they were computed."""
    lam: np.ndarray
    V: np.ndarray
    rho: float


class ESERK4(RKC):
    """``solver.method = "eserk4"``: extrapolated stabilized explicit Runge-Kutta of order 4 (module docstring)."""
    name = "eserk4"
    summary = "ESERK4, extrapolated Chebyshev, order 4, stabilized explicit, error control, optional deflation"
    use_when = "long stiff particle runs at tight tolerances without linear solves or the `sundials` extra"
    order: ClassVar[int] = ORDER
    error_order: ClassVar[int] = ERROR_ORDER
    params = (*CONTROLLER_PARAMS, RADIUS_EVERY, DEFLATE)
    # rkc's carry and, with solver.deflate = m > 0, the pairs: ``lam`` [m at most], ``V`` [N k, m at most] and
    # ``rho_pairs``, the complement's top eigenvalue when they were computed (:class:`_Pairs`)
    carried = (*RKC.carried, Carried("lam", "values", count="deflate", when=lambda stepper: stepper.deflate > 0),
               # in Fortran order, as the live pairs (a column subset of ARPACK's vectors)
               Carried("V", "columns", count="deflate", like="lam", order="F",
                       when=lambda stepper: stepper.deflate > 0),
               Carried("rho_pairs", when=lambda stepper: stepper.deflate > 0))

    def __init__(self, problem: Problem, dt: float, *, controller: StepSizeController, radius_every: int,
                 deflate: int) -> None:
        """As :class:`~pdeflow.solvers.chebyshev.RKC`; ``deflate`` eigenpairs treated linearly implicitly (0:
        none) (``solver.*`` of the same names)."""
        super().__init__(problem, dt, controller=controller, radius_every=radius_every)
        self.deflate = int(deflate)

    # ---- the carry: rkc's, and the deflated pairs ---------------------------------------------------------------
    def _new_plan(self, state: State) -> RadiusPlan:
        """rkc's plan with the pairs the state's carry holds (none held: empty ones; no carry: None)."""
        plan = super()._new_plan(state)
        carry = state.carry
        if self.deflate and carry.get("rho_pairs") is not None:
            lam, V = carry["lam"], carry["V"]
            plan.pairs = _Pairs(np.zeros(0) if lam is None else lam,
                                np.zeros((state.fields["omega"].size, 0)) if V is None else V, carry["rho_pairs"])
        return plan

    # ---- the radius: of the whole spectrum, or of its complement to the deflated pairs ----------------------------
    def _radius(self, state: State, start: np.ndarray | None, plan: RadiusPlan) -> tuple[float, np.ndarray]:
        """Without deflation rkc's ``rho``. With it, the largest eigenvalue of S outside span V (the step's
        :class:`_Pairs`, ``plan.pairs``) and its Ritz vector; the pairs recomputed (ARPACK,
        :meth:`pdeflow.core.system_jacobian.SystemJacobian.top_eigenpairs`) at a cold start or when that value grew
        by :data:`PAIRS_DRIFT` since they were computed."""
        if not self.deflate:
            return super()._radius(state, start, plan)
        jacobian = self._jacobian(state)
        pairs = None if start is None else plan.pairs
        if pairs is not None:
            rho, vector = self._complement(jacobian, pairs.V, start)
            if rho <= PAIRS_DRIFT * pairs.rho:
                return rho, vector
        lam, V = jacobian.top_eigenpairs(min(self.deflate, jacobian.n - 2))
        keep = lam > 0
        rho, vector = self._complement(jacobian, V[:, keep], start)
        plan.pairs = _Pairs(lam[keep], V[:, keep], rho)
        return rho, vector

    @staticmethod
    def _complement(jacobian: SystemJacobian, V: np.ndarray, start: np.ndarray | None) -> tuple[float, np.ndarray]:
        """``(rho_c, x)``: the top Ritz pair of ``Pi S Pi`` (``Pi = I - V V^T``), warm from ``start`` or cold (a
        fixed random vector, also when ``start`` lies in span V: :data:`COMPLEMENT_START`); at least 0."""
        value, vector = jacobian.top_pair(start, COMPLEMENT_START, complement_projection(V))
        return max(value, 0.0), vector

    # ---- the step ------------------------------------------------------------------------------------------------
    def _stage_rule(self) -> tuple[Callable[[float], int], Callable[[int], float], int]:
        """ESERK4's stages (of each sub-integration): :func:`stages_for`, ``beta(s)`` of :func:`serk`,
        :data:`MAX_STAGES`."""
        return stages_for, lambda s: serk(s).beta, MAX_STAGES

    def _step_impl(self, state: State, h: float, plan: RadiusPlan, columns: dict[str, float]) -> tuple[State, float,
                                                                                                  float]:
        """An ESERK4 step with the fewest stable stages for ``h`` in each sub-integration, cut to
        ``beta(MAX_STAGES)`` when longer."""
        omega, mass = state.fields["omega"], state.fields["mass"]
        stages, h, margin = self._stages(h, plan.rho)
        precondition = None
        if self.deflate and plan.pairs is not None and plan.pairs.lam.size:
            lam, V = plan.pairs.lam, plan.pairs.V
            root = np.repeat(np.sqrt(mass), omega.shape[1])

            def precondition(r: np.ndarray, tau: float) -> np.ndarray:
                return deflation_inverse(r.ravel(), root, lam, V, tau).reshape(r.shape)
        fy = -self.evaluate(state).grad_phi
        y4, y3 = eserk4_step(lambda y: self._velocity(y, mass), omega, fy, h, stages, precondition)
        new = state.advanced({"omega": y4, "mass": mass}, h)
        columns.update(stages=float(stages), spectral_radius=plan.rho, stability_margin=margin)
        return new, h, self.error_norm(y4 - y3, omega, y4)

    def _accept_step(self, state: State, new: State, h: float, plan: RadiusPlan,
                     columns: dict[str, float]) -> dict[str, float]:
        """The new state's evaluation (the next step's first stage and the step's diagnostics), then rkc's
        Hermite quadrature and carry, and the pairs handed on."""
        self.evaluate(new)
        columns = super()._accept_step(state, new, h, plan, columns)
        if plan.pairs is not None:
            new.carry.update(lam=plan.pairs.lam, V=plan.pairs.V, rho_pairs=plan.pairs.rho)
        return columns

    def likely_cause(self, state: State) -> str:
        return (f"the eserk4 stepper's tolerances (solver.rtol = {self.rtol:g}, solver.atol = {self.atol:g}) are "
                f"too loose for this problem, or solver.radius_every = {self.radius_every} lets the spectral "
                f"radius grow too far between estimates; tighten them")


__all__ = ["DAMPING", "ESERK4", "MAX_STAGES", "ORDER", "WEIGHTS", "WEIGHTS_THIRD", "Serk", "eserk4_step",
           "evaluations", "serk", "serk_substep", "stages_for"]
