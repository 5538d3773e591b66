"""Data distributions for training one causal attention layer.

Every task produces a :class:`TaskData` in the layout of docs/model.md, section "Data": tokens and targets
[B, T] (int64, values in ``0..V-1``), a 0/1 loss mask [B, T] and weights [B] summing to one, as read-only arrays.
:func:`sample_task` draws ``B`` i.i.d. sequences (``w = 1/B``), :func:`enumerate_task` lists every sequence with its
probability as weight; :func:`make_task` chooses with its ``exact`` flag. Tasks: ``markov``, ``lookback``,
``majority``, ``associative``, ``text``. Conventions (masked targets, random streams, enumeration order):
docs/design.md, "Tasks".
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "MAX_ENUMERATION",
    "TASKS",
    "TASK_NAMES",
    "Task",
    "TaskData",
    "TaskError",
    "enumerate_task",
    "make_task",
    "reads_file",
    "sample_data_set",
    "sample_task",
]

MAX_ENUMERATION: int = 2**20
"""Largest number of sequences an exact enumeration may produce (checked before allocating)."""


class TaskError(ValueError):
    """Invalid task request; the one-line message names the offending parameter."""


@dataclass(frozen=True)
class TaskData:
    """A weighted set of ``B`` sequences of length ``T`` (docs/model.md, "Data").

    Attributes:
        tokens: int64 ``[B, T]`` input tokens in ``0..V-1``.
        targets: int64 ``[B, T]`` target tokens in ``0..V-1``.
        mask: float64 ``[B, T]`` 0/1 loss mask with at least one 1 per row.
        weights: float64 ``[B]``, ``>= 0``, summing to 1.
        vocab_size: ``V``.
        alphabet: for the ``text`` task, the characters; ``alphabet[i]`` is token ``i``.

    The invariants above are checked on construction (``TaskError`` naming the field), and the
    four arrays are then marked read-only (in place: pass copies to keep writable originals).
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray
    weights: np.ndarray
    vocab_size: int
    alphabet: str | None = None

    def __post_init__(self) -> None:
        V = self.vocab_size
        if isinstance(V, bool) or not isinstance(V, (int, np.integer)) or V < 1:
            raise TaskError(f"vocab_size must be a positive int, got {V!r}")
        for name, dtype in (("tokens", np.int64), ("targets", np.int64), ("mask", np.float64)):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.ndim != 2:
                raise TaskError(f"{name} must be a 2-d {np.dtype(dtype).name} array")
        B, T = self.tokens.shape
        if B < 1 or T < 1:
            raise TaskError(f"tokens must have shape [B, T] with B, T >= 1, got {(B, T)}")
        for name in ("targets", "mask"):
            if getattr(self, name).shape != (B, T):
                raise TaskError(f"{name} has shape {getattr(self, name).shape}, expected {(B, T)}")
        for name in ("tokens", "targets"):
            arr = getattr(self, name)
            if arr.min() < 0 or arr.max() >= V:
                raise TaskError(f"{name} must lie in 0..{V - 1}")
        m = self.mask
        if not np.all((m == 0.0) | (m == 1.0)):
            raise TaskError("mask must contain only 0 and 1")
        if not np.all(m.max(axis=1) == 1.0):
            raise TaskError("mask must have at least one 1 per row")
        w = self.weights
        if not isinstance(w, np.ndarray) or w.dtype != np.float64 or w.shape != (B,):
            raise TaskError(f"weights must be a float64 array of shape {(B,)}")
        if not np.all(np.isfinite(w)) or w.min() < 0.0 or abs(w.sum() - 1.0) > 1e-9:
            raise TaskError("weights must be finite, >= 0 and sum to 1")
        if self.alphabet is not None and len(self.alphabet) != V:
            raise TaskError(f"alphabet has {len(self.alphabet)} characters, vocab_size is {V}")
        for name in ("tokens", "targets", "mask", "weights"):
            getattr(self, name).flags.writeable = False


# ----------------------------------------------------------------------------------------------
# Validation helpers


