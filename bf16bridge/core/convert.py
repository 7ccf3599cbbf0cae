"""convert(), plan(), convert_tree(): run the planner's route and check it."""

from __future__ import annotations

import contextvars
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Literal, TypeVar, overload

from bf16bridge.core.autograph import plain_python
from bf16bridge.core import registry
from bf16bridge.trees import walk as trees
from bf16bridge.core.adapter import Adapter, UnalignedImport
from bf16bridge.errors import (Bf16BridgeError, Bf16BridgeWarning, CopyRequiredError, DeviceError, InvalidArgumentError,
                     UnsupportedDtypeError, UnsupportedTypeError)

if TYPE_CHECKING:
    import jax
    import numpy as np
    from types import FrameType

    import tensorflow as tf
    import torch

    from bf16bridge.core.plan import Plan, TreePlan

#: the registered framework names and aliases (others can be registered: any str is taken)
Target = Literal["numpy", "np", "torch", "pt", "pytorch", "jax", "tensorflow", "tf", "keras"]
Fallback = Literal["error", "float32", "bits", "auto"]
#: what to do when the result would be a writable alias of memory its owner treats as
#: read-only or immutable (a torch tensor over a jax or tensorflow buffer)
OnAlias = Literal["warn", "copy", "error", "allow"]
#: what to do when the input takes part in autodiff (a torch tensor that requires grad, a tf
#: tensor a gradient tape watches): its data crosses, its gradient does not
OnGrad = Literal["warn", "error", "drop"]
ON_ALIAS = ("warn", "copy", "error", "allow")
ON_GRAD = ("warn", "error", "drop")

_ROUTES: Any = None


def _routes():
    global _ROUTES
    if _ROUTES is None:
        from bf16bridge.core import planner as routes

        _ROUTES = routes
    return _ROUTES


def _describe(x, to):
    """(source, target, Source) of ``x``; a wrapper that holds a tensor in ``.value`` (a
    keras.Variable, an nnx.Param) is described by that tensor (``Source.value``): plan and
    convert both take this one unwrap."""
    try:
        source = registry.framework_of(x)
    except UnsupportedTypeError:
        inner = trees.unwrap(x)
        if inner is None:
            raise
        x = inner
        source = registry.framework_of(x)
    target = registry.resolve(to)
    # a missing target framework fails here, naming its pip extra
    alignment = _needs_alignment(registry.get(source), registry.get(target))
    return source, target, registry.get(source).describe(x, alignment=alignment)


def _needs_alignment(src, dst) -> bool:
    """Whether a route may depend on the input buffer's alignment (reading it can cost)."""
    return dst.dlpack_unaligned != "ok" or not src.kernels_unaligned


def _check(copy, fallback, for_compute, on_alias, on_grad) -> None:
    _routes().check_args(copy, fallback, for_compute)
    if on_alias not in ON_ALIAS:
        raise InvalidArgumentError(f"on_alias must be one of {', '.join(map(repr, ON_ALIAS))}; got {on_alias!r}")
    if on_grad not in ON_GRAD:
        raise InvalidArgumentError(f"on_grad must be one of {', '.join(map(repr, ON_GRAD))}; got {on_grad!r}")
    if on_alias == "copy" and copy is False:
        raise InvalidArgumentError("on_alias='copy' asks for a copy that copy=False forbids; choose one")


@plain_python
def plan(x, to: Target | str, *, copy: bool | None = None, fallback: Fallback = "error",
         for_compute: bool = False) -> Plan:
    """What ``convert(x, to, ...)`` with the same keywords would do, without doing it (a
    ``keras.Variable`` or ``nnx.Param``: for the tensor it holds, as convert converts it).

    ``Plan.alias`` and ``Plan.drops_grad`` say what ``convert`` would warn about.
    """
    _check(copy, fallback, for_compute, "warn", "warn")
    source, target, src = _describe(x, to)
    return _routes().plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute)


