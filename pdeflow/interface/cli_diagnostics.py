"""``pdeflow diagnose FILE`` and ``pdeflow plot FILE``: the analysis of a trajectory, as a table and figures.

``diagnose`` recomputes the analysis (energy identity, optimality gap, PL/KL rates, head clusters) with the
file's ``[diagnostics]`` settings changed by the options, prints it and stores it as /analysis (replacing
only that group). Minimizers of Phi found by an earlier analysis seed the new gap search.
``plot`` draws the stored analysis (computed in memory when the file has none) into a folder.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.convergence.predictions import PL_TOL, PointPrediction, prediction_at  # noqa: F401
from ..analysis.convergence.rates import THETA_TOL, e_star_refusal
from ..analysis.convergence.spectral import format_spectral_record
from ..analysis.diagnostics import Analysis, analyse, check_editable, read_analysis, write_analysis
from ..analysis.diagnostics.analysis import lowest_energy
from ..core.config import Config, parse_override
from ..core.exit_codes import EXIT_OK, HELP
from ..io.trajectory import Trajectory, open_trajectory
from .cli_figures import add_figure_arguments, figure_dpi

MAX_TABLE_ROWS = 16
DIAGNOSE_HELP = f"""Analyse a trajectory and store the result as /analysis (replacing only that group):
the energy identity residual E(t) - E(0) + int I, the time stationarity is reached, the optimality gap
G = int Phi d rho - min_Omega Phi at chosen frames (certified for k <= 3, where E - G_bound is a lower bound;
an estimate otherwise), the PL ratio mu(t) = I / (2 (E - E*)) and the local exponent
theta(t) = 1 - (1/2) d ln I / d ln(E - E*) over the window where E - E* is trustworthy, with their drift: one
theta of I ~ C (E - E*)^(2 (1 - theta)) only where theta(t) is constant within {THETA_TOL:g} (else "pre-asymptotic",
or the reason there is no KL regime; refused where the window meets frames near a saddle); with --stationary,
the theory's rates at that point beside the measured ones. An E* above the lowest energy of the run is refused
(exit 2, the file untouched); a rerun with --no-gap keeps the gap stored before. Also
clusters of heads with the attention maps of their representatives, and for particle
runs the spectral record: lambda_min, lambda_max and a Morse index bound of the mass-weighted Hessian at every
diagnostics.spectrum_every-th frame near a stationary point, printed as phases (descent, near a saddle of index
>= n, near a minimum). Settings:
the file's [diagnostics] section, changed by the options; minimizers of Phi stored by an earlier analysis seed the
new gap search."""
PLOT_HELP = """Write the figures of a trajectory into a folder, headless: energy and dissipation, the gap, the PL
ratio, the KL fit, the particles coloured by Phi (or the grid density), attention maps of representative
heads, and an animation of the measure (GIF; MP4 too where ffmpeg exists). Uses the stored /analysis,
or computes one in memory when the file has none (or with --recompute)."""


def _usage_error(message: str) -> Exception:
    from .cli import UsageError  # the CLI's error type (imported late: cli imports this module)
    return UsageError(message)


def settings_from_args(traj: Trajectory, args: argparse.Namespace) -> Config:
    """The file's config with its ``[diagnostics]`` keys changed by the options (validated)."""
    changes: dict[str, Any] = {}
    for item in args.set:
        text = item if "=" in item and "." in item.split("=", 1)[0] else f"diagnostics.{item}"
        section, key, value = parse_override(text)
        if section != "diagnostics":
            raise _usage_error(f"--set {item!r}: only [diagnostics] keys can be changed here")
        changes[key] = value
    if getattr(args, "e_star", None) is not None:
        changes["e_star"] = args.e_star
    elif getattr(args, "stationary", None) is not None:
        changes["e_star"] = stationary_point(traj, args.stationary)[0].energy
    if getattr(args, "frames", None) is not None:
        changes["gap_frames"] = args.frames
    if args.no_gap:
        changes["gap"] = False
    return traj.config.replace(diagnostics=changes) if changes else traj.config


def stationary_point(traj: Trajectory, path: str) -> tuple[PointPrediction, str]:
    """The theory's prediction at the point of a ``pdeflow stationary`` result (its energy included) and the
    label of that energy as E*; UsageError when the result belongs to another problem."""
    from ..analysis.stationary.stationary import read_stationary
    from ..io.problem_file import stored_problem
    from ..io.resume import array_difference

    result = read_stationary(path)
    diff = array_difference(traj.arrays, stored_problem(path).arrays())
    if diff is not None:
        raise _usage_error(f"--stationary {path}: a stationary point of another problem (its {diff!r} differs)")
    return prediction_at(result), f"E* of the stationary point found from frame {result['frame']}"


