"""The table of adapters: names, aliases, pip extras, the types that mark a
tensor of each framework, and lazy loading.

Nothing here imports a framework to ask a question about it: ``framework_of``
checks the input's type against classes of modules already in
``sys.modules`` (a tensor of a framework cannot exist before its module was
imported), and caches the answer per type. An adapter module is imported on
first use, under a lock, so several threads may ask at once.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import types
from typing import Any, Callable, NamedTuple, TypeVar

from bf16bridge.core.autograph import plain_python
from bf16bridge.core.adapter import Adapter
from bf16bridge.errors import (FrameworkNotInstalledError, InvalidArgumentError, UnknownFrameworkError,
                               UnsupportedTypeError)


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
#: type -> the framework whose tensors are of that type, for every type seen so far (read it; the
#: registry fills it, and empties it when a framework is registered)
TENSOR_TYPES: dict[type, str] = {}
_LOCK = threading.RLock()
#: names that stand for a framework decided when asked: name -> "module:function" returning it
_DYNAMIC: dict[str, str] = {}
#: bumped by every register_adapter: caches of routes through adapters key on it
GENERATION = 0


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
    (``"bridge"``, ``"cast"``, ``"shard"``, ``"probe"``, ``"numerics"``, ``"kernel"``, ``"trace"``) to an import
    path whose ``HOOKS`` attribute serves it (``bf16bridge.adapters.hooks``); a feature left out
    gets the adapter itself where it implements that protocol, else the protocol's defaults.
    """
    spec = _spec(name, module, types, aliases, extra, requires, hooks)
    key = spec.name
    with _LOCK:
        taken = {key, *spec.aliases}
        clash = [n for n in taken if (n in _SPECS or n in _ALIASES) and _ALIASES.get(n, n) != key]
        if (key in _SPECS or clash) and not replace:
            raise InvalidArgumentError(
                f"register_adapter: {sorted(clash) or [key]} already registered; pass replace=True to override"
            )
        _SPECS[key] = spec
        for alias in spec.aliases:
            _ALIASES[alias] = key
        _LOADED.pop(key, None)
        _HOOKS.clear()
        TENSOR_TYPES.clear()
        global GENERATION
        GENERATION += 1
        for callback in _ON_CHANGE:
            callback()


def _spec(name, module, types, aliases, extra, requires, hooks) -> AdapterSpec:
    """``register_adapter``'s arguments checked (our error naming the one that is wrong), as a row."""
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
    return AdapterSpec(
        name=name.lower(),
        module=module if isinstance(module, str) else "",
        types=types,
        aliases=tuple(a.lower() for a in aliases),
        extra=extra,
        requires=requires,
        instance=module if isinstance(module, Adapter) else None,
        hooks=tuple(sorted((hooks or {}).items())),
    )


#: what register_adapter calls after every change: caches of what adapters declare empty themselves
_ON_CHANGE: list[Callable[[], None]] = []


def on_change(callback: Callable[[], None]) -> None:
    """Call ``callback()`` after every ``register_adapter`` (a cache of plans or routes forgets them)."""
    if callback not in _ON_CHANGE:
        _ON_CHANGE.append(callback)


def route_key(source: str, target: str) -> tuple:
    """What a route from ``source`` to ``target`` depends on beyond the input, as a cache key: the
    registry's generation and the run-time settings of the adapters a route may pass through
    (``Adapter.state()``, e.g. jax's x64 flag, which can change between two calls)."""
    return (GENERATION, get(source).state(), get(HUB).state(), get(target).state())


def names() -> list[str]:
    """The registered framework names, in registration order."""
    return list(_SPECS)


def spec(name: str) -> AdapterSpec:
    return _SPECS[resolve(name)]


def framework(name: str) -> types.ModuleType:
    """Framework ``name``'s own top-level module, imported through its adapter first (which quiets
    what the framework prints at import): for the code that is by nature per framework."""
    s = spec(name)
    get(s.name)
    return importlib.import_module(s.requires or s.name)


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


def tensor_framework(x) -> str | None:
    """``framework_of``'s answer, or None where ``x`` is no registered framework's tensor (without
    asking what it is instead: a walk that keeps such objects asks only when it must)."""
    t = type(x)
    name = TENSOR_TYPES.get(t)  # (the common answer without a call)
    return name if name is not None else framework_of_type(t)


