"""Chunk-level threads: independent items of work (chunks of heads, blocks of sequences) on several threads.

An evaluation of the mean field is a loop over items whose work is large matrix products (BLAS, which
releases the GIL) and the causal core (numba kernels compiled ``nogil``). Running whole items on separate
threads - each with its own buffers, BLAS on one thread and the serial kernels - keeps every core busy
through the projections too, which numba's parallel loops inside the kernels alone cannot: with BLAS on
one thread they would leave the projections, most of the flops, on one core; with BLAS threaded, its
pool and numba's fight for the cores between every product.

Items are handed out one at a time from a shared counter (a descheduled thread does not hold back the
others) and each item's result is written by exactly one thread, so results do not depend on the number
of threads or on which thread took which item.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _reset_after_fork() -> None:
    # a forked child inherits the executor object but none of its threads
    global _pool, _pool_size
    _pool, _pool_size = None, 0


os.register_at_fork(after_in_child=_reset_after_fork)


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pdeflow")
            _pool_size = workers
        return _pool


@dataclass(frozen=True)
class Region:
    """One :func:`for_each_item` call as :func:`occupancy` saw it: its wall seconds and the seconds each of its
    threads spent in ``run`` (in the order they finished). ``idle`` = threads x wall - sum(busy): thread-seconds in
    which a thread of the region had no item left while another still worked (or waited to start)."""
    wall: float
    busy: tuple[float, ...]

    @property
    def idle(self) -> float:
        return len(self.busy) * self.wall - sum(self.busy)


_regions: list[Region] | None = None


@contextmanager
def occupancy() -> Iterator[list[Region]]:
    """Record every :func:`for_each_item` call of the process while the context is open, as a list of
    :class:`Region` (for benchmarks: a call's time outside its regions is serial, their ``idle`` is the tail
    of the threads' items). Not nested; off otherwise (one global test per call)."""
    global _regions
    record: list[Region] = []
    _regions = record
    try:
        yield record
    finally:
        _regions = None


def for_each_item(n_items: int, threads: int, run: Callable[[Iterator[int], int], None]) -> None:
    """Run ``run(items, kernel_threads)`` on ``w = min(threads, n_items)`` threads (the caller is one).

    ``items`` yields item indices in ``range(n_items)``, shared between the threads: every index is
    yielded exactly once overall. With ``w == 1`` the caller runs everything with ``kernel_threads =
    threads`` (the kernels' own numba threads parallelize inside the one item); with ``w > 1`` every thread
    gets ``kernel_threads = 1``. An exception in any thread stops the others after their current item and
    is re-raised here.
    """
    record = _regions
    if record is None:
        _for_each_item(n_items, threads, run)
        return
    start = time.perf_counter()
    busy: list[float] = []

    def timed_run(items: Iterator[int], kernel_threads: int) -> None:
        t0 = time.perf_counter()
        try:
            run(items, kernel_threads)
        finally:
            busy.append(time.perf_counter() - t0)  # list.append is atomic in CPython

    _for_each_item(n_items, threads, timed_run)
    record.append(Region(time.perf_counter() - start, tuple(busy)))


def _for_each_item(n_items: int, threads: int, run: Callable[[Iterator[int], int], None]) -> None:
    workers = max(1, min(int(threads), int(n_items)))
    if workers == 1:
        run(iter(range(n_items)), threads)
        return
    counter = iter(range(n_items))
    lock = threading.Lock()
    stop = threading.Event()

    def items() -> Iterator[int]:
        while not stop.is_set():
            with lock:
                i = next(counter, None)
            if i is None:
                return
            yield i

    futures = [_executor(workers - 1).submit(run, items(), 1) for _ in range(workers - 1)]
    try:
        run(items(), 1)
    except BaseException:
        stop.set()
        raise
    finally:
        wait(futures)
    for f in futures:
        f.result()
