"""core.chunks.spread: the pieces a conversion is cut into, taken by the calling thread and the pool's
threads as they come free: every element done once, errors raised, nothing written after it returns."""

import threading
import time

import numpy as np
import pytest

from bf16bridge.core import chunks


def _quiet():
    return chunks.Progress(1, "test", False)


@pytest.mark.parametrize("n, chunk, threads", [
    (10 * chunks.MIN_PIECE + 3, chunks.CHUNK, 2),   # cut into 8 pieces, shared by two threads
    (5 * chunks.MIN_PIECE, chunks.MIN_PIECE // 3, 3),  # more pieces than threads, the last one short
    (3 * chunks.MIN_PIECE, chunks.CHUNK, 8),        # more threads than pieces
])
def test_every_element_is_done_once(n, chunk, threads):
    src = np.arange(n, dtype=np.int64)
    dst = np.zeros(n, dtype=np.int64)
    seen = []

    def kernel(s, d):
        seen.append((int(s[0]), s.size, threading.get_ident()))
        d += s + 1  # done twice: 2 (s + 1) there

    chunks.spread(kernel, False, src, dst, chunk, threads, _quiet())
    np.testing.assert_array_equal(dst, src + 1)
    starts = sorted(lo for lo, _, _ in seen)
    assert starts == sorted(set(starts)) and sum(size for _, size, _ in seen) == n
    assert max(size for _, size, _ in seen) <= chunk


def test_an_error_in_a_piece_is_raised_and_no_other_piece_starts_after_it():
    n = 64 * chunks.MIN_PIECE
    src, dst = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    started = []

    def kernel(s, d):
        started.append(time.perf_counter())
        if len(started) == 3:
            raise ValueError("piece three")
        time.sleep(0.01)

    with pytest.raises(ValueError, match="piece three"):
        chunks.spread(kernel, False, src, dst, chunks.MIN_PIECE, 2, _quiet())
    assert len(started) < 8  # 64 pieces: the others stopped taking pieces (one each in flight at most)


def test_an_interrupt_waits_for_the_other_threads_pieces():
    """No thread writes into the output once spread returned, raising or not."""
    n = 2 * chunks.MIN_PIECE
    src, dst = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
    caller, inside, finished = threading.get_ident(), threading.Event(), []

    def kernel(s, d):
        if threading.get_ident() == caller:
            assert inside.wait(10)  # the pool thread is inside its piece
            raise KeyboardInterrupt
        inside.set()
        time.sleep(0.3)
        d[...] = 1
        finished.append(True)

    with pytest.raises(KeyboardInterrupt):
        chunks.spread(kernel, False, src, dst, chunks.MIN_PIECE, 2, _quiet())
    assert finished == [True]  # waited for, not left writing
    assert dst.sum() == chunks.MIN_PIECE


def test_the_progress_bar_ends_once_at_the_whole(capsys):
    n = 8 * chunks.MIN_PIECE
    chunks.spread(lambda s, d: None, False, np.zeros(n, np.uint8), np.zeros(n, np.uint8), chunks.MIN_PIECE, 2,
                  chunks.Progress(n, "pieces", True))
    err = capsys.readouterr().err
    assert err.count("100.0%") == 1 and err.endswith("\n"), err