def _as_int(name: str, value: Any, minimum: int | None = None) -> int:
    # bool is an int subclass; True as a length is always a caller bug
    if isinstance(value, bool):
        raise TaskError(f"{name} must be an int, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TaskError(f"{name} must be an int, got {value!r}") from None
    if minimum is not None and v < minimum:
        raise TaskError(f"{name} must be >= {minimum}, got {v}")
    return v


def _fmt_count(n: int) -> str:
    s = str(n)
    return s if len(s) <= 24 else f"~1e{len(s) - 1}"


def _check_count(task: str, formula: str, count: int, hint: str) -> None:
    # MAX_ENUMERATION is read at call time so tests and callers may lower it
    limit = MAX_ENUMERATION
    if count > limit:
        raise TaskError(
            f"{task}: exact enumeration has {formula} = {_fmt_count(count)} sequences, more than "
            f"MAX_ENUMERATION = {limit}; reduce {hint}"
        )


def _sampling_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))


def _digits(index: np.ndarray, base: int, n: int) -> np.ndarray:
    """Base-``base`` digits of ``index``, most significant first: int64 ``[len(index), n]``."""
    out = np.empty((index.shape[0], n), dtype=np.int64)
    rest = index.copy()
    for j in range(n - 1, -1, -1):
        out[:, j] = rest % base
        rest //= base
    return out


def _finish(tokens, targets, mask, weights, V: int, alphabet: str | None = None) -> TaskData:
    """Wraps arrays into a TaskData; ``weights=None`` means uniform, exactly ``1/B`` each."""
    if weights is None:
        weights = np.full(tokens.shape[0], 1.0 / tokens.shape[0])
    else:
        # explicit normalization keeps sum(w) = 1 to rounding for products of probabilities
        weights = np.asarray(weights, dtype=np.float64)
        weights = weights / weights.sum()
    return TaskData(
        tokens=np.ascontiguousarray(tokens, dtype=np.int64),
        targets=np.ascontiguousarray(targets, dtype=np.int64),
        mask=np.ascontiguousarray(mask, dtype=np.float64),
        weights=np.ascontiguousarray(weights),
        vocab_size=int(V),
        alphabet=alphabet,
    )


# ----------------------------------------------------------------------------------------------
# markov


def _markov_matrix(V: int, concentration: float, chain_seed: int) -> np.ndarray:
    """``P[a, b]`` = probability of token ``b`` after ``a``; rows ~ Dirichlet(concentration * 1_V).

    Drawn as ``np.random.default_rng(chain_seed).dirichlet(concentration * np.ones(V), size=V)``.
    """
    P = np.random.default_rng(chain_seed).dirichlet(np.full(V, concentration), size=V)
    # Dirichlet rows sum to 1 only to rounding; renormalize so the enumeration weights are exact
    return P / P.sum(axis=1, keepdims=True)


def _markov_params(V: int, T: int, seed: int | None, params: dict) -> tuple[np.ndarray, int]:
    conc = params.get("concentration", 1.0)
    try:
        conc = float(conc)
    except (TypeError, ValueError):
        raise TaskError(f"concentration must be a positive float, got {conc!r}") from None
    if not (math.isfinite(conc) and conc > 0.0):
        raise TaskError(f"concentration must be a positive finite float, got {conc!r}")
    chain_seed = params.get("chain_seed")
    if chain_seed is None:
        chain_seed = seed
    if chain_seed is None:
        raise TaskError("chain_seed (or seed) is required to draw the markov transition matrix")
    chain_seed = _as_int("chain_seed", chain_seed, 0)
    return _markov_matrix(V, conc, chain_seed), chain_seed


