"""pdeflow's threads (pdeflow.core.workers): the split of one item's kernel work units over the threads
(for_each_range) hands every unit to exactly one thread, runs the ranges at the same time on distinct threads, gives
each caller helpers of its own and re-raises a helper's exception; the causal kernels split that way give
bit-identical results on any number of threads. The whole evaluation on 1 and 2 threads: tests/core/test_core.py
(test_results_do_not_depend_on_thread_count)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from pdeflow.core import kernels, kernels_jvp, workers

# a range that is not running at the same time as the others makes the barrier time out (BrokenBarrierError):
# concurrency is checked without timing anything
WAIT = 60.0


def recorded_ranges(n: int, threads: int, together: int) -> list[tuple[int, int, int]]:
    """The (lo, hi, thread) of every call of for_each_range(n, threads, ...), each call waiting at a barrier for
    ``together`` calls to be running."""
    calls: list[tuple[int, int, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(together, timeout=WAIT)

    def run_range(lo: int, hi: int) -> None:
        barrier.wait()
        with lock:
            calls.append((lo, hi, threading.get_ident()))

    workers.for_each_range(n, threads, run_range)
    return sorted(calls)


@pytest.mark.parametrize(("n", "threads", "ranges"), [(10, 3, 3), (2, 5, 2), (7, 1, 1), (0, 2, 1)])
def test_each_unit_goes_to_one_range_and_the_ranges_run_together(n, threads, ranges):
    calls = recorded_ranges(n, threads, ranges)
    assert len(calls) == ranges
    bounds = [(lo, hi) for lo, hi, _ in calls]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))  # contiguous: every unit exactly once
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert len({ident for *_, ident in calls}) == ranges  # one thread each
    assert (0, n // ranges, threading.get_ident()) in calls  # the caller runs the first range itself


def test_callers_on_two_threads_get_helpers_of_their_own():
    """Two Python threads each split 2 ranges at once: the 4 ranges run together (a shared helper would hold one
    back and break the barrier)."""
    barrier = threading.Barrier(4, timeout=WAIT)
    seen: list[int] = []

    def run_range(lo: int, hi: int) -> None:
        barrier.wait()
        seen.append(threading.get_ident())

    callers = [threading.Thread(target=workers.for_each_range, args=(4, 2, run_range)) for _ in range(2)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(WAIT)
    assert len(set(seen)) == 4


def test_a_helpers_exception_reaches_the_caller_and_the_helpers_are_reused():
    def fail_late(lo: int, hi: int) -> None:
        if lo > 0:
            raise ValueError(f"range {lo}")

    with pytest.raises(ValueError, match="range 2"):
        workers.for_each_range(4, 2, fail_late)
    workers.for_each_range(4, 2, lambda lo, hi: None)
    before = threading.active_count()
    for _ in range(50):
        workers.for_each_range(4, 3, lambda lo, hi: None)
        workers.for_each_item(5, 3, lambda items, k: list(items))
    assert threading.active_count() <= max(before, 1 + 2)  # the caller and two helpers, kept between calls


def test_an_items_exception_stops_the_other_threads_after_their_current_item():
    """Item 0 raises at once; each other item sleeps a millisecond, so the other thread would need a second
    for all of them."""
    taken: list[int] = []

    def run(items, kernel_threads):
        for i in items:
            taken.append(i)
            if i == 0:
                raise RuntimeError("item 0")
            time.sleep(0.001)

    with pytest.raises(RuntimeError, match="item 0"):
        workers.for_each_item(1000, 2, run)
    assert len(taken) < 1000


def test_the_kernels_split_over_threads_give_the_same_bits():
    """The four causal kernels (forward, backward, and the tangents of both) on 1, 2, 3 and 7 threads: 3 sequences x
    2 tiles = 6 work units, split unevenly (3 threads take 2 each; 7 threads, 6 ranges of one), results bitwise
    the one-thread ones. Adding into the gather needs one thread: refused on two."""
    rng = np.random.default_rng(3)
    B, T, dh, n, R, tile = 3, 5, 2, 70, 15, 64
    rows, drows = rng.standard_normal((2, R, 3, dh, n))
    table, dtable = 0.3 * rng.standard_normal((2, T, 3, dh, n))
    tok = rng.integers(0, R, size=(B, T))
    g, dg = rng.standard_normal((2, B, T, dh, n))

    def outputs(threads: int) -> list[np.ndarray]:
        c, dc, c2, dc2, c3 = np.full((5, B, T, dh, n), np.nan)
        grows, trows = np.full((2, B * T, 3, dh, n), np.nan)
        kernels.causal_attention(rows, table, tok, 0.7, c, tile, threads)
        kernels.causal_attention_vjp(rows, table, tok, g, 0.7, c3, grows, None, tile, threads)
        kernels_jvp.causal_attention_jvp(rows, table, drows, dtable, tok, 0.7, c2, dc, tile, threads)
        kernels_jvp.causal_attention_vjp_jvp(rows, table, drows, dtable, tok, g, dg, 0.7, c2, dc2, trows, None, tile,
                                             threads)
        return [c, c3, grows, dc, dc2, trows]

    one = outputs(1)
    assert all(np.isfinite(x).all() for x in one)  # every unit written
    for threads in (2, 3, 7):
        for mine, ref in zip(outputs(threads), one, strict=True):
            np.testing.assert_array_equal(mine, ref)
    with pytest.raises(ValueError, match="one thread only"):
        kernels.causal_attention_vjp(rows, table, tok, g, 0.7, np.empty((B, T, dh, n)), np.zeros((R, 3, dh, n)),
                                     np.zeros((T, 3, dh, n)), tile, 2)
