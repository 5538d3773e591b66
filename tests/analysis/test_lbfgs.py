"""pdeflow.analysis.search.lbfgs: the two-loop recursion against the dense BFGS inverse-Hessian update it stands for,
and
the search against known minima (a quadratic, scipy's Rosenbrock function) and against scipy's L-BFGS-B."""
from __future__ import annotations

from collections import deque

import numpy as np
import scipy.optimize

from pdeflow.analysis.search.lbfgs import lbfgs, two_loop


def test_two_loop_equals_the_dense_bfgs_update():
    """H g by the two-loop recursion equals the dense matrix built by the BFGS update
    H <- (I - rho s y^T) H (I - rho y s^T) + rho s s^T from H_0 = (s^T y / y^T y) I of the newest pair."""
    rng = np.random.default_rng(0)
    n, m = 12, 5
    A = rng.standard_normal((n, n))
    A = A @ A.T + n * np.eye(n)
    pairs = deque()
    for _ in range(m):
        s = rng.standard_normal(n)
        y = A @ s
        pairs.append((s, y, 1.0 / (s @ y)))
    s, y, rho = pairs[-1]
    H = (s @ y) / (y @ y) * np.eye(n)
    for s, y, rho in pairs:
        V = np.eye(n) - rho * np.outer(y, s)
        H = V.T @ H @ V + rho * np.outer(s, s)
    g = rng.standard_normal(n)
    np.testing.assert_allclose(two_loop(g, pairs), H @ g, rtol=1e-12, atol=1e-12 * np.abs(H @ g).max())
    assert np.array_equal(two_loop(g, deque()), g)  # no pair: H_0 = I


def test_lbfgs_finds_the_minimum_of_a_quadratic_and_of_rosenbrock():
    """A quadratic with condition number 1e4 (n = 200): the minimum value to rounding (the search ends when the
    line search can no longer see f decrease), the point to the accuracy that allows (|x - x*| ~ sqrt(f's rounding
    x cond)); the 100-dimensional Rosenbrock function: its minimiser; the callback sees every iterate, and a
    StopIteration from it ends the search there."""
    rng = np.random.default_rng(1)
    n = 200
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    A = (Q * np.logspace(0, 4, n)) @ Q.T
    b = rng.standard_normal(n)
    seen = []
    r = lbfgs(lambda x: (0.5 * x @ A @ x - b @ x, A @ x - b), np.zeros(n), memory=20, max_iter=5000,
              callback=lambda x: seen.append(x.copy()))
    exact = np.linalg.solve(A, b)
    f_star = -0.5 * b @ exact
    assert r.fun - f_star <= 1e-12 * abs(f_star) and np.linalg.norm(r.x - exact) <= 1e-5 * np.linalg.norm(exact)
    assert len(seen) == r.nit and np.array_equal(seen[-1], r.x) and r.nfev >= r.nit
    assert r.stalled  # ended by f's rounding, not by max_iter

    x0 = np.tile([-1.2, 1.0], 50)
    rosen = lbfgs(lambda x: (scipy.optimize.rosen(x), scipy.optimize.rosen_der(x)), x0, memory=10, max_iter=5000)
    assert np.abs(rosen.x - 1.0).max() <= 1e-8 and rosen.fun <= 1e-20

    def stop_at_ten(x, count=[0]):
        count[0] += 1
        if count[0] == 10:
            raise StopIteration

    short = lbfgs(lambda x: (scipy.optimize.rosen(x), scipy.optimize.rosen_der(x)), x0, callback=stop_at_ten)
    assert short.nit == 10 and short.message == "stopped by the callback"


def test_lbfgs_needs_no_more_gradients_than_scipy_lbfgsb():
    """The same method as scipy's L-BFGS-B without bounds: on Rosenbrock (n = 100, 10 pairs) it reaches the
    minimum with at most 1.25 times scipy's gradient evaluations (measured: 592 against 652)."""
    x0 = np.tile([-1.2, 1.0], 50)
    ours = lbfgs(lambda x: (scipy.optimize.rosen(x), scipy.optimize.rosen_der(x)), x0, memory=10, max_iter=5000)
    ref = scipy.optimize.minimize(scipy.optimize.rosen, x0, jac=scipy.optimize.rosen_der, method="L-BFGS-B",
                                  options={"maxcor": 10, "maxiter": 5000, "gtol": 1e-12, "ftol": 0.0})
    assert np.abs(ref.x - 1.0).max() <= 1e-6
    assert ours.nfev <= 1.25 * ref.nfev
