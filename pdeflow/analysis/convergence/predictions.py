"""What the theory predicts for the rates near a stationary point read from a ``pdeflow stationary`` result.

At a nondegenerate local minimum (the lowest eigenvalue ``lambda_min`` of the mass-weighted Hessian S off the
symmetry directions positive) the flow is, to first order, ``dv/dt = -S v`` (docs/model.md, "Rates at a local
minimum"), so near it ``E - E* = (1/2) v^T S v`` and ``I = |S v|^2``: the Lojasiewicz exponent of E there is 1/2,
the PL ratio ``mu = I / (2 (E - E*)) = sum_j lambda_j^2 c_j^2 / sum_j lambda_j c_j^2`` is at least ``lambda_min``
and tends to it along the slowest mode, and the local exponent ``1 - (1/2) d ln I / d ln(E - E*)`` is at most 1/2
(Cauchy-Schwarz) and tends to it. These are claimed only where the result states a proof that the point is
such a minimum; at a degenerate, uncertified or unproven point none is claimed, and the reason says why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..certificate.certificate import PROOFS, stored_lambda_min

KL_AT_MINIMUM = 0.5   # the Lojasiewicz exponent of E at a nondegenerate local minimum


@dataclass(frozen=True)
class PointPrediction:
    """The theory's rates at a stationary point of energy ``energy``: ``theta`` (1/2) and ``mu`` (the limit and
    near-bound ``lambda_min`` of the PL ratio), nan when none is claimed; ``basis`` says on what they rest or why
    none is claimed (one line)."""
    energy: float
    theta: float
    mu: float
    basis: str

    @property
    def claimed(self) -> bool:
        return math.isfinite(self.theta)


def stated_proof(result: dict[str, Any]) -> str:
    """The proof a result states for its minimum verdict ("" when it states none): its ``certificate`` when that is
    one of those :mod:`pdeflow.analysis.certificate.certificate` proves a minimum with (:data:`PROOFS`: the dense
    eigenvalue bound
    or the Cholesky bound on S off the symmetry directions); a Lanczos-only verdict or a saddle's interlacing proves
    no minimum."""
    certificate = str(result.get("certificate", ""))
    return certificate if certificate in PROOFS else ""


def prediction_at(result: dict[str, Any]) -> PointPrediction:
    """The prediction at the point of a stationary result
    (:func:`pdeflow.analysis.stationary.stationary.read_stationary`'s
    dict): claimed only when the result is ``certified``, states a proof (:func:`stated_proof`) and its
    proven lower bound ``lambda_min_lower`` (or, without one, ``lambda_min`` less the residual of the lowest Ritz
    value) is positive (nondegenerate)."""
    energy = float(result["energy"])
    verdict = str(result.get("verdict", "?"))
    nan = math.nan
    if not bool(result.get("certified", False)):
        return PointPrediction(energy, nan, nan, f"none claimed: the point is no certified local minimum (its "
                                                 f"verdict: {verdict})")
    proof = stated_proof(result)
    if not proof:
        return PointPrediction(energy, nan, nan, "none claimed: the result does not state a proven certificate (its "
                                                 f"verdict {verdict!r} may rest on Ritz values alone, which bound "
                                                 "lambda_min from above, not below)")
    lam, stale = stored_lambda_min(result)
    residuals = np.asarray(result.get("lowest_residual", ()), dtype=float)
    r = float(residuals[0]) if residuals.size else 0.0
    lower = float(result.get("lambda_min_lower", lam - r))   # the certificate's proven lower bound
    source = (f" (the certificate's upper end: the file's lambda_min {float(result['lambda_min']):.4g} lies outside "
              "its bracket)") if stale else ""
    if not (math.isfinite(lam) and math.isfinite(lower) and lower > 0):
        return PointPrediction(energy, nan, nan, f"none claimed: a degenerate point (lambda_min = {lam:.4g} is not "
                                                 f"proven away from 0: its lower bound is {lower:.2g})")
    return PointPrediction(energy, KL_AT_MINIMUM, lam, f"nondegenerate local minimum, lambda_min = {lam:.6g}{source} "
                                                       f"(proven >= {lower:.6g}), certificate: {proof}")


__all__ = ["KL_AT_MINIMUM", "PointPrediction", "prediction_at", "stated_proof"]
