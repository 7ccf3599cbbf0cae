"""A callee's in-place writes into its inputs: which ones reach memory the caller treats as immutable.

A bridged call hands the callee zero-copy views of the caller's tensors. A write through one into
memory its owner treats as immutable or read-only changes the caller's tensor; ``input_written``
is our error for it, naming each input by its place in the call.
"""

from __future__ import annotations

from bf16bridge.core.convert import plan
from bf16bridge.errors import InputWrittenError, UnsupportedTypeError
from bf16bridge.functions.paths import input_paths
from bf16bridge.trees import walk as trees


def views_immutable(x, callee: str, fallback) -> bool:
    """Whether the callee's conversion of caller leaf ``x`` is a writable view of memory its owner
    treats as immutable or read-only (what ``convert`` warns about: ``Plan.alias``)."""
    try:
        return plan(x, callee, fallback=fallback).alias is not None
    except UnsupportedTypeError:  # a wrapper (a variable object): the tensor it holds crossed
        inner = trees.unwrap(x)
        return inner is not None and views_immutable(inner, callee, fallback)


def input_written(fn, callee: str, skeleton, bad: list[int], source: str) -> InputWrittenError:
    """Our error for bridged function ``fn`` (of ``callee``) having written into input leaves
    ``bad`` (positions in ``skeleton``'s leaves), views of ``source``'s immutable memory."""
    paths = input_paths(skeleton)
    return InputWrittenError(
        f"the bridged {callee} function {getattr(fn, '__qualname__', fn)!r} wrote in place "
        f"into its input {', '.join(paths[i] for i in bad)}, a zero-copy view of the caller's {source} "
        f"tensor, which {source} treats as immutable or read-only: that memory has ALREADY been changed "
        "(eagerly the caller's tensor and anything sharing its buffer; under a compiled caller the "
        "buffer the compiled computation handed over, maybe the caller's). Pass copy_inputs=True to "
        "bb.bridge (the callee gets copies), or do not write into inputs in the callee (x = x + 1, not "
        "x.add_(1))")
