"""What a trajectory says about the theory: energy identity, optimality gap, PL / KL rates, head structure.

The quantities of docs/model.md ("Dissipation and the energy identity" to "Convergence rates: PL and KL"), one module
per concern, the public names imported here (``pdeflow.analysis.diagnostics.X``):
:mod:`~pdeflow.analysis.convergence.rates`, :mod:`~pdeflow.analysis.convergence.predictions`,
:mod:`~pdeflow.analysis.optimality.domain`, :mod:`~pdeflow.analysis.optimality.certify`,
:mod:`~pdeflow.analysis.optimality.gap`,
:mod:`~pdeflow.analysis.diagnostics.clusters`, :mod:`~pdeflow.analysis.diagnostics.analysis`,
:mod:`~pdeflow.analysis.diagnostics.analysis_file`. What each number means and when it is a bound or only an estimate:
docs/design.md, "Diagnostics".
"""
from __future__ import annotations

from ..convergence.predictions import PointPrediction, prediction_at
from ..convergence.rates import (
                    KLFit,
                    LocalExponent,
                    e_star_refusal,
                    energy_identity_residual,
                    fit_e_star,
                    fit_e_star_interval,
                    kl_exponent,
                    kl_fit,
                    local_exponent,
                    pl_constant,
                    trusted_excess,
)
from ..optimality.certify import certified_min_phi, grad_phi_bound, hess_phi_bound
from ..optimality.domain import Domain
from ..optimality.gap import GapResult, entropic_gap, minimize_phi, optimality_gap
from .analysis import (
    ENTROPY_MISSING,
    SUPPORT_MARGIN,
    Analysis,
    analyse,
    gap_frame_indices,
    gap_inputs,
    support_reach,
)
from .analysis_file import GAP_ON_REQUEST, analyse_run, check_editable, read_analysis, write_analysis
from .clusters import HeadClusters, attention_pattern, frame_measure, head_clusters, probe_sequence, trajectory_grid

__all__ = ["GapResult", "optimality_gap", "entropic_gap", "minimize_phi", "certified_min_phi", "grad_phi_bound",
           "hess_phi_bound", "trusted_excess", "fit_e_star_interval", "ENTROPY_MISSING", "Domain",
           "energy_identity_residual", "pl_constant",
           "kl_exponent", "kl_fit", "KLFit", "fit_e_star", "attention_pattern", "probe_sequence", "HeadClusters",
           "head_clusters", "frame_measure", "trajectory_grid", "Analysis", "analyse", "analyse_run", "write_analysis",
           "read_analysis", "check_editable", "gap_frame_indices", "LocalExponent", "local_exponent", "e_star_refusal",
           "PointPrediction", "prediction_at", "SUPPORT_MARGIN", "support_reach", "GAP_ON_REQUEST", "gap_inputs"]
