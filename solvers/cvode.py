"""A particle stepper on SUNDIALS CVODE (variable-order BDF) through scikit-sundae: a reference at tight tolerances.

The particle system ``y' = f(y)``, ``y = omega`` [N, k] (flattened to [N k] for CVODE), ``f(y)_i = -grad Phi(omega_i;
rho_N)`` (masses fixed, docs/model.md). CVODE (Hindmarsh et al., ACM TOMS 2005) integrates it by BDF of orders 1 to 5
with its own error test and order selection; each step's implicit equations are solved by Newton's method with the
Newton matrix ``I - gamma J`` applied matrix-free by GMRES (SPGMR, :data:`KRYLOV_DIM` directions) on pdeflow's
Jacobian-vector product ``J v = -Problem.system_jvp(y, m, v)`` (exact forward mode; ``solver.jacobian = "difference"``:
a forward difference of grad Phi, :class:`pdeflow.core.system_jacobian.SystemJacobian`; ``"cvode"``: no product of
pdeflow's, CVODE's own difference quotients of the right-hand side, so SUNDIALS used plainly, each quotient a counted
gradient evaluation).

Preconditioner (``solver.deflate = m > 0``): ``J = -M^{-1/2} S M^{1/2}`` with ``S`` symmetric (``M = diag(m_i)``),
and the stiffness sits in a few outlying eigenvalues of ``S``. With its ``m`` largest eigenpairs ``(lam, V)``
(ARPACK, :func:`pdeflow.core.lanczos.top_eigenpairs`), ``P = M^{-1/2} (I + gamma V diag(lam) V^T) M^{1/2}``
approximates ``I - gamma J`` and ``P^-1 = M^{-1/2} (I + V diag(1 / (1 + gamma lam) - 1) V^T) M^{1/2}`` costs no
product. The pairs are computed when CVODE asks for a new preconditioner (its setup call with ``jok`` false: the
first step, after 50 steps without, after a convergence failure) and reused, with CVODE's current ``gamma``, in between.
``solver.preconditioner = "heads"``: ``P = diag_i(I + gamma H_i)`` with the per-head blocks ``H_i`` of the Hessian with
the measure frozen (:func:`pdeflow.core.hessian_assembly.frozen_blocks`, k forward-mode passes, each counted as an exact
product), eigen-decomposed at the same setups so that a new ``gamma`` costs nothing (:func:`block_inverse`).

One pdeflow step is one CVODE internal step (its one-step mode, with the next frame time as a hard stop, so frames
are landed on, never interpolated). Each step leaves the Hermite quadrature of the dissipation (``dI/dt`` at both
ends, one product at the new state, :func:`pdeflow.solvers.dissipation.hermite_dissipation`), so the energy-identity
defect shows the method's error. CVODE's own counters (order, Newton and GMRES iterations, error-test and
convergence failures), which scikit-sundae does not report, are read from the SUNDIALS library it ships (ctypes on
the solver's memory at a byte offset whose layout is checked first, :func:`layout_mismatch`: a SolverError when it
does not hold).

Resume restarts CVODE from the checkpointed state at order 1 (its step and order history are not in the
checkpoint): a resumed run agrees with the uninterrupted one to the tolerance, not bit for bit. Not sharded.
Details: docs/solvers.md, "Reference runs: cvode". Needs the optional extra ``pip install -e ".[sundials]"``.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import os
from typing import Any

import numpy as np

from pdeflow.core.config import Config, ConfigError
from pdeflow.core.hessian_assembly import frozen_blocks
from pdeflow.core.problem import Problem
from pdeflow.core.system_jacobian import SystemJacobian, deflation_inverse

from .base import SolverError, State, Stepper
from .controller import ATOL, DT_MAX, DT_MIN, RTOL
from .dissipation import JACOBIAN, hermite_dissipation, state_jacobian
from .parameters import Param

# GMRES directions per linear solve (CVODE's default 5 is too few once the spectrum spreads: a linear failure each
# time it is exceeded)
KRYLOV_DIM = 30
# the scikit-sundae release whose solver layout the counters below are read with (setup.cfg pins it)
TESTED_RELEASE = "1.2.0"
# scikit-sundae reports only right-hand-side and Jacobian evaluations: CVODE's other counters are read from the
# SUNDIALS library it ships, on the CVODE memory pointer its compiled solver object (``cdef class CVODE`` in
# sksundae/_cy_cvode.pyx) holds as its first field, after the object header (reference count, type) and the
# method table: ``void* mem`` at byte MEM_OFFSET, ``SUNContext ctx`` right after it, the object SOLVER_SIZE bytes
# in all (mem, ctx, 5 pointers, an index, 5 objects). The layout is checked before the pointer is used: the size,
# then the SUNContext that CVODE's memory keeps as its first member (SUNDIALS 7's CVodeMemRec) against ``ctx``, then
# CVODE's count of right-hand-side evaluations against scikit-sundae's; a mismatch is a SolverError, never a guess.
MEM_OFFSET = 24
SOLVER_SIZE = 128
# CVODE's cumulative counters (long int) of the /steps columns, by the SUNDIALS getter reading each
COUNTERS = {"steps": "CVodeGetNumSteps", "rhs": "CVodeGetNumRhsEvals", "nonlinear_iters": "CVodeGetNumNonlinSolvIters",
            "nonlinear_failures": "CVodeGetNumNonlinSolvConvFails", "linear_iters": "CVodeGetNumLinIters",
            "linear_failures": "CVodeGetNumLinConvFails", "rejected": "CVodeGetNumErrTestFails",
            "linear_rhs": "CVodeGetNumLinRhsEvals"}
INSTALL = 'pip install -e ".[sundials]"'


def sundials() -> Any:
    """The ``sksundae.cvode`` module; ConfigError (exit 2) naming the extra to install when it is missing."""
    try:
        import sksundae.cvode
    except ModuleNotFoundError:
        raise ConfigError(f"solver.method = 'cvode' needs scikit-sundae (SUNDIALS CVODE), not installed: "
                          f"{INSTALL}") from None
    return sksundae.cvode


class Counters:
    """CVODE's own cumulative counters of one solver (:data:`COUNTERS`) and the order of its last step, read from
    the SUNDIALS library scikit-sundae ships (it reports only right-hand-side and Jacobian evaluations) at the
    layout checked as :data:`MEM_OFFSET` says; SolverError naming the release when the check fails."""

    def __init__(self, solver: Any, nfev: int) -> None:
        import sksundae

        release = importlib.metadata.version("scikit-sundae")
        libs = os.path.join(os.path.dirname(os.path.dirname(sksundae.__file__)), "scikit_sundae.libs")
        found = glob.glob(os.path.join(libs, "libsundials_cvode*.so*"))
        inner = solver._CVODE__CVODE  # the compiled solver behind the Python class
        problem = layout_mismatch(inner, found, nfev)
        if problem:
            raise SolverError(f"cannot read CVODE's counters from scikit-sundae {release} (layout checked for "
                              f"{TESTED_RELEASE}): {problem}; install scikit-sundae=={TESTED_RELEASE}")
        self.lib = ctypes.CDLL(found[0])
        self.mem = ctypes.c_void_p(ctypes.c_void_p.from_address(id(inner) + MEM_OFFSET).value)

    def _long(self, getter: str) -> int:
        value = ctypes.c_long()
        if getattr(self.lib, getter)(self.mem, ctypes.byref(value)) != 0:
            raise SolverError(f"SUNDIALS {getter} failed")
        return value.value

    def read(self) -> dict[str, float]:
        """The counters now and ``order``, the BDF order of the last step."""
        out = {key: float(self._long(getter)) for key, getter in COUNTERS.items()}
        order = ctypes.c_int()
        self.lib.CVodeGetLastOrder(self.mem, ctypes.byref(order))
        out["order"] = float(order.value)
        return out


def layout_mismatch(inner: Any, libraries: list[str], nfev: int) -> str:
    """Why CVODE's memory cannot be read from scikit-sundae's compiled solver ``inner`` (:data:`MEM_OFFSET`), or ""
    when the layout checks out: the object's size, one SUNDIALS CVODE library in ``libraries``, a non-null memory
    pointer whose first member is the solver's SUNContext, and CVODE's right-hand-side count equal to ``nfev``
    (scikit-sundae's)."""
    if type(inner).__basicsize__ != SOLVER_SIZE:
        return f"its solver object has {type(inner).__basicsize__} bytes, not {SOLVER_SIZE}"
    if len(libraries) != 1:
        return f"{len(libraries)} SUNDIALS CVODE libraries found, not one"
    mem = ctypes.c_void_p.from_address(id(inner) + MEM_OFFSET).value
    context = ctypes.c_void_p.from_address(id(inner) + MEM_OFFSET + 8).value
    if not mem or not context:
        return "a null CVODE memory or SUNContext pointer"
    if ctypes.c_void_p.from_address(mem).value != context:
        return "the CVODE memory pointer does not lead to the solver's SUNContext"
    count = ctypes.c_long()
    status = ctypes.CDLL(libraries[0]).CVodeGetNumRhsEvals(ctypes.c_void_p(mem), ctypes.byref(count))
    if status != 0 or count.value != nfev:
        return f"CVODE counts {count.value} right-hand-side evaluations (status {status}), scikit-sundae {nfev}"
    return ""


def block_inverse(r: np.ndarray, values: np.ndarray, vectors: np.ndarray, gamma: float) -> np.ndarray:
    """``P^-1 r`` [N k] for the block-diagonal ``P = diag_i(I + gamma H_i)`` with ``H_i = Q_i diag(values_i) Q_i^T``
    (``values`` [N, k] >= 0, ``vectors`` [N, k, k]): ``Q_i diag(1 / (1 + gamma values_i)) Q_i^T r_i`` per head, no
    product; a new ``gamma`` needs no new factorisation."""
    n, k = values.shape
    c = np.einsum("nji,nj->ni", vectors, r.reshape(n, k)) / (1.0 + gamma * values)
    return np.einsum("nij,nj->ni", vectors, c).ravel()


class Integration:
    """One running CVODE solver, started at a state (:meth:`Cvode.start`), and what its callbacks need: the shape
    and masses of the measure, the preconditioner's data (the deflation pairs, or the per-head blocks) and the
    count of preconditioner setups of the current step. CVODE's memory advances with each step, so only the state
    it has reached (``step``, its step count) may continue it: it is that state's carry (``state.carry["cvode"]``),
    in memory only (a resumed run starts a new one)."""

    def __init__(self, stepper: Cvode, state: State) -> None:
        omega, mass = state.fields["omega"], state.fields["mass"]
        self.problem, self.kind, self.deflate = stepper.problem, stepper.kind, stepper.deflate
        self.shape, self.mass = omega.shape, mass
        self.root = np.repeat(np.sqrt(mass), omega.shape[1])
        self.pairs: tuple[np.ndarray, np.ndarray] | None = None
        self.blocks: tuple[np.ndarray, np.ndarray] | None = None
        self.setups = 0
        self.step = state.step
        module = stepper.module
        options: dict[str, Any] = {
            "method": "BDF", "linsolver": "gmres", "krylov_dim": KRYLOV_DIM, "rtol": stepper.rtol,
            "atol": stepper.atol, "first_step": stepper.dt if state.step == 0 else 0.0, "min_step": stepper.dt_min,
            "max_step": min(stepper.dt_max, np.finfo(float).max)}
        if stepper.jacobian != "cvode":
            options["jactimes"] = module.CVODEJacTimes(None, self._jtimes)
        if stepper.preconditioner == "heads":
            options["precond"] = module.CVODEPrecond(self._psetup_heads, self._psolve_heads)
        elif self.deflate > 0 and self.deflate < omega.size - 1:
            options["precond"] = module.CVODEPrecond(self._psetup, self._psolve)
        self.solver = module.CVODE(self._rhs, **options)
        result = self.solver.init_step(state.t, omega.ravel().copy())
        self.counters = Counters(self.solver, result.nfev)

    # ---- the callbacks CVODE calls (y, fy, v flat [N k], read-only) ------------------------------------------
    def _omega(self, y: np.ndarray) -> np.ndarray:
        return np.array(y, dtype=float).reshape(self.shape)

    def _rhs(self, t: float, y: np.ndarray, yp: np.ndarray) -> None:
        omega = self._omega(y)
        yp[:] = -self.problem.grad_phi(omega, omega, self.mass).ravel()

    def _jacobian_at(self, y: np.ndarray, fy: np.ndarray) -> SystemJacobian:
        """The system Jacobian at ``y`` (``fy = f(y)``; pdeflow's own products of ``solver.jacobian``'s kind)."""
        return SystemJacobian(self.problem, self._omega(y), self.mass, -self._omega(fy), self.kind)

    def _jtimes(self, t: float, y: np.ndarray, fy: np.ndarray, v: np.ndarray, Jv: np.ndarray) -> None:
        Jv[:] = -self._jacobian_at(y, fy).product(self._omega(v)).ravel()

    def _psetup(self, t: float, y: np.ndarray, fy: np.ndarray, jok: bool, jnew: list, gamma: float) -> None:
        if jok and self.pairs is not None:
            jnew[0] = 0
            return
        self.setups += 1
        lam, V = self._jacobian_at(y, fy).top_eigenpairs(self.deflate)
        keep = lam > 0  # P stays positive definite
        self.pairs = (lam[keep], V[:, keep])
        jnew[0] = 1

    def _psetup_heads(self, t: float, y: np.ndarray, fy: np.ndarray, jok: bool, jnew: list, gamma: float) -> None:
        """The per-head blocks ``H_i`` (:func:`pdeflow.core.hessian_assembly.frozen_blocks`: k forward-mode passes,
        counted by the Problem as k exact products) and their eigen-decompositions when CVODE asks for new Jacobian
        data; ``gamma`` enters only at the solve."""
        if jok and self.blocks is not None:
            jnew[0] = 0
            return
        self.setups += 1
        blocks = frozen_blocks(self.problem, self._omega(y), self.mass)
        values, vectors = np.linalg.eigh(0.5 * (blocks + blocks.transpose(0, 2, 1)))
        self.blocks = (np.maximum(values, 0.0), vectors)  # P stays positive definite
        jnew[0] = 1

    def _psolve_heads(self, t: float, y: np.ndarray, fy: np.ndarray, r: np.ndarray, z: np.ndarray, gamma: float,
                      delta: float, lr: int) -> None:
        z[:] = block_inverse(np.asarray(r), *self.blocks, gamma)

    def _psolve(self, t: float, y: np.ndarray, fy: np.ndarray, r: np.ndarray, z: np.ndarray, gamma: float,
                delta: float, lr: int) -> None:
        lam, V = self.pairs
        z[:] = deflation_inverse(np.asarray(r), self.root, lam, V, gamma)


class Cvode(Stepper):
    """``solver.method = "cvode"``: SUNDIALS CVODE, BDF with preconditioned matrix-free GMRES (module docstring)."""
    name = "cvode"
    summary = ("SUNDIALS CVODE: variable-order BDF, GMRES on Jacobian-vector products (pdeflow's or CVODE's own), "
               "optional preconditioners (extra `sundials`)")
    use_when = ("long stiff particle runs at any tolerance: with `solver.jacobian = \"cvode\"` the cheapest entry of "
                "the race to t = 40 and 200 (studies/race/MATCHED_ACCURACY.md); an independent reference at tight "
                "tolerances")
    sharded = False
    params = (RTOL, ATOL, DT_MIN, DT_MAX, JACOBIAN,
              Param("deflate", int, 0, "largest eigenpairs of the Jacobian in the preconditioner of CVODE's GMRES "
                    "solves (0: none)", ge=0, le=1000),
              Param("preconditioner", str, "deflation", "cvode's GMRES preconditioner: 'deflation' (the "
                    "solver.deflate top eigenpairs; 0: none) or 'heads' (the per-head blocks of the Jacobian)",
                    choices=("deflation", "heads")))
    step_columns = ("order", "rejected", "nonlinear_iters", "nonlinear_failures", "linear_iters", "linear_failures",
                    "jvps", "preconditioner_setups", "rhs_evals", "linear_rhs_evals")

    def __init__(self, problem: Problem, dt: float, *, rtol: float, atol: float, dt_min: float, dt_max: float,
                 jacobian: str, deflate: int, preconditioner: str = "deflation") -> None:
        """``dt`` the first step of a run from t = 0 (a restart lets CVODE choose its own); ``rtol``, ``atol``
        CVODE's tolerances; ``dt_min``, ``dt_max`` its step bounds; ``jacobian`` "exact" or "difference" products
        for GMRES, or "cvode": CVODE's own difference quotients on the right-hand side (no user product; pdeflow's
        own products, dI/dt's and the eigenpairs', are then differences); ``preconditioner`` "deflation" with
        ``deflate`` eigenpairs (0: none) or "heads", the per-head blocks (``solver.*`` of the same names)."""
        super().__init__(problem)
        self.module = sundials()
        self.dt, self.rtol, self.atol = float(dt), float(rtol), float(atol)
        self.dt_min, self.dt_max = float(dt_min), float(dt_max)
        self.jacobian, self.deflate, self.preconditioner = jacobian, int(deflate), preconditioner
        # the kind of pdeflow's own products (dI/dt, eigenpairs): CVODE's quotients are no product of pdeflow's
        self.kind = "difference" if jacobian == "cvode" else jacobian

    @classmethod
    def from_config(cls, problem: Problem, cfg: Config) -> Cvode:
        s = cfg.solver
        return cls(problem, s.dt, rtol=s.rtol, atol=s.atol, dt_min=s.dt_min, dt_max=s.dt_max, jacobian=s.jacobian,
                   deflate=s.deflate, preconditioner=s.preconditioner)

    @classmethod
    def check_keys(cls, cfg: Config) -> None:
        if cfg.solver.preconditioner == "heads" and cfg.solver.deflate > 0:
            raise ConfigError("solver.preconditioner = 'heads' takes no solver.deflate (the blocks alone)")

    # ---- stepping ------------------------------------------------------------------------------------------
    def start(self, state: State) -> Integration:
        """A new CVODE solver at the state (order 1; its first step ``dt`` from t = 0, else CVODE's estimate)."""
        if not np.all(state.fields["mass"] > 0):
            raise SolverError("solver.method = 'cvode' needs positive masses (its preconditioner is symmetrized "
                              "with sqrt(m_i)); use 'adaptive' for zero-mass tracers")
        return Integration(self, state)

    def step(self, state: State, dt_limit: float) -> tuple[State, dict[str, float]]:
        """One CVODE internal step from ``state``: continuing the solver of its carry when it has reached this state,
        else a new one started there."""
        mark = self.problem.mark()
        live = state.carry.get("cvode")
        if live is None or live.step != state.step:
            live = self.start(state)
            slope = state_jacobian(self, state, self.kind).slope()
        else:
            slope, live.setups = state.carry["slope"], 0
        target = state.t + dt_limit
        before = live.counters.read()
        result = live.solver.step(target, method="onestep", tstop=target)
        if not result.success:
            raise SolverError(f"CVODE stopped at t = {state.t:.6g}: {result.message} (flag {result.status}); "
                              f"loosen solver.rtol/atol or lower solver.dt_min")
        after = live.counters.read()
        h = float(result.t) - state.t
        new = state.advanced({"omega": np.array(result.y, dtype=float).reshape(live.shape),
                              "mass": state.fields["mass"]}, h)
        new.dt = h
        self.evaluate(new)  # the step's diagnostics (CVODE's last f is at a Newton iterate, not at y_{n+1})
        new.carry.update(cvode=live, slope=hermite_dissipation(self, state, new, h, slope, self.kind))
        live.step = new.step
        columns = {"order": after["order"], "jvps": float(self.problem.products_since(mark)),
                   "preconditioner_setups": float(live.setups)}
        for key in ("rejected", "nonlinear_iters", "nonlinear_failures", "linear_iters", "linear_failures"):
            columns[key] = after[key] - before[key]
        # CVODE's right-hand-side calls: its Newton iterations' and its difference quotients' (jacobian = "cvode")
        columns["rhs_evals"] = after["rhs"] - before["rhs"]
        columns["linear_rhs_evals"] = after["linear_rhs"] - before["linear_rhs"]
        return new, columns

    def likely_cause(self, state: State) -> str:
        return (f"the cvode stepper's tolerances (solver.rtol = {self.rtol:g}, solver.atol = {self.atol:g}) are "
                f"too loose for this problem; tighten them")
