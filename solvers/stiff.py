"""A stiff particle stepper: the linearly implicit Rosenbrock-W method ROS34PW2 with error control.

The particle system ``y' = f(y)``, ``y = omega`` [N, k], ``f(y)_i = -grad Phi(omega_i; rho_N)`` (masses fixed,
docs/model.md): 4 stages, order 3 with an embedded order-2 error estimate, L-stable, a W-method (order 3 for any
matrix W in place of the Jacobian). Stage systems ``(1/(h g) I - W) U_i = r_i`` in the mass-weighted symmetric
form, by MINRES on whole-system Jacobian-vector products (``stage_solve = "minres"``) or, with carried deflation
eigenpairs, without products under the explicit bound of the rest of the spectrum (``"auto"``). PI step-size
control; Hermite quadrature of the dissipation for the energy-identity check; not sharded.
Details: docs/solvers.md, "Stiff particle runs: rosenbrock" and "The ROS34PW2 stepper in detail".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from scipy.sparse.linalg import LinearOperator, minres

from pdeflow.core.config import Config, ConfigError
from pdeflow.core.lanczos import StartPolicy
from pdeflow.core.problem import Problem
from pdeflow.core.system_jacobian import SystemJacobian, complement_projection

from .base import Carried, SolverError, State
from .controller import CONTROLLER_PARAMS, AdaptiveStepper, StageFailed
from .dissipation import JACOBIAN, hermite_dissipation, state_jacobian
from .parameters import Param
from .step_size import StepSizeController

# ROS34PW2 (Rang & Angermann 2005): alpha_ij, gamma_ij (i > j), the diagonal gamma, b and b_hat.
GAMMA = 0.435866521508459
ALPHA = np.array([[0.0, 0.0, 0.0, 0.0],
                  [0.87173304301691801, 0.0, 0.0, 0.0],
                  [0.84457060015369423, -0.11299064236484185, 0.0, 0.0],
                  [0.0, 0.0, 1.0, 0.0]])
GAMMA_TABLE = np.array([[GAMMA, 0.0, 0.0, 0.0],
                        [-0.87173304301691801, GAMMA, 0.0, 0.0],
                        [-0.90338057013044082, 0.054180672388095326, GAMMA, 0.0],
                        [0.24212380706095346, -1.2232505839045147, 0.54526025533510214, GAMMA]])
B = np.array([0.24212380706095346, -1.2232505839045147, 1.5452602553351020, 0.435866521508459])
B_HAT = np.array([0.37810903145819369, -0.096042292212423178, 0.5, 0.2179332607542295])
# the [solver] keys rosenbrock reads besides the controller's and solver.jacobian
KRYLOV_TOL = Param("krylov_tol", float, 0.01, "stage-solve accuracy, as a fraction of the local error tolerance", gt=0,
                   le=1)
KRYLOV_MAXITER = Param("krylov_maxiter", int, 1000, "MINRES iterations per stage solve (more: a failed solve, the "
                       "step is retried at a quarter of its size)", ge=1)
DEFLATE = Param("deflate", int, 0, "largest eigenpairs of the Jacobian removed from the stage solves by a "
                "preconditioner, carried from step to step (0: none)", ge=0, le=1000)
DEFLATE_EVERY = Param("deflate_every", int, 1, "steps between refinements of the deflated eigenpairs (warm-started "
                      "LOBPCG from the previous ones, kept in the checkpoint; 1: every step)", ge=1)
STAGE_SOLVE = Param("stage_solve", str, "minres", "'minres' (MINRES with the current Jacobian) or 'auto' (needs "
                    "solver.deflate: steps within the explicit bound of the rest of the spectrum take W = the "
                    "Jacobian on the eigenpairs, no products)", choices=("minres", "auto"))
ORDER = 3  # of y_{n+1}
ERROR_ORDER = 2  # of the embedded solution, so err ~ h^3

_GINV = np.linalg.inv(GAMMA_TABLE)
A_T = ALPHA @ _GINV                        # stage arguments in U
C_T = np.diag(1.0 / np.diag(GAMMA_TABLE)) - _GINV  # strictly lower triangular
M_T = B @ _GINV
E_T = (B - B_HAT) @ _GINV                  # y_{n+1} - y_hat_{n+1} = sum_i E_T[i] U_i


def stability_function(z: complex) -> complex:
    """``R(z)``: one step on ``y' = lambda y`` multiplies y by ``R(h lambda)``;
    ``R(z) = 1 + z b^T (I - z (alpha + Gamma))^-1 1``."""
    s = len(B)
    return complex(1.0 + z * B @ np.linalg.solve(np.eye(s) - z * (ALPHA + GAMMA_TABLE), np.ones(s)))


# relative residual below which a stage solve is not asked to go: rounding of the exact product, and the
# truncation error of the difference product (about sqrt(machine epsilon) relative)
FLOOR = {"exact": 1e-13, "difference": 1e-6}
# relative residual a stage solve always reaches, however loose solver.rtol/atol: a target at or above |b| would
# accept U = 0, a zero error estimate and a step that stands still
CEILING = 0.1


# LOBPCG iterations of a refinement of the carried eigenpairs (each costs m products, plus m for the start)
REFINE_ITERATIONS = 2


def explicit_stability_function(z: complex) -> complex:
    """The stability function of a step with ``W = 0`` (the explicit Runge-Kutta method ``(alpha, b)``):
    ``1 + z b^T (I - z alpha)^-1 1``, a cubic-accurate polynomial of degree 4."""
    s = len(B)
    return complex(1.0 + z * B @ np.linalg.solve(np.eye(s) - z * ALPHA, np.ones(s)))


# |R_explicit(-x)| <= 1 for 0 <= x <= EXPLICIT_BOUND (checked in tests/methods/test_stiff.py)
EXPLICIT_BOUND = 1.99
# a Krylov-free step keeps h rho_c below SAFETY * EXPLICIT_BOUND: rho_c is a Rayleigh-Ritz lower bound
SAFETY = 0.8
# products of a Krylov-free step: 3 new stages, the new state's gradient, dI/dt, and about 3 for rho_c
EXPLICIT_COST = 8.0
# the carried eigenpairs are refined at once when the complement's top exceeds DRIFT x the smallest of them
DRIFT = 2.0
# Krylov dimensions of the complement estimate: warm (each step) and cold (the first)
COMPLEMENT_KRYLOV = 3
COMPLEMENT_COLD = 12
COMPLEMENT_START = StartPolicy(warm=COMPLEMENT_KRYLOV, cold=COMPLEMENT_COLD, seed=1)
# largest ratio of the proposed step to a step cut to the explicit bound
CAPPED_GROWTH = 10.0
# what a MINRES step is assumed to cost before one has been measured
DEFAULT_MINRES_COST = 50.0


def _positive(eigen: tuple[np.ndarray, np.ndarray, int] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The pairs with ``lam > 0`` (the preconditioner and W stay positive definite), or None."""
    if eigen is None or not np.any(eigen[0] > 0):
        return None
    keep = eigen[0] > 0
    return eigen[0][keep], eigen[1][:, keep]