@overload
def convert(x, to: Literal["numpy", "np"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> np.ndarray: ...
@overload
def convert(x, to: Literal["torch", "pt", "pytorch"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> torch.Tensor: ...
@overload
def convert(x, to: Literal["jax"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> jax.Array: ...
@overload
def convert(x, to: Literal["tensorflow", "tf"], *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> tf.Tensor: ...
@overload
def convert(x, to: str, *, copy: bool | None = ..., fallback: Fallback = ...,
            for_compute: bool = ..., on_alias: OnAlias = ..., on_grad: OnGrad = ...) -> Any: ...
@plain_python
def convert(x, to, *, copy=None, fallback="error", for_compute=False, on_alias="warn", on_grad="warn"):
    """Move tensor ``x`` to framework ``to`` ("numpy", "torch", "jax", "tensorflow" or an alias).

    bf16 stays bf16 bit for bit, like every other dtype both sides hold.
    ``copy=None``: zero-copy where the route allows, a copy otherwise;
    ``copy=True``: always a fresh copy; ``copy=False``: zero-copy or CopyRequiredError.
    ``fallback`` decides what happens when the target cannot hold bf16: "error"
    (default), "float32" (exact widening), "bits" (raw uint16), or "auto": the
    capability probe chooses (bf16 where the target holds it, float32 where it
    cannot, and with ``for_compute=True`` float32 where the hardware has no bf16
    arithmetic); for a 64-bit integer the target cannot hold (jax without x64) "auto"
    narrows it to 32 bits where every value fits, and raises our error where one does
    not. ``plan(x, to, ...)`` shows the route, the decision and its
    reason, and whether the result shares memory and is writable.

    What the plan knows that matters is said, not left silent:
    ``on_alias`` ("warn", "copy", "error", "allow") chooses what happens when the
    result would be writable over memory its owner treats as immutable or read-only
    (jax or tensorflow -> torch, zero-copy); ``on_grad`` ("warn", "error", "drop")
    when the input takes part in autodiff (a torch tensor that requires grad, a tf
    tensor an active gradient tape watches), whose gradient does not cross.
    Warnings are ``Bf16BridgeWarning``.
    """
    return _one(x, to, copy, fallback, for_compute, on_alias, on_grad)


def _one(x, to, copy, fallback, for_compute, on_alias, on_grad):
    """convert() with its keywords as positions (convert_tree calls this per leaf)."""
    # The hot path: an input of a type, layout and settings seen before, on a zero-copy route,
    # runs the cached plan. The key holds everything the plan depends on: the input's type and
    # Adapter.fast_key (dtype, layout, alignment where it matters, read-only, device, empty or
    # not), the keywords, the registry's generation and the adapters' state. An input the key
    # cannot describe cheaply (fast_key None) takes the full path, and so does any route
    # that copies (its copy costs more than planning it).
    if (copy is None or copy is True or copy is False) and (for_compute is False or for_compute is True):
        try:
            fast = _FAST.get((type(x), to, copy, fallback, for_compute, on_alias, on_grad))
        except TypeError:  # an unhashable keyword value: the full path says what is wrong with it
            fast = None
        if fast is not None and fast.generation == registry._GENERATION:
            k = fast.src.fast_key(x, fast.alignment)
            if k is not None:
                hit = fast.plans.get(k if fast.state is None else (k, fast.state()))
                if hit is not None:
                    p, direct, messages = hit
                    try:
                        y = _run(p, x, fast.source, copy, fast.dst) if direct is None else direct(x)
                    except UnalignedImport:  # a key without the alignment, whose import refused: planned afresh
                        return _convert(x, to, copy, fallback, for_compute, on_alias, on_grad)
                    if messages is not None:
                        for message in messages:
                            _say(message)
                    return y
    return _convert(x, to, copy, fallback, for_compute, on_alias, on_grad)


def _chained(runs: tuple) -> Callable[[Any], Any]:
    """The steps' run functions as one: the function itself where there is one step (most routes
    between frameworks: the import), nested calls for two or three (bit-view, import, bit-view:
    cheaper than a loop over them), a loop beyond."""
    if len(runs) == 1:
        return runs[0]
    if len(runs) == 2:
        first, second = runs

        def two(x):
            return second(first(x))

        return two
    if len(runs) == 3:
        first, second, third = runs

        def three(x):
            return third(second(first(x)))

        return three

    def chained(x):
        for run in runs:
            x = run(x)
        return x

    return chained


class _Fast:
    """The cached zero-copy plans for one input type, target and set of keywords."""

    __slots__ = ("generation", "src", "hub", "dst", "source", "alignment", "plans", "state")

    def __init__(self, src, hub, dst, source, alignment: bool):
        self.generation = registry._GENERATION
        self.src, self.hub, self.dst, self.source = src, hub, dst, source
        stateful = tuple(a for a in dict.fromkeys((src, hub, dst)) if type(a).state is not Adapter.state)
        #: the run-time state of the adapters a route depends on (Adapter.state overridden: jax),
        #: as one call; None where none has any
        self.state: Callable[[], object] | None = (
            None if not stateful else stateful[0].state if len(stateful) == 1
            else lambda: tuple(a.state() for a in stateful))
        #: whether the key reads the input's alignment (_alignment_read)
        self.alignment = alignment
        #: fast_key, or (fast_key, state()) -> (plan, its steps' run functions (and the read-only
        #: mark) as one function (_chained) where _run would add nothing to them: no pointer to
        #: verify (copy=False); else None, the warnings it gives with these keywords, in order, or None)
        self.plans: dict = {}


#: (type, to, keywords) -> _Fast
_FAST: dict = {}
_FAST_LIMIT = 4096


def _alignment_read(p: Plan, dst: Adapter) -> bool:
    """Whether the fast path's key must read the input's alignment for plan ``p`` into ``dst``. Only
    a target's import can make a zero-copy route depend on it (a source's own alignment matters to
    its copies, and routes that copy are never cached); not where each step is a bit-view or a
    DLPack import that takes any buffer or refuses an unaligned one (``Adapter.importer_aligned``,
    which the planner runs for an aligned buffer): that import tells, raising ``UnalignedImport``."""
    if dst.dlpack_unaligned == "ok":
        return False
    for step in p.steps:
        if step.kind == "bitview":
            continue
        if step.kind == "dlpack":
            a = registry.get(step.framework)
            if a.dlpack_unaligned == "ok" or (a.dlpack_unaligned == "copies" and a.importer_aligned() is not None):
                continue
        return True
    return False


def _remember(x, to, copy, fallback, for_compute, on_alias, on_grad, p: Plan, source, target) -> None:
    src, hub, dst = registry.get(source), registry.get(registry.HUB), registry.get(target)
    if len(_FAST) >= _FAST_LIMIT:
        return
    key = (type(x), to, copy, fallback, for_compute, on_alias, on_grad)
    fast = _FAST.get(key)
    read = _alignment_read(p, dst)
    # the plans of one key share its use of alignment: a plan that needs it read, where the key did
    # not, starts a new set that reads it (replaced, not changed: a concurrent call keeps the old)
    if fast is None or fast.generation != registry._GENERATION or (read and not fast.alignment):
        fast = _FAST[key] = _Fast(src, hub, dst, source, read)
    k = src.fast_key(x, fast.alignment)
    if k is None:
        return
    if len(fast.plans) < _FAST_LIMIT:
        runs = tuple(step.run for step in p.steps)
        if not p.writable and dst.marks_readonly:
            runs += (dst.mark_readonly,)
        # _run adds only copy=False's pointer check to the steps' own functions
        direct = None if copy is False and any(step.verify for step in p.steps) else _chained(runs)
        messages = ((_grad_message(p),) if p.drops_grad and on_grad == "warn" else ()) + (
            (_alias_message(p),) if p.alias is not None and on_alias == "warn" else ())
        fast.plans[k if fast.state is None else (k, fast.state())] = (p, direct, messages or None)


def _convert(x, to, copy, fallback, for_compute, on_alias, on_grad):
    _check(copy, fallback, for_compute, on_alias, on_grad)
    source, target, src = _describe(x, to)  # src.value: the tensor a keras.Variable or nnx.Param holds
    routes = _routes()
    p = routes.plan_for(src, source, target, copy=copy, fallback=fallback, for_compute=for_compute)
    # a plan that drops a gradient is kept only where the input stays as it is (src.value is x: a
    # tf tensor a tape watches, which fast_key tells apart; a torch one is detached) and the call
    # goes on (on_grad='error' refuses every time, on the full path)
    if (not p.copies and not (p.drops_grad and on_grad == "error") and src.value is x and on_alias != "copy"
            and not (p.alias is not None and on_alias == "error")):
        _remember(x, to, copy, fallback, for_compute, on_alias, on_grad, p, source, target)
    if p.drops_grad and on_grad != "drop":
        if on_grad == "error":
            raise UnsupportedTypeError(f"{_grad_why(p)}; pass on_grad='drop' to detach, or use bb.bridge for gradients")
        _say(_grad_message(p))
    if p.alias is not None and on_alias != "allow":
        if on_alias == "copy":
            p = routes.plan_for(src, source, target, copy=True, fallback=fallback, for_compute=for_compute)
        elif on_alias == "error":
            raise CopyRequiredError(f"{p.alias}; on_alias='error' refuses it: pass on_alias='copy'")
        else:
            _warn_alias(p)
    try:
        return _run(p, src.value, source, copy, registry.get(p.target))
    except UnalignedImport:
        # the source described a buffer as aligned that the target's import found was not (a
        # framework's small or empty tensor over memory it did not allocate): planned as unaligned
        p = routes.plan_for(src._replace(aligned=False), source, target, copy=copy, fallback=fallback,
                            for_compute=for_compute)
        return _run(p, src.value, source, copy, registry.get(p.target))


def _warn_alias(p: Plan) -> None:
    _say(_alias_message(p))


def _grad_why(p: Plan) -> str:
    return (f"this {p.source} tensor {registry.get(p.source).grad_words}; its data crosses to {p.target} "
            "detached and its gradient does not cross")


def _grad_message(p: Plan) -> str:
    return f"{_grad_why(p)} (on_grad='drop' silences this; on_grad='error' refuses)"


def _alias_message(p: Plan) -> str:
    return f"{p.alias} (on_alias='allow' silences this; 'copy' or 'error' avoid it)"


#: inside convert_tree: the messages its leaves would warn, said once per call when it ends
_SAYING: contextvars.ContextVar[dict | None] = contextvars.ContextVar("bf16bridge_saying", default=None)


def _say(message: str) -> None:
    pending = _SAYING.get()
    if pending is None:
        _warn(message)
    else:
        pending[message] = pending.get(message, 0) + 1


def _warn(message: str) -> None:
    """``warnings.warn(message, Bf16BridgeWarning)`` pointed at the caller's line (the first
    frame outside this package), costing little where it would show nothing.

    ``convert`` may warn on every call of a hot loop, and ``warnings.warn`` costs microseconds
    even when it shows nothing (it walks the stack and searches the filters each time). So
    what ``warnings`` will not show again is remembered: a message the filters ignore
    wherever it is raised, and a call site where it was shown under "default", "module" or
    "once" (or ignored by a filter for that module or line). CPython's "once" is once per
    registry, as "module" is, not once per process: its C ``warn_explicit`` keeps the key in the
    caller's ``__warningregistry__`` (``onceregistry`` only where there is none), so a message shown
    once in one module shows again from another. A site shown under
    "default", "module" or "once" stays quiet only while Python's own registry for it (the
    ``__warningregistry__`` of the frame's globals) is the same dict and still holds the
    warning's key: code run in fresh globals, or a registry cleared, shows it again, as
    ``warnings`` does. The memory holds only while the filters are the ones it was made under
    (the same list object, with the same entries, and the same default action): a change of
    identity or entries forgets it, so "always" and "error" see every call, and the first call
    after a change goes to ``warnings`` as it is.

    Where this differs from ``warnings``: a warning shown once from a line stays quiet there
    until ``warnings.filters`` changes its identity or entries. Python itself would show it
    again after a ``catch_warnings`` block (entered and left, which restores the same list) or a
    ``simplefilter``/``filterwarnings`` call that re-adds a filter already first in the list:
    both bump an internal filters version that Python offers no way to read, and its registries
    are cleared on the next warning. The warnings module is not patched to see them."""
    quiet = _QUIET
    filters = warnings.filters
    if (quiet.filters is not filters or quiet.snapshot != filters
            or quiet.default != warnings.defaultaction):  # type: ignore[attr-defined]
        quiet = _Quiet()
    if message in quiet.messages:
        return
    everywhere = quiet.everywhere.get(message, "")
    if everywhere == "":
        everywhere = _action(message, None, 0)
        if len(quiet.everywhere) < _QUIET_LIMIT:
            quiet.everywhere[message] = everywhere
    if everywhere == "ignore":
        quiet.remember(message)
        return
    level, frame = _outside()
    if frame is None:
        warnings.warn(message, Bf16BridgeWarning, stacklevel=level)
        return
    # the code object by id (hashing one reads all its bytecode; the entry keeps it alive), and
    # the instruction rather than the line (finding the line reads a table)
    site = (id(frame.f_code), frame.f_lasti, message)
    seen = quiet.sites.get(site)
    if seen is not None:
        kept: dict | None = seen[1]
        # "ignore" stores nothing in Python's registry; the others skip only while the registry
        # warnings itself keeps for this frame's globals still says it was shown here
        if kept is None or (kept.get(seen[2]) and frame.f_globals.get("__warningregistry__") is kept):
            return
    action = everywhere or _action(message, frame.f_globals.get("__name__", "<string>"), frame.f_lineno)
    warnings.warn(message, Bf16BridgeWarning, stacklevel=level)
    if action in _SHOWS_ONCE and (seen is not None or len(quiet.sites) < _QUIET_LIMIT):
        if action == "ignore":
            quiet.sites[site] = (frame.f_code, None, None)
        else:
            # CPython's key (Lib/warnings.py, Python/_warnings.c): (text, category, line number)
            key = (message, Bf16BridgeWarning, frame.f_lineno)
            held = frame.f_globals.get("__warningregistry__")
            if held is not None and held.get(key):
                quiet.sites[site] = (frame.f_code, held, key)


class _Quiet:
    """What ``warnings`` will not show again of our messages, under one set of filters."""

    __slots__ = ("filters", "snapshot", "default", "messages", "everywhere", "sites")

    def __init__(self):
        global _QUIET
        self.filters = warnings.filters
        self.snapshot = list(self.filters)
        self.default = warnings.defaultaction  # type: ignore[attr-defined]
        #: messages shown nowhere again (ignored wherever raised)
        self.messages: set = set()
        #: message -> the action for it wherever it is raised, or None where that depends on the site
        self.everywhere: dict = {}
        #: (id of a code object, instruction, message) -> (that code object, the warnings registry of
        #: the frame's globals and the key warnings keeps in it; None, None for an ignored site): a
        #: site shown nothing again while that registry holds that key
        self.sites: dict = {}
        _QUIET = self

    def remember(self, message: str) -> None:
        if len(self.messages) < _QUIET_LIMIT:
            self.messages.add(message)


#: the actions after which ``warnings`` shows a message at a call site no more (until its
#: filters change): "ignore" at once; the others once it has been shown there
_SHOWS_ONCE = frozenset(["ignore", "default", "module", "once"])
_QUIET_LIMIT = 4096


def _action(text: str, module, lineno: int) -> str | None:
    """The action ``warnings`` takes for our warning ``text`` raised in ``module`` at ``lineno``
    (the first filter that matches, as ``warnings.warn_explicit`` searches them). ``module``
    None: the action wherever it is raised, or None where a filter for a module or a line
    could decide it."""
    if module is not None and not isinstance(module, str):
        return None  # an unusual module name: no memory, every call goes to warnings
    for action, msg, cat, mod, ln in warnings.filters:
        if (msg is None or msg.match(text)) and issubclass(Bf16BridgeWarning, cat):
            if module is None:
                if mod is not None or ln != 0:
                    return None
                return action
            if (mod is None or mod.match(module)) and (ln == 0 or lineno == ln):
                return action
    return warnings.defaultaction  # type: ignore[attr-defined]


def _outside() -> tuple[int, FrameType | None]:
    """The first frame outside this package above ``_warn``'s caller, and the stacklevel that
    points ``warnings.warn`` in ``_warn`` at it (frame 0 is this function, 1 is ``_warn``: their
    stacklevels for a call in ``_warn`` are one apart). Asked only where the filters' answer
    depends on the call site."""
    depth = 1
    try:
        while sys._getframe(depth).f_code.co_filename.startswith(_PACKAGE_DIR):
            depth += 1
        return depth, sys._getframe(depth)
    except ValueError:  # no frame outside the package
        return depth, None


def _stacklevel() -> int:
    """The stacklevel that points a ``warnings.warn`` made by the caller at the first line outside
    this package (for modules that warn themselves; ``_warn`` finds it cheaper)."""
    level = 2
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        level, frame = level + 1, frame.f_back
    return level


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_QUIET: _Quiet
_Quiet()


def run_plan(p: Plan, x, copy: bool | None):
    """Run ``p``, which ``plan(x, ..., copy=copy)`` made for this very ``x``, and which warns of
    nothing (no alias, no dropped gradient): for a caller that planned already (Checkpoint.get, on
    a process's first get), so that the route is not described and planned a second time."""
    return _run(p, x, p.source, copy, registry.get(p.target))


def _run(p: Plan, value, source: str, copy, dst_a):
    here = source
    for step in p.steps:
        out = step.run(value)  # type: ignore[misc]
        if step.verify and not step.copies and p.nbytes and copy is False:
            # the framework decides whether it copies; check, so copy=False is never a lie
            before = registry.get(here).data_ptr(value)
            after = registry.get(step.framework).data_ptr(out)
            if before != after:
                raise CopyRequiredError(
                    f"copy=False, but {step.label} copied this {source} input; pass copy=None to allow it"
                )
        value, here = out, step.framework
    if not p.writable and dst_a.marks_readonly:
        # an empty result may come back writable from a framework that had nothing to share
        value = dst_a.mark_readonly(value)
    return value


@plain_python
def to_numpy(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
             on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> np.ndarray:
    """``convert(x, "numpy", ...)``"""
    return convert(x, "numpy", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)


@plain_python
def to_torch(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
             on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> torch.Tensor:
    """``convert(x, "torch", ...)``"""
    return convert(x, "torch", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)


@plain_python
def to_jax(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
           on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> jax.Array:
    """``convert(x, "jax", ...)``"""
    return convert(x, "jax", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)


@plain_python
def to_tensorflow(x, *, copy: bool | None = None, fallback: Fallback = "error", for_compute: bool = False,
                  on_alias: OnAlias = "warn", on_grad: OnGrad = "warn") -> tf.Tensor:
    """``convert(x, "tensorflow", ...)``"""
    return convert(x, "tensorflow", copy=copy, fallback=fallback, for_compute=for_compute,
                   on_alias=on_alias, on_grad=on_grad)


T = TypeVar("T")


OnUnsupported = Literal["raise", "keep"]


@plain_python
def convert_tree(tree: T, to: Target | str, *, copy: bool | None = None, fallback: Fallback = "error",
                 for_compute: bool = False, on_alias: OnAlias = "warn", on_grad: OnGrad = "warn",
                 on_unsupported: OnUnsupported = "raise", unwrap: bool = False) -> T:
    """Convert every tensor leaf of a tree, keeping its structure.

    The tree: dicts (every dict type keeps its type: defaultdict with its factory, OrderedDict,
    a torch state dict's ``_metadata``), other mappings, lists, tuples, namedtuples, and, once
    their library is imported, jax pytree nodes (flax linen/nnx state and Variables, equinox
    modules, registered dataclasses) and optree-registered nodes. A wrapper that holds a tensor
    in ``.value`` and is no tree node (a ``keras.Variable``) becomes its converted value;
    ``unwrap=True``: every such wrapper does (an nnx.State's Params become plain tensors).

    Returns new containers of the same types; the input is not modified. Leaves that are not
    tensors and hold none (ints, strings, None, dtypes, other objects) are kept as they are.
    A tensor leaf that cannot cross raises our error naming its path, and so does an object that
    holds tensors the walk does not enter (a torch model, a tf ragged or sparse tensor, a set of
    tensors, a generator), naming the way out. ``on_unsupported="keep"``: a leaf that cannot
    cross at all (``plan`` refuses it, or its values do: int64 values past int32 under
    ``fallback="auto"`` to a jax without x64) is kept as it is, and the call warns once naming how many
    and where; a refusal the caller chose (``copy=False``, ``on_alias="error"``,
    ``on_grad="error"``) still raises.
    What a leaf's conversion would warn about (aliases, dropped gradients) is said once per
    call, with how many leaves it concerns.
    """
    _check(copy, fallback, for_compute, on_alias, on_grad)
    if on_unsupported not in ("raise", "keep"):
        raise InvalidArgumentError(f"on_unsupported must be 'raise' or 'keep'; got {on_unsupported!r}")
    # the target once, up front: an unknown or unhashable one is the call's fault, not a leaf's
    # (a leaf's error would be kept silently under on_unsupported="keep")
    registry.resolve(to)

    pending: dict = {}
    # _one's cache lookup, done once per leaf type for the whole call: the cached plans for
    # the type and the adapters' state (a tree is converted under one state)
    fasts: dict = {}

    def leaf(x, path):
        try:
            t = type(x)
            got: Any = fasts.get(t)
            if got is None:
                fast = _FAST.get((t, to, copy, fallback, for_compute, on_alias, on_grad))
                got = fasts[t] = (False if fast is None or fast.generation != registry._GENERATION
                                  else (fast, None if fast.state is None else fast.state()))
            if got is not False:
                fast, state = got
                k = fast.src.fast_key(x, fast.alignment)
                if k is not None:
                    hit = fast.plans.get(k if fast.state is None else (k, state))
                    if hit is not None:
                        p, direct, messages = hit
                        try:
                            y = _run(p, x, fast.source, copy, fast.dst) if direct is None else direct(x)
                        except UnalignedImport:  # as in _one: planned afresh
                            return _one(x, to, copy, fallback, for_compute, on_alias, on_grad)
                        if messages is not None:
                            for message in messages:
                                pending[message] = pending.get(message, 0) + 1
                        return y
            return _one(x, to, copy, fallback, for_compute, on_alias, on_grad)
        except Bf16BridgeError as err:
            # (a plain dtype refusal of the values, which plan cannot foresee: int64 values past int32
            # under fallback='auto' to a jax without x64; no refusal the caller chose raises this class)
            if on_unsupported == "keep" and (type(err) is UnsupportedDtypeError
                                             or _cannot_cross(x, to, fallback, for_compute)):
                kept.append(trees.where(path))
                return x
            raise type(err)(f"at {trees.where(path)}: {err}") from err

    kept: list[str] = []
    token = _SAYING.set(pending)
    try:
        out = trees.map_leaves(leaf, tree, unwrap_values=unwrap, strict=True,
                               as_is=_as_is(to, copy, fallback, for_compute))
    finally:
        _SAYING.reset(token)
    for message, n in pending.items():
        _warn(f"{n} lea{'f' if n == 1 else 'ves'} of this tree: {message}")
    if kept:
        n = len(kept)
        _warn(f"on_unsupported='keep' kept {n} lea{'f' if n == 1 else 'ves'} of this tree as "
              f"{'it is' if n == 1 else 'they are'}, not in {registry.resolve(to)}: {', '.join(kept[:3])}"
              f"{f' and {n - 3} more' if n > 3 else ''} (bb.plan_tree says why of each)")
    return out


def _as_is(to, copy, fallback, for_compute) -> Callable[[Any], bool]:
    """Whether ``convert`` with these keywords hands a tensor back as it is (the same object: not a
    detached torch tensor, not a tf.Variable's value, no copy, no other dtype), asked only of a
    tensor already of the target framework, and converted only where its plan copies nothing. The
    trees' walk keeps a plain object whose tensors (in its attributes) all would be: nothing in it
    changes. The answer is the plan's, so it is asked once per type and ``Adapter.fast_key`` in a
    call, for a type the fast path keys plans by (what convert's own fast path asks of it, so a
    tf.Variable, whose plans are never kept, is asked on its own each time, as is a tensor without
    a fast key)."""
    target = registry.resolve(to)
    known: dict = {}  # (type, whether the key reads alignment, fast key) -> the answer

    def key(x):
        fast = _FAST.get((type(x), target, copy, fallback, for_compute, "allow", "drop"))
        if fast is None or fast.generation != registry._GENERATION:
            return None
        k = fast.src.fast_key(x, fast.alignment)  # (alignment read where the fast path reads it)
        return None if k is None else (type(x), fast.alignment, k)

    def as_is(x) -> bool:
        if copy is True or registry.tensor_framework(x) != target:
            return False
        k = key(x)
        answer = known.get(k) if k is not None else None
        if answer is not None:
            return answer
        try:
            answer = (not plan(x, target, fallback=fallback, for_compute=for_compute).copies
                      and _one(x, target, copy, fallback, for_compute, "allow", "drop") is x)
        except Bf16BridgeError:
            answer = False
        k = k or key(x)  # (the conversion just asked may have made the type's plans)
        if k is not None:
            known[k] = answer
        return answer

    return as_is


def _cannot_cross(x, to, fallback, for_compute) -> bool:
    """Whether the leaf ``x`` cannot cross to ``to`` at all (what ``on_unsupported="keep"`` keeps):
    planned with the caller's fallback, but without the refusals the caller chose (``copy=False``,
    ``on_grad="error"``, ``on_alias="error"``), it still has no route: not a tensor, a dtype or a
    device the target cannot hold."""
    try:
        plan(x, to, fallback=fallback, for_compute=for_compute)
    except (UnsupportedTypeError, UnsupportedDtypeError, DeviceError):
        return True
    except Bf16BridgeError:
        return False
    return False


@plain_python
def plan_tree(tree, to: Target | str, *, copy: bool | None = None, fallback: Fallback = "error",
              for_compute: bool = False) -> TreePlan:
    """What ``convert_tree(tree, to, ...)`` would do, leaf by leaf and in total, without doing it."""
    from bf16bridge.core.plan import TreePlan

    _check(copy, fallback, for_compute, "warn", "warn")
    leaves: list = []

    def leaf(x, path):
        try:
            leaves.append((trees.where(path), plan(x, to, copy=copy, fallback=fallback, for_compute=for_compute)))
        except Bf16BridgeError as err:
            leaves.append((trees.where(path), err))
        return x

    trees.map_leaves(leaf, tree, strict=True, as_is=_as_is(to, copy, fallback, for_compute))
    return TreePlan(tuple(leaves))
