"""Running a bits-in, bits-out kernel over a flat array chunk by chunk, on threads, with a
progress bar once a conversion takes a while: extra memory stays bounded by a chunk per thread.

Pure numpy and the standard library: the kernels (``bf16bridge.kernels``) and the numpy
adapter's widening run through here.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from bf16bridge.errors import InvalidArgumentError

#: elements per chunk: 4 Mi elements keeps each temporary at 16 MiB
CHUNK = 1 << 22
#: the smallest piece worth a thread of its own
MIN_PIECE = 1 << 18
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
    if workers > 1:
        chunk = min(chunk, max(MIN_PIECE, -(-n // workers)))
    spans = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
    if workers == 1 or len(spans) == 1:
        for lo, hi in spans:
            kernel(src[lo:hi], dst[lo:hi])
            bar.update(hi)
        return
    _on_threads(kernel, src, dst, spans, workers, bar)


def _on_threads(kernel, src, dst, spans, workers: int, bar: Progress) -> None:
    with _POOL_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="bf16bridge-kernel")
    # at most `workers` pieces in flight, so extra memory stays bounded by a chunk per thread
    pending = []  # (future, end of its span), oldest first
    for lo, hi in spans:
        pending.append((pool.submit(kernel, src[lo:hi], dst[lo:hi]), hi))
        if len(pending) >= workers:
            future, end = pending.pop(0)
            future.result()
            bar.update(end)
    for future, end in pending:
        future.result()
        bar.update(end)


def blocked(step):
    """A kernel that runs ``step`` over pieces of BLOCK elements (its temporaries stay in cache)."""
    def kernel(src, dst) -> None:
        if src.size <= BLOCK:
            step(src, dst)
            return
        for lo in range(0, src.size, BLOCK):
            step(src[lo:lo + BLOCK], dst[lo:lo + BLOCK])
    return kernel
