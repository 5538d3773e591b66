"""The files of ``pdeflow report``: ``index.html`` (one self-contained page, no script, no network: each figure shown
as PNG and linked as PDF, both in ``figures/``, math as Unicode text), ``report.json``, and every section's table as
``tables/<key>.csv`` (UTF-8) and ``tables/<key>.tex`` (ASCII: math as LaTeX macros, for ``\\input`` with no package
beyond LaTeX's own).
"""
from __future__ import annotations

import csv
import html
import json
import re
import unicodedata
from pathlib import Path
from typing import Any

from .sections import CONTRADICTED, HOLDS, Section

STYLE = """
body { font-family: "DejaVu Serif", Georgia, serif; max-width: 1100px; margin: 2em auto; padding: 0 1em;
       line-height: 1.45; color: #222; }
h1, h2 { font-family: "DejaVu Sans", Helvetica, sans-serif; }
.prediction { background: #f4f6fa; border-left: 4px solid #4a6fa5; padding: 0.5em 1em; }
.verdict { font-weight: bold; padding: 0.1em 0.5em; border-radius: 3px; }
.holds { background: #d9f2dc; } .contradicted { background: #f8d7da; } .not-established { background: #eee; }
table { border-collapse: collapse; margin: 0.8em 0; } td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; }
img { max-width: 100%; margin: 0.5em 0; border: 1px solid #eee; }
code, pre { background: #f6f6f6; } pre { padding: 0.6em; overflow-x: auto; }
"""


# the Unicode of the sections' texts as LaTeX math (merged into one $...$ where they touch): pdflatex typesets the
# tables with no package beyond LaTeX's own
LATEX_MATH = {"λ_min": r"\lambda_{\min}", "ρ̂": r"\hat\rho", "±": r"\pm", "²": "^{2}", "·": r"\cdot", "×": r"\times",
              "Φ": r"\Phi", "Ω": r"\Omega", "δ": r"\delta", "θ": r"\theta", "λ": r"\lambda", "μ": r"\mu", "ρ": r"\rho",
              "ω": r"\omega", "ᵗ": "^{t}", "₀": "_{0}", "∇": r"\nabla", "∈": r"\in", "−": "-", "∫": r"\int",
              "≈": r"\approx", "≤": r"\le", "≥": r"\ge", "⪰": r"\succeq", "→": r"\to", "∞": r"\infty",
              "<": "<", ">": ">", "|": "|"}
LATEX_TEXT = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
              "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "Ł": r"\L{}", "ł": r"\l{}"}


# the words the commands' ASCII sentences write for the same symbols
LATEX_WORDS = {"lambda_min": r"\lambda_{\min}", "lambda": r"\lambda", "theta": r"\theta", "mu": r"\mu",
               "Phi": r"\Phi", ">=": r"\ge", "<=": r"\le"}
_TOKENS = re.compile(r"λ_min|ρ̂|\b(?:lambda_min|lambda|theta|mu|Phi)\b|>=|<=|.", re.DOTALL)


def latex_text(text: str) -> str:
    """``text`` (the sections' plain text with Unicode math, or a command's ASCII sentence) as LaTeX: the symbols of
    LATEX_MATH and LATEX_WORDS as math macros (touching ones in one ``$...$``), LaTeX's special characters escaped,
    any other non-ASCII character by its Unicode name in brackets (never a character pdflatex cannot typeset)."""
    pieces: list[tuple[bool, str]] = []   # (math?, LaTeX)
    for match in _TOKENS.finditer(text):
        key, j = match.group(), match.end()
        if key in LATEX_MATH or key in LATEX_WORDS:
            pieces.append((True, LATEX_MATH.get(key) or LATEX_WORDS[key]))
        elif key == "-" and text[j:j + 1].isdigit() and (j == 1 or text[j - 2] in " ([,=:"):
            pieces.append((True, "-"))   # a negative number: a minus sign, not a hyphen
        elif key == "-":
            pieces.append((False, "-{}" if text[j:j + 1] == "-" else "-"))   # "--" stays two hyphens
        elif key in LATEX_TEXT:
            pieces.append((False, LATEX_TEXT[key]))
        elif key in "\n\r\t":
            pieces.append((False, " "))
        elif ord(key) < 128:
            pieces.append((False, key))
        else:
            pieces.append((False, f"[{unicodedata.name(key, hex(ord(key))).lower()}]"))
    out, math_run = [], []
    for is_math, latex in pieces + [(False, "")]:
        if is_math:
            math_run.append(latex)
            continue
        if math_run:
            out.append("$" + " ".join(math_run) + "$")
            math_run = []
        out.append(latex)
    return "".join(out)


