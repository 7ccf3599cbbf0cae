"""The private and unstable parts of jax, XLA and its runtime that the jax adapter relies on, each
behind a name here and guarded: where this jax lacks one, the adapter still imports, and what needs
it falls back (where an older way exists) or raises our error naming it. No other module of the
adapter touches them; docs/adapters.md lists them with the versions they were checked on."""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import jax

from bf16bridge.core import versions
from bf16bridge.errors import PrivateApiError


def missing(api: str, stops: str) -> PrivateApiError:
    """Our error for an internal this jax lacks: which one, and what stops working without it."""
    return versions.private_api_missing("jax", jax.__version__, api, stops)


# -- traced values -------------------------------------------------------------------------------
class _Refuses(type):
    def __instancecheck__(cls, obj):
        raise missing("jax.core.Tracer", "a traced jax value cannot be told from a concrete one, so no jax "
                      "value is converted or bridged")


class _NoTracer(metaclass=_Refuses):
    """The stand-in where this jax has no Tracer class: every isinstance check raises our error."""


def _tracer_class() -> type:
    for module in ("jax.core", "jax._src.core"):
        try:
            found = getattr(importlib.import_module(module), "Tracer", None)
        except ImportError:
            continue
        if isinstance(found, type):
            return found
    return _NoTracer


#: the class of jax's traced values (under jit, grad, vmap), looked up once: read through jax.core's
#: module __getattr__ each time, it costs about as much as the isinstance check itself
Tracer: Any = _tracer_class()


# -- callbacks -------------------------------------------------------------------------------------
def _takes_vmap_method() -> bool:
    try:
        return "vmap_method" in inspect.signature(jax.pure_callback).parameters
    except (TypeError, ValueError):  # no signature to read: the oldest keyword set
        return False


#: jax.pure_callback takes vmap_method; jax 0.4.30's has none (it runs the callback once per batch
#: element, as vmap_method="sequential", and hands any other keyword to the callback)
PURE_CALLBACK_VMAP_METHOD: bool = _takes_vmap_method()

try:  # jax >= 0.6.1
    from jax.experimental.buffer_callback import buffer_callback as _buffer_callback
except ImportError:  # pragma: no cover - jax 0.4.30 (the oldest tested)
    _buffer_callback = None

#: a callback can run on jax's own buffers (jax.experimental.buffer_callback), from jax 0.8.1: before
#: it, a failing callback left the runtime's host-callback state unbalanced. Without it: pure_callback
BUFFER_CALLBACK: bool = _buffer_callback is not None and versions.release(jax.__version__) >= (0, 8, 1)


def buffer_callback(fill, avals, **kw):
    """``jax.experimental.buffer_callback.buffer_callback(fill, avals, **kw)``; asked only where
    BUFFER_CALLBACK says this jax has it."""
    if not BUFFER_CALLBACK or _buffer_callback is None:
        raise missing("jax.experimental.buffer_callback (from 0.8.1)",
                      "a bridged callee cannot run on jax's own buffers")
    return _buffer_callback(fill, avals, **kw)


def stream_of(ctx) -> int:
    """The raw stream handle (a cudaStream_t) of a buffer_callback's execution context."""
    stream = getattr(ctx, "stream", None)
    if stream is None:
        raise missing("stream on buffer_callback's execution context",
                      "a bridged callee cannot queue its work on jax's GPU stream")
    return stream


def refuses_packed(err: BaseException) -> bool:
    """Whether ``err`` is XLA's refusal of a sub-byte type (int4) in a callback (jax 0.4.30's XLA
    takes them only in convert instructions), told by its message's words."""
    return "only supported in convert instructions" in str(err)


def pullback_residuals(vjp_fn):
    """What a ``jax.vjp`` pullback keeps for the backward: the pullback itself, whose referents (a
    ``tree_util.Partial``'s arguments) hold the residuals. Where a jax keeps them elsewhere, a result
    only the residuals keep is taken as kept by the callee and copied: slower, still correct."""
    return vjp_fn


# -- devices ---------------------------------------------------------------------------------------
def compute_capability(device) -> str | None:
    """A CUDA device's compute capability ("9.0") as jaxlib's Device says it; None where it does not."""
    return getattr(device, "compute_capability", None)


# -- compiled programs: XLA's HLO text -------------------------------------------------------------
_HLO_DEF = re.compile(r"%([\w.\-]+) = ([a-z0-9]+)\[")
_HLO_PARAM = re.compile(r"([\w.\-]+): ([a-z0-9]+)\[")
_HLO_MATMUL = re.compile(r"= [a-z0-9]+\[[^\]]*\]\S* (dot|custom-call)\(([^)]*)\)")
# an operand: "%name", or "f32[16,16]{1,0} %name" (older XLA prints its type inline)
_HLO_OPERAND = re.compile(r"(?:([a-z0-9]+)\[[^\]]*\](?:\{[^}]*\})?\s+)?%([\w.\-]+)")


def hlo_text(compiled) -> str:
    """The HLO text of a compiled jax program (``Compiled.as_text()``)."""
    as_text = getattr(compiled, "as_text", None)
    if as_text is None:
        raise missing("Compiled.as_text", "the probe cannot read how a narrow matmul compiled")
    return as_text()


def hlo_matmuls(text: str) -> list[tuple[str, list[str]]]:
    """The dots and library calls of an HLO program text, each with its operands' element types as XLA
    names them ("f8e4m3fn", "bf16"; "?" where the text does not say): [] where none is found."""
    types = {m.group(1): m.group(2) for m in _HLO_DEF.finditer(text)}
    types.update((m.group(1), m.group(2)) for m in _HLO_PARAM.finditer(text))
    return [(m.group(1), [o.group(1) or types.get(o.group(2), "?") for o in _HLO_OPERAND.finditer(m.group(2))])
            for m in _HLO_MATMUL.finditer(text)]


def hlo_type_prefix(numpy_name: str) -> str:
    """The start of XLA's name for a numpy dtype's element type: float8_e4m3fn -> f8 (f8e4m3fn)."""
    return numpy_name.replace("float", "f").split("_")[0]
