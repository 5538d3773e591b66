"""``pdeflow stability CONFIG|FILE -o OUT.h5``: Dirac stationary measures, their stability, checked by simulation;
``pdeflow stability --stationary RESULT -o RATES.h5``: the rates at a certified local minimum (any measure).

Finds the stationary Diracs of the config's problem (or of the problem a pdeflow FILE stores, run with its stored
config: the task's data from the file), computes ``H0``, ``Htr``, verdicts and optimality gaps,
integrates perturbed particle systems (:func:`pdeflow.analysis.dirac.stability.simulate`: RK4 through the shared time
loop)
and compares the measured exponential rates with the predicted ones, then sweeps the zero head over
``stability.weight_decays`` (:mod:`pdeflow.analysis.dirac.stability`). Writes ``/stability`` into OUT.h5 and three PNG
figures beside it: ``<OUT>-spectra.png``, ``<OUT>-rates.png`` and (with a sweep) ``<OUT>-sweep.png``.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from ..analysis.certificate.certificate import DENSE_LIMIT
from ..analysis.dirac.stability import MEAN, SPREAD, StabilityResult, run_stability, write_stability
from ..analysis.hessian.spectrum import KRYLOV_DIM
from ..analysis.linearised.minimum_rates import (
    ENGINES,
    FROZEN,
    LOG_CHANGE_AT_MINIMUM,
    RK4_MAX_STEPS,
    SAMPLES_AT_MINIMUM,
)
from ..core.exit_codes import EXIT_OK, HELP
from ..io.problem_file import config_and_problem
from .cli_figures import add_figure_arguments, figure_dpi


def cmd_stability(args: argparse.Namespace) -> int:
    from .cli import UsageError, new_output_path

    if args.stationary is not None:
        return cmd_minimum_rates(args)
    if args.config is None:
        raise UsageError("stability needs a CONFIG (Dirac measures) or --stationary RESULT (a certified minimum)")
    cfg, problem, _ = config_and_problem(args.config, args.set)
    out = new_output_path(cfg, args.config, args.output, args.force)
    if problem.k > 256:
        raise UsageError(f"stability needs k <= 256 coordinates for its dense Hessians, got k = {problem.k} "
                         f"(reduce model.d or model.head_dim, or use reduced coordinates)")
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"stability: {msg}", flush=True))
    result = run_stability(cfg, problem, progress=say)
    write_stability(out, result, cfg, problem.k, problem)
    figures = []
    if not args.no_plots:
        # the figures' modules here, not at the top: the parser imports this module in every pdeflow process
        from ..analysis.dirac.stability_plots import plot_stability
        from ..analysis.plots.figures import figure_output

        with figure_output(figure_dpi(args), formats=args.format):
            figures = [f.with_suffix(f".{fmt}") for f in plot_stability(result, cfg, out, args.format[0])
                       for fmt in args.format]
    print(summary(result), file=sys.stdout)
    print(f"pdeflow: stability: {len(result.points)} point(s) -> {out}"
          + (f" (figures: {', '.join(p.name for p in figures)})" if figures else ""))
    return EXIT_OK



def summary(result: StabilityResult) -> str:
    """A table of the points (verdict, gap, worst rate error) and the sweep's critical weight decay."""
    lines = ["point  origin      e               verdict               lmin(H0)     lmin(Htr)    gap        "
             "global min.       max rel. rate error"]
    for i, (a, runs) in enumerate(zip(result.points, result.runs)):
        errs = [abs(r.measured[ax] - r.predicted[ax]) / abs(r.predicted[ax]) for r in runs for ax in (MEAN, SPREAD)
                if np.isfinite(r.measured[ax])]
        lines.append(f"{i:<6d} {a.origin:<11s} {a.energy:<15.10g} {a.verdict:<21s} {a.h0_relevant[0]:+.4e}  "
                     f"{a.htr_relevant[0]:+.4e}  {a.gap:<10.3g} {a.global_minimizer:<17s} "
                     f"{max(errs) if errs else float('nan'):.2e}")
    if result.sweep is not None and len(result.sweep.weight_decay):
        sw = result.sweep
        lines.append(f"zero head: lam_c predicted {sw.lam_c_predicted:.6f}, measured {sw.lam_c_measured:.6f} "
                     f"(slope {sw.slope:.4f}; verdicts {', '.join(sw.verdicts)})")
    return "\n".join(lines)



