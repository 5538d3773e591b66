"""Dirac stationary measures (:mod:`pdeflow.analysis.dirac.stability`, ``pdeflow stability``): the verdict logic on
constructed spectra, the dense Hessians against central differences, the zero head against its closed form, the symmetry
directions, and the predicted rates against the particle flow itself
(docs/model.md, "Dirac stationary measures and their stability")."""
from __future__ import annotations

import h5py
import numpy as np
import pytest
import scipy.linalg

from conftest import lookback_text
from pdeflow import Problem, loads_config
from pdeflow.analysis.dirac.stability import (
    MEAN,
    NOT_ESTABLISHED,
    SPREAD,
    analyse_point,
    attach_gap,
    complement_spectrum,
    find_stationary_points,
    frozen_hessian,
    global_minimizer,
    one_head_energy,
    relevant_modes,
    simulate_point,
    translation_hessian,
    verdict,
    zero_head_sweep,
)
from pdeflow.analysis.hessian.local_geometry import symmetry_tangents
from pdeflow.core.model import join_theta, split_theta
from pdeflow.interface.cli import main

# Tiny problem: V = T = 3, d = 4, dh = 2, full coordinates k = 32; exact enumeration (27 sequences).
TINY = lookback_text(diagnostics={"n_starts": 8},
                     stability={"n_starts": 1, "n_modes": 1, "weight_decays": [0.05, 0.25]})


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def build(*overrides: str):
    cfg = loads_config(TINY, list(overrides))
    return cfg, Problem.from_config(cfg)


@pytest.fixture(scope="module")
def nonzero_point(one_numba_thread):
    """A nonzero stationary Dirac of the tiny problem (the minimizer of e) and its analysis. Two starts reach
    two different points of one symmetry orbit: one class, found twice, next to the zero head."""
    cfg, problem = build()
    cands, info = find_stationary_points(problem, n_starts=2, seed=0, start_scale=1.0, grad_tol=1e-10)
    assert cands[0].origin == "zero head" and np.all(cands[0].point == 0)
    assert len(cands) == 2 and info["n_converged"] == 2 and cands[1].multiplicity == 2
    assert cands[1].grad_norm <= 1e-10 and np.linalg.norm(cands[1].point) > 1.0
    return cfg, problem, analyse_point(problem, cands[1].point, cfg.stability.tol)


# ---- verdict logic ------------------------------------------------------------------------------
@pytest.mark.parametrize("h0,htr,expected", [
    ([0.1, 0.5, 2.0], [0.2, 0.5, 3.0], "stable"),
    ([-0.3, 0.5], [-0.1, 0.6], "translation-unstable"),
    ([-0.3, 0.5], [0.05, 0.6], "splitting-unstable"),
    ([-0.3, 0.5], [5e-9, 0.6], "splitting-unstable"),     # Htr undecided, H0 decisively negative
    ([-5e-9, 0.5], [1e-3, 0.6], "inconclusive"),          # smallest of H0 within tol of 0
    ([5e-9, 0.5], [1e-3, 0.6], "inconclusive"),
    ([0.0, 0.5], [0.0, 0.6], "inconclusive"),
    ([2e-8, 0.5], [2e-8, 0.6], "stable"),                 # just beyond tol
    ([-2e-8, 0.5], [2e-8, 0.6], "splitting-unstable"),
    ([-0.3, -0.2], [-2e-8, 0.6], "translation-unstable"),
])
def test_verdict_on_constructed_spectra(h0, htr, expected):
    assert verdict(np.array(h0), np.array(htr), tol=1e-8) == expected


def test_verdict_ignores_symmetry_null_directions():
    """A constructed H0 with a null direction t and a negative one: removing t leaves exactly the other
    eigenvalues; a positive H0 whose only zero is t is stable once t is removed, inconclusive otherwise."""
    rng = np.random.default_rng(3)
    Q = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    values = np.array([0.0, -0.4, 0.3, 0.7, 1.1, 2.0])
    H = Q @ np.diag(values) @ Q.T
    rest, vectors = complement_spectrum(H, Q[:, :1])
    np.testing.assert_allclose(rest, np.sort(values[1:]), atol=1e-13)
    np.testing.assert_allclose(H @ vectors, vectors * rest, atol=1e-13)   # eigenvectors of H itself
    assert np.allclose(Q[:, 0] @ vectors, 0.0, atol=1e-13)
    positive = Q @ np.diag(np.abs(values)) @ Q.T
    assert verdict(complement_spectrum(positive, Q[:, :1])[0], np.abs(values[1:]), 1e-8) == "stable"
    assert verdict(np.linalg.eigvalsh(positive), np.abs(values), 1e-8) == "inconclusive"
    # simulated modes: distinct eigenvalues, none within tol of 0
    modes = relevant_modes(np.array([-1.0, -1.0, 0.0, 2.0]), np.eye(4), 1e-8, 3)
    assert [m[0] for m in modes] == [-1.0, 2.0]


