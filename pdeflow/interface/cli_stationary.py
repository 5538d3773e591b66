"""``pdeflow stationary FILE [--frame F] --kind nearest|minimum -o RESULT``: a stationary point of the flow from a
frame of a particle trajectory, classified by its spectrum (:mod:`pdeflow.analysis.stationary.stationary`).

``nearest``: Newton-Krylov on the velocity field (the stationary point next to the frame, saddle or minimum);
``minimum``: a descent search (L-BFGS, or trust-region Newton with ``--method trust-region``) restarted along
the negative curvature of every saddle it stops at). The verdict (:mod:`pdeflow.analysis.certificate.certificate`): a
saddle
when any Ritz value is negative; a local minimum only when a dense eigendecomposition of S off the symmetry
directions (up to ``--dense-limit`` unknowns on the live heads) bounds every eigenvalue above 0; above the limit,
"no negative eigenvalue found in m Lanczos steps from a random start (not certified)".
Both stop at ``I <= ratio I(0)`` (I(0): the dissipation of the run's first frame) and write a result
file that ``pdeflow info`` prints and ``pdeflow diagnose --stationary`` takes E* from.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..analysis.certificate.certificate import DENSE_LIMIT
from ..analysis.hessian.spectrum import KRYLOV_DIM
from ..analysis.search.structured_minimum import SEARCHES as STRUCTURED_SEARCHES
from ..analysis.stationary.stationary import (
    DISSIPATION_RATIO,
    KINDS,
    METHODS,
    ROUTES,
    format_stationary,
    is_stationary_file,
    minimum,
    nearest,
    read_stationary,
    write_stationary,
)
from ..core.config import Config, loads_config
from ..core.exit_codes import EXIT_OK, HELP
from ..core.problem import JVP_COST, Problem
from ..io.problem_file import stored_problem
from ..io.trajectory import open_trajectory

STATIONARY_HELP = """Find a stationary point of the particle flow from a frame of a trajectory and classify it by
the spectrum of the mass-weighted Hessian (symmetry directions removed): --kind nearest (Newton-Krylov on the
velocity field: the saddle or minimum next to the frame) or --kind minimum (--route structured, the default:
L-BFGS, then a Newton-PCG endgame preconditioned by the per-head blocks of S and a Cholesky certificate of S
assembled from its structure; --route lbfgs: L-BFGS, or trust-region Newton with --method trust-region, certified
by a dense eigendecomposition on at most --dense-limit unknowns of the live heads; both restart along the negative
curvature of each saddle they stop at, and a negative Ritz value of any block is a saddle).
Converged when the dissipation I <= ratio x I(0), I(0) the dissipation of the run's first frame. Writes the point,
its energy, index, converged eigenvalues with residuals, unstable directions and the cost to RESULT (HDF5)."""


def default_output(path: Path, kind: str) -> Path:
    """``<stem>-<kind>.h5`` beside the trajectory."""
    return path.with_name(f"{path.stem}-{kind}.h5")


@dataclass
class Start:
    """Where a search starts: the problem and its config, the particles ``omega`` [N, k] and ``mass`` [N], the
    dissipation ``initial`` I(0) the target is relative to, and the file, frame and time they come from
    (``origin``: the trajectory the frame belongs to, when the file is a stationary result; ``rule``: what fixed
    the frame, :func:`start_rule`)."""
    problem: Problem
    config: Config
    omega: np.ndarray
    mass: np.ndarray
    initial: float
    source: Path
    frame: int
    time: float
    origin: str = ""
    rule: str = ""


def start_of(path: Path, frame: int) -> Start:
    """The start from a particle trajectory's frame, or from the point of a ``pdeflow stationary`` result (to
    continue a search that stopped, or to polish a point with ``--kind nearest``: its I(0), frame and time carry
    over, and the source reads "TRAJECTORY via RESULT": the frame is the trajectory's)."""
    from .cli import UsageError

    if is_stationary_file(path):
        if frame != -1:
            raise UsageError(f"{path} is a stationary-point result: it holds one point, give no --frame")
        r = read_stationary(path)
        return Start(problem=stored_problem(path), config=loads_config(r["config"]),
                     omega=np.asarray(r["omega"], dtype=float), mass=np.asarray(r["mass"], dtype=float),
                     initial=float(r["initial_dissipation"]), source=path, frame=int(r["frame"]),
                     time=float(r["time"]), origin=str(r["source"]), rule=f"the point of {path}")
    traj = open_trajectory(path)
    if "omega" not in traj.frames:
        raise UsageError(f"{traj.path}: stationary needs a particle trajectory (this one holds a grid density)")
    F = len(traj.time)
    if F == 0:
        raise UsageError(f"{traj.path}: no frames")
    if not -F <= frame < F:
        raise UsageError(f"--frame must be in {-F}..{F - 1}, got {frame}")
    frame %= F
    problem = traj.problem()
    omega = np.asarray(traj.frames["omega"][frame], dtype=float)
    mass = (np.asarray(traj.frames["mass"][frame], dtype=float) if "mass" in traj.frames
            else np.full(omega.shape[0], 1.0 / omega.shape[0]))
    initial = float(traj.frames["dissipation"][0]) if "dissipation" in traj.frames else \
        problem.evaluate(traj.frames["omega"][0], mass).dissipation
    return Start(problem=problem, config=traj.config, omega=omega, mass=mass, initial=initial, source=traj.path,
                 frame=frame, time=float(traj.time[frame]),
                 rule=start_rule(str(traj.attrs.get("status")), frame == F - 1, float(traj.time[frame])))