def cmd_minimum_rates(args: argparse.Namespace) -> int:
    """``--stationary RESULT``: the rates at a certified local minimum
    (:func:`pdeflow.analysis.linearised.minimum_rates.minimum_rates`)."""
    from ..analysis.certificate.certificate import stored_lambda_min
    from ..analysis.linearised.minimum_rates import minimum_rates, write_minimum_rates
    from ..analysis.stationary.stationary import read_stationary
    from ..core.config import loads_config
    from ..io.problem_file import stored_problem
    from .cli import UsageError, check_output_file

    if args.config is not None:
        raise UsageError("--stationary takes the problem from RESULT: give no CONFIG")
    if args.output is None:
        raise UsageError("--stationary needs -o RATES.h5")
    for name, value in (("--eps", args.eps), ("--eps-random", args.eps_random)):
        if not (value > 0 and np.isfinite(value)):
            raise UsageError(f"{name} must be positive, got {value}")
    if not (args.log_change > 0 and np.isfinite(args.log_change)):
        raise UsageError(f"--log-change must be positive, got {args.log_change}")
    for name, value, least in (("--random", args.random, 0), ("--samples", args.samples, 5),
                               ("--krylov-dim", args.krylov_dim, 2)):
        if value < least:
            raise UsageError(f"{name} must be >= {least}, got {value}")
    out = check_output_file(Path(args.output), args.stationary, force=args.force)
    r = read_stationary(args.stationary)
    if args.dense_limit < 0:
        raise UsageError(f"--dense-limit must be >= 0 unknowns, got {args.dense_limit}")
    if not r.get("certified"):
        raise UsageError(f"{args.stationary}: not a certified local minimum ({r.get('verdict')}; certificate: "
                         f"{r.get('certificate_text', 'none stored')}); the rates are predicted at a proven minimum "
                         "(pdeflow stationary --kind minimum)")
    cfg = loads_config(r["config"])
    problem = stored_problem(args.stationary)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"stability: {msg}", flush=True))
    hint = stored_lambda_min(r)[0]
    result = minimum_rates(problem, np.asarray(r["omega"]), np.asarray(r["mass"]), eps=args.eps,
                           eps_random=args.eps_random, n_random=args.random, seed=args.seed,
                           log_change=args.log_change, samples=args.samples, method=args.stepper,
                           linearity=not args.no_linearity, progress=say, dense_limit=args.dense_limit,
                           engine=args.engine, lambda_hint=hint if np.isfinite(hint) and hint > 0 else 0.0,
                           source_certificate=str(r.get("certificate_text", "")), factor_dtype=args.factor_dtype,
                           krylov_dim=args.krylov_dim)
    write_minimum_rates(out, result, cfg, problem, source=str(args.stationary))
    if not args.no_plots:
        from ..analysis.dirac.stability_plots import figure_paths, plot_minimum_rates
        from ..analysis.plots.figures import figure_output

        with figure_output(figure_dpi(args), formats=args.format):
            figure = plot_minimum_rates(result, figure_paths(out, args.format[0])["rates"])
        figures = [figure.with_suffix(f".{fmt}") for fmt in args.format]
        print(f"pdeflow: stability: figure {', '.join(map(str, figures))}")
    print(rates_table(result))
    print(f"pdeflow: stability: rates at the minimum of {args.stationary} -> {out}")
    return EXIT_OK



def rates_table(result) -> str:
    """The measured rates against the predictions, one row per perturbation (:class:`MinimumRates`)."""
    lam = result.lambda_min
    lines = [f"minimum: E* = {result.e_star:.12g}, I = {result.i_star:.3e} (off the minimum by at most "
             f"sqrt(I) / lambda_min = {result.offset_bound:.1e}), lambda_min = {lam:.6g} (residual "
             f"{result.lambda_min_residual:.1e}), lambda_max = {result.lambda_max:.6g}, {result.n_symmetry} symmetry "
             f"directions; eps = {result.eps:g}; {result.products} JVPs (polish {result.polish_steps} Newton step(s) "
             f"and spectrum), {result.prediction_products} JVPs (linear predictions), {result.gradients} gradients "
             "(runs)",
             f"certificate: {result.certificate}",
             f"engine: {result.engine}; runs by {', '.join(sorted({r.stepper for r in result.runs}))}",
             f"{'direction':<15} {'E - E* rate':>12} {'predicted':>12} {'distance rate':>14} {'predicted':>12} "
             f"{'min PL ratio':>13} {'predicted':>12} {'least PL / lambda_min':>22} {'max rel. error':>15} "
             f"{'integration error':>18}"]
    for r in result.runs:
        lines.append(f"{r.direction:<15} {r.energy_rate:>12.6g} {r.predicted_energy_rate:>12.6g} "
                     f"{r.distance_rate:>14.6g} {r.predicted_distance_rate:>12.6g} {r.pl_ratio_min:>13.6g} "
                     f"{r.predicted_pl_ratio_min:>12.6g} {r.pl_ratio_least / lam:>22.6g} "
                     f"{np.max(np.abs(r.errors())):>15.2e} {_estimate(r.integration_error):>18}")
    lines.append("max rel. error: measured against predicted; integration error: the estimated relative error of the "
                 "measured rates from the time integration (Richardson; '-': controlled by the stepper, not estimated)")
    return "\n".join(lines)


