"""Tests of pdeflow.core.tasks: data layout, target rules, exact enumeration, seeding, validation."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdeflow.core import tasks
from pdeflow.core.tasks import MAX_ENUMERATION, TASK_NAMES, TaskData, TaskError, enumerate_task, make_task, sample_task

# Non-ASCII on purpose (2-, 3- and 4-byte UTF-8) plus a CRLF, which must survive unchanged.
TEXT = "héllo wörld, ħéllo ☃ wörld 𝄞!\r\nthe end; héllo again.\n"


@pytest.fixture
def text_path(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_bytes(TEXT.encode("utf-8"))
    return p


# Small configurations whose exact enumeration is cheap; keyword arguments beyond name.
SMALL = {
    "markov": dict(vocab_size=3, seq_len=4, concentration=0.7),
    "lookback": dict(vocab_size=3, seq_len=5, lag=2),
    "majority": dict(vocab_size=3, seq_len=5),
    "associative": dict(vocab_size=6, seq_len=5),
    "text": dict(vocab_size=0, seq_len=6),
}


def small_kwargs(name, text_path):
    kw = dict(SMALL[name])
    if name == "text":
        kw["path"] = text_path
    return kw


def check_layout(d: TaskData, V: int, T: int, B: int | None = None) -> None:
    assert isinstance(d, TaskData)
    assert d.vocab_size == V
    for arr, dtype in ((d.tokens, np.int64), (d.targets, np.int64), (d.mask, np.float64)):
        assert arr.dtype == dtype and arr.ndim == 2 and arr.shape[1] == T
        assert not arr.flags.writeable
    n = d.tokens.shape[0]
    if B is not None:
        assert n == B
    assert d.targets.shape == d.mask.shape == (n, T)
    assert d.weights.dtype == np.float64 and d.weights.shape == (n,)
    assert d.tokens.min() >= 0 and d.tokens.max() < V
    assert d.targets.min() >= 0 and d.targets.max() < V
    assert set(np.unique(d.mask)) <= {0.0, 1.0}
    assert np.all(d.mask.sum(axis=1) >= 1)
    assert np.all(d.weights >= 0)
    assert abs(d.weights.sum() - 1.0) <= 1e-12


# ------------------------------------------------------------------------------------------------
# layout, for every task, sampled and exact


def test_task_names():
    assert TASK_NAMES == ("markov", "lookback", "majority", "associative", "text")
    assert MAX_ENUMERATION == 2**20


@pytest.mark.parametrize("name", TASK_NAMES)
def test_sampled_layout(name, text_path):
    kw = small_kwargs(name, text_path)
    d = sample_task(name, n_samples=37, seed=3, **kw)
    V = len(set(TEXT)) if name == "text" else kw["vocab_size"]
    check_layout(d, V, kw["seq_len"], 37)
    np.testing.assert_array_equal(d.weights, np.full(37, 1 / 37))


@pytest.mark.parametrize("name", TASK_NAMES)
def test_exact_layout(name, text_path):
    kw = small_kwargs(name, text_path)
    d = enumerate_task(name, seed=3, **kw)
    V = len(set(TEXT)) if name == "text" else kw["vocab_size"]
    T = kw["seq_len"]
    check_layout(d, V, T)
    expected = {
        "markov": V ** (T + 1),
        "lookback": V**T,
        "majority": V**T,
        "associative": math.perm(V // 2, 2) * (V - V // 2) ** 2 * 2,
        "text": len(TEXT) - T,
    }[name]
    assert d.tokens.shape[0] == expected


@pytest.mark.parametrize("name", ["lookback", "majority", "associative"])
def test_exact_uniform_tasks_list_every_sequence_once(name):
    kw = SMALL[name]
    d = enumerate_task(name, **kw)
    # lookback/majority are determined by tokens; associative by tokens too (the query is the
    # last token and keys are distinct), so distinct rows mean no sequence is listed twice
    assert len(np.unique(d.tokens, axis=0)) == d.tokens.shape[0]
    np.testing.assert_allclose(d.weights, 1.0 / d.tokens.shape[0], rtol=1e-13)


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(["markov", "lookback", "majority", "associative"]),
    V=st.integers(2, 9),
    half=st.integers(1, 4),
    B=st.integers(1, 20),
    seed=st.integers(0, 2**32),
)
def test_sampled_layout_property(name, V, half, B, seed):
    if name == "associative":
        half = min(half, V // 2)
    T = 2 * half + 1  # odd, so valid for associative; lookback uses lag = 1 < T
    d = sample_task(name, vocab_size=V, seq_len=T, n_samples=B, seed=seed)
    check_layout(d, V, T, B)


# ------------------------------------------------------------------------------------------------
# target rules re-derived by slow loops


def test_markov_targets_are_next_token():
    d = sample_task("markov", vocab_size=5, seq_len=7, n_samples=300, seed=1)
    for b in range(300):
        for l in range(6):
            assert d.targets[b, l] == d.tokens[b, l + 1]
    assert np.all(d.mask == 1.0)


def test_markov_chain_matches_documented_draw():
    # the docstring promises the matrix of default_rng(chain_seed).dirichlet(conc * ones(V), V)
    V, conc = 3, 0.7
    P = np.random.default_rng(11).dirichlet(conc * np.ones(V), size=V)
    d = enumerate_task("markov", vocab_size=V, seq_len=3, concentration=conc, chain_seed=11)
    pair = np.zeros((V, V))
    first = np.zeros(V)
    for b in range(d.tokens.shape[0]):
        pair[d.tokens[b, 0], d.targets[b, 0]] += d.weights[b]
        first[d.tokens[b, 0]] += d.weights[b]
    np.testing.assert_allclose(first, 1 / V, atol=1e-14)
    np.testing.assert_allclose(pair, P / V, atol=1e-14)
    # and the sampled chain follows the same matrix
    s = sample_task("markov", vocab_size=V, seq_len=3, n_samples=20000, seed=5,
                    concentration=conc, chain_seed=11)
    counts = np.zeros((V, V))
    np.add.at(counts, (s.tokens.ravel(), s.targets.ravel()), 1)
    emp = counts / counts.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(emp, P, atol=0.03)


@pytest.mark.parametrize("lag", [1, 3])
def test_lookback_rule(lag):
    T = 6
    d = sample_task("lookback", vocab_size=4, seq_len=T, n_samples=200, seed=2, lag=lag)
    for b in range(200):
        for l in range(T):
            if l >= lag:
                assert d.mask[b, l] == 1.0
                assert d.targets[b, l] == d.tokens[b, l - lag]
            else:
                assert d.mask[b, l] == 0.0


def slow_majority(row):
    out = []
    counter = collections.Counter()
    for tok in row:
        counter[int(tok)] += 1
        top = max(counter.values())
        out.append(min(t for t, c in counter.items() if c == top))
    return out


@pytest.mark.parametrize(
    "V,T",
    [(2, 8), (3, 9), (50, 6)],  # V <= T counts over ids; V > T counts over within-row ranks
)
def test_majority_rule(V, T):
    d = sample_task("majority", vocab_size=V, seq_len=T, n_samples=300, seed=4)
    for b in range(300):
        assert list(d.targets[b]) == slow_majority(d.tokens[b])
    assert np.all(d.mask == 1.0)


@pytest.mark.parametrize("V,T", [(3, 4), (7, 3)])
def test_majority_rule_exact(V, T):
    d = enumerate_task("majority", vocab_size=V, seq_len=T)
    for b in range(d.tokens.shape[0]):
        assert list(d.targets[b]) == slow_majority(d.tokens[b])


def check_associative_rows(d, V, n):
    K = V // 2
    T = 2 * n + 1
    for b in range(d.tokens.shape[0]):
        row = [int(x) for x in d.tokens[b]]
        keys, values = row[0 : 2 * n : 2], row[1 : 2 * n : 2]
        assert len(set(keys)) == n and all(0 <= k < K for k in keys)
        assert all(K <= v < V for v in values)
        table = {}
        for k, v in zip(keys, values):
            table[k] = v
        q = row[-1]
        assert q in table
        assert d.targets[b, T - 1] == table[q]
        assert list(d.mask[b]) == [0.0] * (T - 1) + [1.0]


def test_associative_rule_sampled():
    V, n = 10, 3
    d = sample_task("associative", vocab_size=V, seq_len=2 * n + 1, n_samples=400, seed=6,
                    n_pairs=n)
    check_associative_rows(d, V, n)


def test_associative_rule_exact():
    V, n = 7, 2  # 3 keys, 4 values
    d = enumerate_task("associative", vocab_size=V, seq_len=5)
    assert d.tokens.shape[0] == 3 * 2 * 4**2 * 2
    check_associative_rows(d, V, n)


def test_associative_uses_all_keys_when_n_pairs_is_v_half():
    d = sample_task("associative", vocab_size=8, seq_len=9, n_samples=50, seed=0)
    keys = np.sort(d.tokens[:, 0:8:2], axis=1)
    np.testing.assert_array_equal(keys, np.tile(np.arange(4), (50, 1)))


# ------------------------------------------------------------------------------------------------
# exact enumeration against Monte Carlo


def assert_agree(exact: TaskData, mc: TaskData, stat) -> None:
    f_exact = stat(exact.tokens, exact.targets)
    f_mc = stat(mc.tokens, mc.targets)
    mean_exact = float(np.sum(exact.weights * f_exact))
    se = f_mc.std(ddof=1) / math.sqrt(f_mc.shape[0])
    assert se > 0
    assert abs(f_mc.mean() - mean_exact) < 4 * se, (f_mc.mean(), mean_exact, se)


MARKOV_STATS = [
    lambda tok, y: (tok == y).sum(axis=1).astype(float),  # self-transitions
    lambda tok, y: (y[:, -1] == 0).astype(float),
    lambda tok, y: (tok[:, 0] * y[:, -1]).astype(float),  # long-range correlation
]


@pytest.mark.parametrize("stat", MARKOV_STATS)
def test_markov_exact_matches_monte_carlo(stat):
    kw = dict(vocab_size=3, seq_len=4, concentration=0.5)
    # same seed: exact and sampled tasks share the chain (chain_seed defaults to seed)
    exact = make_task("markov", exact=True, n_samples=1, seed=8, **kw)
    mc = make_task("markov", exact=False, n_samples=100_000, seed=8, **kw)
    assert_agree(exact, mc, stat)


ASSOC_STATS = [
    lambda tok, y: y[:, -1].astype(float),
    lambda tok, y: (tok[:, -1] == tok[:, 0]).astype(float),  # query hits the first pair
    lambda tok, y: ((tok[:, -1] == tok[:, 0]) * tok[:, 1] + tok[:, 2]).astype(float),
]


@pytest.mark.parametrize("stat", ASSOC_STATS)
def test_associative_exact_matches_monte_carlo(stat):
    kw = dict(vocab_size=7, seq_len=5)
    exact = enumerate_task("associative", **kw)
    mc = sample_task("associative", n_samples=100_000, seed=9, **kw)
    assert_agree(exact, mc, stat)


# ------------------------------------------------------------------------------------------------
# seeds


@pytest.mark.parametrize("name", TASK_NAMES)
def test_seeds(name, text_path):
    kw = small_kwargs(name, text_path)
    a = sample_task(name, n_samples=64, seed=1, **kw)
    b = sample_task(name, n_samples=64, seed=1, **kw)
    c = sample_task(name, n_samples=64, seed=2, **kw)
    for field in ("tokens", "targets", "mask", "weights"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.tokens, c.tokens)


def test_markov_chain_seed():
    kw = dict(vocab_size=3, seq_len=3)
    e1 = enumerate_task("markov", seed=1, **kw)
    e5 = enumerate_task("markov", seed=5, **kw)
    e1c5 = enumerate_task("markov", seed=1, chain_seed=5, **kw)
    np.testing.assert_array_equal(e1c5.weights, e5.weights)
    assert not np.allclose(e1.weights, e5.weights)
    # the chain seed changes the transitions, not the sampling stream of the initial tokens
    s1 = sample_task("markov", n_samples=200, seed=1, **kw)
    s1c5 = sample_task("markov", n_samples=200, seed=1, chain_seed=5, **kw)
    np.testing.assert_array_equal(s1.tokens[:, 0], s1c5.tokens[:, 0])
    assert not np.array_equal(s1.targets, s1c5.targets)


def test_make_task_dispatch(text_path):
    for name in TASK_NAMES:
        kw = small_kwargs(name, text_path)
        m = make_task(name, exact=False, n_samples=10, seed=4, **kw)
        s = sample_task(name, n_samples=10, seed=4, **kw)
        np.testing.assert_array_equal(m.tokens, s.tokens)
        m = make_task(name, exact=True, n_samples=10, seed=4, **kw)
        e = enumerate_task(name, seed=4, **kw)
        np.testing.assert_array_equal(m.tokens, e.tokens)
        np.testing.assert_array_equal(m.weights, e.weights)


# ------------------------------------------------------------------------------------------------
# enumeration limit and bad parameters


def test_enumeration_limit_names_count():
    with pytest.raises(TaskError) as err:
        enumerate_task("markov", vocab_size=2, seq_len=20, seed=0)
    msg = str(err.value)
    assert "2097152" in msg and str(MAX_ENUMERATION) in msg and "\n" not in msg


@pytest.mark.parametrize(
    "name,kw,count",
    [
        ("lookback", dict(vocab_size=3, seq_len=5), 243),
        ("majority", dict(vocab_size=4, seq_len=4), 256),
        ("markov", dict(vocab_size=3, seq_len=4, chain_seed=0), 243),
        ("associative", dict(vocab_size=8, seq_len=7), 24 * 64 * 3),
        ("text", dict(vocab_size=0, seq_len=3), len(TEXT) - 3),
    ],
)
def test_enumeration_limit_lowered(monkeypatch, text_path, name, kw, count):
    if name == "text":
        kw = dict(kw, path=text_path)
    monkeypatch.setattr(tasks, "MAX_ENUMERATION", count - 1)
    with pytest.raises(TaskError, match=f"= {count} sequences"):
        enumerate_task(name, **kw)
    monkeypatch.setattr(tasks, "MAX_ENUMERATION", count)
    assert enumerate_task(name, **kw).tokens.shape[0] == count


def test_huge_count_is_reported_without_enumerating():
    with pytest.raises(TaskError, match="MAX_ENUMERATION"):
        enumerate_task("lookback", vocab_size=1000, seq_len=1000)


BASE = dict(vocab_size=4, seq_len=5, n_samples=8, seed=0)

BAD = [
    # (name, overrides of BASE, extra params, word the message must contain)
    ("nope", {}, {}, "name"),
    ("markov", {"vocab_size": 1}, {}, "vocab_size"),
    ("markov", {"vocab_size": 2.5}, {}, "vocab_size"),
    ("markov", {"vocab_size": True}, {}, "vocab_size"),
    ("markov", {"seq_len": 0}, {}, "seq_len"),
    ("markov", {"n_samples": 0}, {}, "n_samples"),
    ("markov", {"seed": -1}, {}, "seed"),
    ("markov", {"seed": "0"}, {}, "seed"),
    ("markov", {}, {"lag": 1}, "lag"),
    ("markov", {}, {"concentration": 0.0}, "concentration"),
    ("markov", {}, {"concentration": float("nan")}, "concentration"),
    ("markov", {}, {"concentration": "big"}, "concentration"),
    ("markov", {}, {"chain_seed": -3}, "chain_seed"),
    ("lookback", {}, {"lag": 0}, "lag"),
    ("lookback", {}, {"lag": 5}, "lag"),
    ("lookback", {}, {"lag": 1.5}, "lag"),
    ("lookback", {}, {"n_pairs": 1}, "n_pairs"),
    ("majority", {}, {"foo": 1}, "foo"),
    ("associative", {"seq_len": 4}, {}, "seq_len"),
    ("associative", {"seq_len": 7}, {"n_pairs": 2}, "seq_len"),
    ("associative", {"vocab_size": 6, "seq_len": 9}, {}, "n_pairs"),
    ("associative", {}, {"n_pairs": 0}, "n_pairs"),
    ("text", {}, {}, "path"),
    ("text", {"vocab_size": 1}, {"path": "x"}, "vocab_size"),
]


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("name,over,params,word", BAD)
def test_bad_parameters(name, over, params, word, exact):
    kw = dict(BASE, **over)
    with pytest.raises(TaskError) as err:
        make_task(name, exact=exact, **kw, **params)
    msg = str(err.value)
    assert word in msg and "\n" not in msg
    assert isinstance(err.value, ValueError)


def test_bad_exact_flag():
    with pytest.raises(TaskError, match="exact"):
        make_task("markov", exact="yes", **BASE)


def test_markov_enumeration_needs_a_chain_seed():
    with pytest.raises(TaskError, match="chain_seed"):
        enumerate_task("markov", vocab_size=2, seq_len=2)


def test_taskdata_checks_invariants():
    ok = dict(tokens=np.zeros((2, 3), np.int64), targets=np.zeros((2, 3), np.int64),
              mask=np.ones((2, 3)), weights=np.full(2, 0.5), vocab_size=2)
    TaskData(**ok)
    for field, bad, word in [
        ("weights", np.array([0.5, 0.6]), "weights"),
        ("weights", np.array([1.5, -0.5]), "weights"),
        ("mask", np.array([[1.0, 0, 0], [0, 0, 0]]), "mask"),
        ("tokens", np.full((2, 3), 2, np.int64), "tokens"),
        ("targets", np.zeros((2, 3), np.int32), "targets"),
    ]:
        with pytest.raises(TaskError, match=word):
            TaskData(**dict(ok, **{field: bad}))


# ------------------------------------------------------------------------------------------------
# text


def test_text_vocabulary_and_windows(text_path):
    T = 6
    alphabet = "".join(sorted(set(TEXT)))
    for V in (0, len(alphabet)):
        d = sample_task("text", vocab_size=V, seq_len=T, n_samples=200, seed=0, path=text_path)
        assert d.alphabet == alphabet and d.vocab_size == len(alphabet)
    assert "\r" in d.alphabet and "𝄞" in d.alphabet and "☃" in d.alphabet
    for b in range(200):
        window = "".join(alphabet[t] for t in d.tokens[b]) + alphabet[d.targets[b, -1]]
        assert window in TEXT
        assert "".join(alphabet[t] for t in d.targets[b]) == window[1:]
    assert np.all(d.mask == 1.0)

    e = enumerate_task("text", vocab_size=0, seq_len=T, path=str(text_path))
    n = len(TEXT) - T
    assert e.tokens.shape == (n, T) and e.alphabet == alphabet
    np.testing.assert_allclose(e.weights, 1.0 / n, rtol=1e-13)
    for o in range(n):
        assert "".join(alphabet[t] for t in e.tokens[o]) == TEXT[o : o + T]
        assert alphabet[e.targets[o, -1]] == TEXT[o + T]


def test_text_errors(tmp_path, text_path):
    missing = tmp_path / "missing.txt"
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("héllo wörld".encode("latin-1"))
    short = tmp_path / "short.txt"
    short.write_text("abc", encoding="utf-8")
    mono = tmp_path / "mono.txt"
    mono.write_text("aaaaaaaaaa", encoding="utf-8")
    for path in (missing, latin1, short, mono, tmp_path):
        for exact in (False, True):
            with pytest.raises(TaskError) as err:
                make_task("text", vocab_size=0, seq_len=4, exact=exact, n_samples=4, seed=0,
                          path=path)
            msg = str(err.value)
            assert "path" in msg and str(path) in msg and "\n" not in msg
    with pytest.raises(TaskError, match="vocab_size"):
        sample_task("text", vocab_size=5, seq_len=4, n_samples=4, seed=0, path=text_path)


def test_a_text_config_without_vocab_size_takes_the_files_alphabet(tmp_path):
    """task.vocab_size defaults to the file's distinct characters for the text task (8 for the other tasks); a
    given vocab_size that disagrees with the file is still refused."""
    from pdeflow.core.config import ConfigError, loads_config
    from pdeflow.core.problem import Problem

    path = tmp_path / "t.txt"
    path.write_text("the next character of a real text, 20 distinct!")
    base = (f'[task]\nname = "text"\npath = "{path}"\nseq_len = 4\nn_samples = 8\n'
            '[model]\nd = 4\nhead_dim = 2\nembedding = "gaussian"\n')
    cfg = loads_config(base)
    assert cfg.task.vocab_size == 0
    assert Problem.from_config(cfg).arrays()["embedding"].shape[0] == len(set(path.read_text()))
    assert loads_config('[task]\nname = "markov"\n').task.vocab_size == 8
    with pytest.raises((ConfigError, TaskError), match="disagrees"):
        Problem.from_config(loads_config(base.replace("seq_len", "vocab_size = 8\nseq_len")))
