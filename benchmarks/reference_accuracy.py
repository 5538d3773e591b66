"""``python -m pdeflow.benchmarks.reference_accuracy [--out FOLDER]``: the accuracy of each golden file of
data/reference, measured against a tighter run of the same problem.

For each reference problem the shipped config is run as shipped and again with the tighter settings of
:data:`TIGHTER` (a smaller step, tighter tolerances, a finer grid); :func:`pdeflow.io.reference.compare` then gives,
per quantity and over the shared frames, the largest difference relative to the tighter run's size (energy,
dissipation, logits: ``|a - b| / |b|``; W2 / sliced W2: ``W2 / radius``). The tighter run is the estimate of the exact
flow, so these numbers are the golden file's discretisation error (an estimate: it assumes the tighter run is at least
10 times more accurate, which the method's order gives for the step sizes here). data/reference/README.md records the
output. SGD has no tighter run of the same process (its noise and batches define it): it is compared with the
mean-field flow it approximates (RK4 at dt = 0.005 from the same start), which is its distance from the flow, not an
error of the file.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from pdeflow.solvers.driver import run

from pdeflow import Problem, load_config
from pdeflow.io.reference import compare

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference"
# The tighter run of each problem: config overrides as (section, {key: value}).
TIGHTER: dict[str, dict[str, dict]] = {
    "particles-rk4": {"solver": {"dt": 0.05 / 8}},
    "particles-adaptive": {"solver": {"rtol": 1e-11, "atol": 1e-13}},
    "particles-sgd": {"solver": {"method": "rk4", "dt": 0.005}},
    "particles-jko": {"solver": {"dt": 0.25 / 8, "tau": 0.25 / 8}},
    "grid-fv-entropy": {"grid": {"n": 48}, "solver": {"cfl": 0.2}},
}


def measure(name: str, folder: Path) -> dict[str, float]:
    """The largest relative difference per quantity between the shipped run of ``name`` and its tighter run."""
    cfg = load_config(REFERENCE / f"{name}.toml")
    tight = cfg.replace(**TIGHTER[name])
    paths = {}
    for label, c in (("shipped", cfg), ("tighter", tight)):
        paths[label] = folder / f"{name}-{label}.h5"
        result = run(c, Problem.from_config(c), paths[label], quiet=True, overwrite=True)
        assert result.exit_code == 0, result.message
    rows = compare(paths["shipped"], paths["tighter"], rtol=1.0, atol=0.0, allow_partial=True).rows
    out: dict[str, float] = {}
    for r in rows:
        out[r.quantity] = max(out.get(r.quantity, 0.0), r.value / r.allowed if r.allowed > 0 else r.value)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks.reference_accuracy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", default=list(TIGHTER), help="problems to measure")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pdeflow-reference-accuracy-") as tmp:
        for name in args.only:
            start = time.perf_counter()
            values = measure(name, Path(tmp))
            shown = ", ".join(f"{q} {v:.2g}" for q, v in values.items())
            print(f"{name}: {shown} (against {TIGHTER[name]}; {time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
