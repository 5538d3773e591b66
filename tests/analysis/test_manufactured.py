"""The manufactured checks of :mod:`pdeflow.reference`: every shipped case's config defines exactly its stored
problem; the stored expected values are those of the independent numpy model (tests/reference_model.py) or of the
closed form of the zero head (itself checked against the independent model's Hessian); pdeflow reproduces every
expected value; a code with a plausible mistake fails; and another project's test suite runs the checks from a folder
outside the checkout through the documented API.

``python tests/analysis/test_manufactured.py`` regenerates the shipped cases
(pdeflow/analysis/comparison/manufactured_cases/)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pdeflow.reference as ref
from pdeflow import Problem, loads_config
from pdeflow.analysis.comparison.manufactured import (
    CASES_FOLDER,
    ManufacturedCase,
    Tolerance,
    write_case,
    zero_head_spectrum,
)
from pdeflow.analysis.dirac.stability import analyse_point
from reference_model import ReferenceModel
from test_every_method import TINY

HERE = Path(__file__).resolve().parents[1]   # tests/: the oracle reference_model.py
# the tiny problem of tests/methods/test_every_method.py with 4 embedding dimensions, 3 heads, one step of
# explicit Euler
SETTINGS = ["model.d=4", "init.n_particles=3", "init.scale=0.8", "init.seed=7", 'solver.method="euler"',
            "solver.dt=0.01", "run.t_end=0.01", "run.frame_interval=0.01"]
REDUCED = 'model.coordinates="gain2"'
EXACT = Tolerance(1e-9, 1e-12)           # two float64 implementations of the same formulas
SPECTRUM = Tolerance(1e-6, 1e-8)         # Hessians by complex step or careful differences
EULER_STEPS = [0.02, 0.01, 0.005]


def _config(lam: float, *extra: str) -> str:
    return loads_config(TINY, [*SETTINGS, f"model.weight_decay={lam!r}", *extra]).to_toml()


def _oracle(case: ManufacturedCase) -> ReferenceModel:
    return ReferenceModel.from_arrays(case.problem)


def _measure(text: str) -> tuple[Problem, np.ndarray, np.ndarray]:
    cfg = loads_config(text)
    problem = Problem.from_config(cfg)
    omega, mass = problem.initial_measure(cfg)
    mass = mass * np.linspace(0.5, 1.5, len(mass))   # unequal masses: a code that assumes 1/N fails
    return problem, omega, mass / mass.sum()


# ---- the generator of the shipped cases (independent model and closed form only) ----------------------------------
def _gradients(oracle: ReferenceModel, omega, mass):
    """The residual of rho [B, T, V] and grad Phi at its particles [N, k]."""
    r = oracle.residuals(omega, mass)
    return r, np.array([oracle.grad_phi_from_residuals(w, r) for w in omega])


def phi_values(oracle: ReferenceModel, omega, mass, query) -> dict:
    r, grads = _gradients(oracle, omega, mass)
    return {"logits": oracle.logits(omega, mass), "energy": float(oracle.energy(omega, mass)),
            "phi": np.array([oracle.phi_from_residuals(q, r) for q in query]),
            "grad_phi": np.array([oracle.grad_phi_from_residuals(q, r) for q in query]),
            "dissipation": float(mass @ np.einsum("ik,ik->i", grads, grads))}


def euler_values(oracle: ReferenceModel, omega, mass, steps) -> dict:
    _, grads = _gradients(oracle, omega, mass)
    after = [float(oracle.energy(omega - h * grads, mass)) for h in steps]
    return {"energy": float(oracle.energy(omega, mass)),
            "dissipation": float(mass @ np.einsum("ik,ik->i", grads, grads)), "energy_after_step": np.array(after)}


def build_cases() -> list[ManufacturedCase]:
    cases = []
    text = _config(0.01)
    problem, omega, mass = _measure(text)
    query = np.random.default_rng(3).normal(scale=0.8, size=(2, problem.k))
    arrays = problem.arrays()
    oracle = ReferenceModel.from_arrays(arrays)
    cases.append(ManufacturedCase(
        "phi", "Phi and grad Phi at two query points, logits, energy and dissipation of a 3-head measure with unequal "
        "masses (full coordinates, k = 32, weight decay 0.01).", text, arrays,
        {"omega": omega, "mass": mass, "query": query}, phi_values(oracle, omega, mass, query),
        {k: EXACT for k in ("logits", "energy", "phi", "grad_phi", "dissipation")},
        {"omega": "[N, k] the particles of rho", "mass": "[N] their masses (sum 1)", "query": "[Q, k] query points",
         "logits": "[B, T, V] z = sum_i m_i psi(theta(omega_i))",
         "energy": "E(rho) = R + (lam/2) sum_i m_i |omega_i|^2",
         "phi": "[Q] Phi(query; rho)", "grad_phi": "[Q, k] grad Phi(query; rho)",
         "dissipation": "sum_i m_i |grad Phi(omega_i; rho)|^2"}))
    text = _config(0.05, REDUCED)
    problem, omega, mass = _measure(text)
    arrays = problem.arrays()
    cases.append(ManufacturedCase(
        "energy-step", "The energy identity of one explicit Euler step omega_i -> omega_i - dt grad Phi(omega_i; rho): "
        "E(after) - E = -dt I + O(dt^2), at three dt (reduced coordinates gain2, k = 2).", text, arrays,
        {"omega": omega, "mass": mass, "dt": np.array(EULER_STEPS)},
        euler_values(ReferenceModel.from_arrays(arrays), omega, mass, EULER_STEPS),
        {k: EXACT for k in ("energy", "dissipation", "energy_after_step")},
        {"omega": "[N, k] the particles", "mass": "[N] their masses", "dt": "[3] step sizes",
         "energy": "E before the step", "dissipation": "I = sum_i m_i |grad Phi(omega_i)|^2 before the step",
         "energy_after_step": "[3] E after one explicit Euler step of each dt"}))
    base = Problem.from_config(loads_config(_config(0.0))).arrays()
    sigma = -float(zero_head_spectrum(base)[0])   # lam = 0: the lowest eigenvalue is -sigma_max(K)
    for name, lam, verdict in (("dirac-unstable", 0.5 * sigma, "translation-unstable"),
                               ("dirac-stable", 2.0 * sigma, "stable")):
        lam = float(f"{lam:.3g}")
        text = _config(lam)
        arrays = Problem.from_config(loads_config(text)).arrays()
        spectrum = zero_head_spectrum(arrays)
        cases.append(ManufacturedCase(
            name, f"The zero head delta_0 in full coordinates, weight decay {lam:g} against sigma_max(K) = "
            f"{sigma:.4g}: H0 = Htr with eigenvalues lam, lam +- sigma_i(K) in closed form; verdict {verdict}.",
            text, arrays,
            {"point": np.zeros(len(arrays["theta0"]))},
            {"h0_spectrum": spectrum, "htr_spectrum": spectrum, "verdict": verdict},
            {"h0_spectrum": SPECTRUM, "htr_spectrum": SPECTRUM, "verdict": EXACT},
            {"point": "[k] the Dirac's location (0)",
             "h0_spectrum": "[k] eigenvalues of Hess_omega Phi(omega; delta_0) at 0, ascending",
             "htr_spectrum": "[k] eigenvalues of Hess e(w), e(w) = E(delta_w), at 0, ascending",
             "verdict": "translation-unstable if min Htr < 0, else splitting-unstable if min H0 < 0, else stable"}))
    return cases


# ---- the shipped cases -------------------------------------------------------------------------------------------
CASES = ref.case_names()


def test_the_shipped_cases_are_the_documented_set():
    assert CASES == ["dirac-stable", "dirac-unstable", "energy-step", "phi"]
    assert {c.name for c in ref.load_cases()} == set(CASES)
    with pytest.raises(KeyError, match="known: dirac-stable"):
        ref.load_case("nothing")


@pytest.mark.parametrize("name", CASES)
def test_the_config_defines_the_stored_problem(name):
    case = ref.load_case(name)
    arrays = Problem.from_config(loads_config(case.config)).arrays()
    for key, value in case.problem.items():
        if value is None:
            assert arrays[key] is None, key
        else:
            assert np.array_equal(np.asarray(arrays[key]), value), key


def test_the_stored_values_are_the_independent_models():
    """Regenerated from the independent model now, the stored numbers agree to rounding (not a stored re-read)."""
    fresh = {c.name: c for c in build_cases()}
    for name in CASES:
        case = ref.load_case(name)
        assert case.check(fresh[name].expected) == [], name


def test_the_closed_form_of_the_zero_head_is_the_independent_models_hessian():
    """The dense Hessian of Phi at 0 from the independent model (complex step through its hand-written gradient)
    has the closed-form spectrum; so does its one-head Hessian (the translation Hessian, by central differences of
    its gradient), which is the same matrix at the zero head."""
    case = ref.load_case("dirac-unstable")
    oracle, k = _oracle(case), len(case.inputs["point"])
    zero, one = np.zeros(k), np.ones(1)
    H0 = np.column_stack([oracle.hvp(zero, e, zero[None], one) for e in np.eye(k)])
    assert np.linalg.eigvalsh(0.5 * (H0 + H0.T)) == pytest.approx(case.expected["h0_spectrum"], abs=1e-10)

    def grad_e(w):
        return oracle.grad_phi(w, w[None], one)
    Htr = np.column_stack([(grad_e(1e-5 * e) - grad_e(-1e-5 * e)) / 2e-5 for e in np.eye(k)])
    assert np.linalg.eigvalsh(0.5 * (Htr + Htr.T)) == pytest.approx(case.expected["htr_spectrum"], abs=1e-7)


def pdeflow_values(case: ManufacturedCase, tmp_path: Path) -> dict:
    """What pdeflow computes for a case, keyed like its expected values."""
    cfg = loads_config(case.config)
    problem = Problem.from_config(cfg)
    x = case.inputs
    if case.name == "phi":
        ev = problem.evaluate(x["omega"], x["mass"])
        return {"logits": problem.logits(x["omega"], x["mass"]), "energy": ev.energy,
                "phi": problem.phi(x["query"], x["omega"], x["mass"]),
                "grad_phi": problem.grad_phi(x["query"], x["omega"], x["mass"]), "dissipation": ev.dissipation}
    if case.name == "energy-step":
        ev = problem.evaluate(x["omega"], x["mass"])
        after = [problem.energy(*_pdeflow_euler_step(problem, case.config, x["omega"], x["mass"], h))
                 for h in x["dt"]]   # pdeflow's own Euler stepper, one step from the case's measure
        return {"energy": ev.energy, "dissipation": ev.dissipation, "energy_after_step": np.array(after)}
    a = analyse_point(problem, x["point"], cfg.stability.tol)
    return {"h0_spectrum": a.h0_values, "htr_spectrum": a.htr_values, "verdict": a.verdict}


def _pdeflow_euler_step(problem: Problem, config: str, omega: np.ndarray, mass: np.ndarray, h: float):
    from pdeflow.solvers import make_stepper
    from pdeflow.solvers.base import State

    stepper = make_stepper(problem, loads_config(config, [f"solver.dt={float(h)!r}"]))
    state, _ = stepper.step(State(t=0.0, step=0, dt=h, fields={"omega": omega.copy(), "mass": mass.copy()}), h)
    return state.fields["omega"], state.fields["mass"]


@pytest.mark.parametrize("name", CASES)
def test_pdeflow_passes_every_manufactured_check(name, tmp_path):
    case = ref.load_case(name)
    assert case.check(pdeflow_values(case, tmp_path)) == []


def test_the_energy_step_values_obey_the_energy_identity():
    """E(after) - E + dt I is O(dt^2): halving dt quarters it (the stored numbers are a consistent energy and
    gradient, whichever code computed them)."""
    case = ref.load_case("energy-step")
    e = case.expected
    defect = e["energy_after_step"] - e["energy"] + case.inputs["dt"] * e["dissipation"]
    assert defect[:-1] / defect[1:] == pytest.approx([4.0, 4.0], rel=0.05)
    assert np.all(np.abs(defect) < 0.05 * case.inputs["dt"] * e["dissipation"])   # second order, small


@pytest.mark.parametrize("mistake", ["no weight decay in grad Phi", "equal masses", "no causal mask"])
def test_a_code_with_a_plausible_mistake_fails(mistake):
    case = ref.load_case("phi")
    arrays = dict(case.problem)
    x = dict(case.inputs)
    if mistake == "no weight decay in grad Phi":
        oracle = ReferenceModel.from_arrays(arrays)
        values = phi_values(oracle, x["omega"], x["mass"], x["query"])
        values["grad_phi"] = values["grad_phi"] - arrays["weight_decay"] * x["query"]
    elif mistake == "equal masses":
        values = phi_values(ReferenceModel.from_arrays(arrays), x["omega"], np.full(len(x["mass"]), 1 / len(x["mass"])),
                            x["query"])
    else:
        class Acausal(ReferenceModel):
            def attention(self, X, WQ, WK):
                S = self.scale * (X @ WQ.T) @ (X @ WK.T).T
                A = np.exp(S - S.max(axis=1, keepdims=True))
                return A / A.sum(axis=1, keepdims=True), X @ WQ.T, X @ WK.T
        values = phi_values(Acausal.from_arrays(arrays), x["omega"], x["mass"], x["query"])
    problems = case.check(values)
    assert problems and all("differs by" in p for p in problems)
    with pytest.raises(AssertionError, match="phi: "):
        case.assert_matches(values)


OTHER_PROJECT_TEST = '''
"""Another project's test suite: its own model (here a copy of a numpy model) against pdeflow's manufactured checks."""
import numpy as np
import pytest

import pdeflow.reference as ref
from my_model import ReferenceModel


def hessian(hvp, k):
    H = np.column_stack([hvp(e) for e in np.eye(k)])
    return np.linalg.eigvalsh(0.5 * (H + H.T))


@pytest.mark.parametrize("name", ref.case_names())
def test_my_model(name):
    case = ref.load_case(name)
    model, x = ReferenceModel.from_arrays(case.problem), case.inputs
    mine = {}
    if "query" in x:
        r = model.residuals(x["omega"], x["mass"])
        g = np.array([model.grad_phi_from_residuals(w, r) for w in x["omega"]])
        mine = {"logits": model.logits(x["omega"], x["mass"]), "energy": model.energy(x["omega"], x["mass"]),
                "phi": [model.phi_from_residuals(q, r) for q in x["query"]],
                "grad_phi": [model.grad_phi_from_residuals(q, r) for q in x["query"]],
                "dissipation": x["mass"] @ (g * g).sum(axis=1)}
    elif "dt" in x:
        r = model.residuals(x["omega"], x["mass"])
        g = np.array([model.grad_phi_from_residuals(w, r) for w in x["omega"]])
        mine = {"energy_after_step": [model.energy(x["omega"] - h * g, x["mass"]) for h in x["dt"]]}
    else:
        w, one = x["point"], np.ones(1)
        h0 = hessian(lambda v: model.hvp(w, v, w[None], one), len(w))
        mine = {"h0_spectrum": h0, "verdict": "stable" if h0[0] > 1e-8 else "translation-unstable"}
    case.assert_matches(mine, partial=True)
'''


def test_another_projects_suite_runs_the_checks_from_outside_the_checkout(tmp_path):
    shutil.copy(HERE / "reference_model.py", tmp_path / "my_model.py")
    (tmp_path / "test_other.py").write_text(textwrap.dedent(OTHER_PROJECT_TEST))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "test_other.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 passed" in proc.stdout
    probe = subprocess.run([sys.executable, "-c", "import pdeflow.reference as r; print(r.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0 and not Path(probe.stdout.strip()).is_relative_to(tmp_path)


if __name__ == "__main__":   # regenerate the shipped cases
    CASES_FOLDER.mkdir(exist_ok=True)
    for case in build_cases():
        write_case(CASES_FOLDER / f"{case.name}.json", case)
        print(CASES_FOLDER / f"{case.name}.json")
