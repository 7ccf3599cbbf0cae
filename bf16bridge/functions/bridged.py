"""Functions across frameworks (``bb.bridge``): ``bb.bridge("jax")(fn)`` runs a jax function on the
tensors of any other framework, gradients included.

``bridge`` wraps a function in a ``BridgedFunction``; each call finds the caller's framework from
its tensor leaves and hands a ``ForeignCall`` (``functions.foreign``) to the caller's hooks. The
machinery names no framework: what differs between them is each one's ``BridgeHooks``.
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence

from bf16bridge.adapters.hooks import BridgeHooks
from bf16bridge.core import registry
from bf16bridge.core.autograph import plain_python
from bf16bridge.core.convert import Fallback
from bf16bridge.errors import Bf16BridgeError, Bf16BridgeWarning, InvalidArgumentError
from bf16bridge.functions.callee import RAISED_IN_CALLEE
from bf16bridge.functions.compiled import Compiler, Static
from bf16bridge.functions.foreign import ForeignCall
from bf16bridge.trees import walk as trees


class BridgedFunction:
    """A function of one framework, callable with the tensors of any other."""

    #: a graph tracer that rewrites Python calls an object with this attribute as it is (read with
    #: hasattr): the bridge has no tensor control flow to convert, and the callee is foreign code
    autograph_info__: frozenset = frozenset()

    def __init__(self, fn, callee: str, *, copy_inputs: bool = False, fallback: Fallback = "error",
                 vmap_method: str | None = None, jit: bool | None = None, static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Iterable[str] = ()):
        self.fn = fn
        self.callee = registry.resolve(callee)
        self.copy_inputs = copy_inputs
        self.fallback = fallback
        self.vmap_method = vmap_method
        self.jit = jit
        self.static = Static(fn, static_argnums, static_argnames)
        self._static_named = bool(self.static)  # (read on every call: no __bool__ frame)
        self._specs: dict = {}  # output specs by input signature, for declared-shape callers
        self._memo: dict = {}  # (caller, signature, wanted gradients) -> what the caller's adapter keeps
        self._compiled = Compiler(self)  # the callee compiled, by signature (BridgeHooks.compile)
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r}>"

    def __call__(self, *args, **kwargs):
        try:
            # a graph compiler tracing the caller must not trace the bridge: an imported framework's
            # hooks may hand back this call wrapped to run outside its trace
            for hooks in compilers():
                run = hooks.outside_compiler(self._call)
                if run is not None:
                    return run(args, kwargs)
            return self._call(args, kwargs)
        except Bf16BridgeError as err:
            # ours reach the caller from here, with the caller's line and this one: the frames below are
            # the bridge's (an error the function itself raised keeps its own)
            if getattr(err, RAISED_IN_CALLEE, False):
                raise
            cause = err.__cause__
            raise err.with_traceback(None) from (None if isinstance(cause, Bf16BridgeError) else cause)

    def _call(self, args: tuple, kwargs: dict):  # (the arguments as they came: not packed again)
        leaves, skeleton, flat = trees.flatten_call(args, kwargs)
        caller = caller_of(leaves, self.fn)
        if caller is None or caller == self.callee:
            return self.fn(*args, **kwargs)
        if self._static_named:
            self.static.check(args, kwargs)
        adapter = registry.get(caller)
        hooks = registry.hooks(caller, BridgeHooks)
        traced = hooks.traced(leaves)
        diff = hooks.differentiable_leaves(leaves, traced)
        if any(diff) and not registry.hooks(self.callee, BridgeHooks).differentiates:
            warnings.warn(
                f"{self.callee} has no autodiff: the {caller} inputs' gradients stop at this bridged "
                f"function ({self!r}); compute the function in a framework with autodiff to train through it",
                Bf16BridgeWarning, stacklevel=2)
            diff = [False] * len(leaves)
        call = ForeignCall(self.fn, self.callee, skeleton, diff, self.copy_inputs, self.fallback, self.vmap_method,
                           caller, flat)
        call.traced = traced
        if self.jit is not False:
            call.compiled = self._compiled.find(call, adapter)
        # a traced caller declares the results before anything runs: found by one call on zeros and
        # kept per signature (an eager call learns its results as it runs: none of this)
        sig = trees.key(skeleton) if traced else None
        if sig is not None:
            # with both sides' state: the callee's decides which results it gives, the caller's which it holds
            sig = (sig, adapter.state(), registry.get(self.callee).state(),
                   tuple(adapter.shape_dtype(x) for x in leaves))
            call.out_specs, call.out_skeleton = self._specs.get(sig, (None, None))
            with self._lock:
                call.memo = self._memo.setdefault((caller, sig, tuple(diff)), {})
        outs = hooks.call_foreign(call, leaves)
        if call.out_skeleton is None:  # nothing ran yet (a traced call) and nothing was kept
            call.specs(leaves, adapter.shape_dtype)
        if sig is not None and sig not in self._specs:
            with self._lock:
                self._specs[sig] = (call.out_specs, call.out_skeleton)
        if call.out_skeleton is trees.SLOT:  # one tensor: fill's answer, without the walk
            return outs[0]
        return trees.fill(call.out_skeleton, list(outs))


#: ((registry generation, modules imported), the imported frameworks' hooks that have a graph
#: compiler to step out of): asked on every bridged call, found again when either changes
_COMPILERS: tuple = (None, ())


def compilers() -> tuple:
    """The bridge hooks of the imported frameworks that offer ``outside_compiler``."""
    global _COMPILERS
    now = (registry.GENERATION, len(sys.modules))
    if _COMPILERS[0] != now:
        found = (registry.hooks(a.name, BridgeHooks) for a in registry.imported())
        _COMPILERS = (now, tuple(h for h in found if type(h).outside_compiler is not BridgeHooks.outside_compiler))
    return _COMPILERS[1]


def caller_of(leaves, fn) -> str | None:
    """The framework of a call's tensor leaves (None: no leaves); our error where they mix frameworks."""
    if not leaves:
        return None
    first = type(leaves[0])
    for x in leaves:
        if type(x) is not first:
            break
    else:  # one type (the common call): one question
        return registry.framework_of(leaves[0])
    names = {registry.framework_of(x) for x in leaves}
    if len(names) > 1:
        raise InvalidArgumentError(
            f"the tensors passed to bridged function {getattr(fn, '__qualname__', fn)!r} come from "
            f"{', '.join(sorted(names))}: a call takes one framework's tensors; convert them first "
            "(bb.convert_tree(args, to=...))"
        )
    return names.pop() if names else None


