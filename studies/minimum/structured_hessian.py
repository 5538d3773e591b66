"""The structured Hessian at the shipped minimum of data/configs/longtime.toml (issue 43; record STRUCTURED_HESSIAN.md).

    python -m studies.minimum.structured_hessian [--skip-certificate] [-o STRUCTURED_HESSIAN.json]

At data/stationary/longtime-minimum-from-t0.h5 (N = 128 heads, k = 256, the live heads those not exactly at 0):
times :func:`pdeflow.core.hessian_assembly.assemble_hessian` on the live heads, checks ``S v`` against the exact
whole-system product (:func:`pdeflow.analysis.hessian.spectrum.hessian_operator`, no projection) for 3 seeded random v,
then times the Cholesky certificate (:func:`pdeflow.analysis.certificate.certificate.certify`, default route, from a
20-step
Lanczos run on the live heads) and compares its bracket with the shipped dense certificate's; then its stages one
by one, and the bound with the shipped converged Lanczos value as the estimate (one factorisation). Peak memory is the
process's ``ru_maxrss`` after each stage; the load is ``os.getloadavg`` before and after.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from pdeflow.analysis.certificate.certificate import (
    certify,
    cholesky_bound,
    complement_basis,
    symmetric_part,
)
from pdeflow.analysis.hessian.spectrum import head_symmetries, hessian_operator, spectrum_ends
from pdeflow.analysis.stationary.stationary import read_stationary
from pdeflow.core.hessian_assembly import assemble_hessian
from pdeflow.core.jit import num_threads
from pdeflow.core.tuner import cpu_model
from pdeflow.io.problem_file import stored_problem

POINT = Path(__file__).resolve().parents[2] / "data" / "stationary" / "longtime-minimum-from-t0.h5"
LANCZOS_STEPS = 20


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB -> GB on Linux


def measure(certificate: bool = True) -> dict[str, Any]:
    r = read_stationary(POINT)
    problem = stored_problem(POINT)
    omega, mass = np.asarray(r["omega"]), np.asarray(r["mass"])
    live = np.flatnonzero(~np.all(omega == 0.0, axis=1))
    k = problem.k
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
                           "threads": num_threads(), "load_before": list(os.getloadavg()), "heads": len(omega),
                           "live_heads": int(live.size), "k": k, "n_live": int(live.size) * k}
    t0 = time.perf_counter()
    S = assemble_hessian(problem, omega, mass, heads=live)
    res["assemble_wall"] = time.perf_counter() - t0
    res["assemble_peak_gb"] = peak_gb()
    res["asymmetry_fro"] = float(np.linalg.norm(S - S.T))
    op = hessian_operator(problem, omega[live], mass[live], np.zeros((S.shape[0], 0)))
    rng = np.random.default_rng(43)
    errors, t0 = [], time.perf_counter()
    for _ in range(3):
        v = rng.standard_normal(S.shape[0])
        exact = op.matvec(v)
        errors.append(float(np.linalg.norm(S @ v - exact) / np.linalg.norm(exact)))
    res["product_wall_each"] = (time.perf_counter() - t0) / 3
    res["sv_relative_errors"] = errors
    res["shipped"] = {"lower": r["lambda_min_lower"], "upper": r["lambda_min_upper"], "lambda_min": r["lambda_min"],
                      "certificate_wall": r["certificate_wall"], "certificate_size": r["certificate_size"],
                      "certificate_products": r["certificate_products"]}
    del S
    if certificate:
        t0 = time.perf_counter()
        ends = spectrum_ends(problem, omega, mass, krylov_dim=LANCZOS_STEPS, split_origin=True)
        res["lanczos_wall"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cert = certify(problem, omega, mass, ends, dense_limit=16384)
        res["certify_wall"] = time.perf_counter() - t0
        res["certify_peak_gb"] = peak_gb()
        res["certificate"] = {"kind": cert.kind, "lower": cert.lower, "upper": cert.upper, "size": cert.size,
                              "delta": cert.delta, "products": cert.products, "theta": float(cert.values[0]),
                              "proven_minimum": cert.proven_minimum, "text": cert.describe()}
        lam = r["lambda_min"]
        res["theta_vs_shipped_relative"] = abs(float(cert.values[0]) - lam) / lam
        res["within_shipped_interval"] = bool(r["lambda_min_lower"] <= cert.values[0] <= r["lambda_min_upper"])
        del cert
        # the certificate's stages once more, one by one: C = B^T S B from the structure, its symmetric part, the bound
        sym = head_symmetries(problem, omega[live])
        bases = [complement_basis(sym.blocks[i], int(sym.counts[i])) for i in range(live.size)]
        t0 = time.perf_counter()
        C = assemble_hessian(problem, omega, mass, heads=live, bases=bases)
        stages = {"assemble_C": time.perf_counter() - t0}
        t0 = time.perf_counter()
        symmetric_part(C)
        stages["symmetric_part"] = time.perf_counter() - t0
        bound = cholesky_bound(C)
        stages.update(bound.walls)
        res["stages"] = stages
        res["stages_load"] = list(os.getloadavg())
        res["shift_tries"] = bound.tries
        # the route's case: a converged Lanczos value (the shipped search's, residual 1.2e-11) as the estimate
        t0 = time.perf_counter()
        quick = cholesky_bound(C, estimate=float(r["lowest_ritz"]))
        res["estimate_stage"] = {"wall": time.perf_counter() - t0, "walls": quick.walls, "lower": quick.lower,
                                 "upper": quick.upper, "theta": quick.theta, "load": list(os.getloadavg())}
    res["load_after"] = list(os.getloadavg())
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-certificate", action="store_true", help="only the assembly and the product check")
    ap.add_argument("-o", "--output", default=str(Path(__file__).with_name("STRUCTURED_HESSIAN.json")))
    args = ap.parse_args(argv)
    res = measure(certificate=not args.skip_certificate)
    text = json.dumps(res, indent=2)
    Path(args.output).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
