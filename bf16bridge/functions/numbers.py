"""Python numbers a bridged function returns: each becomes a 0-d tensor of the caller.

One rule in every mode (eagerly, under the caller's autodiff, under a trace): a ``bool``, ``int``,
``float`` or ``complex`` anywhere in the result comes back as a 0-d tensor of a dtype fixed by its
type and by what the caller holds, never by its value: ``bool``; ``int`` as int64 (int32 where the
caller holds no int64: jax without x64); ``float`` as float64 (else float32); ``complex`` as
complex128 (else complex64). A value that dtype does not hold exactly is our error naming the
result. Such a result carries no gradient (it is a constant to the caller's autodiff).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from bf16bridge.core import registry
from bf16bridge.core.adapter import Adapter
from bf16bridge.errors import UnsupportedDtypeError
from bf16bridge.trees import walk as trees

#: the dtypes a Python number may become, first choice first (the second only where the caller holds no first)
CHOICES: dict[type, tuple[str, ...]] = {bool: ("bool",), int: ("int64", "int32"), float: ("float64", "float32"),
                                        complex: ("complex128", "complex64")}
_DEPTH = 64


def numbers_as_leaves(tree) -> tuple[Any, dict[int, Any]]:
    """``tree`` with each Python number replaced by a 0-d numpy array standing in for it (a leaf to
    ``trees.flatten``), and those arrays by ``id`` -> the number. The tree itself where it holds none."""
    found: dict[int, Any] = {}
    return _swap(tree, found, 0), found


def _swap(node, found: dict, depth: int):
    t = type(node)
    if t in CHOICES:
        marker = np.empty((), object)
        found[id(marker)] = node
        return marker
    if t in registry.TENSOR_TYPES or t is str or node is None or depth > _DEPTH:
        return node
    depth += 1
    if t is tuple or t is list:
        items = [_swap(v, found, depth) for v in node]
        return node if all(a is b for a, b in zip(items, node)) else t(items)
    if isinstance(node, tuple) and hasattr(node, "_fields"):  # a namedtuple
        items = [_swap(v, found, depth) for v in node]
        return node if all(a is b for a, b in zip(items, node)) else t(*items)
    if isinstance(node, dict):
        entries = {k: _swap(v, found, depth) for k, v in node.items()}
        if all(entries[k] is v for k, v in node.items()):
            return node
        out = copy.copy(node)  # keeps the type, a defaultdict's factory
        out.clear()
        out.update(entries)
        return out
    kids = trees.children(node)  # a pytree node, a dataclass
    if kids is None:
        return node
    keys, values, rebuild = kids
    items = [_swap(v, found, depth) for v in values]
    return node if all(a is b for a, b in zip(items, values)) else rebuild(items)


def number_array(value, caller: Adapter) -> tuple[np.ndarray | None, str]:
    """``value`` (a Python number) as the 0-d numpy array of the dtype it becomes for ``caller``, and
    that dtype's name; None where that dtype does not hold it exactly."""
    choices = CHOICES[type(value)]
    name = next((c for c in choices if caller.cannot_hold(c) is None), choices[-1])
    dtype = np.dtype(name)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return (np.asarray(value, dtype) if info.min <= value <= info.max else None), name
    got = np.asarray(value, dtype)
    back = complex(got.item())  # (compared as Python numbers: numpy would compare in the array's dtype)
    exact = dtype.kind == "b" or _same(back.real, value.real) and _same(back.imag, complex(value).imag)
    return (got if exact else None), name


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)  # (NaN: the same value)


def not_held(fn, callee: str, caller: Adapter, path: str, value, name: str) -> UnsupportedDtypeError:
    """Our error for Python number ``value`` at result ``path``, which ``name`` (its dtype for ``caller``)
    does not hold exactly."""
    first = CHOICES[type(value)][0]
    why = caller.cannot_hold(first)
    return UnsupportedDtypeError(
        f"the bridged {callee} function {getattr(fn, '__qualname__', fn)!r} returned the Python "
        f"{type(value).__name__} {value!r} at {path}: a Python number comes back as a 0-d {caller.name} tensor, "
        f"here {name}" + (f" ({caller.name} holds no {first} here: {why})" if why else "")
        + f", which does not hold {value!r} exactly. Return a tensor of the dtype you want instead")