@plain_python
def bridge(framework: str, *, copy_inputs: bool = False, fallback: Fallback = "error",
           vmap_method: str | None = None, jit: bool | None = None, static_argnums: int | Sequence[int] = (),
           static_argnames: str | Iterable[str] = ()) -> Callable[[Callable], BridgedFunction]:
    """Declare the framework a function is written in, so tensors of any other can call it.

    ``@bb.bridge("jax")`` over a jax function (jit-compiled or not) makes it callable with
    torch, tensorflow or numpy tensors: they are converted zero-copy where the bridge can,
    the function runs in jax, its results come back in the caller's framework, and the
    caller's autodiff (torch autograd, ``jax.grad``, ``tf.GradientTape``) reaches the
    callee's own vjp. Arguments and results are trees; non-tensor arguments pass through.
    A Python number in the result comes back as a 0-d tensor of the caller (docs/functions.md).

    ``copy_inputs=True``: the callee gets copies, for functions that write into their
    inputs (by default inputs are zero-copy views of the caller's tensors).
    ``fallback``: as in ``convert``, for a dtype one side cannot hold.
    ``vmap_method``: a jax caller under ``vmap`` needs one (``"sequential"``, ...; see
    ``jax.pure_callback``); without it, vmap is refused.
    ``jit``: compile the function, its forward and its vjp, once per signature (argument
    structure, non-tensor values, shapes and dtypes); None (the default) compiles where the
    callee's framework compiles (jax: ``jax.jit``), False runs it as written, True insists.
    Every non-tensor argument is static (compiled in; a new value compiles again);
    ``static_argnums`` / ``static_argnames`` (as ``jax.jit`` spells them) are checked to hold no
    tensor and to be hashable.
    """
    resolved = registry.resolve(framework)
    if jit not in (None, True, False):
        raise InvalidArgumentError(f"jit={jit!r}: pass None (compile where the callee's framework does), True or False")

    def wrap(fn: Callable) -> BridgedFunction:
        return BridgedFunction(fn, resolved, copy_inputs=copy_inputs, fallback=fallback, vmap_method=vmap_method,
                               jit=jit, static_argnums=static_argnums, static_argnames=static_argnames)

    return wrap
