"""The table of adapters: names, aliases, pip extras, the types that mark a
tensor of each framework, and lazy loading.

Nothing here imports a framework to ask a question about it: ``framework_of``
checks the input's type against classes of modules already in
``sys.modules`` (a tensor of a framework cannot exist before its module was
imported), and caches the answer per type. An adapter module is imported on
first use, under a lock, so several threads may ask at once.
"""

from __future__ import annotations

import collections
import functools
import importlib
import itertools
import operator
import struct
import sys
import threading
import types
import weakref
from collections import abc
from typing import Any, NamedTuple, TypeVar

import numpy as np

from bf16bridge.core.autograph import plain_python
from bf16bridge.core.adapter import Adapter
from bf16bridge.errors import FrameworkNotInstalledError, InvalidArgumentError, UnknownFrameworkError, UnsupportedTypeError


class AdapterSpec(NamedTuple):
    """One row of the registry."""

    name: str
    module: str  # import path of a module whose ADAPTER attribute is the adapter
    types: tuple  # "module:Attr.Path" of the classes whose instances belong to it
    aliases: tuple = ()
    extra: str | None = None  # the pip extra that installs the framework
    requires: str | None = None  # the framework's own top-level package
    instance: Adapter | None = None
    #: feature -> import path of a module whose HOOKS attribute is that feature's hooks object
    hooks: tuple[tuple[str, str], ...] = ()


#: the framework every route may pass through: the core dependency, always importable
HUB = "numpy"

_SPECS: dict[str, AdapterSpec] = {}
_ALIASES: dict[str, str] = {}
_LOADED: dict[str, Adapter] = {}
_TYPE_CACHE: dict[type, str] = {}
_LOCK = threading.RLock()
#: names that stand for a framework decided when asked: name -> "module:function" returning it
_DYNAMIC: dict[str, str] = {}
#: bumped by every register_adapter: caches of routes through adapters key on it
_GENERATION = 0


@plain_python
def register_adapter(
    name: str,
    module: str | Adapter,
    *,
    types: tuple | list,
    aliases: tuple | list = (),
    extra: str | None = None,
    requires: str | None = None,
    replace: bool = False,
    hooks: dict[str, str] | None = None,
) -> None:
    """Add a framework to the registry.

    ``module`` is an import path whose ``ADAPTER`` attribute is an
    ``Adapter`` (imported on first use), or an ``Adapter`` instance.
    ``types`` lists the tensor classes as ``"module:Attr"`` strings: they are
    looked up only once that module is in ``sys.modules``. ``hooks`` maps a feature
    (``"bridge"``, ``"cast"``, ``"shard"``, ``"probe"``, ``"numerics"``, ``"kernel"``) to an import
    path whose ``HOOKS`` attribute serves it (``bf16bridge.adapters.hooks``); a feature left out
    gets the adapter itself where it implements that protocol, else the protocol's defaults.
    """
    def names(what: str, value, check=lambda v: True, form: str = "names") -> tuple:
        # a str is a sequence too: taken as one, each letter would be a type or an alias
        if isinstance(value, str) or not isinstance(value, (tuple, list)) or not all(
                isinstance(v, str) and v and check(v) for v in value):
            raise InvalidArgumentError(f"register_adapter: {what} must be a tuple or list of {form}; got {value!r}")
        return tuple(value)

    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"register_adapter: name must be a non-empty string; got {name!r}")
    if not isinstance(module, Adapter) and not (isinstance(module, str) and module):
        raise InvalidArgumentError(f"register_adapter: module must be an import path (whose ADAPTER is an "
                                   f"Adapter) or an Adapter instance; got {module!r}")
    types = names("types", types, lambda v: all(v.partition(":")[::2]), "'module:Attr' strings")
    if requires is not None and not (isinstance(requires, str) and requires):
        raise InvalidArgumentError(f"register_adapter: requires must be a module name or None; got {requires!r}")
    aliases = names("aliases", aliases)
    if hooks is not None and not (isinstance(hooks, dict) and all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in hooks.items())):
        raise InvalidArgumentError(f"register_adapter: hooks must be a dict of feature -> import path; got {hooks!r}")
    key = name.lower()
    with _LOCK:
        taken = {key, *(a.lower() for a in aliases)}
        clash = [n for n in taken if (n in _SPECS or n in _ALIASES) and _ALIASES.get(n, n) != key]
        if (key in _SPECS or clash) and not replace:
            raise InvalidArgumentError(
                f"register_adapter: {sorted(clash) or [key]} already registered; pass replace=True to override"
            )
        instance = module if isinstance(module, Adapter) else None
        spec = AdapterSpec(
            name=key,
            module=module if isinstance(module, str) else "",
            types=tuple(types),
            aliases=tuple(a.lower() for a in aliases),
            extra=extra,
            requires=requires,
            instance=instance,
            hooks=tuple(sorted((hooks or {}).items())),
        )
        _SPECS[key] = spec
        for alias in spec.aliases:
            _ALIASES[alias] = key
        _LOADED.pop(key, None)
        _HOOKS.clear()
        _TYPE_CACHE.clear()
        global _GENERATION
        _GENERATION += 1


