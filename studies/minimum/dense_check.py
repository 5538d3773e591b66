"""The independent check of a certified minimum (issue 43's acceptance): the verdict and lambda_min of the
certificate a ``pdeflow stationary`` result file carries, against a dense eigen-decomposition of S off the symmetry
directions on the live heads, plus the origin block.

``python -m studies.minimum.dense_check RESULT.h5 [--products 3] [--out DIR]``:

1. ``C = B^T S B`` on the live heads (``B`` the per-head orthonormal complements of the symmetry tangents, as the
   certificate takes them), assembled from S's structure (:func:`pdeflow.core.hessian_assembly.assemble_hessian`),
   and checked against S itself: for ``--products`` random coordinate vectors ``y``, ``B^T (S (B y))`` with ``S x``
   the exact forward-mode product (:func:`pdeflow.analysis.hessian.spectrum.hessian_operator`, no assembly) equals ``C
   y``
   (the largest relative difference is reported);
2. LAPACK's symmetric eigensolver (``scipy.linalg.eigh``, driver ``evr``, the lowest :data:`PAIRS` eigenvalues) on
   the symmetric part ``A`` of ``C``: backward stable, so each computed value lies within ``delta = n eps |A|_F +
   |C - C^T|_F`` of an eigenvalue of the exact matrix (Weyl; the bound of
   :func:`pdeflow.analysis.certificate.certificate.eigenvalue_bound`). No Cholesky factorisation, no Rump bound, no
   Lanczos:
   nothing of the certificate's proof;
3. the heads at the origin: the block ``Hess Phi(0; rho)`` [k, k]
  (:func:`pdeflow.analysis.hessian.spectrum.origin_block`,
   k exact products) and its eigenvalues.

The dense verdict is "minimum" when the lowest value minus delta is positive. Compared with the file's
certificate: the dense lambda_min inside the certificate's bracket ``[lambda_min_lower, lambda_min_upper]`` (a proof,
as wide as its worst-case rounding bound), and its relative distance from the file's ``lambda_min`` estimate (the
certificate's computed value, :attr:`pdeflow.analysis.stationary.stationary.StationaryPoint.lambda_min`; files written
before
2026-12-05 stored the lowest converged Ritz value there, which the structured route's short Lanczos run could leave
above lambda_min) and from the bracket's ends.
Writes ``dense_check.json`` into DIR with the CPU model and load before and after.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PAIRS = 3  # lowest eigenvalues of the live block computed


def dense_check(path: str | Path, products: int = 3, log=print) -> dict[str, Any]:
    """Steps 1-3 of the module docstring at the point of the result file ``path``: the numbers, the verdicts and
    the comparison with the file's certificate."""
    import scipy.linalg

    from pdeflow.analysis.certificate.certificate import complement_basis, embedded, symmetric_part
    from pdeflow.analysis.hessian.spectrum import head_symmetries, hessian_operator, origin_block, origin_is_stationary
    from pdeflow.analysis.stationary.stationary import read_stationary
    from pdeflow.core.hessian_assembly import assemble_hessian
    from pdeflow.io.problem_file import stored_problem

    r = read_stationary(path)
    problem = stored_problem(path)
    omega, mass = np.asarray(r["omega"], dtype=float), np.asarray(r["mass"], dtype=float)
    N, k = omega.shape
    dead = np.all(omega == 0.0, axis=1)
    if not (dead.any() and not dead.all() and origin_is_stationary(problem, omega, mass)):
        dead = np.zeros(N, dtype=bool)
    live = np.flatnonzero(~dead)
    sym = head_symmetries(problem, omega[live])
    bases = [complement_basis(sym.blocks[i], int(sym.counts[i])) for i in range(live.size)]
    walls: dict[str, float] = {}

    t0 = time.perf_counter()
    C = assemble_hessian(problem, omega, mass, heads=live, bases=bases)
    walls["assembly"] = time.perf_counter() - t0
    n = C.shape[0]
    log(f"C assembled on {live.size} live heads: n = {n} ({walls['assembly']:.1f} s)")

    t0 = time.perf_counter()
    op = hessian_operator(problem, omega[live], mass[live], np.zeros((live.size * k, 0)))
    rng = np.random.default_rng(43)
    product_error = 0.0
    for _ in range(products):
        y = rng.standard_normal(n)
        x = embedded(y[:, None], bases, k)[:, 0]
        Sx = op.matvec(x)
        exact = np.concatenate([bases[i].T @ Sx[i * k:(i + 1) * k] for i in range(live.size)])
        product_error = max(product_error, float(np.linalg.norm(C @ y - exact) / np.linalg.norm(exact)))
    walls["products"] = time.perf_counter() - t0
    log(f"C y against {products} exact products B^T S B y: largest relative difference {product_error:.2e}")

    t0 = time.perf_counter()
    asymmetry = symmetric_part(C)
    delta = n * np.finfo(float).eps * float(np.linalg.norm(C)) + asymmetry
    values = scipy.linalg.eigh(C, eigvals_only=True, subset_by_index=[0, PAIRS - 1], driver="evr",
                               overwrite_a=True, check_finite=False)
    del C
    walls["eigh"] = time.perf_counter() - t0
    log(f"eigh (evr): lowest {', '.join(f'{v:.10g}' for v in values)}, delta {delta:.2e} ({walls['eigh']:.1f} s)")

    origin: dict[str, Any] = {"heads": int(dead.sum())}
    lowest, low_delta = float(values[0]), float(delta)
    if dead.any():
        o_values, _, o_residuals = origin_block(problem, omega, mass)
        o_delta = k * np.finfo(float).eps * float(np.linalg.norm(o_values))
        origin |= {"lowest": float(o_values[0]), "delta": o_delta, "residual": float(o_residuals[0])}
        if o_values[0] < lowest:
            lowest, low_delta = float(o_values[0]), o_delta
        log(f"origin block ({int(dead.sum())} heads): lowest {o_values[0]:.10g}")

    lower, upper, estimate = float(r["lambda_min_lower"]), float(r["lambda_min_upper"]), float(r["lambda_min"])
    inside = lower <= lowest + low_delta and lowest - low_delta <= upper
    return {"result": str(path), "energy": float(r["energy"]), "certified": bool(r["certified"]),
            "certificate": r["certificate_text"], "certificate_lower": lower, "certificate_upper": upper,
            "live_heads": int(live.size), "n": int(n), "product_check": product_error, "lowest_live": values.tolist(),
            "delta": float(delta), "asymmetry": float(asymmetry), "origin": origin, "lambda_min": lowest,
            "dense_verdict": "minimum" if lowest - low_delta > 0 else "not proven",
            "inside_bracket": bool(inside), "estimate": estimate,
            "relative_to_estimate": abs(estimate - lowest) / abs(lowest),
            "relative_to_upper": abs(upper - lowest) / abs(lowest),
            "relative_to_lower": abs(lowest - lower) / abs(lowest), "walls": walls}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studies.minimum.dense_check", description=__doc__.splitlines()[0])
    p.add_argument("result", help="a pdeflow stationary result file")
    p.add_argument("--products", type=int, default=3, help="exact products the assembly is checked against (3)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    from pdeflow.benchmarks.common import machine

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    res = dense_check(args.result, args.products, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    res |= {"wall": time.perf_counter() - t0, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "machine": machine(), "load_before": load_before, "load_after": list(os.getloadavg()),
            "threads": os.environ.get("NUMBA_NUM_THREADS", "default")}
    (out / "dense_check.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    verdict = "certified" if res["certified"] else "not certified"
    print(f"dense lambda_min {res['lambda_min']:.10g} ({res['dense_verdict']}); certificate "
          f"[{res['certificate_lower']:.10g}, {res['certificate_upper']:.10g}] ({verdict}); "
          f"inside: {res['inside_bracket']}; the file's estimate {res['estimate']:.10g} "
          f"({res['relative_to_estimate']:.1e} relative)")
    return 0 if math.isfinite(res["lambda_min"]) else 1


if __name__ == "__main__":
    sys.exit(main())