def _sample_markov(V: int, T: int, B: int, rng: np.random.Generator, seed: int, params: dict):
    """Markov chain over the vocabulary.

    Process: the transition matrix ``P`` (V x V) has rows drawn i.i.d. from
    ``Dirichlet(concentration * ones(V))`` (param ``concentration``, default 1.0) by
    ``np.random.default_rng(chain_seed).dirichlet(...)`` (param ``chain_seed``; default or
    ``None``: ``seed``), so exact and sampled versions of the same task with the same
    ``chain_seed`` share the chain.
    A sequence has ``T+1`` tokens: ``s_0`` uniform on ``0..V-1``, ``s_{t+1} ~ P[s_t, :]``.
    ``tokens = s[:T]``, ``targets = s[1:]``, mask all ones.

    Exact: all ``V**(T+1)`` sequences ``s`` in lexicographic order, weight
    ``(1/V) prod_t P[s_t, s_{t+1}]``.
    """
    P, _ = _markov_params(V, T, seed, params)
    # inverse-CDF draws for all rows at once: row a's CDF is shifted to [a, a+1], which makes the
    # flattened table sorted, so one searchsorted replaces a [B, V] comparison per step
    shifted = (np.cumsum(P, axis=1) + np.arange(V)[:, None]).ravel()
    s = np.empty((B, T + 1), dtype=np.int64)
    s[:, 0] = rng.integers(0, V, size=B)
    for t in range(T):
        a = s[:, t]
        u = rng.random(B)
        nxt = np.searchsorted(shifted, a + u, side="right") - a * V
        # the clip guards against the last CDF entry rounding just below u
        s[:, t + 1] = np.clip(nxt, 0, V - 1)
    return _finish(s[:, :T], s[:, 1:], np.ones((B, T)), None, V)


def _enumerate_markov(V: int, T: int, seed: int | None, params: dict):
    count = V ** (T + 1)
    formula = f"vocab_size**(seq_len+1) = {V}**{T + 1}"
    _check_count("markov", formula, count, "vocab_size or seq_len")
    P, _ = _markov_params(V, T, seed, params)
    s = _digits(np.arange(count, dtype=np.int64), V, T + 1)
    w = np.full(count, 1.0 / V)
    for t in range(T):
        w *= P[s[:, t], s[:, t + 1]]
    return _finish(s[:, :T], s[:, 1:], np.ones((count, T)), w, V)


# ----------------------------------------------------------------------------------------------
# lookback


def _lookback_lag(T: int, params: dict) -> int:
    lag = _as_int("lag", params.get("lag", 1), 1)
    if lag >= T:
        raise TaskError(f"lag must satisfy 1 <= lag < seq_len = {T}, got {lag}")
    return lag


def _lookback_targets(tokens: np.ndarray, lag: int):
    B, T = tokens.shape
    targets = np.zeros_like(tokens)
    targets[:, lag:] = tokens[:, : T - lag]
    mask = np.zeros((B, T))
    mask[:, lag:] = 1.0
    return targets, mask


def _sample_lookback(V: int, T: int, B: int, rng: np.random.Generator, seed: int, params: dict):
    """Copy the token ``lag`` positions back.

    Process: ``tokens[l]`` i.i.d. uniform on ``0..V-1``; ``targets[l] = tokens[l - lag]`` and
    ``mask[l] = 1`` for ``l >= lag``, ``mask[l] = 0`` (target 0) for ``l < lag``.
    Param ``lag`` (default 1) must satisfy ``1 <= lag < T``.

    Exact: all ``V**T`` token sequences in lexicographic order, each weight ``V**-T``.
    """
    lag = _lookback_lag(T, params)
    tokens = rng.integers(0, V, size=(B, T), dtype=np.int64)
    targets, mask = _lookback_targets(tokens, lag)
    return _finish(tokens, targets, mask, None, V)


def _enumerate_lookback(V: int, T: int, seed: int | None, params: dict):
    lag = _lookback_lag(T, params)
    count = V**T
    _check_count("lookback", f"vocab_size**seq_len = {V}**{T}", count, "vocab_size or seq_len")
    tokens = _digits(np.arange(count, dtype=np.int64), V, T)
    targets, mask = _lookback_targets(tokens, lag)
    return _finish(tokens, targets, mask, None, V)


# ----------------------------------------------------------------------------------------------
# majority


