"""Trees of tensors: walk the containers users have and rebuild them, leaves changed.

A leaf is a tensor of a registered framework. Containers are dicts (every dict
type keeps its type: defaultdict with its factory, OrderedDict), other mappings,
lists, tuples, namedtuples, and, once a framework that knows its own containers
is imported, those too (jax pytree nodes: flax and equinox parameter trees,
registered dataclasses; asked through ``Adapter.tree_children``, so nothing here
names a framework or imports one), deques. Everything else (ints, strings, None,
classes) is kept as it is, except, in a strict walk, objects that hold tensors the walk
does not enter (``hidden``): those are handed to the caller's function, which refuses them.
"""

from __future__ import annotations

import collections
import copy as _copy
import dataclasses
import io
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, MappingView
from typing import Any
from typing import cast as typing_cast

import numpy as np

from bf16bridge.core import registry
from bf16bridge.core.registry import unwrap
from bf16bridge.errors import UnsupportedTypeError
from bf16bridge.trees import hints


def where(path) -> str:
    """A leaf's path as an error names it: ``['layer']['w']``, or "the root"."""
    return "".join(f"[{p!r}]" for p in path) or "the root"


def map_leaves(fn: Callable[[Any, tuple], Any], tree, *, unwrap_values: bool = False, strict: bool = False,
               as_is: Callable[[Any], bool] | None = None):
    """The tree with every tensor leaf ``x`` at ``path`` replaced by ``fn(x, path)``;
    new containers of the same types, the input untouched. ``unwrap_values``: a wrapper
    that holds a tensor in ``.value`` (an nnx.Variable, even where it is a tree node)
    is replaced by ``fn(its value, path)``. ``strict``: an object the walk does not enter but
    that holds tensors (a model object, a tensorflow ragged or sparse tensor, a set of tensors,
    a generator: ``hidden``) is handed to ``fn`` too, as a leaf, for ``fn`` to refuse naming
    its path (convert does: ``registry.framework_of`` names what it is and the way out),
    rather than kept as it is, tensors unseen. ``as_is(tensor)``: whether ``fn`` would hand that
    tensor back as it is; a plain object whose every tensor it would is kept as it is (nothing in
    it would change), in a strict walk too."""
    try:
        return _walk(fn, tree, (), _Walk(unwrap_values, strict, as_is))
    except RecursionError as err:  # the walk recurses, a few frames a level
        raise UnsupportedTypeError(
            f"this tree is nested too deeply to walk (Python's recursion limit is {sys.getrecursionlimit()} "
            "frames, and each level of the tree takes a few): flatten it (a dict of its leaves by path), "
            "or raise sys.setrecursionlimit") from err


class _Walk:
    """What one walk carries: the containers being walked (to refuse a cycle), its options."""

    __slots__ = ("active", "unwrap_values", "strict", "as_is")

    def __init__(self, unwrap_values: bool, strict: bool = False, as_is: Callable[[Any], bool] | None = None):
        self.active: set = set()
        self.unwrap_values = unwrap_values
        self.strict = strict
        self.as_is = as_is


class _Slot:
    """Where a leaf stood, in a skeleton."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<leaf>"


SLOT = _Slot()


def flatten(tree) -> tuple[list, Any]:
    """The tensor leaves of ``tree`` in order, and its skeleton: the same tree with each
    leaf replaced by ``SLOT`` (it holds no tensor; ``fill`` puts leaves back)."""
    if _plain_kinds().get(type(tree)) == _LEAF:  # one tensor (a bridged function's usual result)
        return [tree], SLOT
    leaves: list = []

    def take(x, path=None):
        leaves.append(x)
        return SLOT

    try:
        return leaves, _plain(tree, take, _plain_kinds(), 0)
    except _NotPlain:
        leaves.clear()
    return leaves, map_leaves(take, tree)


def flatten_call(args: tuple, kwargs: dict) -> tuple[list, Any, bool]:
    """``flatten((args, kwargs))``, and whether the call was only positional tensors (its
    skeleton is then ``((SLOT,) * len(args), {})``: the caller may skip ``fill`` and pass the
    leaves as they are). The common call of a bridged function, asked on every one: its
    arguments' types are looked up once each, no walk."""
    if not kwargs:
        kinds = _plain_kinds()
        for a in args:
            if kinds.get(type(a)) != _LEAF:
                break
        else:
            return list(args), ((SLOT,) * len(args), {}), True
    leaves, skeleton = flatten((args, kwargs))
    return leaves, skeleton, False


def fill(skeleton, leaves):
    """The skeleton's tree with ``leaves`` in its slots, in order."""
    it = iter(leaves)
    try:
        return _plain(skeleton, lambda slot: next(it), _plain_kinds(), 0)
    except _NotPlain:
        it = iter(leaves)
    return map_leaves(lambda slot, path: next(it), skeleton)


