"""Limited-memory BFGS for large unconstrained problems: the two-loop recursion and scipy's strong-Wolfe line search.

The search direction is ``d = -H g`` with ``H`` the L-BFGS inverse-Hessian approximation from the ``m`` latest
pairs ``s_j = x_(j+1) - x_j``, ``y_j = g_(j+1) - g_j`` (Nocedal & Wright, *Numerical Optimization*, Algorithm 7.4):
``H_0 = (s^T y / y^T y) I`` from the latest pair, then one backward and one forward pass over the pairs, ``4 m n``
flops. The step length comes from :func:`scipy.optimize.line_search` (strong Wolfe conditions, ``c1 = 1e-4``,
``c2 = 0.9``), trying ``alpha = 1`` first. A pair with
``s^T y <= 1e-12 |s| |y|`` (no positive curvature seen) is not stored, so ``H`` stays positive definite and ``d``
a descent direction.

Why not ``scipy.optimize.minimize(method="L-BFGS-B")``, the same method: its compact-form implementation, made for
bound constraints, spends more per iteration than the two-loop recursion does without them, and on pdeflow's
problems that cost is not small beside a gradient. Measured with scipy 1.17.1 on n = 32,768 (the long run's 128
heads x 256 coordinates) in CPU time per iteration, one thread, AMD EPYC family 25 model 1: 10.5 ms with 30 pairs
and 21.5 ms with 100 for L-BFGS-B, 6.2 ms and 13.5 ms here; one gradient of that problem takes 21 ms of wall time
on two threads. The gradients needed are the same method's (tests/analysis/test_lbfgs.py compares them on Rosenbrock).
"""
from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.optimize

CURVATURE_TOL = 1e-12   # a pair is kept when s^T y > CURVATURE_TOL |s| |y|
WOLFE_C1 = 1e-4         # sufficient decrease
WOLFE_C2 = 0.9          # curvature condition (the usual value for quasi-Newton directions)
FLAT_STEPS = 10         # stalled: this many steps in a row each changing f by at most FLAT_ULPS roundings of f
FLAT_ULPS = 4.0


@dataclass
class LbfgsResult:
    """The last iterate ``x`` [n] with its value ``fun`` and gradient ``jac`` [n], the iterations taken, the
    function-and-gradient evaluations asked for, why the search stopped (``message``) and whether it ``stalled``
    (no line search found a lower f: f's rounding reached, or no descent left)."""
    x: np.ndarray
    fun: float
    jac: np.ndarray
    nit: int
    nfev: int
    message: str
    stalled: bool = False


def two_loop(g: np.ndarray, pairs: deque[tuple[np.ndarray, np.ndarray, float]],
             precondition: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """``H g`` [n] for the L-BFGS inverse Hessian of ``pairs`` (``(s, y, 1 / s^T y)``, oldest first) with
    ``H_0 = (s^T y / y^T y) I`` from the newest pair (the identity when there is none), or, given
    ``precondition`` (``P^-1`` applied to a vector [n], P symmetric positive definite), ``H_0 = gamma P^-1`` with
    ``gamma = s^T y / y^T P^-1 y`` (``P^-1`` alone when there is no pair): the same recursion in the metric of P
    (Nocedal & Wright, section 7.2, the choice of ``H_0``)."""
    q = np.array(g, dtype=float)
    alphas = []
    for s, y, rho in reversed(pairs):
        a = rho * float(s @ q)
        q -= a * y
        alphas.append(a)
    if precondition is not None:
        q = precondition(q)
        if pairs:
            s, y, rho = pairs[-1]
            q *= 1.0 / (rho * float(y @ precondition(y)))
    elif pairs:
        s, y, rho = pairs[-1]
        q *= 1.0 / (rho * float(y @ y))
    for (s, y, rho), a in zip(pairs, reversed(alphas)):
        b = rho * float(y @ q)
        q += (a - b) * s
    return q


def lbfgs(fun: Callable[[np.ndarray], tuple[float, np.ndarray]], x0: np.ndarray, *, memory: int = 30,
          max_iter: int = 1000, callback: Callable[[np.ndarray], None] | None = None,
          precondition: Callable[[np.ndarray], np.ndarray] | None = None) -> LbfgsResult:
    """Minimise ``fun(x) -> (f, grad f)`` from ``x0`` [n] by L-BFGS with ``memory`` pairs (module docstring), for at
    most ``max_iter`` iterations; ``precondition``: ``P^-1`` for ``H_0`` (:func:`two_loop`; the first step is then
    ``-P^-1 g``, unscaled). ``callback(x)`` is called with every accepted iterate and may raise
    ``StopIteration`` to end the search there. When the line search fails along an L-BFGS direction the memory is
    cleared and steepest descent is tried once; a second failure, or :data:`FLAT_STEPS` steps in a row that change
    f by no more than its rounding, end the search (at the last iterate, ``stalled``): near a minimum, once f's
    decrease along a step falls to its rounding, f alone can no longer guide the search."""
    calls = 0
    last: list = [None, math.nan, None]

    def evaluate(x: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal calls
        if last[0] is None or not np.array_equal(last[0], x):
            calls += 1
            f, g = fun(x)
            last[:] = [np.array(x, dtype=float), float(f), np.asarray(g, dtype=float)]
        return last[1], last[2]

    x = np.array(x0, dtype=float)
    f, g = evaluate(x)
    f_previous = None
    pairs: deque[tuple[np.ndarray, np.ndarray, float]] = deque(maxlen=max(1, int(memory)))
    message = f"{max_iter} iterations"
    it, stalled, flat = 0, False, 0
    while it < max_iter:
        if not np.all(np.isfinite(g)) or not math.isfinite(f):
            message = "a non-finite value or gradient"
            break
        d = -two_loop(g, pairs, precondition)
        if not pairs and precondition is None:
            d *= min(1.0, 1.0 / max(float(np.linalg.norm(g)), np.finfo(float).tiny))
        slope = float(g @ d)
        if not slope < 0.0:
            message, stalled = ("the gradient vanished" if not np.any(g) else "no descent direction"), True
            break
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # scipy's LineSearchWarning: a failure is handled below
            alpha = scipy.optimize.line_search(lambda z: evaluate(z)[0], lambda z: evaluate(z)[1], x, d, g, f,
                                               f_previous, c1=WOLFE_C1, c2=WOLFE_C2)[0]
        if alpha is None:
            if not pairs:
                message, stalled = "the line search failed along steepest descent", True
                break
            pairs.clear()  # the model misled: start it again from the gradient
            continue
        s = alpha * d
        x_new = x + s
        f_new, g_new = evaluate(x_new)
        y = g_new - g
        sy = float(s @ y)
        if sy > CURVATURE_TOL * float(np.linalg.norm(s)) * float(np.linalg.norm(y)):
            pairs.append((s, y, 1.0 / sy))
        flat = flat + 1 if abs(f_new - f) <= FLAT_ULPS * np.spacing(abs(f)) else 0
        f_previous, x, f, g = f, x_new, f_new, g_new
        it += 1
        if flat >= FLAT_STEPS:
            message, stalled = f"{FLAT_STEPS} steps in a row changed f by at most its rounding", True
            break
        if callback is not None:
            try:
                callback(x)
            except StopIteration:
                message = "stopped by the callback"
                break
    return LbfgsResult(x=x, fun=f, jac=g, nit=it, nfev=calls, message=message, stalled=stalled)


__all__ = ["LbfgsResult", "lbfgs", "two_loop"]
