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
PL_TOL = 0.05   # the PL ratio within this relative distance of the predicted lambda_min: the slowest mode dominates
# what the spectral test (:func:`spectral_test`) calls the measured local exponent at a claimed minimum
APPROACHING, PRE_ASYMPTOTIC, OFF_REGIME = "approaching", "pre-asymptotic", "not in the linear regime"


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


@dataclass(frozen=True)
class SpectralTest:
    """What the measured PL ratio says of the window at a claimed nondegenerate minimum (:func:`spectral_test`):
    ``state`` APPROACHING, PRE_ASYMPTOTIC or OFF_REGIME ("" when nothing is predicted or measured) and ``text``, one
    line with the ratios it rests on."""
    state: str
    text: str


def spectral_test(mu_last: float, mu_min: float, lambda_min: float) -> SpectralTest:
    """The theory's own test of the window at a nondegenerate minimum with lowest eigenvalue ``lambda_min`` of S:
    near it ``mu = I / (2 (E - E*)) >= lambda_min`` and ``mu -> lambda_min`` along the slowest mode, while the local
    exponent tends to 1/2. With the PL ratio ``mu_last`` at the window's end and its least ``mu_min`` over the window:

    - ``mu_min < (1 - PL_TOL) lambda_min``: OFF_REGIME (the bound fails: the window is not in the linear regime of
      this point, or E* is not this flow's limit);
    - ``mu_last > (1 + PL_TOL) lambda_min``: PRE_ASYMPTOTIC (the slowest mode does not dominate yet, whatever the
      local exponent's drift);
    - otherwise APPROACHING (the slowest mode dominates: the local exponent approaches 1/2).

    A fixed tolerance on the local exponent's drift decides none of these: near a minimum the exponent drifts slowly
    however far mu is from its limit."""
    if not (math.isfinite(mu_last) and math.isfinite(mu_min) and math.isfinite(lambda_min) and lambda_min > 0):
        return SpectralTest("", "")
    if mu_min < (1.0 - PL_TOL) * lambda_min:
        return SpectralTest(OFF_REGIME, f"{OFF_REGIME} of this point: mu falls to {mu_min / lambda_min:.3g} x "
                                        "lambda_min, below the bound (or E* is not this flow's limit)")
    ratio = mu_last / lambda_min
    if ratio - 1.0 > PL_TOL:
        return SpectralTest(PRE_ASYMPTOTIC, f"{PRE_ASYMPTOTIC}: mu is still {ratio:.3g} x lambda_min at the "
                                            f"window's end (more than {PL_TOL:g} above it), so the slowest mode does "
                                            "not dominate yet")
    return SpectralTest(APPROACHING, f"{APPROACHING} it: mu = {ratio:.3g} x lambda_min at the window's end (within "
                                     f"{PL_TOL:g}), the slowest mode dominates")


__all__ = ["KL_AT_MINIMUM", "PL_TOL", "APPROACHING", "PRE_ASYMPTOTIC", "OFF_REGIME", "PointPrediction",
           "SpectralTest", "prediction_at", "spectral_test", "stated_proof"]
