"""Shared helpers of the core tests: small problems from TOML text or from raw arrays, random measures.

``make_problem(**overrides)`` (fixture) builds ``Problem.from_config(loads_config(toml_text))`` from a
small base config; overrides are ``section={key: value}`` tables merged into it, e.g.
``make_problem(model={"coordinates": "gain2"}, task={"name": "lookback", "lag": 1})``.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# The suite runs the default kernel variant: a plan remembered on this machine by `pdeflow bench` or
# `pdeflow tune` (pdeflow.core.tuner) would change chunk sizes that tests count on; set before pdeflow is
# imported (pdeflow.core.jit reads the remembered vector width), inherited by subprocesses.
os.environ.setdefault("PDEFLOW_TUNE", "off")

# Under pytest-xdist (the README's test command runs two workers, `-n 2 --dist loadfile`), each worker is one
# process on one core: one numba thread each (two workers of two threads would fight for two cores), inherited
# by the processes a test starts. The workers and those processes share numba's cache in the checkout: a kernel
# is compiled once, by whichever process needs it first, while the others wait for it and load it
# (pdeflow.core.jit.compile_serially; tests/core/test_compile_cache.py).
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _XDIST_WORKER:
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")

from pdeflow.core.config import Config, dumps_toml, loads_config  # noqa: E402 - after the environment is set
from pdeflow.core.problem import Problem  # noqa: E402

# The folders mirror the package (tests/README.md); a test module imports another's helpers by its name from any
# folder, so every folder is importable whichever file pytest is asked to run.
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if _folder.is_dir() and _folder.name[0] not in "._" and str(_folder) not in sys.path:
        sys.path.append(str(_folder))

# Small everything (the suite must stay fast): V = 3, T = 3, d = 7, dh = 2, so p = 56.
BASE: dict[str, dict[str, Any]] = {
    "task": {"name": "markov", "vocab_size": 3, "seq_len": 3, "exact": True, "concentration": 0.7},
    "model": {"d": 7, "head_dim": 2, "weight_decay": 0.05, "family_scale": 3.0, "family_seed": 1},
}


def config_text(**overrides: dict[str, Any]) -> str:
    """TOML text of BASE updated with ``section={key: value}`` overrides."""
    data = {name: dict(values) for name, values in BASE.items()}
    for name, values in overrides.items():
        if name == "task" and values.get("name", "markov") != "markov":
            data["task"] = {}  # markov's own keys (concentration) are refused by other tasks
        data.setdefault(name, {}).update(values)
    return dumps_toml(data)


# the lookback problem of the stability, rates-at-a-minimum and Hessian tests: V = T = 3, lag 1, exact data, d = 4,
# dh = 2, sinusoidal positions, weight decay 0.05
LOOKBACK: dict[str, dict[str, Any]] = {
    "task": {"name": "lookback", "vocab_size": 3, "seq_len": 3, "lag": 1, "exact": True},
    "model": {"d": 4, "head_dim": 2, "positions": "sinusoidal", "weight_decay": 0.05},
}


def lookback_text(**overrides: dict[str, Any]) -> str:
    """TOML text of LOOKBACK updated with ``section={key: value}`` overrides."""
    data = {name: dict(values) for name, values in LOOKBACK.items()}
    for name, values in overrides.items():
        data.setdefault(name, {}).update(values)
    return dumps_toml(data)


def build_config(**overrides: dict[str, Any]) -> Config:
    return loads_config(config_text(**overrides))


def build_problem(**overrides: dict[str, Any]) -> Problem:
    return Problem.from_config(build_config(**overrides))


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands out whole files (--dist loadfile) and by default the files with the most tests first;
    # pdeflow's longest tests sit in files with few tests, which then ran last, one worker idle meanwhile.
    # Collection order instead, with the files holding `slow` tests first (pytest_collection_modifyitems).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with a test marked ``slow`` run first (stable order otherwise): started early, the longest runs
    overlap the many short tests of the other worker instead of ending the suite alone. A file of more than about
    15 s marks its longest tests ``slow`` for this: a long file among the last ones kept one worker busy for up to
    20 s after the other had finished."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture
def make_problem():
    """``make_problem(**overrides) -> Problem`` built through TOML text and ``Problem.from_config``."""
    return build_problem


@pytest.fixture
def make_config():
    """``make_config(**overrides) -> Config`` parsed from TOML text."""
    return build_config


def rel_err(a, b) -> float:
    """Norm-wise relative difference ``|a - b| / |b|`` (``|a - b|`` when b = 0)."""
    a = np.asarray(a, dtype=complex if np.iscomplexobj(a) else float)
    b = np.asarray(b, dtype=complex if np.iscomplexobj(b) else float)
    den = float(np.linalg.norm(np.ravel(b)))
    num = float(np.linalg.norm(np.ravel(a - b)))
    return num / den if den > 0 else num


def random_measure(k: int, n: int, rng: np.random.Generator, scale: float = 1.0,
                   uniform: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """n particles N(0, scale^2 I_k) with Dirichlet (non-uniform) masses summing to 1, or 1/n."""
    omega = scale * rng.standard_normal((n, k))
    mass = np.full(n, 1.0 / n) if uniform else rng.dirichlet(np.full(n, 2.0))
    return omega, mass


def random_mask_and_weights(B: int, T: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A 0/1 mask with zeros (at least one 1 per row) and non-uniform weights summing to 1."""
    mask = (rng.random((B, T)) < 0.6).astype(float)
    mask[np.arange(B), rng.integers(0, T, size=B)] = 1.0
    mask[0, :] = 1.0
    mask[0, 0] = 0.0 if T > 1 else 1.0          # at least one zero somewhere
    weights = rng.random(B) ** 2 + 1e-3
    return mask, weights / weights.sum()