def _majority_targets(tokens: np.ndarray, V: int) -> np.ndarray:
    """Running mode of each row, ties to the smallest token id.

    Only the token just added changes its count, so the mode can be updated incrementally.
    When ``V > T`` counts are kept over within-row ranks (at most T distinct values) instead of
    token ids, so memory is O(B*min(V, T)); ranks preserve id order, so the tie rule on ids is
    the tie rule on ranks.
    """
    B, T = tokens.shape
    if V <= T:
        rank, width = tokens, V
    else:
        order = np.argsort(tokens, axis=1, kind="stable")
        srt = np.take_along_axis(tokens, order, axis=1)
        new_value = np.ones((B, T), dtype=bool)
        new_value[:, 1:] = srt[:, 1:] != srt[:, :-1]
        del srt
        rank = np.empty((B, T), dtype=np.int64)
        np.put_along_axis(rank, order, np.cumsum(new_value, axis=1) - 1, axis=1)
        del order, new_value
        width = T

    rows = np.arange(B)
    counts = np.zeros((B, width), dtype=np.int32)
    best_count = np.zeros(B, dtype=np.int32)
    best_rank = np.zeros(B, dtype=np.int64)
    best_tok = np.zeros(B, dtype=np.int64)
    targets = np.empty((B, T), dtype=np.int64)
    for l in range(T):
        r = rank[:, l]
        counts[rows, r] += 1
        c = counts[rows, r]
        take = (c > best_count) | ((c == best_count) & (r < best_rank))
        best_count = np.where(take, c, best_count)
        best_rank = np.where(take, r, best_rank)
        best_tok = np.where(take, tokens[:, l], best_tok)
        targets[:, l] = best_tok
    return targets


def _sample_majority(V: int, T: int, B: int, rng: np.random.Generator, seed: int, params: dict):
    """Running majority.

    Process: ``tokens[l]`` i.i.d. uniform on ``0..V-1``; ``targets[l]`` is the most frequent token
    among ``tokens[0..l]`` (inclusive), ties broken by the smallest token id; mask all ones.

    Exact: all ``V**T`` token sequences in lexicographic order, each weight ``V**-T``.
    """
    tokens = rng.integers(0, V, size=(B, T), dtype=np.int64)
    return _finish(tokens, _majority_targets(tokens, V), np.ones((B, T)), None, V)


def _enumerate_majority(V: int, T: int, seed: int | None, params: dict):
    count = V**T
    _check_count("majority", f"vocab_size**seq_len = {V}**{T}", count, "vocab_size or seq_len")
    tokens = _digits(np.arange(count, dtype=np.int64), V, T)
    return _finish(
        tokens, _majority_targets(tokens, V), np.ones((count, T)), None, V
    )


# ----------------------------------------------------------------------------------------------
# associative recall


def _assoc_layout(V: int, T: int, params: dict) -> tuple[int, int, int]:
    """Returns ``(n_pairs, n_keys, n_values)``."""
    n_keys, n_values = V // 2, V - V // 2
    if params.get("n_pairs") is not None:
        n = _as_int("n_pairs", params["n_pairs"], 1)
        if T != 2 * n + 1:
            raise TaskError(
                f"seq_len must equal 2*n_pairs+1 = {2 * n + 1} for associative, got {T}"
            )
    else:
        if T < 3 or T % 2 == 0:
            raise TaskError(
                f"seq_len must be odd and >= 3 for associative (2*n_pairs+1), got {T}"
            )
        n = (T - 1) // 2
    if n > n_keys:
        raise TaskError(
            f"n_pairs = {n} exceeds the {n_keys} distinct keys of vocab_size = {V} "
            "(keys are 0..V//2-1)"
        )
    return n, n_keys, n_values


def _distinct_from_lehmer(digits: np.ndarray) -> np.ndarray:
    """Ordered distinct keys from Lehmer digits: ``digits[:, j]`` in ``0..K-1-j`` selects the
    ``digits[:, j]``-th smallest key not chosen before. Uniform digits give a uniform ordered
    sample without replacement; all digit tuples give every arrangement exactly once.
    """
    M, n = digits.shape
    keys = np.empty((M, n), dtype=np.int64)
    for j in range(n):
        c = digits[:, j].copy()
        prev = np.sort(keys[:, :j], axis=1)
        # walking the earlier keys in ascending order, each one at or below c shifts c up by one
        for i in range(j):
            c += prev[:, i] <= c
        keys[:, j] = c
    return keys


def _assoc_build(keys: np.ndarray, values: np.ndarray, q: np.ndarray):
    M, n = keys.shape
    T = 2 * n + 1
    tokens = np.empty((M, T), dtype=np.int64)
    tokens[:, 0 : 2 * n : 2] = keys
    tokens[:, 1 : 2 * n : 2] = values
    rows = np.arange(M)
    tokens[:, -1] = keys[rows, q]
    targets = np.zeros((M, T), dtype=np.int64)
    targets[:, -1] = values[rows, q]
    mask = np.zeros((M, T))
    mask[:, -1] = 1.0
    return tokens, targets, mask


