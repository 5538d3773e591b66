"""Tests of pdeflow.core.config: every bad configuration raises a one-line ConfigError naming the key;
overrides, TOML round trips, and a fuzz test where nothing but ConfigError may escape."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pdeflow.core.config import (
    SECTIONS,
    Config,
    ConfigError,
    describe_schema,
    load_config,
    loads_config,
    parse_override,
)
from pdeflow.core.problem import Problem

SMALL = '[task]\nvocab_size = 3\nseq_len = 3\nn_samples = 8\n[model]\nd = 7\nhead_dim = 2\n'


def small(model_and_rest: str) -> str:
    """A small valid config (V = 3, T = 3, d = 7, dh = 2) followed by more [model] keys and sections."""
    return SMALL + model_and_rest


@pytest.fixture
def files(tmp_path):
    """Basis files with defects, and the folder ({tmp} in the table below)."""
    p = 4 * 7 * 2
    np.savez(tmp_path / "bad_shape.npz", basis=np.ones((p - 1, 2)))
    np.savez(tmp_path / "bad_theta0.npz", basis=np.ones((p, 2)), theta0=np.ones(p + 1))
    np.savez(tmp_path / "nonfinite.npz", basis=np.full((p, 2), np.nan))
    np.savez(tmp_path / "no_basis.npz", other=np.ones(3))
    (tmp_path / "not_npz.npz").write_text("not a zip file")
    return tmp_path


# (id, TOML text, overrides, where it must fail, text the message must contain)
# where: "loads" = loads_config, "problem" = Problem.from_config, "measure" = Problem.initial_measure,
# "file" = load_config of a file that does not exist
BAD = [
    ("unknown-key", "[run]\nt_ends = 2.0\n", [], "loads", "run.t_ends"),
    ("unknown-key-hint", "[solver]\ndtmin = 0.1\n", [], "loads", "solver.dt_min"),
    ("unknown-section", "[runs]\nt_end = 2.0\n", [], "loads", "runs"),
    ("section-not-table", "run = 3\n", [], "loads", "run"),
    ("wrong-type-str-for-int", '[model]\nd = "8"\n', [], "loads", "model.d"),
    ("wrong-type-int-for-str", "[solver]\nmethod = 3\n", [], "loads", "solver.method"),
    ("wrong-type-date", "[run]\nt_end = 2024-01-01\n", [], "loads", "run.t_end"),
    ("bool-for-int", "[model]\nd = true\n", [], "loads", "model.d"),
    ("bool-for-float", "[run]\nt_end = true\n", [], "loads", "run.t_end"),
    ("float-for-int", "[init]\nn_particles = 2.5\n", [], "loads", "init.n_particles"),
    ("int-for-bool", "[task]\nexact = 1\n", [], "loads", "task.exact"),
    ("list-of-strings", '[init]\nmean = [1.0, "a"]\n', [], "loads", "init.mean"),
    ("table-for-list", "[init]\nmean = {a = 1}\n", [], "loads", "init.mean"),
    ("below-ge", "[task]\nseq_len = 0\n", [], "loads", "task.seq_len"),
    ("not-gt", "[solver]\ndt = 0.0\n", [], "loads", "solver.dt"),
    ("above-le", "[solver]\ncfl = 1.5\n", [], "loads", "solver.cfl"),
    ("negative-float", "[model]\nweight_decay = -0.1\n", [], "loads", "model.weight_decay"),
    ("nan-float", "[run]\nt_end = nan\n", [], "loads", "run.t_end"),
    ("bad-choice", '[solver]\njacobian = "leapfrog"\n', [], "loads", "solver.jacobian"),
    ("bad-choice-model", '[model]\nembedding = "random"\n', [], "loads", "model.embedding"),
    ("bad-task-name", '[task]\nname = "copy"\n', [], "loads", "task.name"),
    ("vocab-too-small", "[task]\nvocab_size = 1\n", [], "loads", "task.vocab_size"),
    ("param-of-other-task", '[task]\nname = "markov"\nlag = 2\n', [], "loads", "task.lag"),
    ("lag-ge-seq-len", '[task]\nname = "lookback"\nseq_len = 4\nlag = 4\n', [], "loads", "task.lag"),
    ("onehot-positions-d-le-T", '[task]\nseq_len = 8\n[model]\nd = 8\npositions = "onehot"\n', [], "loads",
     "model.d"),
    ("basis-file-without-path", '[model]\ncoordinates = "basis_file"\n', [], "loads", "model.basis_path"),
    ("path-without-basis-file", '[model]\nbasis_path = "b.npz"\n', [], "loads", "model.basis_path"),
    ("dt-min-gt-dt-max", "[solver]\ndt_min = 0.5\ndt_max = 0.1\n", [], "loads", "solver.dt_min"),
    ("frame-interval-gt-t-end", "[run]\nt_end = 1.0\nframe_interval = 2.0\n", [], "loads", "run.frame_interval"),
    ("text-without-path", '[task]\nname = "text"\n', [], "loads", "task.path"),
    ("chaos-n-list-fraction", "[chaos]\nn_list = [1.5]\n", [], "loads", "chaos.n_list"),
    ("chaos-eta-list-empty", "[chaos]\neta_list = []\n", [], "loads", "chaos.eta_list"),
    ("chaos-eta-list-nan", "[chaos]\neta_list = [nan]\n", [], "loads", "chaos.eta_list"),
    ("weight-decays-negative", "[stability]\nweight_decays = [-1.0]\n", [], "loads", "stability.weight_decays"),
    ("weight-decays-nan", "[stability]\nweight_decays = [nan]\n", [], "loads", "stability.weight_decays"),
    ("grid-lower-inf", "[grid]\nlower = [-inf]\n", [], "loads", "grid.lower"),
    ("init-mean-nan", "[init]\nmean = [nan]\n", [], "loads", "init.mean"),
    ("huge-int-for-float", "[run]\nt_end = 1" + "0" * 400 + "\n", [], "loads", "run.t_end"),
    ("huge-int-in-list", "[chaos]\nn_list = [1" + "0" * 400 + "]\n", [], "loads", "chaos.n_list"),
    ("malformed-toml", "[run\nt_end = 1.0\n", [], "loads", "TOML"),
    ("malformed-value", "[run]\nt_end = 1.0.0\n", [], "loads", "TOML"),
    ("deeply-nested-toml", "a = " + "[" * 5000 + "]" * 5000 + "\n", [], "loads", "TOML"),
    ("override-without-equals", "", ["run.t_end"], "loads", "run.t_end"),
    ("override-without-dot", "", ["t_end=2"], "loads", "t_end=2"),
    ("override-unknown-key", "", ["run.tend=2"], "loads", "run.tend"),
    ("override-bad-value", "", ["model.d=abc"], "loads", "model.d"),
    ("override-into-non-table", "run = 1\n", ["run.t_end=2"], "loads", "run"),
    ("onehot-embedding-d-lt-V", '[task]\nvocab_size = 8\nn_samples = 8\n[model]\nd = 5\nembedding = "onehot"\n', [],
     "problem", "model.embedding"),
    ("onehot-embedding-positions",
     '[task]\nvocab_size = 5\nseq_len = 3\nn_samples = 8\n[model]\nd = 7\npositions = "onehot"\n', [], "problem",
     "model.embedding"),
    ("identity-unembedding-d-lt-V",
     '[task]\nvocab_size = 8\nn_samples = 8\n[model]\nd = 5\nembedding = "gaussian"\nunembedding = "identity"\n',
     [], "problem", "model.unembedding"),
    ("basis-file-wrong-shape", small('coordinates = "basis_file"\nbasis_path = "{tmp}/bad_shape.npz"\n'), [],
     "problem", "model.basis_path"),
    ("basis-file-wrong-theta0", small('coordinates = "basis_file"\nbasis_path = "{tmp}/bad_theta0.npz"\n'), [],
     "problem", "model.basis_path"),
    ("basis-file-nonfinite", small('coordinates = "basis_file"\nbasis_path = "{tmp}/nonfinite.npz"\n'), [],
     "problem", "model.basis_path"),
    ("basis-file-no-basis", small('coordinates = "basis_file"\nbasis_path = "{tmp}/no_basis.npz"\n'), [],
     "problem", "model.basis_path"),
    ("basis-file-not-npz", small('coordinates = "basis_file"\nbasis_path = "{tmp}/not_npz.npz"\n'), [],
     "problem", "model.basis_path"),
    ("basis-file-missing", small('coordinates = "basis_file"\nbasis_path = "{tmp}/nope.npz"\n'), [],
     "problem", "model.basis_path"),
    ("text-file-missing", '[task]\nname = "text"\nvocab_size = 0\npath = "{tmp}/nope.txt"\n', [], "problem",
     "path"),
    ("enumeration-too-large", '[task]\nexact = true\nvocab_size = 5\nseq_len = 9\n[model]\nd = 7\n', [],
     "problem", "vocab_size"),
    ("missing-config-file", "", [], "file", "absent.toml"),
    ("init-mean-wrong-length", small('coordinates = "gain2"\n[init]\nmean = [1.0, 2.0, 3.0]\n'), [], "measure",
     "init.mean"),
]


def check_message(exc: ConfigError, expected: str) -> None:
    msg = str(exc)
    assert expected in msg, msg
    assert msg.strip() and "\n" not in msg and "\r" not in msg, repr(msg)


def _run(text: str, overrides: list[str], where: str, folder) -> None:
    if where == "file":
        load_config(folder / "absent.toml", overrides)
        return
    cfg = loads_config(text, overrides)
    if where == "loads":
        return
    problem = Problem.from_config(cfg)
    if where == "measure":
        problem.initial_measure(cfg)


def test_bad_table_is_large_and_unique():
    ids = [row[0] for row in BAD]
    assert len(ids) == len(set(ids)) and len(ids) >= 20


@pytest.mark.parametrize("name,text,overrides,where,expected", BAD, ids=[row[0] for row in BAD])
def test_bad_config_raises_config_error_naming_the_key(files, name, text, overrides, where, expected):
    text = text.replace("{tmp}", str(files))
    with pytest.raises(ConfigError) as info:
        _run(text, overrides, where, files)
    check_message(info.value, expected)
    if where in ("problem", "measure"):  # these pass the schema: the data or the files are what is wrong
        loads_config(text, overrides)


def test_unreadable_config_file(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes("[output]\npath = 'caf\xe9'\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    check_message(info.value, str(path))


def test_malformed_file_message_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[run\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    check_message(info.value, str(path))


@pytest.mark.parametrize("text,overrides", [
    ('[run]\n"a\\nb" = 1\n', []),
    ('["x\\ny"]\n', []),
    ("", ["x\ny.t_end=1"]),
    ("", ["run.a\rb=1"]),
])
def test_messages_stay_on_one_line_with_odd_key_names(text, overrides):
    with pytest.raises(ConfigError) as info:
        loads_config(text, overrides)
    check_message(info.value, "")


def test_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[run]\nt_end = 5.0\nframe_interval = 0.5\n[solver]\nmethod = "rk4"\ndt = 0.1\n')
    cfg = load_config(path, overrides=["run.t_end=2", "solver.method=heun"])
    assert cfg.run.t_end == 2.0 and isinstance(cfg.run.t_end, float)
    assert cfg.solver.method == "heun"
    assert cfg.run.frame_interval == 0.5 and cfg.solver.dt == 0.1
    assert cfg.source == str(path)
    assert load_config(path).run.t_end == 5.0
    # later overrides win; a new section is created; list and string values parse as TOML
    cfg = load_config(path, overrides=["run.t_end=2", "run.t_end=3", "init.mean=[1, 2.5]", 'output.path="x.h5"'])
    assert cfg.run.t_end == 3.0 and cfg.init.mean == [1, 2.5] and cfg.output.path == "x.h5"
    assert parse_override(" model.d = 12 ") == ("model", "d", 12)


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    sub = tmp_path / "cfg"
    sub.mkdir()
    p = 4 * 7 * 2
    np.savez(sub / "b.npz", basis=np.eye(p)[:, :2])
    (sub / "c.toml").write_text(SMALL + 'coordinates = "basis_file"\nbasis_path = "b.npz"\n')
    cfg = load_config(sub / "c.toml")
    assert cfg.resolve_path("b.npz") == sub / "b.npz"
    problem = Problem.from_config(cfg)
    assert problem.k == 2 and np.array_equal(problem.arrays()["basis"], np.eye(p)[:, :2])


def test_replace_validates():
    cfg = loads_config("")
    assert cfg.replace(run={"t_end": 2.0}).run.t_end == 2.0
    with pytest.raises(ConfigError) as info:
        cfg.replace(run={"t_end": -1.0})
    check_message(info.value, "run.t_end")
    with pytest.raises(ConfigError) as info:
        cfg.replace(bogus={"a": 1})
    check_message(info.value, "bogus")


def nondefault_config() -> Config:
    return loads_config(
        '[task]\nname = "text"\npath = "dir/my \\"book\\" \\\\ é.txt"\nvocab_size = 0\nseq_len = 5\n'
        '[model]\nd = 9\nbeta = 3.5\nweight_decay = 1e-3\nscore_scale = 0.1\nprecision = "float32"\n'
        "[init]\nmean = [1, -2.5, 0.0]\n[diagnostics]\ne_star = 0.25\ngap = false\n"
        "[grid]\nlower = [-1.5]\nupper = [2, 3]\n[stability]\nweight_decays = [0.0, 0.1]\n"
        "[solver]\ndt_max = 0.5\nmethod = \"adaptive\"\n")


@pytest.mark.parametrize("make", [lambda: loads_config(""), nondefault_config], ids=["defaults", "non-default"])
def test_to_toml_round_trip(make):
    cfg = make()
    text = cfg.to_toml()
    again = loads_config(text)
    assert again.to_toml() == text
    assert again.to_dict().keys() == cfg.to_dict().keys()
    for name in SECTIONS:  # equal values (nan == nan for e_star)
        for key, value in cfg.to_dict()[name].items():
            other = again.to_dict()[name][key]
            assert type(other) is type(value) and (other == value or (value != value and other != other)), key


@pytest.mark.parametrize("path", ["line\nbreak.txt", "tab\there.txt", "bell\x07.txt", "del\x7f.txt"])
def test_to_toml_round_trip_with_control_characters(path):
    cfg = loads_config("[output]\npath = " + json.dumps(path).replace("\x7f", "\\u007f") + "\n")
    assert cfg.output.path == path
    text = cfg.to_toml()
    assert loads_config(text).to_toml() == text


def test_schema_description_lists_every_key():
    text = describe_schema()
    for name, cls in SECTIONS.items():
        assert f"[{name}]" in text
        for f in dataclasses.fields(cls):
            assert f"  {f.name} = " in text


# --------------------------------------------------------------------------------------------------
# fuzzing: nothing but a one-line ConfigError may escape

SECTION_NAMES = list(SECTIONS)
KEY_NAMES = sorted({f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)})
FRAGMENTS = ["[", "]", "[[", "]]", "=", " = ", "\n", '"', "'", ",", "{", "}", ".", "#", "inf", "nan", "-inf",
             "true", "false", "1", "-3", "0.5", "1e400", "1979-05-27", '"markov"', '"text"', '"basis_file"',
             "[1, 2]", "[]", "{a = 1}", "\\", "\\n", '"""', "+", "_", "0x1f", "1_000"] + \
            [f"[{s}]\n" for s in SECTION_NAMES] + [f"{k} = " for k in KEY_NAMES]