def generation() -> int:
    """How many times the registry changed: part of every cache key that reads adapters."""
    return _GENERATION


def state(source: str, target: str) -> tuple:
    """What a route from ``source`` to ``target`` depends on beyond the input: the registry's
    generation and the run-time settings of the adapters a route may pass through
    (``Adapter.state()``, e.g. jax's x64 flag, which can change between two calls)."""
    return (_GENERATION, get(source).state(), get(HUB).state(), get(target).state())


def names() -> list[str]:
    """The registered framework names, in registration order."""
    return list(_SPECS)


def spec(name: str) -> AdapterSpec:
    return _SPECS[resolve(name)]


def register_dynamic_alias(name: str, function: str) -> None:
    """Make ``name`` stand for the framework ``function`` ("module:function") names when asked
    (``"keras"``: the running Keras backend). The module is imported only when ``name`` is used."""
    _DYNAMIC[name.lower()] = function


def resolve(name: str) -> str:
    """Canonical framework name for a name or alias; UnknownFrameworkError otherwise."""
    if not isinstance(name, str):
        raise UnknownFrameworkError(
            f"the target must be a framework name (one of {_choices()}), got {type(name).__name__}"
        )
    key = name.lower()
    if key in _DYNAMIC and key not in _SPECS:
        mod_name, _, fn = _DYNAMIC[key].partition(":")
        try:
            key = getattr(importlib.import_module(mod_name), fn)()
        except ImportError as err:
            raise FrameworkNotInstalledError(f"{name!r} is not usable here ({err}); install it") from err
    key = _ALIASES.get(key, key)
    if key not in _SPECS:
        raise UnknownFrameworkError(f"unknown framework {name!r}; choose one of {_choices()}")
    return key


def _choices() -> str:
    out = []
    for s in _SPECS.values():
        out.append(s.name + (f" ({', '.join(s.aliases)})" if s.aliases else ""))
    out.extend(f"{d} (its running backend)" for d in _DYNAMIC)
    return ", ".join(out)


def install_hint(name: str) -> str:
    """How to install a registered framework: its pip extra, else its package."""
    s = spec(name)
    return f"pip install 'bf16bridge[{s.extra}]'" if s.extra else f"install {s.requires or s.name}"


def get(name: str) -> Adapter:
    """The adapter for a framework, importing its module on first use."""
    adapter = _LOADED.get(name)  # the hot path: a canonical name, already loaded
    if adapter is not None:
        return adapter
    key = resolve(name)
    adapter = _LOADED.get(key)
    if adapter is not None:
        return adapter
    with _LOCK:
        adapter = _LOADED.get(key)
        if adapter is None:
            s = _SPECS[key]
            if s.instance is not None:
                adapter = s.instance
            else:
                try:
                    adapter = importlib.import_module(s.module).ADAPTER
                except ImportError as err:
                    raise FrameworkNotInstalledError(
                        f"{key} is not usable here ({err}); {install_hint(key)}"
                    ) from err
            _LOADED[key] = adapter
    return adapter


_HOOKS: dict[tuple[str, type], Any] = {}
H = TypeVar("H")


def hooks(name: str, kind: type[H]) -> H:
    """Framework ``name``'s hooks for one feature (``kind``: a protocol of ``bf16bridge.adapters.hooks``),
    importing the module that holds them on first use; the protocol's defaults where it has none."""
    found = _HOOKS.get((name, kind))
    if found is not None:
        return found
    key = resolve(name)
    with _LOCK:
        modules = dict(_SPECS[key].hooks)
        path = modules.get(kind.feature)  # type: ignore[attr-defined]
        if path is not None:
            try:
                found = importlib.import_module(path).HOOKS
            except ImportError as err:
                raise FrameworkNotInstalledError(f"{key} is not usable here ({err}); {install_hint(key)}") from err
        else:
            adapter = get(key)
            if isinstance(adapter, kind):
                found = adapter
            else:
                found = kind()
                found.name = key  # type: ignore[attr-defined]
        _HOOKS[(name, kind)] = _HOOKS[(key, kind)] = found
    return found