# ---- Hessians ----------------------------------------------------------------------------------
def test_dense_hessians_match_central_differences():
    """H0: central differences of grad Phi(.; delta_w) (measure frozen); Htr: of grad e = grad Phi(w; delta_w);
    both symmetric, and M = Htr - H0 positive semidefinite."""
    _, problem = build()
    k = problem.k
    w = 0.7 * np.random.default_rng(1).normal(size=k)
    one, h = np.ones(1), 1e-5
    H0, Htr = frozen_hessian(problem, w), translation_hessian(problem, w)
    fd0, fdtr = np.empty((k, k)), np.empty((k, k))
    for j in range(k):
        step = np.zeros(k)
        step[j] = h
        plus, minus = w + step, w - step
        fd0[:, j] = (problem.grad_phi(plus[None], w[None], one)[0]
                     - problem.grad_phi(minus[None], w[None], one)[0]) / (2 * h)
        fdtr[:, j] = (problem.grad_phi(plus[None], plus[None], one)[0]
                      - problem.grad_phi(minus[None], minus[None], one)[0]) / (2 * h)
    scale = np.abs(Htr).max()
    assert np.abs(H0 - 0.5 * (fd0 + fd0.T)).max() <= 1e-7 * scale
    assert np.abs(Htr - 0.5 * (fdtr + fdtr.T)).max() <= 1e-7 * scale
    assert np.abs(fd0 - fd0.T).max() <= 1e-7 * scale and np.abs(fdtr - fdtr.T).max() <= 1e-7 * scale
    M = np.linalg.eigvalsh(Htr - H0)
    assert M[0] >= -1e-12 * scale and M[-1] > 1e-3 * scale


def test_zero_head_derivatives_vanish_and_h0_is_the_bilinear_coupling():
    """At omega = 0 every first derivative of the head feature vanishes: grad Phi(0; rho) = 0 for any measure,
    so M = 0 and Htr = H0. With uniform causal attention, Phi_data = <WO WV, A>_F with
    A = sum_{b,l} lw U^T r xbar^T, r = 1/V - onehot(y), xbar the prefix mean of x: the spectrum of H0 is
    lam +- sigma_i(A) (each dh times) and lam on the remaining 2 d dh directions."""
    cfg, problem = build()
    k, zero, lam = problem.k, np.zeros(problem.k), problem.weight_decay
    rng = np.random.default_rng(2)
    omega, mass = rng.normal(size=(5, k)), rng.dirichlet(np.ones(5))
    assert np.all(problem.grad_phi(zero[None], omega, mass) == 0.0)
    assert np.all(one_head_energy(problem, zero)[1] == 0.0)
    H0, Htr = frozen_hessian(problem, zero), translation_hessian(problem, zero)
    assert np.abs(Htr - H0).max() <= 1e-15
    a = problem.arrays()
    x = a["embedding"][a["tokens"]] + a["positions"][None]                       # [B, T, d]
    B, T, d = x.shape
    xbar = np.cumsum(x, axis=1) / np.arange(1, T + 1)[None, :, None]
    r = np.full((B, T, problem.vocab_size), 1.0 / problem.vocab_size)
    np.put_along_axis(r, a["targets"][..., None], r[0, 0, 0] - 1.0, axis=-1)
    lw = a["weights"][:, None] * a["mask"] / a["mask"].sum(axis=1, keepdims=True)
    A = np.einsum("bl,bli,blj->ij", lw, r @ a["unembedding"], xbar)
    sigma = np.linalg.svd(A, compute_uv=False)
    dh = problem.head_dim
    expected = np.sort(np.concatenate([np.repeat(lam + sigma, dh), np.repeat(lam - sigma, dh),
                                       np.full(2 * d * dh, lam)]))
    np.testing.assert_allclose(np.linalg.eigvalsh(H0), expected, atol=1e-13)
    sweep = zero_head_sweep(problem, cfg.replace(stability={"weight_decays": []}))
    assert sweep.lam_c_predicted == pytest.approx(sigma[0], rel=1e-12)


