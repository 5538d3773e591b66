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
    "sphinx-mathjax-offline",   # MathJax shipped in _static: math renders without network
    "numpydoc",
    "sphinx_gallery.gen_gallery",
]

# The gallery: examples/plot_*.py run at build time (seconds each), their figures on the pages
sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "within_subsection_order": "FileNameSortKey",
    "write_computation_times": False,
}

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.md5", "auto_examples/*.json"]

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

html_theme = "furo"
html_title = "pdeflow"
html_static_path = ["_static"]
html_css_files = ["wide.css"]


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