def start_rule(status: str, last: bool, time: float) -> str:
    """What fixed a start frame at ``time`` of a run that ended with ``status`` (``last``: its last frame): the
    run's end time or stationarity (fixed by the config: the same frame on every machine), a wall-time limit
    (machine-dependent), or the frame chosen."""
    if not last:
        return f"the frame at t = {time:.9g} (chosen)"
    if status == "finished":
        return f"the run's end time t = {time:.9g} (fixed by the config)"
    if status == "stationary":
        return f"the run's stationarity test at t = {time:.9g} (fixed by the config)"
    if status == "wall_time":
        return f"the run's wall-time limit, at t = {time:.9g} (machine-dependent)"
    return f"the last frame of a run that ended with status {status!r}, at t = {time:.9g}"


def cmd_stationary(args: argparse.Namespace) -> int:
    from .cli import UsageError, check_output_file

    if not (math.isfinite(args.ratio) and 0 < args.ratio < 1):
        raise UsageError(f"--ratio must be in (0, 1), got {args.ratio:g}")
    if not math.isfinite(args.max_wall) or args.max_wall < 0:
        raise UsageError(f"--max-wall must be >= 0 seconds, got {args.max_wall:g}")
    if not math.isfinite(args.max_cost) or args.max_cost < 0:
        raise UsageError(f"--max-cost must be >= 0 gradient equivalents, got {args.max_cost:g}")
    if args.krylov_dim is not None and args.krylov_dim < 2:
        raise UsageError(f"--krylov-dim must be >= 2, got {args.krylov_dim}")
    if args.dense_limit is not None and args.dense_limit < 0:
        raise UsageError(f"--dense-limit must be >= 0 unknowns, got {args.dense_limit}")
    if args.method is not None and args.kind != "minimum":
        raise UsageError("--method chooses the search of --kind minimum; nearest is Newton-Krylov")
    if args.route is not None and args.kind != "minimum":
        raise UsageError("--route chooses the route of --kind minimum; nearest is Newton-Krylov")
    route = args.route or ("lbfgs" if args.method is not None else ROUTES[0])
    if args.method is not None and route != "lbfgs":
        raise UsageError("--method chooses the search of --route lbfgs; the structured route has its own")
    if args.search is not None and (args.kind != "minimum" or route != "structured"):
        raise UsageError("--search chooses the search of --kind minimum --route structured; --route lbfgs has "
                         "--method")
    start = start_of(Path(args.file), args.frame)
    out = Path(args.output) if args.output else default_output(start.source, args.kind)
    if out.exists() and out.resolve() == start.source.resolve():
        raise UsageError(f"output path {str(out)!r} is the file the search starts from")
    check_output_file(out, force=args.force)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"stationary: {msg}", flush=True))
    limits = {"ratio": args.ratio, "max_wall": args.max_wall if args.max_wall > 0 else math.inf,
              "max_cost": args.max_cost if args.max_cost > 0 else math.inf, "progress": say}
    if args.kind == "minimum" and route == "structured":
        from ..analysis.search.structured_minimum import CERTIFY_KRYLOV, structured_minimum
        from ..analysis.search.structured_minimum import DENSE_LIMIT as STRUCTURED_LIMIT

        say(f"route structured, search {args.search or STRUCTURED_SEARCHES[0]}; start: {start.rule}")
        point = structured_minimum(start.problem, start.omega, start.mass, start.initial,
                                   search=args.search or STRUCTURED_SEARCHES[0],
                                   krylov_dim=args.krylov_dim or CERTIFY_KRYLOV,
                                   dense_limit=STRUCTURED_LIMIT if args.dense_limit is None else args.dense_limit,
                                   **limits)
    else:
        options = {"method": args.method or METHODS[0]} if args.kind == "minimum" else {}
        search = nearest if args.kind == "nearest" else minimum
        point = search(start.problem, start.omega, start.mass, start.initial, krylov_dim=args.krylov_dim or KRYLOV_DIM,
                       dense_limit=DENSE_LIMIT if args.dense_limit is None else args.dense_limit, **limits, **options)
    write_stationary(out, point, start.config, start.problem, frame=start.frame,
                     source=f"{start.origin} via {start.source}" if start.origin else str(start.source),
                     time_of_frame=start.time, ratio=args.ratio, start_rule=start.rule)
    print(format_stationary(out, read_stationary(out)))
    print(f"pdeflow: stationary: {point.verdict} -> {out}")
    return EXIT_OK