toml_ish_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=40).map("".join)

scalars = st.one_of(
    st.booleans(), st.integers(), st.integers(min_value=-10**320, max_value=10**320),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["markov", "text", "lookback", "onehot", "gaussian", "identity", "basis_file", "gain3",
                     "heun", "inf", "float32", "log", "fresh"]))
values = st.one_of(scalars, st.lists(scalars, max_size=4), st.dictionaries(st.text(max_size=3), scalars, max_size=2))
names = lambda known: st.one_of(st.sampled_from(known), st.text(max_size=6))  # noqa: E731
config_dicts = st.dictionaries(names(SECTION_NAMES), st.dictionaries(names(KEY_NAMES), values, max_size=6),
                               max_size=5)


def toml_string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def dict_to_toml(data: dict) -> str:
    lines = []
    for section, table in data.items():
        lines.append(f"[{toml_string(section)}]")
        lines.extend(f"{toml_string(k)} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


overrides = st.lists(st.one_of(
    st.text(max_size=12),
    st.builds(lambda s, k, v: f"{s}.{k}={v}", names(SECTION_NAMES), names(KEY_NAMES),
              st.one_of(scalars.map(toml_value), st.text(max_size=6)))), max_size=3)


def must_be_config_error_or_config(call) -> None:
    try:
        cfg = call()
    except ConfigError as exc:
        msg = str(exc)
        assert msg.strip() and "\n" not in msg and "\r" not in msg, repr(msg)
    else:
        assert isinstance(cfg, Config)


FUZZ = settings(max_examples=300, deadline=None, database=None, derandomize=True, report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@FUZZ
@given(text=toml_ish_text, extra=overrides)
def test_fuzz_loads_config_text(text, extra):
    must_be_config_error_or_config(lambda: loads_config(text, extra))


@FUZZ
@given(data=config_dicts, extra=overrides)
def test_fuzz_loads_config_dicts(data, extra):
    text = dict_to_toml(data)
    must_be_config_error_or_config(lambda: loads_config(text, extra))
