"""``python -m pdeflow.benchmarks [--quick] [--out DIR]``: run the benchmark suite, write JSON + markdown, print
the table."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pdeflow.core.exit_codes import EXIT_OK

from .common import REFERENCE_CONFIG, RESULTS
from .suite import PRESETS, markdown, run, write


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdeflow.benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (a few minutes)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="full (default), quick, or tiny (smoke test)")
    p.add_argument("--out", default=str(RESULTS),
                   help="directory of the JSON and markdown results (default: benchmarks/results)")
    p.add_argument("--config", default=str(REFERENCE_CONFIG), help="problem config (default: bench-reference)")
    args = p.parse_args(argv)
    preset = args.preset or ("quick" if args.quick else "full")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    partial = out / f"bench-{preset}-partial.json"

    def checkpoint(res):
        partial.write_text(json.dumps(res, indent=2, default=float) + "\n")

    res = run(preset, args.config, log=lambda s: print(s, file=sys.stderr, flush=True), checkpoint=checkpoint)
    partial.unlink(missing_ok=True)
    js, md = write(res, args.out)
    print(markdown(res))
    print(f"results: {js} and {md}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