def check_e_star(traj: Trajectory, e_star: float, point: PointPrediction | None) -> None:
    """UsageError (exit 2, one line) when ``e_star`` lies above the lowest energy of the run (its accurate span) or
    above the energy of the given stationary point: no limit of the flow lies there."""
    refused = e_star_refusal(e_star, lowest_energy(traj))
    if not refused and point is not None:
        refused = e_star_refusal(e_star, point.energy, "the energy of the stationary point")
    if refused:
        raise _usage_error(refused)


def _fmt(x: float, spec: str = ".6g") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def _ratio(measured: float, predicted: float) -> str:
    return _fmt(measured / predicted, ".4g") if math.isfinite(measured) and predicted else "-"


def rate_lines(a: Analysis) -> list[str]:
    """The report's lines on the rates: the KL verdict (one line), the PL ratio with its drift, and the theory's
    predictions at a given stationary point beside the measurements, with their ratio."""
    window = f"t in [{_fmt(a.kl_window_start, '.6g')}, {_fmt(a.kl_window_end, '.6g')}]"
    if math.isfinite(a.kl_theta):
        lo, hi = a.kl_theta_range
        span = f"t in [{a.kl_t_first:.6g}, {a.kl_t_last:.6g}]"
        lines = [f"KL exponent   theta = {a.kl_theta:.4f}: the local exponent theta(t) = 1 - (1/2) d ln I / "
                 f"d ln(E - E*) lies in [{lo:.4f}, {hi:.4f}] over {span} (its range over the window and E*'s "
                 "interval, extended by its drift on the side it moves; not a confidence interval; constant within "
                 f"{a.kl_tolerance:g}; {a.kl_points} trusted points; 0.5 = PL); "
                 f"C = {_fmt(a.kl_constant, '.4g')}; predicted vs observed E - E*: max |log ratio| "
                 f"{_fmt(a.kl_decay_error, '.3g')}"]
    else:
        lines = [f"KL exponent   {a.kl_status or 'not computed'}"]
    if math.isfinite(a.pl_mu_first):
        drift = 100.0 * (a.pl_mu_last / a.pl_mu_first - 1.0)
        lines.append(f"PL ratio      mu(t) = I / (2 (E - E*)) from {a.pl_mu_first:.4g} to {a.pl_mu_last:.4g} over "
                     f"{window} (drift {drift:+.1f} %), least {a.pl_mu_min:.4g}, where E - E* is trustworthy")
    else:
        lines.append("PL ratio      - (no sample of the window where E - E* is trustworthy)")
    if not a.prediction:
        return lines
    if not math.isfinite(a.predicted_theta):
        return lines + [f"theory        {a.prediction}"]
    # the KL line above states the theory's exponent and the spectral test (mu against lambda_min) on the measured
    # local exponent; here the local exponent at the window's end beside 1/2
    measured, what = a.kl_theta_last, "local exponent at the window's end"
    lines.append(f"theory        at the stationary point: {a.prediction}")
    lines.append(f"theory theta  {a.predicted_theta:g} (the Lojasiewicz exponent there; theta(t) <= 1/2 in the linear "
                 f"regime, -> 1/2): measured {what} {_fmt(measured, '.4f')}, "
                 f"ratio {_ratio(measured, a.predicted_theta)}")
    lines.append(f"theory mu     -> lambda_min = {a.predicted_mu:.6g} along the slowest mode, >= lambda_min near the "
                 f"point: measured {_fmt(a.pl_mu_last, '.4g')} at the window's end (ratio "
                 f"{_ratio(a.pl_mu_last, a.predicted_mu)}), least {_fmt(a.pl_mu_min, '.4g')} (ratio "
                 f"{_ratio(a.pl_mu_min, a.predicted_mu)})")
    return lines


