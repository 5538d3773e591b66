"""How far ``lambda_min`` can move between a certified point and the minimum it approximates.

A certificate (:mod:`pdeflow.analysis.certificate.certificate`) bounds ``lambda_min`` of S at the point it is given,
``v = M^(1/2) omega`` (mass-weighted, flat [N k]). A search stops there with ``I = |g|^2 > 0`` (``g = M^(1/2) grad
Phi``, the energy's gradient in v), off the minimum ``v*`` it approximates, and S at ``v*`` differs: on a 4-head
minimum of the quickstart problem the bracket at a point with ``I = 9e-14 I(0)`` was ``[0.00029141829, 0.00029141833]``
and the one at the point polished to ``I = 6e-29``, ``[0.00029142543, 0.00029142547]``, 2.4e-5 apart (relative) while
each is 1e-7 wide. To first order in the distance:

- **distance**: ``|v* - v| <= r = sqrt(I) / lambda`` with ``lambda`` the certificate's lower bound (Newton's step
  ``-S^-1 g``; ``g`` is orthogonal to the symmetry directions, on whose complement ``S >= lambda``), the nearest
  point of the minimum's symmetry orbit taken as ``v*``;
- **slope**: the lowest eigenvalue moves by ``q . (v* - v)`` with ``q = D^3 E[x, x, .] = d/dh S(v + h x) x``
  (Hellmann-Feynman; ``x`` its unit eigenvector, ``q`` projected off the symmetry directions), so by at most
  ``|q| r``.

Measured (:func:`drift_to_minimum`): ``q`` by a central difference of two exact JVPs (:data:`STEP`), then the change of
``x``'s Rayleigh quotient over the distance ``r`` along ``+-q / |q|``: ``w = max |x^T S(v +- r q / |q|) x - x^T S(v)
x|`` (three more JVPs; ``w`` holds ``|q| r`` and the curvature along that direction). The bracket about the minimum
is the certificate's widened by ``w``: ``[lower - w, upper + w]``. It is an **estimate**, not a proof: first order in
``r`` (its self-consistent form, ``S >= lambda - |q| r`` on the whole ball, would shrink ``lambda`` in ``r``), and
for a simple lowest eigenvalue (the origin block's copies at every dead head move together: their block is the
same). ``r`` is the worst case, ``g`` all along the slowest direction: on the quickstart case above ``w`` is 25 % of
lambda_min where the minimum's differs by 2.4e-5; the polish of ``pdeflow stability --stationary`` (Newton to the
rounding floor, ``I ~ 1e-29``) makes ``w`` negligible there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...core.problem import Problem
from ..hessian.spectrum import head_symmetries, hessian_operator

STEP = 1e-4     # the central difference of q: h = STEP x max(1, the largest head's |v_i|) along the unit x


@dataclass(frozen=True)
class MinimumDrift:
    """:func:`drift_to_minimum`: the ``distance`` bound ``r = sqrt(I) / lambda`` to the minimum (mass-weighted),
    the ``slope`` ``|q|`` of x's Rayleigh quotient and its unit ``direction`` [N k] (v-coordinates; empty when not
    computed), the measured ``change`` w of it over r (the bracket's widening), and the JVP ``products`` spent."""
    distance: float
    slope: float
    change: float
    products: int
    direction: np.ndarray = field(default_factory=lambda: np.zeros(0))


def drift_to_minimum(problem: Problem, omega: np.ndarray, mass: np.ndarray, lower: float,
                     vector: np.ndarray) -> MinimumDrift:
    """How far the lowest eigenvalue of S can move between ``omega`` [N, k] (masses ``mass`` [N]) and the minimum it
    approximates (module docstring), from the certificate's lower bound ``lower > 0`` and the unit eigenvector
    ``vector`` [N k] (v-coordinates) of its lowest value. Five exact JVPs and one gradient; none when ``I = 0``."""
    omega = np.asarray(omega, dtype=float)
    mass = np.asarray(mass, dtype=float)
    root = np.sqrt(mass)[:, None]
    g = (root * problem.grad_phi(omega, omega, mass)).ravel()
    distance = math.sqrt(float(g @ g)) / lower
    if distance == 0.0:
        return MinimumDrift(0.0, math.nan, 0.0, 0)
    x = np.asarray(vector, dtype=float).ravel()
    x = x / np.linalg.norm(x)
    none = np.zeros((omega.size, 0))
    mark = problem.mark()

    def S_at(dv: np.ndarray) -> np.ndarray:
        """``S(v + dv) x``: one exact JVP at the moved point (no projection)."""
        return hessian_operator(problem, omega + dv.reshape(omega.shape) / root, mass, none).matvec(x)

    h = STEP * max(1.0, float(np.max(np.linalg.norm(root * omega, axis=1))))
    q = head_symmetries(problem, omega).project((S_at(h * x) - S_at(-h * x)) / (2.0 * h))
    slope = float(np.linalg.norm(q))
    if slope == 0.0:
        return MinimumDrift(distance, 0.0, 0.0, problem.products_since(mark))
    theta = float(x @ S_at(np.zeros(omega.size)))
    step = distance * q / slope
    change = max(abs(float(x @ S_at(sign * step)) - theta) for sign in (1.0, -1.0))
    return MinimumDrift(distance, slope, change, problem.products_since(mark), q / slope)


__all__ = ["MinimumDrift", "STEP", "drift_to_minimum"]