# -- the plain walk: what a bridged function's call flattens and fills, several times a call ----
#
# Arguments are nearly always tuples, lists and dicts of tensors and plain values. For those,
# flatten and fill take this walk: no paths, no cycle bookkeeping, no ABC checks, a type's
# kind looked up once. It does what the full walk does with them (a tensor of a type the
# registry knows, or a slot, is a leaf; strings, numbers and None are kept; the three
# containers are rebuilt as they are) and gives up on anything else, or on a tree deeper than
# _PLAIN_DEPTH (a cycle, say), for the full walk to decide.

_LEAF, _KEEP, _TUPLE, _LIST, _DICT = range(5)
_PLAIN_DEPTH = 64


class _NotPlain(Exception):
    """The tree holds something only the full walk decides."""


#: (registry generation, {type: kind}): types whose kind is known, for that registry
_KINDS: tuple[int, dict] = (-1, {})


def _plain_kinds() -> dict:
    global _KINDS
    generation, kinds = _KINDS
    if generation != registry.GENERATION:
        kinds = {tuple: _TUPLE, list: _LIST, dict: _DICT, type(None): _KEEP, str: _KEEP, bytes: _KEEP,
                 int: _KEEP, float: _KEEP, bool: _KEEP, complex: _KEEP, _Slot: _LEAF}
        _KINDS = (registry.GENERATION, kinds)
    return kinds


def _kind(t: type, kinds: dict) -> int:
    """The kind of a type not yet in ``kinds``: a tensor type the registry knows (strings first:
    np.str_ is numpy's, and a label), or not plain."""
    if issubclass(t, (str, bytes)):
        kind = _KEEP
    elif t in registry.TENSOR_TYPES:
        kind = _LEAF
    else:
        raise _NotPlain
    if len(kinds) < 1024:
        kinds[t] = kind
    return kind


def _plain(node, leaf, kinds: dict, depth: int):
    t = type(node)
    kind = kinds.get(t)
    if kind is None:
        kind = _kind(t, kinds)
    if kind == _LEAF:
        return leaf(node)
    if kind == _KEEP:
        return node
    if depth > _PLAIN_DEPTH:
        raise _NotPlain
    depth += 1
    # a leaf and a kept value (most children) are taken here, without a call of their own
    if kind == _DICT:
        return {name: leaf(v) if (k := kinds.get(type(v))) == _LEAF else v if k == _KEEP
                else _plain(v, leaf, kinds, depth) for name, v in node.items()}
    return t([leaf(v) if (k := kinds.get(type(v))) == _LEAF else v if k == _KEEP
              else _plain(v, leaf, kinds, depth) for v in node])


def key(skeleton, *, values_only: bool = False):
    """A hashable key for a skeleton (its containers, types and non-tensor values), or None
    when some value in it cannot be hashed. Values that compare equal but are not the same
    argument get different keys: ``1``, ``1.0`` and ``True`` by their type (``x * 1`` keeps an
    integer tensor's dtype, ``x * 1.0`` does not), ``0.0`` and ``-0.0`` (and NaN payloads) by their
    bits, inside dataclasses too: a traced caller reuses what it kept for a key, the callee's
    arguments included. Other objects count by their own ``==`` and hash; with ``values_only``,
    an object compared by identity (``object.__eq__``: no value to compare) counts by its type."""
    try:
        frozen = _freeze(skeleton, values_only)
        hash(frozen)
    except TypeError:
        return None
    return frozen


def _freeze(node, values_only: bool = False):
    if isinstance(node, Mapping):
        return (type(node), tuple((_freeze(k, values_only), _freeze(v, values_only)) for k, v in node.items()))
    if isinstance(node, (list, tuple)):
        return (type(node), tuple(_freeze(v, values_only) for v in node))
    if isinstance(node, (float, complex)):
        return (type(node), struct.pack("<dd", node.real, node.imag))
    if isinstance(node, np.generic):
        return (type(node), node.tobytes())
    if dataclasses.is_dataclass(node) and not isinstance(node, type):  # its fields, as a tuple's
        return (type(node), tuple((f.name, _freeze(getattr(node, f.name), values_only))
                                  for f in dataclasses.fields(node)))
    if values_only and type(node).__eq__ is object.__eq__:
        return (type(node),)
    return (type(node), node)