def format_analysis(traj: Trajectory, a: Analysis, e_star_label: str | None = None) -> str:
    """The analysis as a short report and a table over frames (the gap frames and an even subsample)."""
    k = traj.model_attrs.get("k")
    n = traj.frames["omega"].shape[1] if "omega" in traj.frames else int(np.prod(np.shape(traj.frames["density"])[1:]))
    what = f"{n} particles" if "omega" in traj.frames else f"grid of {n} cells"
    lines = [f"file          {traj.path} ({traj.attrs.get('method')}, {what}, k = {k})"]
    res = a.energy_identity_residual
    drop = float(a.energy[0] - np.min(a.energy)) if a.energy.size else math.nan
    if res.size and np.all(np.isnan(res)):
        lines.append("energy ident. refused (see the note)")
    else:
        worst = float(np.max(np.abs(res))) if res.size else math.nan
        lines.append(f"energy ident. max |E(t) - E(0) + int I| = {_fmt(worst, '.3e')}"
                     f" (energy decrease {_fmt(drop, '.3e')})")
    lines.append("stationary    " + (f"from t = {a.stationary_time:.6g}" if math.isfinite(a.stationary_time)
                                      else "not reached") + f" (I <= {_fmt(a.stationary_tol, '.3g')})")
    if a.e_star_source == "none":
        lines.append("E*            unknown")
    else:
        known = {"given": e_star_label or "given", "stationary": e_star_label or a.e_star_text,
                 "lower_bound": "certified lower bound; E* in", "fit": "fitted from the tail; 95% in"}
        span = ("" if a.e_star_source in ("given", "stationary")
                else f" [{_fmt(a.e_star_low, '.14g')}, {_fmt(a.e_star_high, '.14g')}]")
        lines.append(f"E*            {_fmt(a.e_star, '.12g')} ({known.get(a.e_star_source, a.e_star_source)}{span})")
    lines.extend(rate_lines(a))
    if a.gap_computed:
        radius = f" {a.gap_radius:g}" if math.isfinite(a.gap_radius) else ""
        if a.gap_is_estimate:
            kind = "ESTIMATE (non-exhaustive multi-start search: E - G is not a lower bound)"
        elif a.gap_domain == "grid, entropic":
            kind = "exact over grid densities"
        else:
            kind = "certified (grid + Taylor bounds on every cell, refined)"
        lines.append(f"gap search    Omega = {a.gap_domain}{radius}; {kind}")
        last = a.gap_frames[-1]
        bound = (f", certified G <= {a.gap_bound[last]:.6g}" if a.gap_certified[last] else "")
        lines.append(f"last gap      G = {a.gap[last]:.6g}{bound} at t = {a.time[last]:.6g}, argmin Phi = "
                     + np.array2string(a.minimizer[last][:6], precision=4, separator=", ")
                     + (" ..." if a.minimizer.shape[1] > 6 else ""))
    else:
        lines.append("gap search    off")
    c = a.clusters
    if c is not None:
        shown = ", ".join(f"{m:.3g} ({int(s)})" for m, s in zip(c.mass[:8], c.size[:8]))
        lines.append(f"head clusters {len(c.mass)} at distance {c.threshold:.3g}; mass (heads): {shown}"
                     + (" ..." if len(c.mass) > 8 else ""))
    for note in a.notes:
        lines.append(f"note          {note}")
    F = a.time.size
    spread = np.round(np.linspace(0, F - 1, min(F, MAX_TABLE_ROWS))).astype(int)
    rows = set(a.gap_frames.tolist()) | set(spread.tolist())
    lines.append("")
    head = "E - G bound" if not a.gap_is_estimate else "E - G (none)"
    lines.append(f"{'t':>10} {'energy':>16} {'dissipation':>12} {'gap':>12} {head:>16} {'mu':>10} {'residual':>10}")
    for f in sorted(rows):
        lines.append(f"{a.time[f]:>10.4g} {a.energy[f]:>16.10g} {a.dissipation[f]:>12.4e} {_fmt(a.gap[f], '.4e'):>12} "
                     f"{_fmt(a.lower_bound[f], '.10g'):>16} {_fmt(a.pl_mu[f], '.4g'):>10} "
                     f"{_fmt(a.energy_identity_residual[f], '.2e'):>10}")
    spectral = format_spectral_record(a.spectrum)
    return "\n".join(lines + ([""] + spectral if spectral else []))


def cmd_diagnose(args: argparse.Namespace) -> int:
    traj = open_trajectory(args.file)
    cfg = settings_from_args(traj, args)
    point, label = stationary_point(traj, args.stationary) if args.stationary else (None, None)
    if args.e_star is not None:
        label = None
    if math.isfinite(cfg.diagnostics.e_star):
        check_e_star(traj, float(cfg.diagnostics.e_star), point)
    if not args.no_write:
        check_editable(traj.path)       # before the work, not after it
    analysis = analyse(traj, cfg.diagnostics, previous=read_analysis(traj), run_stationary_tol=cfg.run.stationary_tol,
                       point=point)
    if not args.no_write:
        write_analysis(traj.path, analysis)
    print(format_analysis(traj, analysis, label))
    if not args.no_write:
        print(f"\nstored as /analysis in {traj.path}")
    return EXIT_OK


