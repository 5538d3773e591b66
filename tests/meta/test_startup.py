"""Every pdeflow process builds the whole command line's parser, which imports every command's module: a module
imported there pays its import in each ``pdeflow run`` (and in each stage ``pdeflow report`` starts). matplotlib
(about half a second) is imported only by a command that draws."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_parser_imports_no_plotting_library():
    code = ("import sys\nfrom pdeflow.interface.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'PIL')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