def _classes(s: AdapterSpec):
    for path in s.types:
        mod_name, _, attr = path.partition(":")
        mod = sys.modules.get(mod_name)
        if mod is None:
            continue
        obj = mod
        try:
            for part in attr.split("."):
                obj = getattr(obj, part)
        except AttributeError:
            continue
        if isinstance(obj, type):
            yield obj


def imported() -> list[Adapter]:
    """The adapters whose framework is already imported (loading their modules, not the frameworks)."""
    out = []
    for s in list(_SPECS.values()):
        if s.instance is None and (s.requires or s.name) not in sys.modules:
            continue
        try:
            out.append(get(s.name))
        except FrameworkNotInstalledError:
            continue
    return out


def tree_children(node):
    """``(keys, children, rebuild)`` for a container a framework already imported knows
    (a jax pytree node), or None. Imports no framework."""
    for adapter in imported():
        out = adapter.tree_children(node)
        if out is not None:
            return out
    return None


#: libraries that are no framework of their own but hold tensors in objects of theirs (Keras
#: layers): their top-level package -> "module:function" answering as ``Adapter.not_a_tensor``
_HOLDERS: dict[str, str] = {}


def register_holder(requires: str, function: str) -> None:
    """Make ``not_a_tensor`` ask ``function`` ("module:function", imported on first use) once
    ``requires`` is in ``sys.modules``: a library whose objects hold tensors (Keras layers)."""
    _HOLDERS[requires] = function


def held_by_library(x) -> str | None:
    """What ``x`` is, and the way out, where a ``register_holder`` library (Keras) says it holds
    tensors of its own (a Keras layer; also a torch ``nn.Module`` under Keras's torch backend), or None."""
    for requires, function in _HOLDERS.items():
        if requires in sys.modules:
            mod_name, _, fn = function.partition(":")
            why = getattr(importlib.import_module(mod_name), fn)(x)
            if why is not None:
                return why
    return None


def not_a_tensor(x) -> str | None:
    """What an object that holds tensors but is no tensor of any framework is, and the way out
    (a torch model, a tensorflow ragged or sparse tensor, a Keras layer: ``register_holder``'s
    libraries, then ``Adapter.not_a_tensor`` of the frameworks already imported), or None.
    Imports no framework."""
    why = held_by_library(x)
    if why is not None:
        return why
    for adapter in imported():
        why = adapter.not_a_tensor(x)
        if why is not None:
            return why
    return None