def _sample_associative(V: int, T: int, B: int, rng: np.random.Generator, seed: int, params: dict):
    """Associative recall of a key's value.

    Layout: ``T = 2*n_pairs + 1`` tokens ``k_1 v_1 k_2 v_2 ... k_n v_n q`` (param ``n_pairs``;
    default or ``None``: ``(T-1)//2``, then ``T`` must be odd; a given ``n_pairs`` must satisfy
    ``T == 2*n_pairs+1``). Keys lie in ``0..V//2-1``, values in ``V//2..V-1``.

    Process: ``(k_1..k_n)`` is a uniform ordered sample without replacement from the ``V//2``
    keys (so ``n_pairs <= V//2``); each ``v_i`` is i.i.d. uniform on the values; a query index
    ``i*`` is uniform on ``1..n`` and ``q = k_{i*}``. The target at the last position is
    ``v_{i*}`` with mask 1; all other positions have mask 0 (target 0).

    Exact: every (ordered distinct keys, values, query index), i.e.
    ``K!/(K-n)! * (V-K)**n * n`` sequences with ``K = V//2``, each of probability
    ``(K-n)!/K! * (V-K)**-n / n``; ordered lexicographically by (Lehmer digits of the keys,
    values, query index).
    """
    n, K, Vv = _assoc_layout(V, T, params)
    digits = np.stack([rng.integers(0, K - j, size=B) for j in range(n)], axis=1)
    keys = _distinct_from_lehmer(digits)
    values = K + rng.integers(0, Vv, size=(B, n), dtype=np.int64)
    q = rng.integers(0, n, size=B)
    tokens, targets, mask = _assoc_build(keys, values, q)
    return _finish(tokens, targets, mask, None, V)


def _enumerate_associative(V: int, T: int, seed: int | None, params: dict):
    n, K, Vv = _assoc_layout(V, T, params)
    n_perm = math.perm(K, n)
    count = n_perm * Vv**n * n
    _check_count(
        "associative", f"perm({K}, {n}) * {Vv}**{n} * {n}", count, "vocab_size or n_pairs/seq_len"
    )
    idx = np.arange(count, dtype=np.int64)
    q = idx % n
    idx //= n
    vidx = idx % (Vv**n)
    pidx = idx // (Vv**n)
    lehmer = np.empty((count, n), dtype=np.int64)
    for j in range(n - 1, -1, -1):
        lehmer[:, j] = pidx % (K - j)
        pidx //= K - j
    keys = _distinct_from_lehmer(lehmer)
    values = K + _digits(vidx, Vv, n)
    tokens, targets, mask = _assoc_build(keys, values, q)
    # every configuration is a product of uniform choices, (K-n)!/K! * Vv**-n / n = 1/count
    return _finish(tokens, targets, mask, None, V)


# ----------------------------------------------------------------------------------------------
# text


