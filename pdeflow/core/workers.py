"""Chunk-level threads: independent items of work (chunks of heads, blocks of sequences) on several threads.

An evaluation of the mean field is a loop over items whose work is large matrix products (BLAS, which
releases the GIL) and the causal core (numba kernels compiled ``nogil``). Running whole items on separate
threads - each with its own buffers, BLAS on one thread and the serial kernels - keeps every core busy
through the projections too, which splitting the kernels' work units alone cannot: with BLAS on one
thread it would leave the projections, most of the flops, on one core; with BLAS threaded, its pool and
pdeflow's threads fight for the cores between every product. Only an evaluation of one item splits its
kernels' work units over the threads (:func:`for_each_range`).

Items are handed out one at a time from a shared counter (a descheduled thread does not hold back the
others) and each item's result is written by exactly one thread, so results do not depend on the number
of threads or on which thread took which item.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class _Helper:
    """A thread of pdeflow's that runs one task at a time, handed over through two locks. A hand-over and its join
    are paid once per evaluation, and once per kernel call when one item has all the threads (:func:`for_each_range`):
    18 us on the 2-core Xeon (``python -m pdeflow.benchmarks.compile_cost``), where a ``ThreadPoolExecutor``'s submit
    and wait took about 70 us."""

    def __init__(self) -> None:
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._task: Callable[[], None] | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._serve, name="pdeflow", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            try:
                self._task()  # type: ignore[misc]
            except BaseException as error:  # noqa: BLE001 - handed to the caller by join()
                self._error = error
            finally:
                self._task = None
                self._done.release()

    def start(self, task: Callable[[], None]) -> None:
        self._error, self._task = None, task
        self._go.release()

    def join(self) -> BaseException | None:
        """Wait for the task; the exception it raised, if any."""
        self._done.acquire()
        return self._error


_idle: list[_Helper] = []  # helpers no call holds: each call takes its own, so callers on several threads never share
_idle_lock = threading.Lock()


def _reset_after_fork() -> None:
    # a forked child inherits the helper objects but none of their threads
    global _idle, _idle_lock
    _idle, _idle_lock = [], threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _take(k: int) -> list[_Helper]:
    with _idle_lock:
        taken = [_idle.pop() for _ in range(min(k, len(_idle)))]
    return taken + [_Helper() for _ in range(k - len(taken))]


def _give_back(helpers: list[_Helper]) -> None:
    with _idle_lock:
        _idle.extend(helpers)


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
    threads`` (the kernels split the one item's work units over the threads: :func:`for_each_range`); with
    ``w > 1`` every thread gets ``kernel_threads = 1``. An exception in any thread stops the others after their
    current item and is re-raised here.
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

    def share() -> None:
        try:
            run(items(), 1)
        except BaseException:
            stop.set()  # the other threads stop after their current item
            raise

    _together(share, [share] * (workers - 1))


def _together(own: Callable[[], None], others: list[Callable[[], None]]) -> None:
    """Run ``own`` on this thread and each of ``others`` on a helper of its own; return when all are done (every
    helper, before the caller's buffers go), re-raising the first exception (this thread's first)."""
    helpers = _take(len(others))
    for helper, task in zip(helpers, others):
        helper.start(task)
    try:
        own()
    finally:
        errors = [helper.join() for helper in helpers]
        _give_back(helpers)
    for error in errors:
        if error is not None:
            raise error


def for_each_range(n: int, threads: int, run_range: Callable[[int, int], None]) -> None:
    """Run ``run_range(lo, hi)`` over the ``w = min(threads, n)`` contiguous ranges
    ``[n t // w, n (t + 1) // w)``, ``t < w``, of ``range(n)`` on ``w`` threads (the caller is one): what the
    causal kernels do with their work units when one item has all the threads (:func:`for_each_item` with a
    single item). ``run_range`` must release the GIL (pdeflow's kernels are compiled ``nogil``). Not recorded by
    :func:`occupancy`: it runs inside an item of a recorded region."""
    w = max(1, min(int(threads), int(n)))
    if w == 1:  # every kernel call of an item on one thread: no helper to take
        run_range(0, n)
        return
    _together(lambda: run_range(0, n // w),
              [functools.partial(run_range, n * t // w, n * (t + 1) // w) for t in range(1, w)])
