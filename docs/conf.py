"""Sphinx configuration of the pdeflow documentation (built with ``sphinx-build -W -b html docs OUT``)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the checkout's code, not an installed copy: the API pages describe the tree they are built from
sys.path.insert(0, str(ROOT))
# autodoc imports pdeflow, which sets the BLAS thread variables at import; keep the build light
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import pdeflow  # noqa: E402

project = "pdeflow"
author = "the pdeflow authors"
copyright = "the pdeflow authors"
release = pdeflow.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "numpydoc",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# MyST: $...$ and $$...$$ math, headings get anchors so pages can link to sections
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# autodoc: members in source order, signatures with their type hints
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# numpydoc: the docstrings are numpydoc-style prose; no generated member tables (they would duplicate
# the explicit entries of api.rst)
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

html_theme = "alabaster"
html_static_path: list[str] = []
html_theme_options = {"description": "mean-field gradient flow of multi-head attention", "nosidebar": False}


# The docstrings write norms as plain text, |x|, outside literals; reStructuredText would read |...| as a
# substitution reference. Escape a bare "|" outside ``literals`` so the formula shows as written.
def _escape_bars(line: str) -> str:
    parts = line.split("``")
    for i in range(0, len(parts), 2):  # even parts lie outside ``...``
        parts[i] = parts[i].replace("\\|", "|").replace("|", "\\|")
    return "``".join(parts)


def _plain_math(app, what, name, obj, options, lines: list[str]) -> None:
    lines[:] = [_escape_bars(line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _plain_math)