def with_random_data(problem: Problem, rng: np.random.Generator) -> Problem:
    """The same layer built directly with ``Problem(arrays)``, with masks with zeros and non-uniform weights."""
    arrays = problem.arrays()
    B, T = arrays["tokens"].shape
    mask, weights = random_mask_and_weights(B, T, rng)
    arrays = dict(arrays, mask=mask, weights=weights)
    return Problem(arrays, precision=problem.precision, beta=problem.beta)


def random_arrays(rng: np.random.Generator, V: int = 4, T: int = 4, d: int = 6, dh: int = 2, B: int = 9,
                  k: int | None = None, score_scale: float = 0.8, weight_decay: float = 0.07) -> dict[str, Any]:
    """A fully random problem for ``Problem(arrays)``: gaussian tables, random data, optional random basis."""
    p = 4 * d * dh
    mask, weights = random_mask_and_weights(B, T, rng)
    return {
        "embedding": rng.normal(size=(V, d)), "positions": 0.5 * rng.normal(size=(T, d)),
        "unembedding": rng.normal(size=(V, d)) / math.sqrt(d),
        "tokens": rng.integers(0, V, size=(B, T)), "targets": rng.integers(0, V, size=(B, T)),
        "mask": mask, "weights": weights,
        "theta0": np.zeros(p) if k is None else 0.3 * rng.normal(size=p),
        "basis": None if k is None else rng.normal(size=(p, k)) / math.sqrt(p) * 4,
        "head_dim": dh, "score_scale": score_scale, "weight_decay": weight_decay,
    }


@pytest.fixture(scope="module")
def one_numba_thread():
    """One numba thread for a whole test module (``pytestmark = pytest.mark.usefixtures("one_numba_thread")``):
    tiny kernels on a loaded 2-core machine run many times faster on one thread than on two."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


@pytest.fixture(scope="module")
def one_blas_thread():
    """One BLAS thread for a whole test module (when threadpoolctl is installed): small dense products
    (grid solvers) also run many times faster on one thread than on two on a loaded 2-core machine."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1):
        yield


def symmetric_particle_jacobian(problem: Problem, omega: np.ndarray, mass: np.ndarray, step: float) -> np.ndarray:
    """``M^{1/2} J M^{-1/2}`` [N k, N k] of the particle system, ``J = d grad Phi_i / d omega_j`` (the measure moving
    with the particles) by central differences of step ``step``: the dense reference of the stability checks."""
    columns = []
    for e in np.eye(omega.size):
        d = e.reshape(omega.shape) * step
        plus, minus = omega + d, omega - d
        difference = problem.grad_phi(plus, plus, mass) - problem.grad_phi(minus, minus, mass)
        columns.append((difference / (2 * step)).ravel())
    jacobian = np.array(columns).T
    root = np.repeat(np.sqrt(mass), omega.shape[1])
    return root[:, None] * jacobian / root[None, :]