def write_tables(folder: Path, section: Section) -> list[Path]:
    """``<key>.csv`` (quantity, value, what) and ``<key>.tex`` (a tabular of three paragraph columns for
    ``\\input``, ASCII: math as LaTeX macros, :func:`latex_text`) of a section's table."""
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, tex_path = folder / f"{section.key}.csv", folder / f"{section.key}.tex"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["quantity", "value", "what"])
        w.writerows(section.rows)
    lines = [f"% {latex_text(section.title)}: verdict {section.verdict} ({latex_text(section.reason)})",
             r"\begin{tabular}{p{0.26\linewidth}p{0.3\linewidth}p{0.34\linewidth}}", r"\hline",
             r"quantity & value & what \\", r"\hline"]
    lines += [" & ".join(latex_text(c) for c in row) + r" \\" for row in section.rows]
    lines += [r"\hline", r"\end{tabular}", ""]
    tex_path.write_text("\n".join(lines), encoding="ascii")
    return [csv_path, tex_path]


def _verdict_class(verdict: str) -> str:
    return {HOLDS: "holds", CONTRADICTED: "contradicted"}.get(verdict, "not-established")


def render_html(title: str, sections: list[Section], provenance: dict[str, Any]) -> str:
    """The page: a summary table of the verdicts, one part per section, then what was run and what it cost."""
    e = html.escape
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>",
           f"<style>{STYLE}</style></head><body>", f"<h1>{e(title)}</h1>",
           "<table><tr><th>statement</th><th>verdict</th><th>reason</th></tr>"]
    for s in sections:
        out.append(f"<tr><td><a href='#{s.key}'>{e(s.title)}</a></td><td><span class='verdict "
                   f"{_verdict_class(s.verdict)}'>{e(s.verdict)}</span></td><td>{e(s.reason)}</td></tr>")
    out.append("</table>")
    for s in sections:
        out += [f"<h2 id='{s.key}'>{e(s.title)}</h2>",
                f"<p class='prediction'><b>Prediction.</b> {e(s.prediction)}</p>",
                f"<p><b>Verdict:</b> <span class='verdict {_verdict_class(s.verdict)}'>{e(s.verdict)}</span> "
                f"&mdash; {e(s.reason)}</p>"]
        if s.rows:
            out.append("<table><tr><th>quantity</th><th>value</th><th>what it is</th></tr>")
            out += [f"<tr><td>{e(q)}</td><td>{e(v)}</td><td>{e(w)}</td></tr>" for q, v, w in s.rows]
            out.append("</table>")
        out.append(f"<p>Table: <a href='tables/{s.key}.csv'>CSV</a>, <a href='tables/{s.key}.tex'>LaTeX</a>. "
                   f"Source: <code>{e(s.source)}</code>.</p>")
        for stem in s.figures:
            out.append(f"<p><a href='figures/{stem}.pdf'><img src='figures/{stem}.png' alt='{e(stem)}'></a></p>")
    out.append("<h2 id='provenance'>What was run and what it cost</h2><table>")
    for key in ("pdeflow_version", "cpu", "cores", "python", "target", "total_wall_s"):
        out.append(f"<tr><td>{e(key)}</td><td>{e(str(provenance.get(key, '')))}</td></tr>")
    out.append("</table><table><tr><th>stage</th><th>command</th><th>wall (s)</th><th>cost</th><th>status</th></tr>")
    for st in provenance.get("stages", []):
        out.append(f"<tr><td>{e(st['stage'])}</td><td><code>{e(st['command'])}</code></td>"
                   f"<td>{st.get('wall_s', float('nan')):.1f}</td><td>{e(str(st.get('cost', '')))}</td>"
                   f"<td>{e(st.get('status', ''))}</td></tr>")
    out.append("</table>")
    out.append(f"<h3>Config</h3><pre>{e(provenance.get('config', ''))}</pre></body></html>")
    return "\n".join(out)


def write_report(folder: Path, title: str, sections: list[Section], provenance: dict[str, Any]) -> list[Path]:
    """``index.html``, ``report.json`` and the tables of every section in ``folder`` (figures are already in
    ``folder/figures``). Returns the files written."""
    written = []
    for s in sections:
        written += write_tables(folder / "tables", s)
    (folder / "report.json").write_text(json.dumps({"title": title, "sections": [s.as_dict() for s in sections],
                                                    "provenance": provenance}, indent=1, default=str),
                                        encoding="utf-8")
    (folder / "index.html").write_text(render_html(title, sections, provenance), encoding="utf-8")
    return [folder / "index.html", folder / "report.json", *written]


__all__ = ["write_report", "write_tables", "render_html", "latex_text", "LATEX_MATH", "LATEX_WORDS"]
