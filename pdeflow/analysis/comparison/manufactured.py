"""Manufactured checks for other codes: small problems with known answers that exercise a code's model, not only its
stepper. Each case is one JSON file of :data:`CASES_FOLDER` (shipped inside the package): a pdeflow config (TOML
text), the explicit problem it defines (the arrays of :meth:`pdeflow.Problem.arrays`, so another code needs neither
pdeflow's tasks nor its config reader), the inputs, the expected values with their tolerances, and what each value
is. The public front door is :mod:`pdeflow.reference` (docs/guide.md, "Checking another code").

The expected values come from outside pdeflow's model code: ``phi`` and ``energy-step`` from the slow independent
numpy model of docs/model.md (tests/reference_model.py), ``dirac-*`` in closed form (below); pdeflow's test suite
asserts that pdeflow reproduces every one of them (tests/analysis/test_manufactured.py), and that the independent model
reproduces the stored numbers.

Closed form of the zero head (``dirac-*``, full coordinates). At ``w = 0`` every head's feature vanishes, so the
logits of ``delta_0`` are 0, the residual is ``r[b, l] = 1/V - onehot(y[b, l])`` and ``G[b, l] = lw[b, l] U^T r[b, l]``
[d]; the attention is the causal mean, ``xbar[b, l] = mean_{j <= l} x_j(b)``. To second order
``Phi(omega) = sum_h WV[h, :] K WO[:, h] + (lam/2) |omega|^2`` with ``K = sum_{b,l} xbar[b, l] G[b, l]^T`` [d, d],
so ``H0`` has the eigenvalues ``lam`` (``2 d dh`` times, the WQ and WK block) and ``lam +- sigma_i(K)`` (each ``dh``
times); the feature's Jacobian vanishes at 0, so ``M = 0`` and ``Htr = H0``. The Dirac is *translation-unstable*
when ``sigma_max(K) > lam`` (growth rate ``sigma_max - lam``) and *stable* when ``sigma_max(K) < lam``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CASES_FOLDER = Path(__file__).resolve().parent / "manufactured_cases"
# the arrays of a problem (Problem.arrays()) and which of them are integers
PROBLEM_KEYS = ("embedding", "positions", "unembedding", "theta0", "basis", "tokens", "targets", "mask", "weights",
                "head_dim", "score_scale", "weight_decay")
INTEGER_KEYS = ("tokens", "targets", "head_dim")


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol |expected|`` elementwise (text values: equal)."""
    rtol: float
    atol: float

    def allowed(self, expected: np.ndarray) -> np.ndarray:
        return self.atol + self.rtol * np.abs(expected)


@dataclass
class ManufacturedCase:
    """One manufactured check: ``config`` (TOML text for pdeflow), ``problem`` (the explicit arrays, keys of
    :data:`PROBLEM_KEYS`; ``basis`` None in full coordinates), ``inputs`` and ``expected`` (name -> array or text),
    ``tolerances`` (name -> :class:`Tolerance`) and ``meaning`` (name -> what the value is, shapes included)."""
    name: str
    description: str
    config: str
    problem: dict[str, Any]
    inputs: dict[str, Any]
    expected: dict[str, Any]
    tolerances: dict[str, Tolerance]
    meaning: dict[str, str] = field(default_factory=dict)

    def check(self, actual: dict[str, Any], partial: bool = False) -> list[str]:
        """One line per value of ``actual`` outside its tolerance (or of another shape, or unknown), and per expected
        value missing from ``actual`` unless ``partial``; an empty list means the code passes."""
        problems = [f"{self.name}: no expected value named {key!r} (known: {', '.join(self.expected)})"
                    for key in actual if key not in self.expected]
        if not partial:
            problems += [f"{self.name}: {key} missing" for key in self.expected if key not in actual]
        for key in (k for k in self.expected if k in actual):
            problems += _mismatch(f"{self.name}: {key}", actual[key], self.expected[key], self.tolerances[key])
        return problems

    def assert_matches(self, actual: dict[str, Any], partial: bool = False) -> None:
        """:meth:`check`, raising AssertionError with every problem (for another code's test suite)."""
        problems = self.check(actual, partial)
        if problems:
            raise AssertionError("\n".join(problems))