def _walk(fn, node, path, walk: _Walk):
    # np.str_ too: a label, not a tensor; a class (np.float32, ml_dtypes.bfloat16 as a dtype in a
    # config) is never data, though numpy's scalar types have __array__
    if isinstance(node, (str, bytes, type)) or node is None:
        return node
    if type(node) in registry.TENSOR_TYPES or node is SLOT:  # a tensor of a type seen before: no ABC checks
        return fn(node, path)
    t = type(node)
    if t is int or t is float or t is bool or t is complex:  # kept, as the plain walk keeps them, without
        return node  # asking every adapter what they are (numpy's scalars are types of their own)
    if t is dict or t is list or t is tuple or isinstance(node, (Mapping, list, tuple, *SEQUENCES)):
        if id(node) in walk.active:
            raise UnsupportedTypeError(f"at {where(path)}: the tree contains itself; a tree must be finite")
        walk.active.add(id(node))
        try:
            return _container(fn, node, path, walk)
        finally:
            walk.active.discard(id(node))
    if registry.tensor_framework(node) is None:  # (what it is instead is asked below only if it matters)
        if walk.unwrap_values:
            inner = unwrap(node)
            if inner is not None:
                return fn(inner, path)
        found = children(node)
        if found is not None:
            keys, values, rebuild = found
            return rebuild([_walk(fn, v, path + (k,), walk) for k, v in zip(keys, values)])
        inner = unwrap(node)
        if inner is not None:
            return fn(inner, path)  # a keras.Variable and the like: its value
        if _has_array_protocol(node):
            return fn(node, path)  # holds data we cannot move: fn says so, naming the path
        if walk.strict and hidden(node, path, walk):
            return fn(node, path)  # holds tensors the walk does not reach: fn says so, naming the path
        return node  # a number, a string, an object: kept
    return fn(node, path)


#: sequences of Python's own that are no list or tuple, walked as one and rebuilt as the same
#: type (a deque with its maxlen)
SEQUENCES = (collections.deque, collections.UserList)


def hidden(node, path=(), walk: _Walk | None = None) -> bool:
    """Whether ``node``, an object the walk keeps as it is, may hold tensors the walk would not
    reach: a model object or a composite tensor of an imported framework
    (``registry.not_a_tensor``), a set holding a tensor, a generator (what it yields is not known
    until it is used up), any other one-shot iterator of Python's (map, zip, iter(list); not a file),
    a dict view holding a tensor, a plain object holding one in its attributes at any depth, or too
    much there to look through, or a container there whose reading raised
    (``hints.held_in_attributes``; tensors the walk's ``as_is`` says would come back as they are
    do not count)."""
    if isinstance(node, Iterator) and not isinstance(node, io.IOBase):  # a generator among them
        return True
    if isinstance(node, (set, frozenset, MappingView)):
        found: list = []

        def seen(x, p):
            if not isinstance(x, np.generic):  # a numpy scalar in a set is a plain value, as a Python one is
                found.append(p)
            return x

        _walk(seen, list(typing_cast(Iterable, node)), path, walk or _Walk(False, True))
        return bool(found)
    return registry.not_a_tensor(node) is not None or bool(hints.held_in_attributes(node, walk and walk.as_is))


#: what marks an object as holding array data (numpy's and DLPack's protocols)
_ARRAY_PROTOCOLS = ("__array__", "__array_interface__", "__dlpack__")


def _has_array_protocol(node) -> bool:
    try:
        return any(hasattr(node, a) for a in _ARRAY_PROTOCOLS)
    except Exception:  # noqa: BLE001 - a proxy's __getattr__ raising its own error: nothing we can read
        return False


def children(node):
    """``(keys, children, rebuild)`` of one level of a container the walk rebuilds (a jax pytree
    node, an optree node, a plain dataclass), or None."""
    return registry.tree_children(node) or _optree_children(node) or _dataclass_children(node)


def _dataclass_children(node):
    """The fields of a plain dataclass instance (one no tree library registered), ``init=False``
    ones too (a field set but never assigned has no value: not a child), rebuilt as a new instance
    holding the same attributes with each field set, as frozen and slotted classes allow: neither
    ``__init__`` nor ``__post_init__`` runs again (a field scaled there would be scaled twice), nor
    the copy protocol (a ``__copy__`` returning the instance itself would change it in place)."""
    if isinstance(node, type) or not dataclasses.is_dataclass(node):
        return None
    names = [f.name for f in dataclasses.fields(node) if hasattr(node, f.name)]
    instance: Any = node  # an instance, not a class (checked above)

    def rebuild(values):
        cls = type(instance)
        try:
            new = object.__new__(cls)
        except TypeError as err:  # a dataclass over a builtin type, whose own __new__ it needs
            raise UnsupportedTypeError(
                f"cannot rebuild a {cls.__qualname__} (a dataclass over {cls.__mro__[-2].__name__}) with new "
                "field values; pass its fields as a dict, or register the type with jax.tree_util") from err
        state = getattr(instance, "__dict__", None)
        if state is not None:
            object.__getattribute__(new, "__dict__").update(state)
        for klass in cls.__mro__:  # slotted attributes (a class's own __slots__, each base's too)
            slots = klass.__dict__.get("__slots__", ())
            for slot in (slots,) if isinstance(slots, str) else slots:
                if slot not in ("__dict__", "__weakref__") and hasattr(instance, slot):
                    object.__setattr__(new, slot, getattr(instance, slot))
        for name, value in zip(names, values):
            object.__setattr__(new, name, value)
        return new

    return names, [getattr(node, n) for n in names], rebuild


