"""Trials that keep a framework's native log lines off the process's stderr.

The adapters find what a framework can do by trying it; a refused trial is a finding (its
exception is the reason), but the framework's C++ also logs the refusal straight to file
descriptor 2 (tensorflow's "OP_REQUIRES failed ... UNIMPLEMENTED: Cast float4_e2m1fn to float is
not supported", kineto's "profiler_start" lines), which no Python setting reaches after import.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading

_STDERR = threading.RLock()  # a trial inside a trial holds it twice


def without_native_lines(fn, *markers: bytes):
    """``fn()`` with the process's stderr (file descriptor 2) held in a temporary file, then every
    line written there meanwhile written back but those holding one of ``markers``. Only the
    lines the trial causes are dropped: other threads' output in that window comes out after it,
    not lost. One trial at a time (the descriptor is the process's)."""
    with _STDERR:
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no stderr to hold: let the lines through
            return fn()
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                return fn()
            finally:
                try:
                    if sys.stderr is not None:
                        sys.stderr.flush()
                finally:
                    os.dup2(saved, 2)
                    os.close(saved)
                    held.seek(0)
                    kept = [line for line in held.read().splitlines(keepends=True)
                            if not any(m in line for m in markers)]
                    if kept:
                        os.write(2, b"".join(kept))