def _estimate(value: float) -> str:
    return f"{value:.2e}" if math.isfinite(value) else "-"



def add_command(subparsers) -> None:
    """Register ``pdeflow stability``."""
    from .cli import add_config_arguments

    p = subparsers.add_parser("stability", help="stationary Dirac measures: stability analysis checked by simulation",
                              epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p, "TOML config file ([stability] section), or a pdeflow file (trajectory or result: its "
                         "stored config on its stored problem, the task's data from the file); none with --stationary",
                         "output HDF5 file (default: output.path, else <config>.h5)", optional_config=True)
    p.add_argument("--stationary", metavar="RESULT",
                   help="a certified minimum (pdeflow stationary --kind minimum): check the rates predicted there")
    p.add_argument("--eps", type=float, default=1e-4,
                   help="--stationary: size of the perturbations along the slowest direction (mass-weighted norm; "
                        "default 1e-4: the relative rate error of the next order is ~ D^3 E eps / lambda_min)")
    p.add_argument("--eps-random", type=float, default=1e-3,
                   help="--stationary: size of the random perturbations (default 1e-3: most of it is in fast modes "
                        "that decay first)")
    p.add_argument("--random", type=int, default=2, help="--stationary: random directions besides the slowest")
    p.add_argument("--seed", type=int, default=0, help="--stationary: seed of the random directions")
    p.add_argument("--log-change", type=float, default=LOG_CHANGE_AT_MINIMUM,
                   help="--stationary: a run lasts this / lambda_min (the slowest mode's distance falls by "
                        f"e^-this; default {LOG_CHANGE_AT_MINIMUM})")
    p.add_argument("--samples", type=int, default=SAMPLES_AT_MINIMUM,
                   help=f"--stationary: samples per run (default {SAMPLES_AT_MINIMUM})")
    p.add_argument("--engine", choices=ENGINES, default=FROZEN,
                   help=f"--stationary: {FROZEN} (default): the heads at the origin split off, the runs by ROS2 on S "
                        "frozen at the minimum (I + gamma h S factorised once), the certificate the source's above "
                        "--dense-limit; products: exact products on the whole measure, the dense certificate, "
                        "rkc or RK4 runs (--stepper)")
    p.add_argument("--factor-dtype", choices=("float32", "float64"), default="float32",
                   help="--stationary, --engine frozen: the precision of the factor of I + gamma h S (float32: "
                        "half the memory, n^2 x 4 bytes)")
    p.add_argument("--stepper", choices=("auto", "rk4", "rkc"), default="auto",
                   help="--stationary, --engine products: the runs' stepper (auto: rkc when RK4 at dt = 1 / "
                        f"lambda_max would take more than {RK4_MAX_STEPS:,} steps)")
    p.add_argument("--krylov-dim", type=int, default=KRYLOV_DIM,
                   help=f"--stationary: Lanczos steps for the spectrum's ends (default {KRYLOV_DIM}; the slow end of "
                        "a stiff minimum may need more)")
    p.add_argument("--dense-limit", type=int, default=DENSE_LIMIT,
                   help="--stationary: assemble S densely on the live heads up to this many unknowns to prove the "
                        f"point a minimum (default {DENSE_LIMIT}; n products, ~6 n^2 doubles); above it no proof, "
                        "no rates")
    p.add_argument("--no-linearity", action="store_true",
                   help="--stationary: skip the run along the slowest direction at eps/2 (the linearity check)")
    p.add_argument("--no-plots", action="store_true", help="do not write the figures")
    add_figure_arguments(p, several=True)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_stability)