_OPTREE_NAMESPACES: dict = {}


def _optree_children(node):
    """One level of an optree-registered node (found in any namespace), once optree is imported."""
    optree = sys.modules.get("optree")
    if optree is None:
        return None
    cls = type(node)
    if cls not in _OPTREE_NAMESPACES:
        found = None
        try:  # optree keys custom nodes by (namespace, class); no public call lists namespaces
            from optree.registry import _NODETYPE_REGISTRY
        except ImportError:
            _NODETYPE_REGISTRY = {}
        for k in list(_NODETYPE_REGISTRY):
            if isinstance(k, tuple) and len(k) == 2 and k[1] is cls:
                found = k[0]
                break
        _OPTREE_NAMESPACES[cls] = found
    namespace = _OPTREE_NAMESPACES[cls]
    if namespace is None:
        return None
    paths, leaves, spec = optree.tree_flatten_with_path(node, is_leaf=lambda x: x is not node,
                                                        none_is_leaf=True, namespace=namespace)
    keys = [p[0] if p else "?" for p in paths]
    return keys, leaves, spec.unflatten


def _container(fn, node, path, walk: _Walk):
    t = type(node)
    tensors = registry.TENSOR_TYPES  # a tensor of a type seen before goes to fn without a _walk of its own
    if t is list or t is tuple:  # the common containers first, with no ABC checks
        return t([fn(v, path + (i,)) if type(v) in tensors and not isinstance(v, (str, bytes))
                  else _walk(fn, v, path + (i,), walk) for i, v in enumerate(node)])
    if t is dict:
        return {k: fn(v, path + (k,)) if type(v) in tensors and not isinstance(v, (str, bytes))
                else _walk(fn, v, path + (k,), walk) for k, v in node.items()}
    if isinstance(node, collections.ChainMap):
        # each of its maps, under its place in .maps (a value a nearer map hides is data too, under a
        # path of its own): rebuilt from its items, it became one map of what it showed
        return type(node)(*[_walk(fn, m, path + (i,), walk) for i, m in enumerate(node.maps)])
    if isinstance(node, Mapping):
        if not isinstance(node, dict):
            # a mapping a tree library registers (flax's nnx.State, FrozenDict) is rebuilt its own way
            # (a State rebuilt from its items would hold States where it held dicts)
            found = children(node)
            # only where the library's children are the mapping's own items (haiku's FlatMap flattens
            # to every nested leaf under positions 0, 1, ...: walked by items(), its paths kept)
            if found is not None and len(found[0]) == len(node) and set(found[0]) == set(node.keys()):
                keys, values, rebuild = found
                return rebuild([_walk(fn, v, path + (k,), walk) for k, v in zip(keys, values)])
        items = {k: _walk(fn, v, path + (k,), walk) for k, v in node.items()}
        if isinstance(node, dict):
            out = _copy.copy(node)  # keeps the type, a defaultdict's factory, attributes
            out.clear()
            out.update(items)
            return out
        try:
            return type(node)(items)  # type: ignore[call-arg]  # a Mapping type of unknown constructor
        except TypeError as err:
            raise UnsupportedTypeError(
                f"at {where(path)}: cannot rebuild a {type(node).__qualname__} from a dict; "
                "pass a dict, or register the type with jax.tree_util"
            ) from err
    values = [_walk(fn, v, path + (i,), walk) for i, v in enumerate(node)]
    if isinstance(node, SEQUENCES):
        seq = _copy.copy(node)  # keeps the type, a deque's maxlen, attributes
        seq.clear()
        seq.extend(values)
        return seq
    if hasattr(node, "_fields"):  # namedtuple
        return type(node)(*values)
    try:
        return type(node)(values)
    except TypeError as err:
        raise UnsupportedTypeError(
            f"at {where(path)}: cannot rebuild a {type(node).__qualname__} from a list of its items "
            "(its constructor takes other arguments); pass a plain tuple or list, or register the type "
            "with jax.tree_util"
        ) from err
