"""Native output held off the process's stderr while the bridge tries what a framework can do.

The adapters and the probe find what a framework can do by trying it. Its C++ writes to file
descriptor 2 meanwhile (a refused cast's "OP_REQUIRES failed ...", kineto's profiler lines, torch's
CUDA build without a driver: "gpuGetDeviceCount failed", tensorflow's absl preamble), which no Python
setting reaches. Whatever fd 2 receives while a trial runs is taken as the trial's own, by what it is
and not by what it says: held, and kept with the trial's name (``written()``; the probe reports it).
Python's own ``sys.stderr`` (warnings, logging) still reaches the real stderr meanwhile.
"""

from __future__ import annotations

import collections
import io
import os
import sys
import tempfile
import threading
from typing import Callable, TypeVar

T = TypeVar("T")

_STDERR = threading.RLock()  # one hold at a time (the descriptor is the process's); a trial inside a trial nests
#: (what was tried, what fd 2 received meanwhile), oldest first: a record, not a log (the last 64)
_WRITTEN: collections.deque[tuple[str, str]] = collections.deque(maxlen=64)


def written() -> tuple[tuple[str, str], ...]:
    """(what was tried, what it wrote to fd 2) for each trial in this process that wrote there, oldest first."""
    with _STDERR:
        return tuple(_WRITTEN)


def _python_stderr_to(fd: int):
    """Point ``sys.stderr`` at ``fd`` where it writes to fd 2 itself; returns what to put back (None: untouched)."""
    current = sys.stderr
    try:
        if current is None or current.fileno() != 2:
            return None
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # a replaced stream (pytest's, a StringIO)
        return None
    current.flush()
    sys.stderr = open(fd, "w", encoding=getattr(current, "encoding", None) or "utf-8",  # noqa: SIM115
                      errors=getattr(current, "errors", None) or "backslashreplace", closefd=False, buffering=1)
    return current


def held_native_output(fn: Callable[[], T], what: str) -> T:
    """``fn()`` with file descriptor 2 held in a temporary file; what it received meanwhile is kept
    under ``what`` (``written()``), not written out. Where there is no fd 2 to hold, ``fn()`` as it is."""
    with _STDERR:
        try:
            saved = os.dup(2)
        except OSError:  # no stderr to hold: nothing to keep off it
            return fn()
        put_back = _python_stderr_to(saved)
        ours = sys.stderr if put_back is not None else None
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                return fn()
            finally:
                os.dup2(saved, 2)
                if put_back is not None:
                    if sys.stderr is ours:  # unless someone else replaced it meanwhile
                        sys.stderr = put_back
                    if ours is not None:
                        ours.flush()
                        ours.close()  # closefd=False: the descriptor stays open until below
                os.close(saved)
                held.seek(0)
                text = held.read().decode("utf-8", errors="replace").strip()
                if text:
                    _WRITTEN.append((what, text))