def framework_of_type(t: type) -> str | None:
    """The registered framework whose tensors are of type ``t`` (cached per type), or None."""
    name = TENSOR_TYPES.get(t)
    if name is not None:
        return name
    for s in _SPECS.values():
        if any(issubclass(t, cls) for cls in _classes(s)):
            TENSOR_TYPES[t] = s.name
            return s.name
    return None


def unwrap(x):
    """The tensor a variable-like wrapper holds in ``.value`` (keras.Variable, nnx.Param), or None.
    A wrapper with a ``get_value()`` accessor is read through it (flax deprecates ``.value``: read
    under a warnings filter of "error", it would raise)."""
    cls = type(x)
    if callable(getattr(cls, "get_value", None)) and isinstance(inspect.getattr_static(cls, "value", None), property):
        try:
            value = x.get_value()
        except Exception:  # noqa: BLE001 - an accessor that wants arguments, or fails: .value below
            value = None
        if value is not None and not callable(value) and tensor_framework(value) is not None:
            return value
    try:
        value = getattr(x, "value", None)
    except Exception:  # noqa: BLE001 - a property that fails: not a wrapper we can read
        return None
    if value is None or callable(value):
        return None
    try:
        framework_of(value)
    except UnsupportedTypeError:
        return None
    return value


#: functions adding a hint to framework_of's error: x -> "; what it holds and the way out", or None
_HINTS: list[Callable[[Any], str | None]] = []


def register_hint(function: Callable[[Any], str | None]) -> None:
    """Make ``framework_of``'s error for an object that is no tensor ask ``function(x)`` for a hint
    (the trees' scanner: which attributes hold tensors a walk does not enter)."""
    if function not in _HINTS:
        _HINTS.append(function)


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
    if isinstance(x, (bool, int, float, complex, list, tuple)):
        hint = (
            "; make an array first, for example "
            "numpy.asarray(x, dtype=ml_dtypes.bfloat16) or torch.tensor(x, dtype=torch.bfloat16)"
        )
    else:
        for ask in _HINTS:
            hint = ask(x) or ""
            if hint:
                break
    raise UnsupportedTypeError(
        f"{t.__module__}.{t.__qualname__} is not a tensor of any registered framework "
        f"({', '.join(_SPECS)}){hint}"
    )


register_adapter("numpy", "bf16bridge.adapters.numpy", types=("numpy:ndarray", "numpy:generic"),
                 aliases=("np",), requires="numpy")
register_adapter("torch", "bf16bridge.adapters.torch.convert", types=("torch:Tensor",),
                 aliases=("pt", "pytorch"), extra="torch", requires="torch",
                 hooks={"bridge": "bf16bridge.adapters.torch.bridge", "cast": "bf16bridge.adapters.torch.cast",
                        "shard": "bf16bridge.adapters.torch.shards", "probe": "bf16bridge.adapters.torch.probe",
                        "numerics": "bf16bridge.adapters.torch.numerics", "kernel": "bf16bridge.adapters.torch.kernels",
                        "trace": "bf16bridge.adapters.torch.trace"})
register_adapter("jax", "bf16bridge.adapters.jax.convert", types=("jax:Array", "jax:core.Tracer"),
                 extra="jax", requires="jax",
                 hooks={"bridge": "bf16bridge.adapters.jax.bridge", "shard": "bf16bridge.adapters.jax.shards",
                        "probe": "bf16bridge.adapters.jax.probe", "numerics": "bf16bridge.adapters.jax.numerics",
                        "trace": "bf16bridge.adapters.jax.trace"})
register_adapter("tensorflow", "bf16bridge.adapters.tensorflow.convert",
                 types=("tensorflow:Tensor", "tensorflow:Variable"),
                 aliases=("tf",), extra="tensorflow", requires="tensorflow",
                 hooks={"bridge": "bf16bridge.adapters.tensorflow.bridge",
                        "probe": "bf16bridge.adapters.tensorflow.probe",
                        "numerics": "bf16bridge.adapters.tensorflow.numerics",
                        "trace": "bf16bridge.adapters.tensorflow.trace"})
register_dynamic_alias("keras", "bf16bridge.adapters.keras:backend")
register_holder("keras", "bf16bridge.adapters.keras:not_a_tensor")
