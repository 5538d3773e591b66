"""The ``[solver]`` section of a config: ``method``, ``dt`` and every key a stepper class declares it reads
(``params`` of :class:`pdeflow.solvers.base.Stepper`), a key several methods read with what it means to each.

GENERATED from the registry of steppers by ``python -m pdeflow.solvers.table --write``
(:mod:`pdeflow.solvers.parameters`); ``--check`` (tests/methods/test_which_solver.py) fails while this file
differs from the declarations. Do not edit it: edit the declaration on the stepper class and regenerate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .keys import spec


@dataclass(frozen=True)
class SolverConfig:
    method: str = spec("rk4", "time stepper (the methods, and the keys below each reads: pdeflow config)")
    dt: float = spec(0.01, "time step (initial step for adaptive methods)", gt=0)
    rtol: float = spec(1e-06, "relative tolerance", gt=0)
    atol: float = spec(1e-09, "absolute tolerance", gt=0)
    dt_min: float = spec(1e-10, "smallest allowed step", gt=0)
    dt_max: float = spec(math.inf, "largest allowed step", gt=0)
    max_growth: float = spec(5.0, "largest step growth factor per step", gt=1)
    radius_every: int = spec(
        25,
        "the most steps between estimates of the Jacobian's spectral radius (fewer while it grows; and after "
        "every rejected step)",
        ge=1)
    jacobian: str = spec(
        "exact",
        "Jacobian-vector products in forward mode (exact) or by a forward difference of grad Phi (one real "
        "evaluation; the W-method keeps its order); cvode only: 'cvode', CVODE's own difference quotients on "
        "its right-hand side",
        choices=("exact", "difference", "cvode"))
    deflate: int = spec(
        0,
        "cvode: largest eigenpairs of the Jacobian in the preconditioner of CVODE's GMRES solves (0: none); "
        "eserk4: largest eigenpairs of the Jacobian treated linearly implicitly, the stages chosen for the "
        "rest of the spectrum (0: none); rosenbrock: largest eigenpairs of the Jacobian removed from the "
        "stage solves by a preconditioner, carried from step to step (0: none)",
        ge=0, le=1000)
    preconditioner: str = spec(
        "deflation",
        "cvode's GMRES preconditioner: 'deflation' (the solver.deflate top eigenpairs; 0: none) or 'heads' "
        "(the per-head blocks of the Jacobian)",
        choices=("deflation", "heads"))
    alpha: float = spec(1.0, "transport speed alpha in d omega/dt = -alpha grad Phi", ge=0)
    gamma: float = spec(0.0, "Fisher-Rao rate gamma in d m/dt = -gamma m (Phi - <Phi>) (0: Wasserstein flow)", ge=0)
    total_mass: str = spec(
        "fixed",
        "'fixed' (d m/dt = -gamma m (Phi - <Phi>), probability measures) or 'free' (d m/dt = -gamma m Phi, "
        "the unbalanced/conic flow)",
        choices=("fixed", "free"))
    mass_floor: float = spec(
        1e-12,
        "a particle whose mass falls below this fraction of the total is removed (mass set to 0, counted in "
        "/steps/removed)",
        ge=0, le=0.001)
    cfl: float = spec(0.4, "CFL number", gt=0, le=1)
    scheme: str = spec("muscl", "flux scheme", choices=("upwind", "muscl"))
    limiter: str = spec("minmod", "slope limiter", choices=("minmod", "vanleer"))
    tau: float = spec(0.0, "proximal time step (0: solver.dt)", ge=0)
    epsilon: float = spec(
        0.0,
        "jko: entropic regularization eps (0: h^2, h the smallest cell width - the smallest eps whose blur "
        "resolves the grid; below it sub-cell motion is pinned); adds diffusion eps/(4 tau), printed by "
        "pdeflow info (raise solver.tau or grid.n to shrink it); wfr_jko: entropic regularization eps of the "
        "plan, kernel width sqrt(2 eps alpha / gamma) (0: h^2 gamma / (2 alpha), a kernel one cell wide)",
        ge=0)
    inner_tol: float = spec(
        1e-10,
        "jko: tolerance of the inner solve (particles: Euler-Lagrange residual in velocity units; grid: L1 "
        "marginal violation and linearization change); wfr_jko: tolerance of the linearization: L1 change of "
        "the masses between linearizations, over the mass",
        gt=0)
    inner_maxiter: int = spec(
        500,
        "iteration limit of the inner solve (particles: L-BFGS-B and Newton; grid: Newton per linearization)",
        ge=1)
    outer_maxiter: int = spec(50, "linearizations of the risk per step (fixed-point iteration)", ge=1)
    krylov_tol: float = spec(0.01, "stage-solve accuracy, as a fraction of the local error tolerance", gt=0, le=1)
    krylov_maxiter: int = spec(
        1000,
        "MINRES iterations per stage solve (more: a failed solve, the step is retried at a quarter of its "
        "size)",
        ge=1)
    deflate_every: int = spec(
        1,
        "steps between refinements of the deflated eigenpairs (warm-started LOBPCG from the previous ones, "
        "kept in the checkpoint; 1: every step)",
        ge=1)
    stage_solve: str = spec(
        "minres",
        "'minres' (MINRES with the current Jacobian) or 'auto' (needs solver.deflate: steps within the "
        "explicit bound of the rest of the spectrum take W = the Jacobian on the eigenpairs, no products)",
        choices=("minres", "auto"))