def _text_source(V: int, T: int, params: dict) -> tuple[np.ndarray, str]:
    """Returns (the file as token ids, the alphabet) after all checks."""
    if "path" not in params:
        raise TaskError("path is required for the text task")
    path = params["path"]
    try:
        path = os.fspath(path)
    except TypeError:
        raise TaskError(f"path must be a str or os.PathLike, got {path!r}") from None
    try:
        # newline="" keeps the file's characters exactly (no \r\n translation)
        with open(path, encoding="utf-8", errors="strict", newline="") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        raise TaskError(f"path {path!r} is not valid UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise TaskError(f"path {path!r} cannot be read: {exc.strerror or exc}") from None
    if len(text) < T + 1:
        raise TaskError(
            f"path {path!r} has {len(text)} characters, fewer than seq_len+1 = {T + 1}"
        )
    alphabet = "".join(sorted(set(text)))
    if len(alphabet) < 2:
        raise TaskError(f"path {path!r} has {len(alphabet)} distinct character(s); need >= 2")
    if V != 0 and V != len(alphabet):
        raise TaskError(
            f"vocab_size = {V} disagrees with the {len(alphabet)} distinct characters of {path!r} "
            "(pass 0 to take it from the file)"
        )
    code = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    lut_keys = np.frombuffer(alphabet.encode("utf-32-le"), dtype="<u4")
    ids = np.searchsorted(lut_keys, code).astype(np.int64)
    return ids, alphabet


def _sample_text(V: int, T: int, B: int, rng: np.random.Generator, seed: int, params: dict):
    """Next character of a UTF-8 text file.

    Param ``path`` (required). The vocabulary is the sorted set of the file's characters (code
    point order); ``alphabet[i]`` is token ``i``. ``vocab_size`` must equal the number of distinct
    characters, or be 0 to take it from the file. The file is read with no newline translation.

    Process: ``B`` windows ``c[o..o+T]`` of ``T+1`` consecutive characters at offsets ``o``
    i.i.d. uniform on ``0..N-T-1`` (``N`` = number of characters); ``tokens = window[:T]``,
    ``targets = window[1:]``, mask all ones.

    Exact: every window (offsets ``0..N-T-1`` in order), each weight ``1/(N-T)``.
    """
    ids, alphabet = _text_source(V, T, params)
    n_windows = ids.shape[0] - T
    offsets = rng.integers(0, n_windows, size=B)
    win = ids[offsets[:, None] + np.arange(T + 1)]
    return _finish(
        win[:, :T], win[:, 1:], np.ones((B, T)), None, len(alphabet), alphabet
    )


def _enumerate_text(V: int, T: int, seed: int | None, params: dict):
    ids, alphabet = _text_source(V, T, params)
    count = ids.shape[0] - T
    _check_count("text", "characters - seq_len", count, "the file (path) or raise seq_len")
    win = np.lib.stride_tricks.sliding_window_view(ids, T + 1)
    return _finish(
        win[:, :T], win[:, 1:], np.ones((count, T)), None,
        len(alphabet), alphabet,
    )


# ----------------------------------------------------------------------------------------------
# dispatch

_SampleFn = Callable[..., TaskData]
_EnumFn = Callable[..., TaskData]



@dataclass(frozen=True)
class Task:
    """A task declared once: its ``name`` (``task.name``), the sampler and the enumerator of its data, the
    task-specific parameters it takes (the ``[task]`` keys of the same names: a config refuses them for other
    tasks), and ``from_config``: the keyword arguments from the config's values of ``params`` and ``task.seed``,
    where a config value means "the default" (default: the values as given)."""
    name: str
    sample: _SampleFn
    enumerate: _EnumFn
    params: tuple[str, ...] = ()
    from_config: Callable[[dict[str, Any], int], dict[str, Any]] | None = None

    def keyword_arguments(self, values: dict[str, Any], seed: int) -> dict[str, Any]:
        """The task-specific keyword arguments of :func:`make_task` from the config's ``values`` of
        :attr:`params` and ``task.seed``."""
        return self.from_config(values, seed) if self.from_config else dict(values)


TASKS: dict[str, Task] = {t.name: t for t in (
    # chain_seed = -1: the data seed task.seed (passed explicitly: sgd and chaos draw with other seeds, same chain)
    Task("markov", _sample_markov, _enumerate_markov, ("concentration", "chain_seed"),
         lambda v, seed: {"concentration": v["concentration"],
                          "chain_seed": seed if v["chain_seed"] < 0 else v["chain_seed"]}),
    Task("lookback", _sample_lookback, _enumerate_lookback, ("lag",)),
    Task("majority", _sample_majority, _enumerate_majority),
    # n_pairs = 0: (T - 1) // 2
    Task("associative", _sample_associative, _enumerate_associative, ("n_pairs",),
         lambda v, seed: {"n_pairs": v["n_pairs"]} if v["n_pairs"] > 0 else {}),
    Task("text", _sample_text, _enumerate_text, ("path",)),
)}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)


def _common(name: Any, vocab_size: Any, seq_len: Any, params: dict) -> tuple[str, int, int]:
    if not isinstance(name, str) or name not in TASKS:
        raise TaskError(f"name must be one of {', '.join(TASK_NAMES)}; got {name!r}")
    # text may take V from the file (vocab_size = 0)
    V = _as_int("vocab_size", vocab_size, 0 if name == "text" else 2)
    if name == "text" and V == 1:
        raise TaskError("vocab_size must be 0 (from the file) or >= 2 for text, got 1")
    T = _as_int("seq_len", seq_len, 1)
    allowed = TASKS[name].params
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        ok = ", ".join(sorted(allowed)) or "none"
        raise TaskError(f"{unknown[0]} is not a parameter of task {name!r} (accepted: {ok})")
    return name, V, T


