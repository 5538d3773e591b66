"""``pdeflow recover FILE [-o OUT]``: make the file of a killed run readable by any HDF5 tool.

A run writes its file in HDF5's SWMR mode; when its process dies (kill -9, out of memory, a full disk) HDF5's
"open for SWMR write" flag stays set and every HDF5 reader other than a SWMR reader (plain ``h5py.File(path)``,
``h5dump``, HDFView) refuses the file. ``recover`` writes the committed content (every frame and step row the last
checkpoint counts, and the checkpoint itself) to a complete, cleanly closed copy: ``OUT``, or, without ``-o``, a
copy that then replaces ``FILE``. The result still continues with ``pdeflow run --resume``, bit for bit
(:func:`pdeflow.io.recovery.recover`; docs/schema.md, "Crash safety").
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..core.exit_codes import EXIT_OK, HELP
from ..io.file_access import open_by_swmr_writer
from ..io.recovery import recover
from ..io.trajectory import check_file


def cmd_recover(args: argparse.Namespace) -> int:
    from .cli import check_output_file

    path = Path(args.file)
    check_file(path)
    out = None if args.output is None else check_output_file(Path(args.output), force=args.force)
    if out is None and not open_by_swmr_writer(path):
        print(f"pdeflow: {path}: no writer left it open; any HDF5 tool reads it as it is")
        return EXIT_OK
    frames, steps = recover(path, out)   # refuses a file a live writer holds
    print(f"pdeflow: recovered {frames} committed frames and {steps} step rows -> {out or path} "
          f"(plain HDF5 now; continue the run with pdeflow run --resume)")
    return EXIT_OK


def add_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recover", help="make the file of a killed run readable by any HDF5 tool (still resumable)",
                       epilog=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="trajectory file whose run was killed")
    p.add_argument("-o", "--output", help="write the recovered file there and leave FILE as it is "
                                          "(default: replace FILE, once the complete copy exists)")
    p.add_argument("--force", action="store_true", help="overwrite an existing -o file")
    p.set_defaults(func=cmd_recover)