def _mismatch(label: str, actual: Any, expected: Any, tol: Tolerance) -> list[str]:
    if isinstance(expected, str):
        return [] if actual == expected else [f"{label}: {actual!r}, expected {expected!r}"]
    a, e = np.asarray(actual, dtype=float), np.asarray(expected, dtype=float)
    if a.shape != e.shape:
        return [f"{label}: shape {a.shape}, expected {e.shape}"]
    excess = np.abs(a - e) - tol.allowed(e)
    if not np.all(excess <= 0):    # nan fails too
        i = int(np.nanargmax(np.where(np.isnan(excess), np.inf, excess)))
        return [f"{label}: differs by {float(np.abs(a - e).flat[i]):.3g} at index {np.unravel_index(i, e.shape)} "
                f"(allowed {tol.atol:g} + {tol.rtol:g} |expected| = {float(tol.allowed(e).flat[i]):.3g})"]
    return []


def _array(value: Any, integer: bool = False) -> Any:
    if value is None or isinstance(value, str):
        return value
    return np.asarray(value, dtype=np.int64 if integer else float)


def case_names() -> list[str]:
    """The names of the shipped cases, sorted."""
    return sorted(p.stem for p in CASES_FOLDER.glob("*.json"))


def load_case(name: str) -> ManufacturedCase:
    """The shipped case ``name`` (:func:`case_names`); KeyError naming the known ones for another name."""
    path = CASES_FOLDER / f"{name}.json"
    if not path.is_file():
        raise KeyError(f"no manufactured case {name!r}; known: {', '.join(case_names())}")
    raw = json.loads(path.read_text(encoding="utf-8"))
    problem = {key: _array(raw["problem"].get(key), key in INTEGER_KEYS) for key in PROBLEM_KEYS}
    for key in ("head_dim", "score_scale", "weight_decay"):
        problem[key] = raw["problem"][key]
    return ManufacturedCase(
        name=name, description=raw["description"], config=raw["config"], problem=problem,
        inputs={k: _array(v) for k, v in raw["inputs"].items()},
        expected={k: _array(v) for k, v in raw["expected"].items()},
        tolerances={k: Tolerance(*raw["tolerances"][k]) for k in raw["expected"]},
        meaning=dict(raw.get("meaning", {})))


def load_cases() -> list[ManufacturedCase]:
    """Every shipped case."""
    return [load_case(name) for name in case_names()]


def as_json(value: Any) -> Any:
    """A value for a case file: arrays as nested lists (floats written to round-trip exactly)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    return value


def write_case(path: str | Path, case: ManufacturedCase) -> None:
    """Write a case file (the generator of the shipped cases, tests/analysis/test_manufactured.py)."""
    raw = {"description": case.description, "config": case.config,
           "problem": {k: as_json(v) for k, v in case.problem.items()},
           "inputs": {k: as_json(v) for k, v in case.inputs.items()},
           "expected": {k: as_json(v) for k, v in case.expected.items()},
           "tolerances": {k: [t.rtol, t.atol] for k, t in case.tolerances.items()},
           "meaning": case.meaning}
    Path(path).write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")


def zero_head_spectrum(problem: dict[str, Any]) -> np.ndarray:
    """The eigenvalues (ascending) [p] of ``H0 = Htr`` at the zero head of a full-coordinate problem, in closed form
    (module docstring), from the arrays alone with numpy."""
    E, P, U = (np.asarray(problem[k], dtype=float) for k in ("embedding", "positions", "unembedding"))
    tokens, targets = np.asarray(problem["tokens"]), np.asarray(problem["targets"])
    mask, weights = np.asarray(problem["mask"], dtype=float), np.asarray(problem["weights"], dtype=float)
    lam, dh = float(problem["weight_decay"]), int(problem["head_dim"])
    V, d = E.shape
    T = P.shape[0]
    x = E[tokens] + P[None, :T]                                        # [B, T, d]
    xbar = np.cumsum(x, axis=1) / np.arange(1, T + 1)[None, :, None]   # the causal mean
    lw = weights[:, None] * mask / mask.sum(axis=1, keepdims=True)     # [B, T]
    r = np.full((*tokens.shape, V), 1.0 / V)
    np.put_along_axis(r, targets[..., None], r.take(0) - 1.0, axis=2)
    G = lw[..., None] * (r @ U)                                        # [B, T, d]
    K = np.einsum("bli,blj->ij", xbar, G)
    sigma = np.linalg.svd(K, compute_uv=False)
    values = np.concatenate([np.full(2 * d * dh, lam), np.repeat(lam + sigma, dh), np.repeat(lam - sigma, dh)])
    return np.sort(values)


__all__ = ["ManufacturedCase", "Tolerance", "case_names", "load_case", "load_cases", "write_case",
           "zero_head_spectrum", "CASES_FOLDER"]