#: how much one look into an object's attributes reads before it stops, in values (a value's type
#: is asked where it is, in C: some 25 ns, so a vocabulary of 400,000 words is read in a few
#: milliseconds); an object entered (its attributes read in Python) and a level of the look (its
#: sets and lists) are charged what they cost, measured against a value: about 1 and 2 us
LOOK_BUDGET = 2_000_000
OBJECT_COST = 50
LEVEL_COST = 100
#: the most objects one look enters: a look through an object graph (a linked list of nodes, a
#: level each) stops after a few milliseconds, whatever the budget has left
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
        # (a set of the ids, in C, where all are new: a Python loop over 600,000 small lists costs
        # more than reading them; ids shifted: an object's address is a multiple of 16, which
        # leaves a set of them colliding, and no two objects share one shifted: _ID_SHIFT)
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
        elif _framework_of_type(t) is not None:
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
    level's values by type, a type's kind asked once: 400,000 words are one set of types, read where
    they are); None where the look runs past its budget, which is charged before what it pays for
    is read (a level's values, the attributes of the objects entered there)."""
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
            members = _members(level, groups, one_type, kind)
            if kind == _TENSOR:
                arrays = []
                for v in members:
                    if isinstance(v, np.ndarray) and v.dtype.kind in "OUS":
                        if v.dtype.kind == "O":  # its elements are objects: looked at as a list's
                            arrays.append(v)
                        continue  # strings: plain values
                    if state.as_is is None or not state.as_is(v):
                        return True
                deeper += (a.ravel().tolist() for a in state.fresh(arrays))
            elif kind == _IMMUTABLE:
                immutable = list(members)
                if max(map(len, immutable)) > _SHARED_LEN:
                    immutable = [v for v in immutable if len(v) <= _SHARED_LEN] + state.fresh(
                        [v for v in immutable if len(v) > _SHARED_LEN])
                # (many short containers read as one: a Python loop over them costs more)
                deeper.append(immutable[0] if len(immutable) == 1 else list(itertools.chain.from_iterable(immutable)))
            elif kind == _MUTABLE:
                fresh = state.fresh(list(members))
                deeper.append(fresh[0] if len(fresh) == 1 else list(itertools.chain.from_iterable(fresh)))
            elif kind == _DICT:  # keys too: a torch tensor is hashable
                fresh = state.fresh(list(members))
                deeper += ((fresh[0], fresh[0].values()) if len(fresh) == 1 else
                           (list(itertools.chain.from_iterable(fresh)),
                            list(itertools.chain.from_iterable(d.values() for d in fresh))))
            elif kind == _REF:
                deeper.append([r() for r in state.fresh(list(members))])
            else:
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
        level = [chunk for chunk in deeper if len(chunk)]
    state.clean |= state.entered
    return False


def _members(level: list, groups: dict, one_type: bool, kind: int):
    """The values of ``level`` of that kind (``groups``: kind -> its types there)."""
    if kind not in groups:
        return ()
    if one_type:
        return itertools.chain.from_iterable(level)
    ts = groups[kind]
    return (v for chunk in level for v in chunk if type(v) in ts)


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


def tensor_framework(x) -> str | None:
    """``framework_of``'s answer, or None where ``x`` is no registered framework's tensor (without
    asking what it is instead: a walk that keeps such objects asks only when it must)."""
    t = type(x)
    name = _TYPE_CACHE.get(t)  # (the common answer without a call)
    return name if name is not None else _framework_of_type(t)


def _framework_of_type(t: type) -> str | None:
    """The registered framework whose tensors are of type ``t`` (cached per type), or None."""
    name = _TYPE_CACHE.get(t)
    if name is not None:
        return name
    for s in _SPECS.values():
        if any(issubclass(t, cls) for cls in _classes(s)):
            _TYPE_CACHE[t] = s.name
            return s.name
    return None


@plain_python
def framework_of(x) -> str:
    """The name of the framework whose tensor ``x`` is, without importing any framework."""
    name = tensor_framework(x)
    if name is not None:
        return name
    t = type(x)
    why = not_a_tensor(x)
    if why is not None:
        raise UnsupportedTypeError(why)
    hint = ""
    for kinds, way_out in _NOT_WALKED:
        if isinstance(x, kinds):  # the first that fits: a generator is an iterator too
            hint = f"; {way_out}"
            break
    held, unknown, why = look(x) if not hint else ((), (), "")
    if held:
        hint = (f"; it holds tensors in its attributes ({', '.join(held)}), which a tree walk does not enter "
                "(it keeps such an object only where each of them would come back as it is): make it a "
                "dataclass (whose fields are walked), or pass the tensors it holds")
    elif unknown:
        hint = (f"; {why}, so whether it holds tensors is not known: make it a dataclass (whose fields are "
                "walked), or leave it out of the tree")
    if isinstance(x, (bool, int, float, complex, list, tuple)):
        hint = (
            "; make an array first, for example "
            "numpy.asarray(x, dtype=ml_dtypes.bfloat16) or torch.tensor(x, dtype=torch.bfloat16)"
        )
    raise UnsupportedTypeError(
        f"{t.__module__}.{t.__qualname__} is not a tensor of any registered framework "
        f"({', '.join(_SPECS)}){hint}"
    )


register_adapter("numpy", "bf16bridge.adapters.numpy", types=("numpy:ndarray", "numpy:generic"),
                 aliases=("np",), requires="numpy")
register_adapter("torch", "bf16bridge.adapters.torch.convert", types=("torch:Tensor",),
                 aliases=("pt", "pytorch"), extra="torch", requires="torch")
register_adapter("jax", "bf16bridge.adapters.jax.convert", types=("jax:Array", "jax:core.Tracer"),
                 extra="jax", requires="jax")
register_adapter("tensorflow", "bf16bridge.adapters.tensorflow.convert",
                 types=("tensorflow:Tensor", "tensorflow:Variable"),
                 aliases=("tf",), extra="tensorflow", requires="tensorflow")
register_dynamic_alias("keras", "bf16bridge.adapters.keras:backend")
register_holder("keras", "bf16bridge.adapters.keras:not_a_tensor")