def sample_task(
    name: str, *, vocab_size: int, seq_len: int, n_samples: int, seed: int, **params: Any
) -> TaskData:
    """Monte Carlo data set: ``B = n_samples`` i.i.d. sequences of task ``name``, ``w = 1/B``.

    Shapes: tokens/targets/mask ``[B, T]`` with ``T = seq_len``, weights ``[B]``.
    Sampling uses ``np.random.default_rng(SeedSequence(seed, spawn_key=(0,)))``; the same
    arguments always give the same data. Raises :class:`TaskError` on bad arguments.
    """
    name, V, T = _common(name, vocab_size, seq_len, params)
    B = _as_int("n_samples", n_samples, 1)
    seed = _as_int("seed", seed, 0)
    return TASKS[name].sample(V, T, B, _sampling_rng(seed), seed, params)


def enumerate_task(
    name: str, *, vocab_size: int, seq_len: int, seed: int | None = None, **params: Any
) -> TaskData:
    """Exact population of task ``name``: every sequence with its probability as weight.

    Shapes: tokens/targets/mask ``[M, T]``, weights ``[M]`` with ``M`` the number of enumerated
    sequences (see each task), which must not exceed :data:`MAX_ENUMERATION`.
    ``seed`` only matters for ``markov``, where it is the default ``chain_seed`` (one of the two
    is required there). Raises :class:`TaskError` on bad arguments or too many sequences.
    """
    name, V, T = _common(name, vocab_size, seq_len, params)
    if seed is not None:
        seed = _as_int("seed", seed, 0)
    return TASKS[name].enumerate(V, T, seed, params)


def make_task(
    name: str,
    *,
    vocab_size: int,
    seq_len: int,
    exact: bool,
    n_samples: int,
    seed: int,
    **params: Any,
) -> TaskData:
    """:func:`enumerate_task` if ``exact`` else :func:`sample_task`.

    ``n_samples`` and ``seed`` are validated in both cases; with ``exact=True``, ``n_samples`` is
    unused and ``seed`` only serves as the default ``chain_seed`` of ``markov``, so
    ``make_task(..., exact=True, seed=s)`` and ``make_task(..., exact=False, seed=s)`` describe
    the same distribution.
    """
    if not isinstance(exact, (bool, np.bool_)):
        raise TaskError(f"exact must be a bool, got {exact!r}")
    _as_int("n_samples", n_samples, 1)
    _as_int("seed", seed, 0)
    if exact:
        return enumerate_task(name, vocab_size=vocab_size, seq_len=seq_len, seed=seed, **params)
    return sample_task(
        name, vocab_size=vocab_size, seq_len=seq_len, n_samples=n_samples, seed=seed, **params
    )


def reads_file(name: str) -> bool:
    """Whether task ``name`` reads its data from a file (``task.path``): such a task's sequences can be drawn only
    where that file is, while a problem stored in a pdeflow file (``/data``) travels with the file."""
    return "path" in TASKS[name].params


def sample_data_set(data: TaskData, *, n_samples: int, seed: int) -> TaskData:
    """``n_samples`` sequences drawn i.i.d. from the weighted set ``data`` (row ``b`` with probability ``w_b``, with
    replacement), each of weight ``1 / n_samples``: fresh sequences of the distribution ``data`` holds (exactly the
    task's when ``data`` is an exact enumeration, its empirical law when ``data`` was sampled). What a command that
    re-runs a stored problem draws for a task whose file it cannot read (:func:`reads_file`). Shapes as
    :func:`sample_task`; the generator as :func:`sample_task`'s for ``seed``."""
    B = _as_int("n_samples", n_samples, 1)
    index = _sampling_rng(_as_int("seed", seed, 0)).choice(len(data.weights), size=B, p=data.weights)
    return TaskData(data.tokens[index], data.targets[index], data.mask[index], np.full(B, 1.0 / B),
                    data.vocab_size, data.alphabet)