class _SolveFailed(StageFailed):
    """A stage system missed its tolerance within solver.krylov_maxiter iterations."""


@dataclass
class _Carry:
    """What an accepted step hands to the next in the state's carry (:attr:`Rosenbrock.carried`, checkpointed by the
    base): ``slope = dI/dt`` at the state, the carried eigenpairs ``lam`` [m], ``V`` [n, m] of ``S`` (None: none
    yet) and ``age``, the steps since they were computed or refined; ``top`` [n] the complement's top eigenvector
    (Krylov-free steps) and ``minres_cost`` the products of the last MINRES step. The PI controller's memory is
    the controller's (:meth:`~pdeflow.solvers.controller.AdaptiveStepper.previous_error`)."""
    slope: float
    lam: np.ndarray | None = None
    V: np.ndarray | None = None
    age: int = 0
    top: np.ndarray | None = None
    minres_cost: float = DEFAULT_MINRES_COST

    @classmethod
    def handed_on(cls, values: dict) -> _Carry | None:
        """The carry of the values handed on to a step (:attr:`pdeflow.core.state.State.carry`); None when dI/dt is
        not among them (the step starts afresh)."""
        if values.get("slope") is None:
            return None
        age = values.get("age")
        return cls(values["slope"], values.get("lam"), values.get("V"), 0 if age is None else age, values.get("top"),
                   values["minres_cost"])


