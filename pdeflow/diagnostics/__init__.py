"""What a trajectory says about the theory: energy identity, optimality gap, PL / KL rates, head structure.

All quantities follow docs/model.md ("Dissipation and the energy identity" to "Convergence rates: PL and KL"):

- energy identity residual ``r(t) = E(t) - E(t0) + int_{t0}^t I(u) du``, zero for the exact flow; the integral
  is the run's own quadrature of each step (``/steps/dissipation_integral``: a Runge-Kutta method's stage
  quadrature, so ``r`` falls at the method's order), the trapezoid rule (``O(dt^2)``) for older files;
- optimality gap ``G(rho) = int Phi d rho - min_{omega in Omega} Phi(omega; rho)`` on a compact set Omega
  (a ball ``|omega| <= R``, a box ``[-R, R]^k``, or the box of a grid run). With ``beta = inf`` the energy is
  convex in rho, so ``E(nu) >= E(rho) + int Phi_rho d(nu - rho) >= E(rho) - G(rho)`` for every measure nu on
  Omega: ``E - G`` is a lower bound on the best energy over measures on Omega (for any rho, in Omega or not)
  - but only with the true min Phi. The search gives a min Phi attained in Omega, so a gap never above the
  true one; a lower bound needs a *certified* min Phi (k <= 3: :func:`certified_min_phi`), and then uses the
  certified upper bound on the gap. Otherwise the gap is an estimate, and E - G is no bound and never E*;
- PL ratio ``mu(t) = I / (2 (E - E*))``; Kurdyka-Lojasiewicz exponent theta from the regression
  ``log I = log C + 2 (1 - theta) log(E - E*)`` (theta = 1/2: PL, exponential decay), both only where
  ``E - E*`` is trustworthy (:func:`trusted_excess`: ten times the width of the interval holding E*), the KL
  exponent only when it lies in (0, 1], with a moving-block bootstrap interval (:func:`kl_fit`);
- particles with ``beta < inf`` store an energy without the entropy term (a particle measure has no
  density): their energy identity, E*, PL and KL are refused with a note (ENTROPY_MISSING);
- head structure: clusters of heads in omega (single linkage), their masses, and the attention map of a
  representative head of each heavy cluster on a probe sequence.

One module per concern; the public names are imported here, so ``pdeflow.diagnostics.X`` is the way to use them:

- :mod:`pdeflow.diagnostics.rates`: the energy identity residual, the PL ratio, the KL exponent, fits of E*;
- :mod:`pdeflow.diagnostics.domain`: the parameter set Omega (a ball, a box, or a grid run's box);
- :mod:`pdeflow.diagnostics.certify`: the certified lower bound on min Phi (k <= 3);
- :mod:`pdeflow.diagnostics.gap`: the optimality gap and the search for min Phi;
- :mod:`pdeflow.diagnostics.clusters`: a trajectory's measures, attention maps and head clusters;
- :mod:`pdeflow.diagnostics.analysis`: the analysis of a trajectory, from all of the above;
- :mod:`pdeflow.diagnostics.analysis_file`: ``/analysis`` in the trajectory file.
"""
from __future__ import annotations

from .analysis import ENTROPY_MISSING, Analysis, analyse, gap_frame_indices
from .analysis_file import analyse_run, check_editable, read_analysis, write_analysis
from .certify import certified_min_phi, grad_phi_bound, hess_phi_bound
from .clusters import HeadClusters, attention_pattern, frame_measure, head_clusters, probe_sequence, trajectory_grid
from .domain import Domain
from .gap import GapResult, entropic_gap, minimize_phi, optimality_gap
from .rates import (
    KLFit,
    energy_identity_residual,
    fit_e_star,
    fit_e_star_interval,
    kl_exponent,
    kl_fit,
    pl_constant,
    trusted_excess,
)

__all__ = ["GapResult", "optimality_gap", "entropic_gap", "minimize_phi", "certified_min_phi", "grad_phi_bound",
           "hess_phi_bound", "trusted_excess", "fit_e_star_interval", "ENTROPY_MISSING", "Domain",
           "energy_identity_residual", "pl_constant",
           "kl_exponent", "kl_fit", "KLFit", "fit_e_star", "attention_pattern", "probe_sequence", "HeadClusters",
           "head_clusters", "frame_measure", "trajectory_grid", "Analysis", "analyse", "analyse_run", "write_analysis",
           "read_analysis", "check_editable", "gap_frame_indices"]
