"""``bb.parity.tap(name, x)``: a mark in a plain function (jax, torch, numpy ...) that
``bb.parity.trace`` records as a layer named ``name``; outside a trace it hands ``x`` back and does
nothing else. Under ``jax.jit`` the value is handed over when the compiled function runs."""

from __future__ import annotations

import threading

from bf16bridge.adapters.hooks import TraceHooks
from bf16bridge.core import registry
from bf16bridge.errors import InvalidArgumentError

#: the recorders of the traces running now, innermost last (a list, not a context variable: a jax
#: callback runs on a thread of jax's own)
_ACTIVE: list = []
_LOCK = threading.Lock()


def tap(name: str, x):
    """``x``, recorded as the output of a layer ``name`` when a trace runs the function holding it."""
    if not _ACTIVE:
        return x
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"parity.tap: name must be a non-empty string naming the layer; got {name!r}")
    return registry.hooks(registry.framework_of(x), TraceHooks).tap(name, x, record)


def record(name: str, port: str, value) -> None:
    """Hand a tapped value to the trace running now (none running: dropped, as outside a trace)."""
    with _LOCK:
        recorder = _ACTIVE[-1] if _ACTIVE else None
    if recorder is not None:
        recorder(name, port, value)


class recording:
    """While a trace runs one model: taps record to ``recorder``."""

    def __init__(self, recorder):
        self.recorder = recorder

    def __enter__(self):
        with _LOCK:
            _ACTIVE.append(self.recorder)
        return self

    def __exit__(self, *exc):
        with _LOCK:
            _ACTIVE.remove(self.recorder)
