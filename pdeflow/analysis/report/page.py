"""The files of ``pdeflow report``: ``index.html`` (one self-contained page, no script, no network: figures beside it
as PNG, math as Unicode text), ``report.json``, and every section's table as ``tables/<key>.csv`` and
``tables/<key>.tex``.
"""
from __future__ import annotations

import csv
import html
import json
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


def _latex_escape(text: str) -> str:
    out = text
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                 ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        out = out.replace(a, b)
    return out


def write_tables(folder: Path, section: Section) -> list[Path]:
    """``<key>.csv`` (quantity, value, what) and ``<key>.tex`` (a booktabs tabular, UTF-8) of a section's table."""
    folder.mkdir(parents=True, exist_ok=True)
    csv_path, tex_path = folder / f"{section.key}.csv", folder / f"{section.key}.tex"
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["quantity", "value", "what"])
        w.writerows(section.rows)
    lines = [f"% {section.title}: verdict {section.verdict} ({section.reason})", r"\begin{tabular}{lll}", r"\toprule",
             r"quantity & value & what \\", r"\midrule"]
    lines += [" & ".join(_latex_escape(c) for c in row) + r" \\" for row in section.rows]
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    tex_path.write_text("\n".join(lines), encoding="utf-8")
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


__all__ = ["write_report", "write_tables", "render_html"]
