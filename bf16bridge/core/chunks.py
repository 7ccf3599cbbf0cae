"""Running a bits-in, bits-out kernel over a flat array chunk by chunk, on threads, with a
progress bar once a conversion takes a while: extra memory stays bounded by a chunk per thread.

Pure numpy and the standard library: the kernels (``bf16bridge.kernels``) and the numpy
adapter's widening run through here.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time

from bf16bridge.errors import InvalidArgumentError

#: elements per chunk: 4 Mi elements keeps each temporary at 16 MiB
CHUNK = 1 << 22
#: the smallest piece worth a thread of its own
MIN_PIECE = 1 << 18
#: on threads, a conversion is cut into about this many pieces a thread, taken as threads come free
PIECES_PER_THREAD = 4
#: elements a table kernel handles at a time (``blocked``): its temporaries (np.take's intp
#: indices among them) stay in cache
BLOCK = 1 << 16
#: show a progress bar when a conversion is still running after this many seconds
PROGRESS_AFTER_S = 1.0

_POOLS: dict = {}
#: the cores this process may run on, read once: asking costs more than a small conversion
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
_POOL_LOCK = threading.Lock()


class Progress:
    """A plain progress bar on stderr, shown only once a conversion has taken a while."""

    def __init__(self, total: int, label, enabled: bool | None):
        # label: a str, or a call giving one, made only when the bar shows (naming a dtype costs
        # time a small conversion that shows no bar should not pay)
        self.total, self.label, self.enabled = total, label, enabled
        self.start = time.perf_counter()
        self.shown = False

    def update(self, done: int) -> None:
        if self.enabled is False:
            return
        if not self.shown:
            if self.enabled is None and (time.perf_counter() - self.start < PROGRESS_AFTER_S or not sys.stderr.isatty()):
                return
            self.shown = True
            if callable(self.label):
                self.label = self.label()
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:6.1%}")
        if done >= self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def spread(kernel, threaded: bool, src, dst, chunk: int, threads: int | None, bar: Progress) -> None:
    """Run ``kernel(src piece, dst piece)`` over the flat arrays chunk by chunk, on threads."""
    n = src.size
    # a threaded backend parallelises inside each call; the others get a thread per piece
    workers = 1 if threaded else max(1, min(threads or _CORES, 8))
    if chunk < 1:
        raise InvalidArgumentError(f"chunk must be a positive number of elements; got {chunk}")
    if n <= chunk and (workers == 1 or n <= MIN_PIECE):  # one piece (the spans below would be one)
        if n:
            kernel(src, dst)
            bar.update(n)
        return
    if workers > 1:  # pieces small enough that a thread slowed by other load holds up little
        chunk = min(chunk, max(MIN_PIECE, -(-n // (workers * PIECES_PER_THREAD))))
    if workers == 1 or n <= chunk:
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            kernel(src[lo:hi], dst[lo:hi])
            bar.update(hi)
        return
    _on_threads(kernel, src, dst, chunk, workers, bar)


def _pool(size: int):
    with _POOL_LOCK:
        pool = _POOLS.get(size)
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            pool = _POOLS[size] = ThreadPoolExecutor(size, thread_name_prefix="bf16bridge-kernel")
    return pool


def _on_threads(kernel, src, dst, chunk: int, workers: int, bar: Progress) -> None:
    """The calling thread and ``workers - 1`` pool threads each take the next piece until none is
    left: one piece a thread at a time, so extra memory stays bounded by a chunk per thread."""
    n, pieces, lock = src.size, itertools.count(), threading.Lock()
    stop: list = []  # non-empty once a piece raised (or the caller is done): no thread takes another
    done = [0]

    def work(show: bool) -> None:
        while not stop:
            with lock:  # (a shared iterator is atomic under the GIL only: free-threaded Python too)
                lo = next(pieces) * chunk
            if lo >= n:
                return
            try:
                kernel(src[lo:lo + chunk], dst[lo:lo + chunk])
            except BaseException:
                stop.append(True)
                raise
            with lock:
                done[0] += min(chunk, n - lo)
            if show and done[0] < n:  # (the whole is shown once, at the end)
                bar.update(done[0])

    futures = [_pool(workers - 1).submit(work, False) for _ in range(workers - 1)]
    error = None
    try:
        work(True)
    except BaseException as err:  # (an interrupt too: the other threads finish their pieces first)
        error = err
    stop.append(True)
    for future in futures:  # none writes into dst once this returns; one not started never will
        if future.cancel():
            continue
        try:
            future.result()
        except BaseException as err:
            error = error or err
    if error is not None:
        raise error
    bar.update(n)


def blocked(step):
    """A kernel that runs ``step`` over pieces of BLOCK elements (its temporaries stay in cache)."""
    def kernel(src, dst) -> None:
        if src.size <= BLOCK:
            step(src, dst)
            return
        for lo in range(0, src.size, BLOCK):
            step(src[lo:lo + BLOCK], dst[lo:lo + BLOCK])
    return kernel