def test_symmetry_directions_are_exact_symmetries_and_null_vectors(nonzero_point):
    """The orbit (G WQ, G WK, H WV, WO H^T), G, H rotations, leaves e unchanged at any point; at a stationary
    point its tangents are null vectors of H0 and Htr, and they are what the analysis removes."""
    cfg, problem, a = nonzero_point
    d, dh = problem.d, problem.head_dim
    rng = np.random.default_rng(4)
    w = rng.normal(size=problem.k)
    G = scipy.linalg.expm(0.8 * np.array([[0.0, 1.0], [-1.0, 0.0]]))
    Hrot = scipy.linalg.expm(-1.3 * np.array([[0.0, 1.0], [-1.0, 0.0]]))
    wq, wk, wv, wo = (m[0] for m in split_theta(w[None], d, dh))
    moved = join_theta((G @ wq)[None], (G @ wk)[None], (Hrot @ wv)[None], (wo @ Hrot.T)[None])[0]
    e, e_moved = one_head_energy(problem, w)[0], one_head_energy(problem, moved)[0]
    assert abs(e - e_moved) <= 1e-13 * abs(e)
    assert np.linalg.norm(moved - w) > 0.5
    T = symmetry_tangents(problem, a.point)
    assert T.shape == (problem.k, 2) and a.n_symmetry == 2
    np.testing.assert_allclose(T.T @ T, np.eye(2), atol=1e-12)
    scale = np.abs(a.htr).max()
    assert np.abs(a.h0 @ T).max() <= 1e-10 * scale and np.abs(a.htr @ T).max() <= 1e-10 * scale
    assert a.symmetry_residual <= 1e-10 * scale
    assert len(a.h0_relevant) == problem.k - 2
    # reduced coordinates have no orbit to remove
    _, reduced = build('model.coordinates="gain2"')
    assert symmetry_tangents(reduced, np.ones(reduced.k)).shape == (reduced.k, 0)


# ---- the check by simulation -------------------------------------------------------------------
def test_zero_head_critical_weight_decay_matches_simulation():
    """Below lam_c the perturbations of the zero head grow, above they decay, at -lambda_min(H0) (5%: here far
    better), and the zero of the measured rates against lam is lam_c."""
    cfg, problem = build("stability.weight_decays=[0.05, 0.25]", "stability.t_end=20.0")
    sweep = zero_head_sweep(problem, cfg)
    lam_c = sweep.lam_c_predicted
    assert 0.05 < lam_c < 0.25
    assert sweep.verdicts == ["translation-unstable", "stable"]
    np.testing.assert_allclose(sweep.predicted[:, SPREAD], lam_c - sweep.weight_decay, rtol=1e-10)
    np.testing.assert_allclose(sweep.measured, sweep.predicted, rtol=1e-3)
    assert sweep.measured[0, SPREAD] > 0 > sweep.measured[1, SPREAD]
    assert sweep.lam_c_measured == pytest.approx(lam_c, rel=1e-3)


def test_nonzero_stationary_dirac_rates_match_simulation(nonzero_point):
    """The minimizer of e is splitting-unstable here (Htr > 0, lambda_min(H0) < 0): the mean of a perturbation
    decays at -lambda_min(Htr) while its spread grows at -lambda_min(H0); both measured within 5% (here 1e-3)."""
    cfg, problem, a = nonzero_point
    assert a.verdict == "splitting-unstable"
    assert a.htr_relevant[0] > cfg.stability.tol and a.h0_relevant[0] < -cfg.stability.tol
    runs = simulate_point(problem, a, cfg, seed=0)
    assert len(runs) == 1
    r = runs[0]
    np.testing.assert_allclose(r.predicted, [-a.htr_relevant[0], -a.h0_relevant[0]], rtol=1e-12)
    np.testing.assert_allclose(r.measured, r.predicted, rtol=0.05)
    np.testing.assert_allclose(r.measured, r.predicted, rtol=1e-3)
    assert r.measured[MEAN] < 0 < r.measured[SPREAD]
    assert r.mean_amplitude[-1] < r.mean_amplitude[0] and r.spread_amplitude[-1] > r.spread_amplitude[0]
    # what is left is the nonlinearity: the rate error is O(eps), ten times smaller for ten times smaller eps
    errors = []
    for eps in (1e-3, 1e-4):
        c = cfg.replace(stability={"eps": eps})
        run = simulate_point(problem, a, c, seed=0)[0]
        errors.append(np.abs(run.measured / run.predicted - 1.0))
    assert np.all(errors[0] > 1e-5)  # well above the step and fit errors
    np.testing.assert_allclose(errors[0] / errors[1], 10.0, rtol=0.2)


