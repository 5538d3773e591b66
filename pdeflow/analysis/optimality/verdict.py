"""The one rule on optimality: is ``rho`` a global minimiser of E over measures on Omega, from its gap
``G = int Phi d rho - min_Omega Phi``?

A search for ``min Phi`` gives two numbers (:class:`pdeflow.analysis.optimality.gap.GapResult`): the gap ``found``,
``int Phi d rho - Phi(w)`` at the least point ``w`` found in Omega, a lower bound on the true G (Phi is attained
there), and, where ``min Phi`` was certified, the certified upper bound ``bound = int Phi d rho - min_Phi_lower``.
The true gap lies in ``[found, bound]``. So:

- ``found > tol`` proves "no": Phi lies ``found`` below its mean on rho at ``w``, a witness that the support
  condition fails (whatever was not searched);
- ``bound <= tol`` proves "yes": every G compatible with the certificate is within ``tol``;
- anything else is "not established": no certificate, or one whose upper bound lies above ``tol`` however small the
  gap found (a found G of 8e-9 beside a certified bound of 3.2e-6 proves nothing at ``tol = 1e-6``).

``pdeflow stability``'s ``global_minimizer`` of a Dirac (:mod:`pdeflow.analysis.dirac.stability`) and the Optimality
section of ``pdeflow report`` (:mod:`pdeflow.analysis.report.sections`) both state :func:`gap_verdict`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

YES, NO, NOT_ESTABLISHED = "yes", "no", "not established"
# the report's threshold on G for "the last frame is optimal" (stability's is stability.gap_tol, a config key)
REPORT_GAP_TOL = 1e-6


def _g(x: float) -> str:
    return f"{x:.4g}"


@dataclass(frozen=True)
class GapVerdict:
    """``answer`` (YES, NO or NOT_ESTABLISHED) and ``reason``: one line quoting the number the answer rests on
    (the certified upper bound for YES and for a certificate too loose to decide, the gap found for NO)."""
    answer: str
    reason: str


def gap_verdict(found: float, bound: float, tol: float) -> GapVerdict:
    """The verdict on optimality from the gap ``found`` (a lower bound on G, nan when not computed), the certified
    upper ``bound`` on G (nan when ``min Phi`` was not certified) and the threshold ``tol`` > 0 (see the module)."""
    if math.isfinite(found) and found > tol:
        certified = f", certified G ≤ {_g(bound)}" if math.isfinite(bound) else ""
        return GapVerdict(NO, f"G ≥ {_g(found)} > {tol:g} (Φ found that far below its mean on ρ, a witness"
                              f"{certified}): not optimal on Ω")
    if math.isfinite(bound) and bound <= tol:
        return GapVerdict(YES, f"certified G ≤ {_g(bound)} ≤ {tol:g} (found G = {_g(found)}): optimal on Ω")
    if math.isfinite(bound):
        return GapVerdict(NOT_ESTABLISHED, f"certified G ≤ {_g(bound)}, above {tol:g} (found G = {_g(found)}): "
                                           "the certificate is too loose to decide")
    if math.isfinite(found):
        return GapVerdict(NOT_ESTABLISHED, f"G ≈ {_g(found)} is an estimate (a lower bound from a non-exhaustive "
                                           "search, no certified upper bound)")
    return GapVerdict(NOT_ESTABLISHED, "the gap was not computed")


__all__ = ["YES", "NO", "NOT_ESTABLISHED", "REPORT_GAP_TOL", "GapVerdict", "gap_verdict"]
