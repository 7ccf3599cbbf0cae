"""tensorflow's autograph rewrites the Python of every function a ``tf.function`` reaches, library
code included, unless the function carries its marker. Ours carry it: the bridge has no tensor
control flow to convert, and rewritten it warned ("AutoGraph could not transform <function
_gcd_import>", from a lazy import) and traced slower. The marker is an attribute tensorflow reads
with hasattr: nothing is imported for it (as on ``functions.BridgedFunction``)."""

from __future__ import annotations

from typing import TypeVar

F = TypeVar("F")


def plain_python(fn: F) -> F:
    """``fn``, marked for autograph to call as it is."""
    fn.autograph_info__ = frozenset()  # type: ignore[attr-defined]
    return fn