@dataclass
class _Plan:
    """What a step decides before its attempts (:meth:`Rosenbrock._begin_step`): ``slope = dI/dt`` at its start,
    the eigenpairs ``eigen`` (lam, V, age) and their positive part ``pairs``, the longest Krylov-free step
    ``h_stable``, the complement's top vector ``top``, the products a MINRES step was measured to cost and
    ``mark``, the Problem's counts when the step began (what it costs is counted from there); and of the current
    attempt: ``krylov`` (MINRES stage solves) and its ``margin`` to the explicit bound."""
    slope: float
    eigen: tuple[np.ndarray, np.ndarray, int] | None
    pairs: tuple[np.ndarray, np.ndarray] | None
    h_stable: float
    top: np.ndarray | None
    minres_cost: float
    mark: dict[str, int]
    krylov: bool = True
    margin: float = math.nan


class Rosenbrock(AdaptiveStepper):
    """``solver.method = "rosenbrock"``: ROS34PW2 with MINRES stage solves (see the module docstring)."""
    name = "rosenbrock"
    summary = "Rosenbrock-W ROS34PW2, L-stable, order 3, error control, MINRES on Jacobian-vector products"
    use_when = "stiffness far beyond the motion's own time scales, where an L-stable method of order 3 is wanted"
    sharded = False
    order: ClassVar[int] = ORDER
    error_order: ClassVar[int] = ERROR_ORDER
    step_columns = ("rejected", "failed_solves", "krylov_iters", "jvps", "explicit_margin")
    stability_column = "explicit_margin"
    failure_fix = "raise solver.krylov_maxiter or solver.krylov_tol"
    params = (*CONTROLLER_PARAMS, JACOBIAN, KRYLOV_TOL, KRYLOV_MAXITER, DEFLATE, DEFLATE_EVERY, STAGE_SOLVE)

    # what an accepted step hands to the next besides the controller's memory (:class:`_Carry`): with solver.deflate
    # the eigenpairs and their age, with solver.stage_solve = "auto" the complement's top vector
    carried = (*AdaptiveStepper.carried, Carried("slope"), Carried("minres_cost"),
               Carried("lam", "values", count="deflate", when=lambda stepper: stepper.deflate > 0),
               Carried("V", "columns", count="deflate", like="lam", when=lambda stepper: stepper.deflate > 0),
               Carried("age", "int", when=lambda stepper: stepper.deflate > 0),
               Carried("top", "vector", when=lambda stepper: stepper.stage_solve == "auto"))

    def __init__(self, problem: Problem, dt: float, *, controller: StepSizeController, jacobian: str,
                 krylov_tol: float, krylov_maxiter: int, deflate: int, deflate_every: int, stage_solve: str) -> None:
        """``dt`` the first step; ``controller`` the run's step-size controller (as for ``adaptive``); ``jacobian``
        "exact" or "difference" products; the stage solves' ``krylov_tol`` and ``krylov_maxiter``; ``deflate``
        carried eigenpairs refined every ``deflate_every`` steps; ``stage_solve`` "minres" or "auto" (``solver.*``
        of the same names)."""
        super().__init__(problem, dt, controller=controller)
        self.jacobian, self.krylov_tol, self.krylov_maxiter = jacobian, float(krylov_tol), int(krylov_maxiter)
        self.deflate, self.deflate_every, self.stage_solve = int(deflate), int(deflate_every), stage_solve

    @classmethod
    def check_keys(cls, cfg: Config) -> None:
        if cfg.solver.jacobian == "cvode":
            raise ConfigError("solver.jacobian = 'cvode' (CVODE's own difference quotients) is cvode's alone: "
                              "use 'exact' or 'difference'")
        if cfg.solver.stage_solve == "auto" and cfg.solver.deflate == 0:
            raise ConfigError("solver.stage_solve = 'auto' needs solver.deflate > 0 (the eigenpairs W is made of)")

    def _velocity(self, omega: np.ndarray, mass: np.ndarray) -> np.ndarray:
        return self.problem.velocity(omega, mass)

    def _jacobian(self, state: State) -> SystemJacobian:
        """The system Jacobian at the state (``solver.jacobian``'s products)."""
        return state_jacobian(self, state, self.jacobian)

    def _solve(self, jacobian: SystemJacobian, root: np.ndarray, shift: float, rhs: np.ndarray, target: float,
               columns: dict[str, float], tighten: list[float],
               basis: list[tuple[np.ndarray, np.ndarray]], precond: LinearOperator | None = None) -> np.ndarray:
        """``U`` [N, k] with ``(shift I - J) U = rhs`` (``jacobian``: J at the state): true residual (in
        ``v = M^{1/2} U``) <= target; its MINRES iterations added to ``columns["krylov_iters"]``.

        The step's earlier solutions ``v_j`` and their images ``A v_j`` (``basis``, extended here) give the start
        ``v0 = V c``, ``c`` minimizing ``|b - (A V) c|``: the stage right-hand sides share the part ``f(y_n) + O(h)``,
        so later stages start from a smaller residual at no extra product.

        MINRES stops on a backward error ``|r| / (|A| |v| + |b|)``, which lets ``|r|`` exceed ``rtol |b|`` by up
        to ``1 + h g lambda_max``: a solve whose true residual misses the target restarts from its result
        with ``rtol`` tightened by the miss, and ``tighten[0]`` carries that factor to the step's later solves.
        """
        shape, n = rhs.shape, rhs.size

        def apply(v: np.ndarray) -> np.ndarray:
            # the shift inside the operator: scipy's minres(shift=) leaves it out of the residual of x0
            return shift * v + jacobian.apply(v)

        op = LinearOperator((n, n), matvec=apply, dtype=float)
        b = (root * rhs).ravel()
        norm_b = float(np.linalg.norm(b))
        if norm_b == 0.0:
            return np.zeros(shape)
        floor = FLOOR[self.jacobian]
        target = min(max(target, floor * norm_b), CEILING * norm_b)
        budget = self.krylov_maxiter
        # the start v0 = V c and its image (A V) c, known without a product: MINRES solves for the correction
        start, start_image, rest = np.zeros(n), np.zeros(n), b
        if basis:
            V = np.column_stack([p[0] for p in basis])
            AV = np.column_stack([p[1] for p in basis])
            c = np.linalg.lstsq(AV, b, rcond=None)[0]
            if float(np.linalg.norm(b - AV @ c)) < norm_b:
                start, start_image = V @ c, AV @ c
                rest = b - start_image
        norm_rest = float(np.linalg.norm(rest))
        if norm_rest <= target:
            basis.append((start, start_image))
            return start.reshape(shape) / root
        v, previous = None, np.inf
        while True:
            iterations = [0]
            rtol = max(min(0.1, target / norm_rest) / tighten[0], FLOOR["exact"])
            v, _ = minres(op, rest, x0=v, rtol=rtol, maxiter=budget, M=precond,
                          callback=lambda _: iterations.__setitem__(0, iterations[0] + 1))
            columns["krylov_iters"] += iterations[0]
            budget -= iterations[0]
            image = apply(v)
            residual = float(np.linalg.norm(rest - image))
            if residual <= target:
                basis.append((start + v, start_image + image))
                return (start + v).reshape(shape) / root
            # out of iterations, at MINRES's own floor, or a restart that no longer halves the residual
            if budget <= 0 or rtol <= FLOOR["exact"] or residual > 0.5 * previous:
                raise _SolveFailed(f"MINRES residual {residual:.3g} > {target:.3g} after "
                                   f"{self.krylov_maxiter - budget} iterations")
            tighten[0] *= 2.0 * residual / target
            previous = residual

    def _attempt(self, state: State, h: float, columns: dict[str, float],
                 pairs: tuple[np.ndarray, np.ndarray] | None = None,
                 krylov: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """One ROS34PW2 step of size h from ``state``: (y_{n+1}, error vector); ``pairs`` the deflated
        eigenpairs of ``S`` at ``y_n`` (:meth:`_eigenpairs`) or None. ``krylov`` False: the stage systems are
        solved with ``W = -M^{-1/2} V diag(lam) V^T M^{1/2}`` exactly (no product; module docstring, Krylov-free
        steps)."""
        s = self
        omega, mass = state.fields["omega"], state.fields["mass"]
        root = np.sqrt(mass)[:, None]
        shift = 1.0 / (h * GAMMA)
        weights = 1.0 / (s.atol + s.rtol * np.abs(omega))
        # solution error about krylov_tol in the error norm (module docstring)
        rms = float(np.sqrt(np.mean((weights / root) ** 2)))
        target = s.krylov_tol * math.sqrt(omega.size) / (h * GAMMA * rms)
        U: list[np.ndarray] = []
        jacobian = self._jacobian(state)
        precond = None
        if pairs is not None:
            lam, V = pairs

            def apply_inverse(x: np.ndarray) -> np.ndarray:
                # P^-1 = (I - V V^T) / shift + V diag(1 / (shift + lam)) V^T, P = shift I + V diag(lam) V^T
                return x / shift + V @ ((1.0 / (shift + lam) - 1.0 / shift) * (V.T @ x))

            precond = LinearOperator((omega.size, omega.size), matvec=apply_inverse, dtype=float)
        tighten = [1.0]
        basis: list[tuple[np.ndarray, np.ndarray]] = []
        for i in range(len(B)):
            if i == 0:
                f = -self.evaluate(state).grad_phi
            else:
                y = omega.copy()
                for j in range(i):
                    if A_T[i, j] != 0.0:
                        y += A_T[i, j] * U[j]
                f = self._velocity(y, mass)
            rhs = f.copy()
            for j in range(i):
                rhs += (C_T[i, j] / h) * U[j]
            if not krylov:
                b = (root * rhs).ravel()
                U.append((b / shift if precond is None else precond.matvec(b)).reshape(rhs.shape) / root)
                continue
            U.append(self._solve(jacobian, root, shift, rhs, target, columns, tighten, basis, precond))
        y_new, err = omega.copy(), np.zeros_like(omega)
        for i in range(len(B)):
            y_new += M_T[i] * U[i]
            err += E_T[i] * U[i]
        return y_new, err

    def _eigenpairs(self, state: State, carry: _Carry | None,
                    refine: bool = False) -> tuple[np.ndarray, np.ndarray, int] | None:
        """``(lam [m], V [n, m], age)``: approximate top eigenpairs of ``S = M^{1/2} (-J) M^{-1/2}`` for the step
        from ``state`` (module docstring, Deflation): the carried ones while younger than
        ``solver.deflate_every`` steps and ``refine`` is False, else refined by warm-started LOBPCG at the state;
        without carried
        pairs ARPACK's ``solver.deflate`` largest (relative tolerance 1e-2, a fixed start vector, so a function
        of the state alone). None when deflation is off."""
        m = self.deflate
        n = state.fields["omega"].size
        if m == 0 or m >= n - 1:
            return None
        if carry is not None and carry.V is not None and carry.age < self.deflate_every and not refine:
            return carry.lam, carry.V, carry.age
        jacobian = self._jacobian(state)
        if carry is not None and carry.V is not None and carry.V.shape[1] >= 1:
            lam, V = jacobian.refine_pairs(carry.V, REFINE_ITERATIONS, 1e-3 * carry.lam.max())
            return lam, V, 0
        lam, V = jacobian.top_eigenpairs(m)
        return lam, V, 0

    def _operator(self, state: State) -> LinearOperator:
        """``S = M^{1/2} (-J) M^{-1/2}`` at the state as products (blocks column by column)."""
        return self._jacobian(state).operator()

    def _complement_top(self, state: State, V: np.ndarray | None,
                        start: np.ndarray | None) -> tuple[float, np.ndarray]:
        """``(rho_c, x)``: the largest eigenvalue of ``S`` on the orthogonal complement of span V (0 if negative)
        and its Ritz vector: :meth:`pdeflow.core.system_jacobian.SystemJacobian.top_pair` of ``C = Pi S Pi``
        (``Pi = I - V V^T``, V orthonormal; C is zero on span V) with :data:`COMPLEMENT_KRYLOV` products from
        ``start`` (the previous step's vector) or :data:`COMPLEMENT_COLD` from a fixed random vector
        (:data:`COMPLEMENT_START`). A lower bound of the true value."""
        value, vector = self._jacobian(state).top_pair(start, COMPLEMENT_START, complement_projection(V))
        return max(value, 0.0), vector

    def _begin_step(self, state: State, columns: dict[str, float]) -> _Plan:
        """dI/dt, the deflation eigenpairs and, for ``stage_solve = "auto"``, the complement's top eigenvalue that
        bounds a Krylov-free step."""
        s = self
        if not np.all(state.fields["mass"] > 0):
            raise SolverError("solver.method = 'rosenbrock' needs positive masses (its stage systems are "
                              "symmetrized with sqrt(m_i)); use 'adaptive' for zero-mass tracers")
        columns.update(failed_solves=0.0, krylov_iters=0.0)
        # the first stage, f at the state, is the state's evaluation (the previous step's): a MINRES step's cost
        # (minres_cost) counts from after it
        self.evaluate(state)
        mark = self.problem.mark()
        carry = _Carry.handed_on(state.carry)
        slope = carry.slope if carry is not None else self._jacobian(state).slope()
        eigen = self._eigenpairs(state, carry)
        pairs = _positive(eigen)
        h_stable, top = math.inf, None
        minres_cost = carry.minres_cost if carry is not None else DEFAULT_MINRES_COST
        if s.stage_solve == "auto" and eigen is not None:
            rho, top = self._complement_top(state, None if pairs is None else pairs[1],
                                            carry.top if carry is not None else None)
            if eigen[2] > 0 and pairs is not None and rho > DRIFT * pairs[0].min():
                # V has drifted off the top of the spectrum (an eigenvalue well above its smallest outside it):
                # refine it now. Not at rho just above lam_min: on a continuous spectrum the complement's top is
                # about the m-th eigenvalue, and refining would not move it
                eigen = self._eigenpairs(state, carry, refine=True)
                pairs = _positive(eigen)
                rho, top = self._complement_top(state, None if pairs is None else pairs[1], top)
            h_stable = SAFETY * EXPLICIT_BOUND / rho if rho > 0 else math.inf
        return _Plan(slope, eigen, pairs, h_stable, top, minres_cost, mark)

    def _step_impl(self, state: State, h: float, plan: _Plan, columns: dict[str, float]) -> tuple[State, float,
                                                                                                float]:
        """A ROS34PW2 step: Krylov-free (cut to the explicit bound) when that costs less per unit time, else with
        MINRES stage solves (:class:`_SolveFailed`, a :class:`~pdeflow.solvers.controller.StageFailed`, when one
        misses its tolerance)."""
        # Krylov-free when the step fits the explicit bound, or when capping it there costs less per unit time
        plan.krylov = plan.top is None or not (h <= plan.h_stable
                                               or plan.h_stable / EXPLICIT_COST >= h / plan.minres_cost)
        plan.margin = math.nan
        if not plan.krylov:
            h = min(h, plan.h_stable)
            plan.margin = SAFETY * h / plan.h_stable if math.isfinite(plan.h_stable) else 0.0
        omega = state.fields["omega"]
        y_new, err_vec = self._attempt(state, h, columns, plan.pairs, plan.krylov)
        new = state.advanced({"omega": y_new, "mass": state.fields["mass"]}, h)
        return new, h, self.error_norm(err_vec, omega, y_new)

    def _proposal(self, dt: float, h: float, h_taken: float, err: float, factor: float) -> float:
        """A step cut to the explicit bound: the error of the short step says how long an accurate step could be
        (err ~ h^3), the choice against a MINRES step of that size needs it (growth up to CAPPED_GROWTH)."""
        if h_taken < h:
            return max(dt, h_taken * self.controller.factor(err, math.nan, self.exponent, CAPPED_GROWTH))
        return super()._proposal(dt, h, h_taken, err, factor)

    def _accept_step(self, state: State, new: State, h: float, plan: _Plan,
                     columns: dict[str, float]) -> dict[str, float]:
        """The new state's evaluation (the next step's first stage), the Hermite quadrature and the carry."""
        self.evaluate(new)  # the next step's first stage and the step's diagnostics
        new_slope = hermite_dissipation(self, state, new, h, plan.slope, self.jacobian)
        # the step's gradients and products, all attempts', as the Problem counted them since the step began
        minres_cost = float(sum(self.problem.since(plan.mark).values())) if plan.krylov else plan.minres_cost
        lam, V, age = (plan.eigen[0], plan.eigen[1], plan.eigen[2] + 1) if plan.eigen is not None else (None, None, 0)
        new.carry.update(slope=new_slope, minres_cost=minres_cost, lam=lam, V=V, age=age, top=plan.top)
        columns["explicit_margin"] = plan.margin
        return columns

    def likely_cause(self, state: State) -> str:
        return (f"the rosenbrock stepper's tolerances (solver.rtol = {self.rtol:g}, "
                f"solver.atol = {self.atol:g}) are too loose for this problem; tighten them")