# ---- the command --------------------------------------------------------------------------------
def test_cli_writes_stability_file_and_figures(tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    out = tmp_path / "stab.h5"
    assert main(["stability", str(path), "-o", str(out), "--quiet"]) == 0
    with h5py.File(out, "r") as f:
        g = f["stability"]
        S, k = g["points"].shape
        assert S == 2 and k == 32
        for key in ("h0_eigenvalues", "htr_eigenvalues", "m_eigenvalues"):
            assert g[key].shape == (S, k)
        assert [v.decode() for v in g["verdict"][:]] == ["translation-unstable", "splitting-unstable"]
        assert g["predicted_rate"].shape == g["measured_rate"].shape == (S, 2, 1)
        np.testing.assert_allclose(g["measured_rate"][:], g["predicted_rate"][:], rtol=0.05)
        # an unstable Dirac is never a global minimizer: Phi decreases along the negative directions of H0
        # (the gap found is attained at a point of Omega: a proof of "no", with or without a certificate)
        assert np.all(g["optimality_gap"][:] > 0)
        assert [v.decode() for v in g["global_minimizer"][:]] == ["no", "no"]
        assert np.all(np.isnan(g["gap_bound"][:]))        # k = 32: the search is not exhaustive
        assert g["sweep/weight_decay"].shape == (2,)
        assert g["sweep"].attrs["lam_c_measured"] == pytest.approx(g["sweep"].attrs["lam_c_predicted"], rel=1e-3)
    for name in ("spectra", "rates", "sweep"):
        assert (tmp_path / f"stab-{name}.png").stat().st_size > 1000
    assert main(["stability", str(path), "-o", str(out), "--quiet"]) == 2          # exists, no --force
    assert main(["stability", str(path), "-o", str(out), "--set", "stability.eps=-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pdeflow: error:") and "stability.eps" in err[-1]


def test_reduced_coordinates_search_and_refused_sweep(tmp_path, capsys):
    """In reduced coordinates omega = 0 is not the zero head (theta0 != 0) and not stationary: it is only a
    start of the search; the zero-head sweep is refused with one line naming the key."""
    _, problem = build('model.coordinates="gain2"')
    cands, info = find_stationary_points(problem, n_starts=2, seed=0, start_scale=1.0, grad_tol=1e-10)
    assert info["zero_grad_norm"] > 1e-6
    assert cands and all(c.origin != "zero head" and c.grad_norm <= 1e-10 for c in cands)
    assert info["n_converged"] + info["n_rejected"] == 3
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    code = main(["stability", str(path), "-o", str(tmp_path / "x.h5"), "--quiet", "--set", 'model.coordinates="gain2"'])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "stability.weight_decays" in err[0]
    assert not (tmp_path / "x.h5").exists()


# ---- global minimizer: a label no stronger than the evidence --------------------------------------
def test_global_minimizer_is_yes_only_with_a_certificate(one_numba_thread):
    """The zero head with a weight decay above A X (|Phi_data| <= A X |WV| |WO| <= A X |w|^2 / 2) is a global
    minimizer of E in full coordinates (k = 32): the search finds gap 0, but without a certificate the label
    is "not established". A stationary Dirac of the 1-D output gain family (Phi(.; delta_w*) is a convex
    quadratic, so w* is its global minimizer) is certified (k = 1): "yes". A found positive gap proves "no"."""
    from pdeflow.analysis.optimality.certify import _BoundTerms

    cfg, problem = build("model.weight_decay=0.05")
    zero = np.zeros(problem.k)
    terms = _BoundTerms.of(problem, problem.residual_features(zero[None], np.ones(1)))
    lam = 2.0 * terms.A * terms.X
    cfg, problem = build(f"model.weight_decay={lam}", "diagnostics.radius=2.0")
    a = analyse_point(problem, zero, cfg.stability.tol)
    assert attach_gap(problem, a, cfg) is None
    assert abs(a.gap) <= cfg.stability.gap_tol and not a.gap_exhaustive and np.isnan(a.gap_bound)
    assert global_minimizer(a, cfg.stability.gap_tol) == NOT_ESTABLISHED

    cfg, problem = build('model.coordinates="output_gain"', "model.weight_decay=0.3", "diagnostics.radius=4.0")
    cands, _ = find_stationary_points(problem, n_starts=2, seed=0, start_scale=1.0, grad_tol=1e-10)
    a = analyse_point(problem, cands[0].point, cfg.stability.tol)
    assert attach_gap(problem, a, cfg) is None
    assert a.gap_exhaustive and 0 <= a.gap_bound <= cfg.stability.gap_tol and abs(a.gap) <= a.gap_bound + 1e-15
    assert global_minimizer(a, cfg.stability.gap_tol) == "yes"
    a.gap, a.gap_bound = 1e-3, np.nan
    assert global_minimizer(a, cfg.stability.gap_tol) == "no"