def add_command(subparsers) -> None:
    """Register ``pdeflow stationary``."""
    p = subparsers.add_parser("stationary", help="a stationary point (nearest, or a local minimum) from a frame",
                              description=STATIONARY_HELP, epilog=HELP,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="particle trajectory (.h5), or a result of pdeflow stationary (start from its point)")
    p.add_argument("--kind", choices=KINDS, required=True, help="nearest: Newton-Krylov; minimum: a local minimum")
    p.add_argument("--route", choices=ROUTES, default=None,
                   help="the route of --kind minimum (default structured; lbfgs when --method is given): structured "
                        "= L-BFGS, Newton-PCG preconditioned by S's per-head blocks and a Cholesky certificate "
                        "from S's structure; "
                        "lbfgs = the descent search of --method with a Lanczos run and a dense certificate")
    p.add_argument("--search", choices=STRUCTURED_SEARCHES, default=None,
                   help=f"the search of --route structured (default {STRUCTURED_SEARCHES[0]}): lbfgs = L-BFGS then "
                        "Newton-PCG; float32 = the same with L-BFGS's gradients in float32; trust-region = "
                        "trust-region Newton-Krylov (Steihaug-Toint CG in the metric of S's per-head blocks) "
                        "to the target")
    p.add_argument("--method", choices=METHODS, default=None,
                   help=f"the descent search of --route lbfgs (default {METHODS[0]})")
    p.add_argument("--frame", type=int, default=-1, help="frame to start from (default: the last)")
    p.add_argument("-o", "--output", help="result file (default: <file stem>-<kind>.h5 beside the file)")
    p.add_argument("--force", action="store_true", help="overwrite an existing result file")
    p.add_argument("--ratio", type=float, default=DISSIPATION_RATIO,
                   help=f"converged when I <= ratio x I(0) (default {DISSIPATION_RATIO:g})")
    p.add_argument("--krylov-dim", type=int, default=None,
                   help=f"Lanczos steps of the spectrum (default {KRYLOV_DIM}; the structured route's: 40)")
    p.add_argument("--dense-limit", type=int, default=None, metavar="UNKNOWNS",
                   help=f"certify a minimum by a dense eigendecomposition of S on the live heads up to this many "
                        f"unknowns (default {DENSE_LIMIT}: n products, ~6 n^2 doubles; the structured route's "
                        "Cholesky certificate: 20000, ~4 n^2 doubles); above it the verdict is Lanczos evidence, "
                        "not a certificate")
    p.add_argument("--max-wall", type=float, default=0.0, metavar="SECONDS",
                   help="stop the search after this many seconds and report the point reached (default: no limit; "
                        "machine-dependent: --max-cost stops at the same point on every machine)")
    p.add_argument("--max-cost", type=float, default=0.0, metavar="GRADIENTS",
                   help="stop the search once it has cost this many gradient equivalents (grad Phi evaluations + "
                        f"{JVP_COST:g} per Hessian product) and report the point reached (default: no limit)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_stationary)
