"""A bridged function compiled by its own framework (``bb.bridge("jax")``: ``jax.jit``), once per signature.

``Compiler`` keeps, for one bridged function, the callee compiled per signature: the arguments'
structure and non-tensor values (each a constant compiled in, as ``jax.jit``'s static arguments
are), both sides' run-time state and which leaves want a gradient; the callee's framework keys its
own compiled code by the shapes and dtypes (``BridgeHooks.compile``). ``Static`` checks the
arguments a user names static, as ``jax.jit``'s ``static_argnums`` / ``static_argnames`` do.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from bf16bridge.adapters.hooks import BridgeHooks
from bf16bridge.core import registry
from bf16bridge.errors import Bf16BridgeWarning, InvalidArgumentError
from bf16bridge.functions import callee as running
from bf16bridge.trees import walk as trees

#: signatures one bridged function compiles for before a warning says that each new one compiles again
SIGNATURES_WARNED = 16


class Compiler:
    """The callee of one bridged function, compiled per signature (None where it is run as written)."""

    def __init__(self, bridged) -> None:
        self.bridged = bridged
        self.entries: dict = {}
        self.hooks: BridgeHooks | None = None  # the callee's, found on the first call (bridge() imports nothing)
        self.unhashable_warned = False
        self.lock = threading.Lock()

    def find(self, call, caller) -> Any:
        """The compiled callee for ``call``'s signature (``caller``: the caller's core Adapter), made on first
        need; None where the callee's framework compiles nothing or the signature cannot be keyed."""
        hooks = self.hooks
        if hooks is None:
            hooks = self.hooks = registry.hooks(call.callee, BridgeHooks)
        if not hooks.compiles:
            if self.bridged.jit:
                raise InvalidArgumentError(
                    f"bb.bridge({call.callee!r}, jit=True): bf16bridge compiles only a jax callee ({call.callee} "
                    "functions run as written); drop jit=True, or compile the function with its framework's own tools")
            return None
        shape = len(call.skeleton[0]) if call.flat else trees.key(call.skeleton)
        if shape is None:
            self._unhashable()
            return None
        key = (shape, call.caller, caller.state(), registry.get(call.callee).state(), tuple(call.diff))
        found = self.entries.get(key)
        if found is None:
            with self.lock:
                found = self.entries.get(key)
                if found is None:
                    bridged = self.bridged
                    run = functools.partial(running.run, bridged.fn, call.callee, call.caller, call.skeleton, call.flat)
                    found = self.entries[key] = hooks.compile(run, list(call.diff))
                    if len(self.entries) == SIGNATURES_WARNED:
                        self._many()
        return found

    def _unhashable(self) -> None:
        if self.unhashable_warned:
            return
        self.unhashable_warned = True
        warnings.warn(
            f"the bridged function {self._name()} was called with a non-tensor argument that cannot be hashed, "
            "so it cannot be compiled in as a constant: it runs as written (uncompiled, slower) for such calls. "
            "Pass hashable values (tuples, numbers, strings, frozen dataclasses), or bb.bridge(..., jit=False)",
            Bf16BridgeWarning, stacklevel=5)

    def _many(self) -> None:
        warnings.warn(
            f"the bridged function {self._name()} has been compiled for {SIGNATURES_WARNED} signatures: every "
            "non-tensor argument is compiled in as a constant, so one whose value changes from call to call "
            "compiles again each call. Pass such a value as a tensor, or bb.bridge(..., jit=False)",
            Bf16BridgeWarning, stacklevel=5)

    def _name(self) -> str:
        return repr(getattr(self.bridged.fn, "__qualname__", self.bridged.fn))


class Static:
    """The arguments named static (``static_argnums``, ``static_argnames``): checked to hold no tensor and to
    be hashable. Every non-tensor argument is static already; naming one says that it must stay so."""

    def __init__(self, fn, argnums: int | Sequence[int], argnames: str | Iterable[str]) -> None:
        nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        names = (argnames,) if isinstance(argnames, str) else tuple(argnames)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
            raise InvalidArgumentError(f"static_argnums={argnums!r}: pass an int or a sequence of ints (positions)")
        if not all(isinstance(n, str) for n in names):
            raise InvalidArgumentError(f"static_argnames={argnames!r}: pass a str or a sequence of str (names)")
        try:  # each named by the other too, where the signature says (as jax.jit does)
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.nums = frozenset(nums) | {positional.index(n) for n in names if n in positional}
        self.names = frozenset(names) | {positional[i] for i in nums if -len(positional) <= i < len(positional)}

    def __bool__(self) -> bool:
        return bool(self.nums or self.names)

    def check(self, args: tuple, kwargs: dict) -> None:
        """Our error for a static argument of this call that holds a tensor or cannot be hashed."""
        for i in self.nums:
            if -len(args) <= i < len(args):
                _check_one(f"args[{i % len(args)}]", args[i])
        for name in self.names:
            if name in kwargs:
                _check_one(f"kwargs[{name!r}]", kwargs[name])


def _check_one(path: str, value) -> None:
    if trees.flatten(value)[0]:
        raise InvalidArgumentError(
            f"{path} is named static (static_argnums / static_argnames) but holds a tensor: tensors cross the "
            "bridge as traced inputs, never as constants; drop it from the static arguments, or pass a Python value")
    if trees.key(trees.flatten(value)[1]) is None:
        raise InvalidArgumentError(
            f"{path} is named static (static_argnums / static_argnames) but cannot be hashed, as a static "
            "argument must be (jax.jit's rule): pass a hashable value (numbers, strings, tuples, frozen dataclasses)")
