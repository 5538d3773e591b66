"""Propagation of chaos (pdeflow/analysis/finite_heads/chaos.py, ``pdeflow chaos``): the synchronous coupling, the
rate fitter,
the static approximation's sampling law, and the command end to end on a tiny config."""
from __future__ import annotations

import itertools
import math

import h5py
import numba
import numpy as np
import pytest
from pdeflow.solvers import make_stepper
from pdeflow.solvers.loop import frame_times

from conftest import build_config
from pdeflow import Problem
from pdeflow.analysis.finite_heads import chaos
from pdeflow.core.config import ConfigError
from pdeflow.interface.cli import main


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny problems: one numba thread avoids hand-offs that dominate their cost (results do not depend on
    the thread count, see tests/core/test_core.py)."""
    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(previous)


TINY = {"init": {"scale": 1.0}, "solver": {"method": "rk4", "dt": 0.05},
        "run": {"t_end": 0.4, "frame_interval": 0.2}, "sgd": {"batch_size": 8},
        "chaos": {"n_ref": 48, "n_list": [2, 4, 8], "seeds": 2, "eta_list": [0.1, 0.05], "probe_size": 4,
                  "static_draws": 4}}


def tiny_config(**overrides):
    sections = {name: dict(values) for name, values in TINY.items()}
    for name, values in overrides.items():
        sections.setdefault(name, {}).update(values)
    return build_config(**sections)


# ---- the coupling --------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["euler", "rk4", "adaptive"])
def test_tracers_at_the_reference_points_reproduce_the_reference(method):
    """Tracers started at the reference particles' own initial points move exactly like them, and riding
    along (mass 0) does not change the reference: same trajectory as the reference integrated alone."""
    cfg = tiny_config(solver={"method": method})
    problem = Problem.from_config(cfg)
    stepper = make_stepper(problem, cfg)
    omega0, mass = problem.initial_particles(12, 3, scale=1.0)
    times = frame_times(cfg)
    ref, tracers, end = chaos.characteristics(stepper, omega0, mass, omega0.copy(), times, cfg.solver.dt)
    np.testing.assert_array_equal(tracers, ref)
    assert end.t == times[-1] and np.ptp(ref[-1] - ref[0]) > 1e-2  # the particles moved
    alone, _, _ = chaos.characteristics(stepper, omega0, mass, omega0[:0], times, cfg.solver.dt)
    scale = np.max(np.abs(alone))
    np.testing.assert_allclose(ref, alone, rtol=0, atol=1e-12 * scale)


def test_tracers_follow_the_reference_field():
    """A tracer away from the reference moves with -grad Phi(.; rho_ref(t)): one Euler step checks the field."""
    cfg = tiny_config(solver={"method": "euler"})
    problem = Problem.from_config(cfg)
    stepper = make_stepper(problem, cfg)
    omega0, mass = problem.initial_particles(12, 3, scale=1.0)
    others, _ = problem.initial_particles(5, 4, scale=1.0)
    h = cfg.solver.dt
    ref, tracers, _ = chaos.characteristics(stepper, omega0, mass, others, np.array([0.0, h]), h)
    expected = others - h * problem.grad_phi(others, omega0, mass)
    np.testing.assert_allclose(tracers[1], expected, rtol=0, atol=1e-13 * np.max(np.abs(expected)))
    np.testing.assert_allclose(ref[1], omega0 - h * problem.grad_phi(omega0, omega0, mass), rtol=0,
                               atol=1e-13 * np.max(np.abs(omega0)))


def test_distances_follow_their_formulas():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    explicit = math.sqrt(sum(np.sum((a[i] - b[i]) ** 2) for i in range(7)) / 7)
    assert chaos.coupling_distance(a, b) == pytest.approx(explicit, rel=1e-14)
    z, z_ref = rng.normal(size=(3, 4, 6)), rng.normal(size=(3, 4, 6))
    lw = rng.random((3, 4))
    explicit = math.sqrt(sum(lw[i, j] * np.sum((z[i, j] - z_ref[i, j]) ** 2) for i in range(3) for j in range(4)))
    assert chaos.logit_gap(z, z_ref, lw) == pytest.approx(explicit, rel=1e-14)
    # sliced W2: invariant under a common shift is zero, a shift by c in every direction costs |c| on average
    x = rng.normal(size=(50, 3))
    assert chaos.sliced_w2(x, x, seed=1) == pytest.approx(0.0, abs=1e-12)
    assert chaos.sliced_w2(x, x + np.array([0.3, 0.0, 0.0]), seed=1) > 0.05


# ---- the rate fitter -----------------------------------------------------------------------------
def test_power_law_fit_is_exact_on_exact_data():
    x = np.array([8, 16, 32, 64, 128, 8, 16, 32])
    fit = chaos.fit_power_law(x, 3.0 * x**-0.5)
    assert fit.slope == pytest.approx(-0.5, abs=1e-12) and fit.prefactor == pytest.approx(3.0, rel=1e-12)
    assert fit.ci[1] - fit.ci[0] < 1e-10 and fit.r2 == pytest.approx(1.0)


@pytest.mark.parametrize("true_slope,sigma", [(-0.5, 0.2), (-1.0, 0.5), (0.5, 0.05)])
def test_power_law_fit_recovers_known_slopes_with_calibrated_intervals(true_slope, sigma):
    """Synthetic y = C x^s exp(sigma eps): over 400 data sets the 95% CI covers s 95% of the time (binomial
    3-sigma band) and the slopes scatter about s by their own standard error."""
    rng = np.random.default_rng(11)
    x = np.repeat([16, 32, 64, 128, 256], 4).astype(float)
    fits = [chaos.fit_power_law(x, 0.7 * x**true_slope * np.exp(sigma * rng.standard_normal(x.size)))
            for _ in range(400)]
    coverage = np.mean([f.covers(true_slope) for f in fits])
    assert abs(coverage - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 400), coverage
    slopes = np.array([f.slope for f in fits])
    exact_se = sigma / math.sqrt(np.sum((np.log(x) - np.log(x).mean()) ** 2))
    assert abs(slopes.mean() - true_slope) < 4 * exact_se / math.sqrt(len(fits))
    assert np.std(slopes) == pytest.approx(exact_se, rel=0.15)
    assert np.mean([f.stderr for f in fits]) == pytest.approx(exact_se, rel=0.1)


def test_grouped_fit_has_one_slope_and_a_level_per_group():
    """Systems at very different levels, each seen at several x: the fixed-effects fit recovers the common
    slope exactly on exact data and with a calibrated CI on noisy data; pooling them would not."""
    eta = np.tile([0.1, 0.05, 0.025], 6)
    groups = np.repeat(np.arange(6), 3)
    levels = np.exp(np.random.default_rng(0).normal(0.0, 1.5, size=6))[groups]
    fit = chaos.fit_power_law(eta, levels * eta**0.5, groups=groups)
    assert fit.slope == pytest.approx(0.5, abs=1e-12) and fit.ci[1] - fit.ci[0] < 1e-10
    assert fit.prefactor == pytest.approx(np.exp(np.mean(np.log(levels))), rel=1e-12)
    assert chaos.fit_power_law(eta, levels * eta**0.5).stderr > 0.2  # pooled: the levels look like noise
    rng = np.random.default_rng(1)
    covered = [chaos.fit_power_law(eta, levels * eta**0.5 * np.exp(0.1 * rng.standard_normal(18)),
                                   groups=groups).covers(0.5) for _ in range(400)]
    assert abs(np.mean(covered) - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 400)
    with pytest.raises(ValueError, match="fit_power_law"):  # one point per group leaves no degrees of freedom
        chaos.fit_power_law(eta[:3], eta[:3], groups=[0, 1, 2])


@pytest.mark.parametrize("x,y", [([1, 2], [1, 2]), ([1, 1, 1], [1, 2, 3]), ([1, 2, 3], [1, 0, 2]),
                                 ([1, 2, 3], [1, np.nan, 2]), ([1, 2, 3], [1, 2])])
def test_power_law_fit_refuses_bad_data(x, y):
    with pytest.raises(ValueError, match="fit_power_law"):
        chaos.fit_power_law(np.array(x, dtype=float), np.array(y, dtype=float))


# ---- the static approximation --------------------------------------------------------------------
def test_static_draws_are_iid_from_the_weighted_measure():
    """The exact law of hat rho_N (N ordered i.i.d. draws, probabilities the masses) gives E[gap] by
    enumeration; it is >= 0 (E is convex in rho, Jensen) and the Monte Carlo mean of static_gaps matches it."""
    cfg = tiny_config()
    problem = Problem.from_config(cfg)
    rng = np.random.default_rng(5)
    omega = 1.5 * rng.normal(size=(3, problem.k))
    mass = np.array([0.5, 0.3, 0.2])
    e_ref = problem.energy(omega, mass)
    n = 3
    exact = 0.0
    for tup in itertools.product(range(3), repeat=n):
        exact += np.prod(mass[list(tup)]) * (problem.energy(omega[list(tup)], np.full(n, 1 / n)) - e_ref)
    assert exact > 0
    gaps = chaos.static_gaps(problem, omega, mass, np.array([n]), 600, np.random.default_rng(1))[0]
    se = gaps.std(ddof=1) / math.sqrt(gaps.size)
    assert abs(gaps.mean() - exact) < 4 * se, (gaps.mean(), exact, se)


def test_static_draws_are_with_replacement():
    """Data term off (zero unembedding): gap = (lam/2)(mean_j |x_j|^2 - int |omega|^2 d rho), whose variance is
    (lam/2)^2 Var_rho(|omega|^2) / N for i.i.d. draws (without replacement it would shrink by (M - N)/(M - 1))."""
    cfg = tiny_config(model={"unembedding": "zero", "weight_decay": 2.0})
    problem = Problem.from_config(cfg)
    rng = np.random.default_rng(2)
    omega = rng.normal(size=(8, problem.k)) * rng.uniform(0.2, 2.0, size=(8, 1))
    mass = rng.dirichlet(np.ones(8))
    sq = np.sum(omega**2, axis=1)
    var = np.sum(mass * (sq - np.sum(mass * sq)) ** 2)
    n, draws = 4, 2000
    gaps = chaos.static_gaps(problem, omega, mass, np.array([n]), draws, np.random.default_rng(3))[0]
    expected_var = var / n  # (lam/2)^2 = 1
    assert abs(gaps.mean()) < 4 * math.sqrt(expected_var / draws)
    assert gaps.var(ddof=1) == pytest.approx(expected_var, rel=5 * math.sqrt(2 / draws))


# ---- the experiment ------------------------------------------------------------------------------
def write_config(tmp_path, cfg):
    path = tmp_path / "chaos.toml"
    path.write_text(cfg.to_toml())
    return path


def test_chaos_command_on_a_tiny_config(tmp_path, capsys):
    cfg = tiny_config()
    out = tmp_path / "out.h5"
    assert main(["chaos", str(write_config(tmp_path, cfg)), "-o", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "coupling distance vs N" in printed and "SGD excess vs eta" in printed
    assert out.with_suffix(".png").stat().st_size > 10_000
    res = chaos.read_result(out)
    F = len(frame_times(cfg))
    assert res["coupling"].shape == (3, 2, F) and res["sgd_excess"].shape == (3, 2, 2, F)
    assert res["static_gap"].shape == (3, 4)
    # the coupling starts at zero: tracers, flows and SGD share their initial points
    assert np.all(res["coupling"][:, :, 0] == 0) and np.all(res["sgd_excess"][..., 0] == 0)
    assert np.all(res["coupling"][:, :, 1:] > 0) and np.all(np.isfinite(res["logit_gap"]))
    for name in ("coupling", "logit_gap", "sgd_eta", "static"):
        assert np.isfinite(res[f"slope_{name}"]) and res[f"slope_{name}_ci"].shape == (2,)
        lo, hi = res[f"slope_{name}_ci"]
        assert lo <= res[f"slope_{name}"] <= hi
    with h5py.File(out, "r") as f:
        assert f.attrs["schema"] == chaos.SCHEMA and "[chaos]" in f.attrs["config"]
    # the stored slope is the fit of the stored raw data
    fit = chaos.fit_power_law(np.repeat(res["n_list"], 2), res["coupling"][:, :, -1].ravel())
    assert res["slope_coupling"] == pytest.approx(fit.slope, rel=1e-12)


def test_full_batch_sgd_excess_is_first_order_in_eta(tmp_path):
    """With batch = the whole data set SGD is explicit Euler: its distance to the RK4 flow is O(eta), so the
    fitted exponent is near 1 (a minibatch would give about 1/2)."""
    cfg = tiny_config(sgd={"batch_size": 10_000}, chaos={"eta_list": [0.1, 0.05, 0.025], "seeds": 1},
                      run={"t_end": 0.2, "frame_interval": 0.2})
    problem = Problem.from_config(cfg)
    result = chaos.run_chaos(cfg, problem, frame_times(cfg))
    assert result.fits["sgd_eta"].slope == pytest.approx(1.0, abs=0.1)


def test_the_horizon_chaos_t_end_is_the_experiments_whatever_run_t_end(tmp_path):
    """chaos.t_end = 0.4 on a config whose run goes to t = 40 (a long main job's config): the experiment is the one
    of run.t_end = 0.4, measurement for measurement, with its frames ending at 0.4."""
    short = tiny_config(chaos={"seeds": 1})
    long = tiny_config(chaos={"seeds": 1, "t_end": 0.4}, run={"t_end": 40.0})
    problem = Problem.from_config(short)
    a, b = chaos.run_chaos(short, problem), chaos.run_chaos(long, problem)
    np.testing.assert_array_equal(b.times, [0.0, 0.2, 0.4])
    np.testing.assert_array_equal(a.times, b.times)
    for name in ("coupling", "sgd_excess", "energy_gap", "static_gap"):
        np.testing.assert_array_equal(a.data[name], b.data[name])
    assert a.attrs["fit_time"] == b.attrs["fit_time"] == 0.4


@pytest.mark.parametrize("override,key", [(["chaos.t_end=0.1"], "chaos.t_end"),   # a horizon without frames
                                          # a horizon beyond the static approximation's time
                                          (["chaos.t_end=0.8", "chaos.converge_time=0.6"], "chaos.converge_time"),
                                          (["solver.method='sgd'"], "solver.method"),
                                          (["chaos.n_list=[4, 8]"], "chaos.n_list"),
                                          (["chaos.eta_list=[0.1]"], "chaos.eta_list"),
                                          (["chaos.converge_time=0.1"], "chaos.converge_time"),
                                          (["model.beta=10.0"], "model.beta")])
def test_chaos_refuses_bad_configs_in_one_line(tmp_path, capsys, override, key):
    out = tmp_path / "out.h5"
    args = ["chaos", str(write_config(tmp_path, tiny_config())), "-o", str(out), "--quiet"]
    for o in override:
        args += ["--set", o]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
    assert not out.exists()


def test_chaos_does_not_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "out.h5"
    out.write_text("keep")
    assert main(["chaos", str(write_config(tmp_path, tiny_config())), "-o", str(out), "--quiet"]) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "keep"


def test_quick_config_is_smaller():
    cfg = build_config(chaos={"n_list": [64, 16, 32, 128], "eta_list": [0.01, 0.04, 0.02], "seeds": 5})
    q = chaos.quick_config(cfg)
    assert q.chaos.n_list == [16, 32, 64] and q.chaos.eta_list == [0.04, 0.02] and q.chaos.seeds == 2
    assert q.chaos.n_ref == cfg.chaos.n_ref // 4


# ---- resuming -------------------------------------------------------------------------------------
class _Crash(Exception):
    pass


def test_an_interrupted_experiment_resumes_bit_for_bit(tmp_path):
    """A crash after some (N, seed) blocks: the work file keeps them, and the resumed experiment skips them
    and gives the uninterrupted experiment's measurements bit for bit."""
    cfg = tiny_config(chaos={"seeds": 1})
    problem = Problem.from_config(cfg)
    times = frame_times(cfg)
    whole = chaos.run_chaos(cfg, problem, times)
    work = tmp_path / "out.h5.work"
    labels = []

    def crash_in_third_block(label, units):
        labels.append(label)
        if label.startswith("flow N=8"):
            raise _Crash

    with pytest.raises(_Crash):
        chaos.run_chaos(cfg, problem, times, progress=crash_in_third_block, work=work)
    data = {name: np.empty_like(whole.data[name]) for name in chaos.BLOCK_DATA}
    done = chaos.read_work(work, cfg, data)
    assert done.tolist() == [[True], [True], [False]]
    assert np.all(np.isnan(data["coupling"][2])) and np.all(np.isfinite(data["coupling"][:2]))
    labels.clear()
    resumed = chaos.run_chaos(cfg, problem, times, progress=lambda label, u: labels.append(label),
                              work=work)
    assert "N=2 (done before)" in labels and "N=4 (done before)" in labels and "flow N=8" in labels
    assert "flow N=2" not in labels
    for name, value in whole.data.items():
        np.testing.assert_array_equal(resumed.data[name], value, err_msg=name)
    # a work file of another config is refused
    other = tiny_config(chaos={"seeds": 1, "n_ref": 40})
    with pytest.raises(ConfigError, match="another config"):
        chaos.run_chaos(other, Problem.from_config(other), frame_times(other), work=work)


def test_chaos_command_resume_and_force(tmp_path, capsys):
    cfg = tiny_config(chaos={"seeds": 1})
    config = write_config(tmp_path, cfg)
    out = tmp_path / "out.h5"
    work = chaos.work_path(out)
    assert main(["chaos", str(config), "-o", str(out), "--quiet", "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err and not out.exists()
    # an unfinished experiment's work file: refused without --resume or --force, and left as it was
    problem = Problem.from_config(cfg)
    with pytest.raises(_Crash):
        chaos.run_chaos(cfg, problem, frame_times(cfg), work=work,
                        progress=lambda label, u: (_ for _ in ()).throw(_Crash) if label == "flow N=4" else None)
    before = work.read_bytes()
    assert main(["chaos", str(config), "-o", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume" in err[0] and work.read_bytes() == before
    assert main(["chaos", str(config), "-o", str(out), "--quiet", "--resume"]) == 0
    assert out.exists() and not work.exists()
    resumed = chaos.read_result(out)
    out2 = tmp_path / "whole.h5"
    assert main(["chaos", str(config), "-o", str(out2), "--quiet"]) == 0
    whole = chaos.read_result(out2)
    for name in chaos.BLOCK_DATA + ("static_gap", "reference_energy"):
        np.testing.assert_array_equal(resumed[name], whole[name], err_msg=name)


def test_chaos_killed_with_sigkill_resumes(tmp_path):
    """kill -9 as soon as the first block is in the work file; --resume finishes with the numbers of an
    uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = tiny_config(chaos={"seeds": 6})
    config = write_config(tmp_path, cfg)
    out = tmp_path / "out.h5"
    work = chaos.work_path(out)
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "pdeflow", "chaos", str(config), "-o", str(out), "--quiet"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not work.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert work.exists() and not out.exists(), proc.stderr.read()
    assert main(["chaos", str(config), "-o", str(out), "--quiet", "--resume"]) == 0
    whole = tmp_path / "whole.h5"
    assert main(["chaos", str(config), "-o", str(whole), "--quiet"]) == 0
    a, b = chaos.read_result(out), chaos.read_result(whole)
    for name in chaos.BLOCK_DATA + ("static_gap",):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