def _coords(text: str | None, k: int) -> list[int] | None:
    if text is None:
        return None
    try:
        coords = [int(c) for c in text.split(",")]
    except ValueError:
        raise _usage_error(f"--coords must be two integers I,J, got {text!r}") from None
    if len(coords) != 2 or coords[0] == coords[1] or not all(0 <= c < k for c in coords):
        raise _usage_error(f"--coords must be two different coordinates in 0..{k - 1}, got {text!r}")
    return coords


def cmd_plot(args: argparse.Namespace) -> int:
    from ..analysis.plots.plotting import plot_all  # matplotlib only for this command

    traj = open_trajectory(args.file)
    if len(traj.time) == 0:
        raise _usage_error(f"{traj.path}: no frames to plot")
    from .cli import check_output_folder  # imported late, like _usage_error

    out = check_output_folder(Path(args.output) if args.output else traj.path.with_name(traj.path.stem + "_plots"))
    coords = _coords(args.coords, int(traj.model_attrs.get("k", 0)))
    if coords is not None and "omega" not in traj.frames:
        raise _usage_error("--coords applies to particle runs only")
    if not -len(traj.time) <= args.frame < len(traj.time):
        raise _usage_error(f"--frame must be in {-len(traj.time)}..{len(traj.time) - 1}, got {args.frame}")
    if args.fps < 1:
        raise _usage_error(f"--fps must be >= 1, got {args.fps}")
    dpi = figure_dpi(args)
    analysis = None if args.recompute else read_analysis(traj)
    if analysis is None:
        cfg = settings_from_args(traj, args)
        analysis = analyse(traj, cfg.diagnostics, run_stationary_tol=cfg.run.stationary_tol)
    out.mkdir(exist_ok=True)
    for path in plot_all(traj, analysis, out, coords=coords, frame=args.frame, movie=not args.no_animation,
                         fps=args.fps, fmt=args.format, dpi=dpi):
        print(path)
    return EXIT_OK


def add_command(subparsers: argparse._SubParsersAction) -> None:
    """Register ``diagnose`` and ``plot``."""
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("file", help="trajectory file (.h5)")
        p.add_argument("--no-gap", action="store_true", help="skip the search for min Phi (diagnostics.gap = false)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="change a [diagnostics] key, e.g. --set radius=3 --set domain=box (repeatable)")

    p = subparsers.add_parser("diagnose", help="energy identity, optimality gap, PL/KL rates, head clusters",
                              description=DIAGNOSE_HELP, epilog=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    common(p)
    p.add_argument("--e-star", type=float, metavar="X", help="known optimal energy E* (diagnostics.e_star)")
    p.add_argument("--stationary", metavar="RESULT",
                   help="a pdeflow stationary result (of this file's problem): E* = the energy of its point (unless "
                        "--e-star), and the theory's rates there printed beside the measured ones")
    p.add_argument("--frames", type=int, metavar="N", help="frames where the gap is computed (diagnostics.gap_frames)")
    p.add_argument("--no-write", action="store_true", help="print only; leave the file untouched")
    p.set_defaults(func=cmd_diagnose)

    p = subparsers.add_parser("plot", help="figures and an animation of a trajectory (headless)",
                              description=PLOT_HELP, epilog=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    common(p)
    p.add_argument("-o", "--output", metavar="DIR", help="output folder (default: <file stem>_plots beside the file)")
    p.add_argument("--coords", metavar="I,J",
                   help="particle coordinates to plot (default: principal axes; k = 2: both)")
    p.add_argument("--frame", type=int, default=-1, help="frame of the particle / density figure (default: last)")
    p.add_argument("--fps", type=int, default=5, help="frames per second of the animation")
    p.add_argument("--no-animation", action="store_true", help="no GIF / MP4")
    p.add_argument("--recompute", action="store_true", help="recompute the analysis (in memory) instead of reading it")
    add_figure_arguments(p)
    p.set_defaults(func=cmd_plot)


__all__ = ["add_command", "format_analysis", "settings_from_args"]
