"""The object scanner behind our error hints: which attributes of a plain object hold tensors.

A tree walk keeps a plain object as it is; where its attributes hold tensors (at any depth), the
walk cannot convert them, and ``framework_of``'s error names them (``hint``, registered with the
registry). A look reads within a budget: an object graph too large to read says so instead.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import struct
import types
import weakref
from collections import abc

import numpy as np

from bf16bridge.core import registry

#: containers of Python's own that a tree walk does not enter, and the way out
_NOT_WALKED = (
    ((set, frozenset), "a set is not walked (its order is not fixed, and most tensors cannot be set "
                       "members): pass a list or a tuple"),
    ((types.GeneratorType,), "a generator is not walked (walking it would use it up): pass a list of "
                             "what it yields"),
    ((abc.MappingView,), "a dict view (d.values(), d.items()) is not walked: pass the dict, or list(view)"),
    ((abc.Iterator,), "an iterator (map, zip, iter(...)) is not walked (walking it would use it up): pass a "
                      "list of what it yields"),
)


#: how much one look into an object's attributes reads before it stops, in values; an object entered
#: (its attributes read in Python) and a level of the look cost more than a value, and are charged so
LOOK_BUDGET = 2_000_000
OBJECT_COST = 50
LEVEL_COST = 100
#: the most objects one look enters (a linked list of nodes is a level each), whatever the budget has left
LOOK_OBJECTS = 1_000
#: a tuple or frozenset longer than this is entered once a look, as a list is (a label tuple shared
#: by many examples is read once); shorter ones are read wherever they are (asking costs more)
_SHARED_LEN = 16


def held_in_attributes(x, as_is=None) -> tuple[str, ...]:
    """The names of the attributes of a plain object (its ``__dict__`` and ``__slots__``; a
    ``functools.partial``'s arguments) that hold a tensor of a registered framework, at any depth
    of the lists, tuples, sets, dicts (keys and values), weak references, numpy object arrays and
    other objects' attributes there (each object and container entered once: a cycle ends); numpy
    scalars and numpy arrays of strings are plain values. ``as_is(tensor)``: a tensor for which it
    is true (the caller would hand it back as it is) does not count. The attributes whose holdings
    are not known are named too: the look read more than its budget (``LOOK_BUDGET`` values,
    ``LOOK_OBJECTS`` objects; the attribute it read most of is named), or reading one raised. () for
    an object with none, and for a class or a module, whose attributes are no data of theirs."""
    found, unknown, _ = look(x, as_is)
    return found + unknown


def look(x, as_is=None) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """``held_in_attributes``'s answer in parts: the attributes found holding a tensor, those whose
    holdings are not known, and why not ("" where every one is known)."""
    if issubclass(type(x), (type, types.ModuleType)):
        return (), (), ""
    found: list[str] = []
    unknown: list[str] = []
    why = ""
    state = _Look(as_is, id(x))
    spent: dict[str, int] = {}
    for name, value in _attributes(x):
        name = str(name)
        before = state.values
        try:
            holds = _holds_tensor(value, state)
        except Exception as err:  # noqa: BLE001 - a container's own error (its __iter__, values(), a type's __hash__)
            unknown.append(name)
            why = why or f"reading its attribute {name} raised {type(err).__name__}: {err}"
            continue
        spent[name] = before - state.values
        if holds is None:  # the budget is spent: named after the attribute that took most of it
            most = max(spent, key=spent.__getitem__)
            return (tuple(found), (*unknown, most), why or (
                f"its attributes hold more than a look for tensors reads ({LOOK_BUDGET:,} values or "
                f"{LOOK_OBJECTS:,} objects; the most in {most})"))
        if holds:
            found.append(name)
    return tuple(found), tuple(unknown), why


#: ids shifted right by this are still distinct: every object holds at least a reference count and
#: a type pointer (two pointers: 16 bytes where a pointer has 8), so no two share a block of that size
_ID_SHIFT = (2 * struct.calcsize("P")).bit_length() - 1


class _Look:
    """What one look carries across an object's attributes: what is left of its budget, the kinds
    of the types met, and the containers entered under attributes found to hold no tensor (each of
    them was read through, so another attribute reaching one need not read it again)."""

    __slots__ = ("as_is", "values", "objects", "kinds", "clean", "entered")

    def __init__(self, as_is, root: int):
        self.as_is = as_is
        self.values = LOOK_BUDGET
        self.objects = LOOK_OBJECTS
        self.kinds: dict = {}  # type -> kind: a long list is asked once a type
        self.clean = {root >> _ID_SHIFT}  # (the object itself: each of its attributes is looked at on its own)
        self.entered: set = set()  # under the attribute being looked at

    def fresh(self, values: list) -> list:
        """Those of ``values`` (containers, objects) not entered yet, now entered."""
        if len(values) == 1:  # (a level of one: the common case in a nested config)
            k = id(values[0]) >> _ID_SHIFT
            if k in self.entered or k in self.clean:
                return []
            self.entered.add(k)
            return values
        # a set of the ids, in C, where all are new (a Python loop over many small lists costs more
        # than reading them); ids shifted, as addresses are multiples of 16 (_ID_SHIFT)
        keys = set(map(operator.rshift, map(id, values), itertools.repeat(_ID_SHIFT)))
        if len(keys) == len(values) and keys.isdisjoint(self.entered) and keys.isdisjoint(self.clean):
            self.entered |= keys
            return values
        fresh = []
        for v in values:
            k = id(v) >> _ID_SHIFT
            if k not in self.entered and k not in self.clean:
                self.entered.add(k)
                fresh.append(v)
        return fresh


def _attributes(x) -> list:
    """``(name, value)`` of an object's attributes: its ``__dict__``, its ``__slots__``, a
    ``functools.partial``'s arguments; none where reading them raises (a proxy)."""
    try:  # a proxy's __getattr__ may raise anything: then there is nothing we can read
        attrs = getattr(x, "__dict__", None)
    except Exception:  # noqa: BLE001
        attrs = None
    items = list(attrs.items()) if isinstance(attrs, dict) else []
    if isinstance(x, functools.partial):
        items += [("args", x.args), ("keywords", x.keywords)]
    for cls in type(x).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            stored = f"_{cls.__name__.lstrip('_')}{name}" if name.startswith("__") and not name.endswith("__") else name
            try:
                items.append((name, getattr(x, stored)))
            except Exception:  # noqa: BLE001 - an unset slot (AttributeError), a failing descriptor
                pass
    return items


_PLAIN, _TENSOR, _IMMUTABLE, _MUTABLE, _DICT, _REF, _OBJECT = range(7)
#: values that hold no tensor: Python's scalars, numpy's (a numpy type, but a plain value), classes, modules
_PLAIN_TYPES = (str, bytes, int, float, complex, type(None), type, types.ModuleType, np.generic,
                types.FunctionType, types.BuiltinFunctionType, range)


def _kind(t: type, kinds: dict) -> int:
    kind = kinds.get(t)
    if kind is None:
        if issubclass(t, _PLAIN_TYPES):
            kind = _PLAIN
        elif registry.framework_of_type(t) is not None:
            kind = _TENSOR
        elif issubclass(t, (tuple, frozenset)):
            kind = _IMMUTABLE  # (a cycle through one passes through a mutable container or an object)
        elif issubclass(t, (list, set, collections.deque)):
            kind = _MUTABLE
        elif issubclass(t, dict):
            kind = _DICT
        elif issubclass(t, weakref.ref):
            kind = _REF  # (a WeakValueDictionary's values: their referents are looked at)
        else:
            kind = _OBJECT
        kinds[t] = kind
    return kind


def _holds_tensor(value, state: _Look) -> bool | None:
    """Whether ``value`` holds a tensor ``state.as_is`` does not pass, looking level by level (a
    level's values by type, a type's kind asked once); None where the look runs past its budget,
    which is charged before what it pays for is read."""
    state.entered = set()
    level: list = [(value,)]  # a level: the containers (or lists) whose values are looked at
    while level:
        state.values -= sum(map(len, level)) + LEVEL_COST
        if state.values < 0:
            return None
        types_here: set = set()
        for chunk in level:
            types_here.update(map(type, chunk))
        groups: dict[int, set] = {}
        for t in types_here:
            kind = _kind(t, state.kinds)
            if kind != _PLAIN:
                groups.setdefault(kind, set()).add(t)
        one_type = len(types_here) == 1
        deeper: list = []
        for kind in sorted(groups):  # (tensors first: a look that finds one stops)
            found = _DEEPER[kind](_members(level, groups, one_type, kind), state, deeper)
            if found is not False:
                return found
        level = [chunk for chunk in deeper if len(chunk)]
    state.clean |= state.entered
    return False


# What a level's values of one kind add to the next level (``deeper``): each returns True where it
# found a tensor, None where the budget is spent, else False.

def _tensors(members, state: _Look, deeper: list) -> bool | None:
    arrays = []
    for v in members:
        if isinstance(v, np.ndarray) and v.dtype.kind in "OUS":
            if v.dtype.kind == "O":  # its elements are objects: looked at as a list's
                arrays.append(v)
            continue  # strings: plain values
        if state.as_is is None or not state.as_is(v):
            return True
    deeper += (a.ravel().tolist() for a in state.fresh(arrays))
    return False


def _immutables(members, state: _Look, deeper: list) -> bool | None:
    immutable = list(members)
    if max(map(len, immutable)) > _SHARED_LEN:
        immutable = [v for v in immutable if len(v) <= _SHARED_LEN] + state.fresh(
            [v for v in immutable if len(v) > _SHARED_LEN])
    # (many short containers read as one: a Python loop over them costs more)
    deeper.append(immutable[0] if len(immutable) == 1 else list(itertools.chain.from_iterable(immutable)))
    return False


def _mutables(members, state: _Look, deeper: list) -> bool | None:
    fresh = state.fresh(list(members))
    deeper.append(fresh[0] if len(fresh) == 1 else list(itertools.chain.from_iterable(fresh)))
    return False


def _dicts(members, state: _Look, deeper: list) -> bool | None:
    fresh = state.fresh(list(members))  # keys too: a torch tensor is hashable
    deeper += ((fresh[0], fresh[0].values()) if len(fresh) == 1 else
               (list(itertools.chain.from_iterable(fresh)),
                list(itertools.chain.from_iterable(d.values() for d in fresh))))
    return False


def _refs(members, state: _Look, deeper: list) -> bool | None:
    deeper.append([r() for r in state.fresh(list(members))])
    return False


def _objects(members, state: _Look, deeper: list) -> bool | None:
    members = list(members)
    n = state.objects + 1  # (where the first n are all new, the look stops: the rest is not asked)
    fresh = state.fresh(members[:n])
    if len(fresh) < n:
        fresh += state.fresh(members[n:])
    state.objects -= len(fresh)  # charged before their attributes are read
    state.values -= OBJECT_COST * len(fresh)
    if state.objects < 0 or state.values < 0:
        return None
    deeper.append([v for obj in fresh for _, v in _attributes(obj)])
    return False


_DEEPER = {_TENSOR: _tensors, _IMMUTABLE: _immutables, _MUTABLE: _mutables, _DICT: _dicts, _REF: _refs,
           _OBJECT: _objects}


def _members(level: list, groups: dict, one_type: bool, kind: int):
    """The values of ``level`` of that kind (``groups``: kind -> its types there)."""
    if kind not in groups:
        return ()
    if one_type:
        return itertools.chain.from_iterable(level)
    ts = groups[kind]
    return (v for chunk in level for v in chunk if type(v) in ts)


def hint(x) -> str | None:
    """What ``framework_of``'s error adds for ``x``, no tensor of any framework: a container a tree
    walk does not enter, or the attributes that hold tensors (or could not be read), and the way out."""
    for kinds, way_out in _NOT_WALKED:
        if isinstance(x, kinds):  # the first that fits: a generator is an iterator too
            return f"; {way_out}"
    held, unknown, why = look(x)
    if held:
        return (f"; it holds tensors in its attributes ({', '.join(held)}), which a tree walk does not enter "
                "(it keeps such an object only where each of them would come back as it is): make it a "
                "dataclass (whose fields are walked), or pass the tensors it holds")
    if unknown:
        return (f"; {why}, so whether it holds tensors is not known: make it a dataclass (whose fields are "
                "walked), or leave it out of the tree")
    return None


registry.register_hint(hint)
