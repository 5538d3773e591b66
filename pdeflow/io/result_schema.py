"""The result files of the analysis commands, one declarative table per kind, next to the trajectory's
(:data:`pdeflow.io.schema.ITEMS`): ``pdeflow stationary`` (a stationary point), ``stability --stationary`` (rates at a
minimum), ``pdeflow stability`` (Dirac stationary measures), ``pdeflow chaos`` (propagation of chaos) and its work file.
``pdeflow wfr`` writes two trajectories.

Each :class:`ResultKind` names its root ``schema`` attribute and version, the group its command writes and the entries
of that group as :class:`pdeflow.io.schema.Item` rows (the same columns and symbols as the trajectory's table);
the files of the kinds :data:`WITH_PROBLEM` also hold ``/model`` and ``/data`` as a trajectory does. The writers in
:mod:`pdeflow.analysis` take their schema names from here; :func:`check_result` checks a file against its table
(``pdeflow validate``), :func:`summary` is what ``pdeflow info`` prints, and docs/schema.md shows the tables
(``python -m pdeflow.io.result_schema docs/schema.md``; a test fails when they disagree). Symbols: ``N``, ``k`` as in
a trajectory; ``L``, ``M`` (the converged lowest and highest eigenvalues), ``U`` (unstable directions), ``I``
(iterations), ``X`` (excess checks), ``J`` (runs), ``P`` (Dirac points), ``n`` (simulated modes), ``A`` (the
ladder of N), ``Q`` (seeds), ``G`` (fit times), ``E`` (SGD step sizes).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import schema
from .file_access import plain
from .schema import OPTIONAL, REQUIRED, WRITTEN, Item, _attr, _data, _group


@dataclass(frozen=True)
class ResultKind:
    """One kind of result file: its root ``schema`` attribute and ``version``, the ``command`` writing it, a
    ``title``, its ``items`` (the group and its entries) and whether it stores the problem (``/model``, ``/data``)."""
    schema: str
    version: int
    command: str
    title: str
    group: str
    items: tuple[Item, ...]
    with_problem: bool = True


def _floats(group: str, names: str, shape: tuple[str, ...], meaning: str) -> tuple[Item, ...]:
    return tuple(_data(f"{group}/{name}", shape, "float", WRITTEN, meaning) for name in names.split())


def _attrs(group: str, dtype: str, names: str, meaning: str) -> tuple[Item, ...]:
    return tuple(_attr(f"{group}.{name}", dtype, WRITTEN, meaning) for name in names.split())


STATIONARY = ResultKind("pdeflow-stationary", 1, "pdeflow stationary", "a stationary point", "/stationary", (
    _group("/stationary", REQUIRED, "the point found, its spectrum and the search"),
    *_attrs("/stationary", "text", "kind source verdict message", "the kind searched, the trajectory searched from, "
           "the verdict on the point, how the search ended"),
    *_attrs("/stationary", "int", "frame iterations gradients products certify_products morse_index_lower n_symmetry",
           "the start frame, the search's cost, the negative eigenvalues proven (interlacing or the dense bound), "
           "the symmetry directions removed"),
    *_attrs("/stationary", "float", "time energy dissipation start_energy start_dissipation initial_dissipation ratio "
           "target lambda_max lowest_ritz lowest_ritz_residual gradient_equivalents jvp_gradients wall "
           "certify_wall", "values at the point and the start, the target I <= ratio I(0), the spectrum's ends, costs"),
    _attr("/stationary.lambda_min", "float", WRITTEN, "the lowest eigenvalue of S off the symmetry directions: the "
          "certificate's value when it computed one (inside [lambda_min_lower, lambda_min_upper]), else the lowest "
          "converged Ritz value (an upper bound)"),
    *_attrs("/stationary", "bool", "converged certified", "whether the target was reached and the spectrum certified"),
    _data("/stationary/omega", ("N", "k"), "float", REQUIRED, "the point's particle positions"),
    _data("/stationary/mass", ("N",), "float", REQUIRED, "its masses"),
    *_floats("/stationary", "lowest lowest_residual", ("L",), "converged Ritz values at the low end and "
             "residuals (Lanczos, the origin block): not necessarily the lowest eigenvalues, see lambda_min"),
    *_floats("/stationary", "highest highest_residual", ("M",), "converged highest eigenvalues, residuals"),
    _data("/stationary/unstable_directions", ("U", "N", "k"), "float", WRITTEN,
          "unit Ritz vectors of the negative eigenvalues (mass-weighted coordinates)"),
    _group("/stationary/history", WRITTEN, "per iteration of the search"),
    _data("/stationary/history/*", ("I",), "number", OPTIONAL, "energy, dissipation, products, gradients, wall"),
))

RATES = ResultKind("pdeflow-minimum-rates", 2, "pdeflow stability --stationary", "rates at a minimum", "/rates", (
    _group("/rates", REQUIRED, "measured and predicted local rates at a certified minimum"),
    *_attrs("/rates", "float", "e_star i_star lambda_min lambda_min_residual lambda_max eps offset offset_bound",
           "E*, I*, the spectrum's ends, the perturbation size, the polish offset and its bound"),
    *_attrs("/rates", "int", "morse_index_lower n_symmetry products prediction_products gradients polish_steps",
           "the index, the symmetry directions, costs"),
    _attr("/rates.source", "text", WRITTEN, "the stationary result the minimum came from"),
    _attr("/rates.engine", "text", WRITTEN, "the engine that measured them: frozen or products"),
    _data("/rates/omega_star", ("N", "k"), "float", REQUIRED, "the polished minimum"),
    _data("/rates/mass", ("N",), "float", REQUIRED, "its masses"),
    _data("/rates/excess_check", ("X", "3"), "float", WRITTEN, "size, direct E - E*, gradient form"),
    _data("/rates/direction", ("J",), "text", WRITTEN, "the perturbation of each run"),
    _data("/rates/stepper", ("J",), "text", WRITTEN, "its stepper"),
    *_floats("/rates", "eps energy_rate distance_rate pl_ratio_min pl_ratio_least predicted_energy_rate "
             "predicted_distance_rate predicted_pl_ratio_min prediction_error excess_agreement gradients steps",
             ("J",), "per run: measured and predicted rates, costs"),
    _data("/rates/integration_error", ("J",), "float", OPTIONAL, "per run: the estimated relative error of its "
          "measured rates from the integration (NaN: not estimated; absent in files before 2026-12-05)"),
    _data("/rates/relative_error", ("J", "3"), "float", WRITTEN, "energy, distance, PL ratio"),
    _group("/rates/runs", WRITTEN, "one group r<j> per run: times, excess, excess_direct, distance, pl_ratio, "
           "trusted, predicted_excess, predicted_distance"),
))

STABILITY = ResultKind("pdeflow-stability", 1, "pdeflow stability", "Dirac stationary measures", "/stability", (
    _group("/stability", REQUIRED, "the stationary Diracs, their Hessians, verdicts and simulated rates"),
    *_attrs("/stability", "float", "tol eps weight_decay", "the search tolerance, perturbation size, lam"),
    _attr("/stability.n_particles", "int", WRITTEN, "particles of the simulations"),
    _attr("/stability.notes", "text", WRITTEN, "notes, '; '-separated"),
    _data("/stability/points", ("P", "k"), "float", REQUIRED, "the Dirac locations"),
    *_floats("/stability", "energy grad_norm h0_relevant_min htr_relevant_min symmetry_residual optimality_gap "
             "min_phi gap_bound", ("P",), "per point (gap_bound NaN when not certified)"),
    _data("/stability/multiplicity", ("P",), "int", WRITTEN, "how often the search found it"),
    _data("/stability/n_symmetry_modes", ("P",), "int", WRITTEN, "symmetry directions"),
    _data("/stability/origin", ("P",), "text", WRITTEN, "how it was found"),
    _data("/stability/verdict", ("P",), "text", REQUIRED, "the H0 / Htr verdict"),
    _data("/stability/global_minimizer", ("P",), "text", WRITTEN, "the optimality verdict"),
    _data("/stability/gap_exhaustive", ("P",), "any", WRITTEN, "whether the gap search was exhaustive"),
    *_floats("/stability", "h0 htr", ("P", "k", "k"), "the Hessians H0 and Htr"),
    *_floats("/stability", "h0_eigenvalues htr_eigenvalues m_eigenvalues", ("P", "k"), "their eigenvalues, ascending"),
    *_floats("/stability", "predicted_rate measured_rate mode_eigenvalue", ("P", "2", "n"),
             "axis 1: mean / Htr, spread / H0 (NaN where not simulated)"),
    _group("/stability/runs", WRITTEN, "one group p<s>_m<j> per simulation: times, amplitudes, directions"),
    _group("/stability/sweep", OPTIONAL, "the sweep over weight decays: weight_decay, h0_min, htr_min, verdict, rates"),
))

CHAOS = ResultKind("pdeflow-chaos", 1, "pdeflow chaos", "propagation of chaos", "/chaos", (
    _group("/chaos", REQUIRED, "raw measurements over the ladder of N and the fitted rates (attributes slope_<name>, "
           "slope_<name>_ci, ...)"),
    _data("/chaos/n_list", ("A",), "number", REQUIRED, "the ladder of N"),
    _data("/chaos/eta_list", ("E",), "number", REQUIRED, "the SGD step sizes"),
    *_floats("/chaos", "coupling logit_gap energy_gap sliced_w2", ("A", "Q", "G"), "per N, seed and fit time"),
    *_floats("/chaos", "sgd_excess sgd_coupling sgd_energy_gap", ("A", "Q", "E", "G"), "per N, seed, eta, fit time"),
    _data("/chaos/*", ("...",), "any", OPTIONAL, "the static measurements"),
))

CHAOS_WORK = ResultKind("pdeflow-chaos-work", 1, "pdeflow chaos (unfinished)", "the finished blocks of a chaos run",
                        "/", (
    _data("/done", ("A", "Q"), "any", REQUIRED, "whether each block is done"),
    _data("/*", ("...",), "float", OPTIONAL, "the measurements of the blocks, named as in /chaos (NaN: not done)"),
), with_problem=False)

KINDS: tuple[ResultKind, ...] = (STATIONARY, RATES, STABILITY, CHAOS, CHAOS_WORK)
ROOT = tuple(it for it in schema.ITEMS if it.path in ("/.pdeflow_version", "/.created", "/.config"))
PROBLEM = tuple(it for it in schema.ITEMS if it.path.startswith(("/model", "/data")))


def kind_of(name: object) -> ResultKind | None:
    """The kind whose ``schema`` attribute is ``name`` (None for a trajectory or anything else)."""
    return next((k for k in KINDS if k.schema == name), None)


def table(kind: ResultKind) -> tuple[Item, ...]:
    """Every entry a file of ``kind`` may hold: root attributes, the problem (if stored) and its own group."""
    root = tuple(Item(it.kind, it.path, it.shape, it.dtype, WRITTEN, it.meaning) for it in ROOT)
    return root + (PROBLEM if kind.with_problem else ()) + kind.items


def check_result(f, kind: ResultKind) -> list[str]:
    """Every departure of the open file ``f`` from the table of ``kind``, one line each (version included)."""
    out = []
    version = plain(f.attrs.get("schema_version"))
    if version != kind.version:
        out.append(f"root attribute schema_version must be {kind.version} for {kind.schema}, got {version!r}")
    out += [p.message for p in schema.check(f, lambda: (0, 0), needs=(REQUIRED, WRITTEN), items=table(kind))]
    return out


def summary(f, kind: ResultKind, path: str | Path) -> str:
    """``pdeflow info`` on a result file: what it is, the problem, then each dataset of its group with its shape and
    each scalar attribute with its value."""
    lines = [f"file        {path}",
             f"kind        {kind.title} ({kind.command}; schema {kind.schema} version {kind.version})",
             f"written     {plain(f.attrs.get('created'))} by pdeflow "
             f"{plain(f.attrs.get('pdeflow_version'))}"]
    if kind.with_problem and "model" in f and "embedding" in f["model"] and "tokens" in f["data"]:
        (V, d), (B, T) = f["model/embedding"].shape, f["data/tokens"].shape
        lines.append(f"problem     V={V} T={T} B={B} d={d} dh={plain(f['model'].attrs.get('head_dim'))}")
    group = f[kind.group]
    for key in group:
        node = group[key]
        shape = f"[{', '.join(map(str, node.shape))}]" if hasattr(node, "shape") else f"group of {len(node)}"
        lines.append(f"  {key:<26} {shape}")
    for key, value in group.attrs.items():
        value = plain(value)
        if np.ndim(value) == 0:
            text = f"{value:.6g}" if isinstance(value, float) else str(value)
            lines.append(f"  {key:<26} {text[:100]}")
    return "\n".join(lines)


# ---- the tables of docs/schema.md ---------------------------------------------------------------------------------
BEGIN = "<!-- result tables: generated by python -m pdeflow.io.result_schema -->"
END = "<!-- end of the result tables -->"


def markdown() -> str:
    """One table per kind of result file."""
    lines = []
    for kind in KINDS:
        lines += [f"### `{kind.schema}` (version {kind.version}): {kind.title}", "",
                  f"Written by `{kind.command}`. Root attributes `schema`, `schema_version`, `pdeflow_version`, "
                  f"`created`, `config`" + (", and `/model` and `/data` as in a trajectory." if kind.with_problem
                                             else "; no problem stored."), "",
                  "| entry | kind | shape | type | needed | meaning |", "| --- | --- | --- | --- | --- | --- |"]
        rows: list[tuple[list[str], Item]] = []
        for it in kind.items:   # entries alike but for their names share a row
            entry = f"`{it.name}`" if it.kind == "attribute" else f"`{it.path}`"
            last = rows[-1][1] if rows else None
            if last is not None and it.kind != "group" and (last.kind, last.shape, last.dtype, last.need,
                                                            last.meaning) == (it.kind, it.shape, it.dtype, it.need,
                                                                              it.meaning):
                rows[-1][0].append(entry)
            else:
                rows.append(([entry], it))
        for entries, it in rows:
            shape = "" if it.shape is None else "[" + ", ".join(it.shape) + "]"
            where = f" of `{it.group}`" if it.kind == "attribute" else ""
            lines.append(f"| {', '.join(entries)} | {it.kind}{where} | {shape} | {it.dtype or ''} | {it.need} | "
                         f"{it.meaning.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_doc(path: str | Path) -> None:
    """Replace the generated block of ``path`` (docs/schema.md) with :func:`markdown`."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no block between {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{markdown()}{END}{rest.split(END, 1)[1]}", encoding="utf-8")


if __name__ == "__main__":
    write_doc(sys.argv[1] if len(sys.argv) > 1 else "docs/schema.md")
