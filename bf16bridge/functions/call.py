"""Functions across frameworks (``bb.bridge``): ``bb.bridge("jax")(fn)`` runs a jax function on torch,
tensorflow or numpy tensors, gradients included.

The call machinery lives here and names no framework. A call:

1. flattens the arguments (``trees.flatten``): the tensor leaves must share one
   framework, the caller's; everything else passes through unchanged;
2. converts each leaf to the callee's framework (zero-copy where the bridge can);
3. runs the function (with the callee's own vjp when a gradient is wanted:
   ``Adapter.vjp``);
4. converts the result's leaves back to the caller's framework.

How the caller's autodiff takes a foreign backward is the caller adapter's
``call_foreign`` (torch: an ``autograd.Function``; jax: ``custom_vjp`` around
``pure_callback``, which also works under ``jit``; tensorflow: ``custom_gradient``,
around ``py_function`` inside ``tf.function``). A backward converts the incoming
cotangents to the callee, runs the callee's pullback and converts the gradients
back: each gradient is the callee's own vector-Jacobian product, bit for bit.
"""

from __future__ import annotations

import functools
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from bf16bridge.core.autograph import plain_python
from bf16bridge.core import dtypes
from bf16bridge.core import fpenv
from bf16bridge.core import registry
from bf16bridge.trees import walk as trees
from bf16bridge.core.adapter import Adapter
from bf16bridge.core.convert import Fallback, _one, plan
from bf16bridge.errors import (Bf16BridgeError, Bf16BridgeWarning, InputWrittenError, InvalidArgumentError,
                     UnsupportedDtypeError, UnsupportedTypeError)
from bf16bridge.adapters.hooks import BridgeHooks, second_order_refused

__all__ = ["bridge", "BridgedFunction", "ForeignCall", "second_order_refused"]


class ForeignCall:
    """One call of a bridged function, as the caller's adapter sees it.

    ``forward(leaves, want_vjp, to)`` runs the callee on the input leaves (tensors of
    any framework: the caller's, or numpy inside a jax callback) and returns the
    output leaves as tensors of framework ``to``, with a handle for ``backward``.
    ``backward(handle, cotangents, to)`` returns one gradient per input leaf (None
    where there is none) as tensors of ``to``. ``recompute_backward`` does both for
    callers that cannot keep a Python handle between forward and backward (jax,
    tensorflow graphs): the forward runs again, with the callee's vjp.
    """

    __slots__ = ("fn", "callee", "skeleton", "diff", "copy_inputs", "fallback", "out_skeleton", "out_specs",
                 "vmap_method", "memo", "caller", "_declared", "flat", "traced", "flushed")

    def __init__(self, fn, callee, skeleton, diff, copy_inputs, fallback, vmap_method, caller=None, flat=False):
        self.fn = fn
        self.callee = callee
        self.caller = caller  # the framework whose tensors called (None: not known)
        self.skeleton = skeleton  # (args, kwargs) with the tensor leaves taken out
        #: the skeleton is ((SLOT,) * n, {}): the leaves are the positional arguments, as they are
        # (a traced call's arguments, the caller's tracers, may not have taken flatten_call's fast walk)
        self.flat = flat or (type(skeleton) is tuple and len(skeleton) == 2 and skeleton[1] == {}
                             and type(skeleton[0]) is tuple and all(s is trees.SLOT for s in skeleton[0]))
        self.diff = diff  # per input leaf: does the caller want its gradient?
        self.copy_inputs = copy_inputs
        self.fallback = fallback
        self.vmap_method = vmap_method
        self.out_skeleton: Any = None  # the result's tree, leaves taken out, once known
        self._declared: tuple | None = None  # (the declared results' values key,), once compared
        self.out_specs: list | None = None  # [(shape, dtype name)] of the output leaves, once known
        #: what a caller adapter keeps between calls of one signature (input structure, non-tensor
        #: values, leaves' shapes and dtypes, which want gradients); None when it cannot be keyed
        self.memo: dict | None = None
        #: whether the caller is being traced (Adapter.traced, asked once a call: its hooks read this)
        self.traced = False
        #: whether the thread that made the call flushes subnormals (fpenv): the callee, run later on a
        #: thread of the caller's runtime that does (under jax.jit, in tf.function), computes as it
        #: would have there, keeping them
        self.flushed = fpenv.flushes()

    # -- the pieces every caller hook uses -----------------------------------------------
    # convert's hot path (_one) with its keywords as positions: copy, fallback, for_compute,
    # on_alias, on_grad (a call converts every leaf both ways)
    def _inputs(self, leaves):
        copy, to, fallback = True if self.copy_inputs else None, self.callee, self.fallback
        return [_one(x, to, copy, fallback, False, "allow", "drop") for x in leaves]

    def _flat_fn(self, *callee_leaves):
        if self.flat:
            out = self.fn(*callee_leaves)
        else:
            args, kwargs = trees.fill(self.skeleton, callee_leaves)
            out = self.fn(*args, **kwargs)
        # one tensor of the callee's (the usual result): the leaf flatten would find, and the check
        # below passed, in one lookup of its type (registry's cache of tensor types: one not in it yet,
        # or a tree, takes the walk)
        one = registry._TYPE_CACHE.get(type(out)) == self.callee
        out_leaves, skeleton = ([out], trees.SLOT) if one else trees.flatten(out)
        if self.out_skeleton is not None:  # declared (traced): what the caller will be handed
            self._check_declared(skeleton)
        self.out_skeleton = skeleton
        if not one:
            for x in out_leaves:
                if registry.framework_of(x) != self.callee:
                    raise UnsupportedTypeError(
                        f"the bridged {self.callee} function returned a {registry.framework_of(x)} tensor; "
                        f"return {self.callee} tensors (the bridge converts them for the caller)"
                    )
        return out_leaves

    def _check_declared(self, skeleton) -> None:
        """Our error for a run whose non-tensor results differ from the declared ones: a traced
        caller hands back the results' tree as found by the call on zeros, so a value computed
        from the inputs (``float(x.sum())``) would come back as it was on zeros, silently."""
        # values only: an object compared by identity (a fresh instance each run) has no value
        # that could have changed, so it counts by its type
        if skeleton is self.out_skeleton:  # the same object (trees.SLOT: one tensor)
            return
        if self._declared is None:
            self._declared = (trees.key(self.out_skeleton, values_only=True),)
        declared = self._declared[0]
        if declared is None or trees.key(skeleton, values_only=True) == declared:
            return  # (a tree holding unhashable values cannot be compared: taken as declared)
        raise UnsupportedTypeError(
            f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returned "
            f"{_short(skeleton)} around its tensors, but {_short(self.out_skeleton)} when its results were "
            "declared (under a transformation they are found by one call on zeros): a result that is not a "
            "tensor must not depend on the inputs' values; return it as a tensor")

    def _outputs(self, out_leaves, to):
        fallback, out = self.fallback, []
        for i, y in enumerate(out_leaves):
            try:
                out.append(_one(y, to, None, fallback, False, "allow", "drop"))
            except Bf16BridgeError as err:  # which function and result, and where a fallback goes
                raise type(err)(
                    f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r}, result leaf "
                    f"{i}, to {to}: {err} (for a bridged call, fallback= goes to bb.bridge(..., fallback=...))"
                ) from err
        return out

    def forward(self, leaves, want_vjp: bool, to: str, borrowed: str | None = None):
        """The callee's results for ``leaves`` as tensors of ``to`` (and its pullback, with ``want_vjp``).
        ``borrowed``: the framework whose immutable buffers the leaves are, whatever type they come as (what
        a jax pure_callback hands its callback, jax arrays in the jax versions tested): a callee's write into
        any is our error. None: the leaves' own types say (a callback's own copies are its business)."""
        if not self.flushed and fpenv.flushes():  # on a runtime's thread that flushes subnormals
            with fpenv.keeping():
                return self._forward(leaves, want_vjp, to, borrowed)
        return self._forward(leaves, want_vjp, to, borrowed)

    def _forward(self, leaves, want_vjp: bool, to: str, borrowed: str | None = None):
        callee_leaves = self._inputs(leaves)
        callee = registry.get(self.callee)
        hooks = registry.hooks(self.callee, BridgeHooks)
        # inputs are views of the caller's tensors: a callee writing into one that views immutable
        # memory (a torch callee's x.add_(1) on a jax array) changes the caller's array. Where the
        # callee's framework can see writes (Adapter.watch_writes) that is our error, not silence
        watched = None if self.copy_inputs else hooks.watch_writes(callee_leaves)
        try:
            if want_vjp and any(self.diff):
                out_leaves, pullback = hooks.vjp(self._flat_fn, callee_leaves, self.diff)
            else:
                out_leaves, pullback = self._flat_fn(*callee_leaves), None
        except Exception as err:
            if watched is not None and (bad := self._written(hooks, watched, leaves, borrowed)):
                err.add_note(str(bad))  # the callee's own error first, and what it did before it
            raise
        if watched is not None and (bad := self._written(hooks, watched, leaves, borrowed)):
            raise bad
        caller = registry.get(to)
        kept: list[int] = []
        # results the callee keeps (Adapter.kept), where one side writes in place and the other takes
        # them as immutable; copied on the mutable side, whose copy is the cheap one (torch's, not a tf
        # op's). A caller whose results are read-only (numpy's, from an immutable callee) writes nothing
        if out_leaves and callee.immutable != caller.immutable and not caller.marks_readonly:
            kept = hooks.kept(out_leaves, pullback)
            if kept and not callee.immutable:  # a torch parameter: copied now, before it changes
                out_leaves, kept = self._own(callee, hooks, out_leaves, callee_leaves, kept), []
        outs = self._outputs(out_leaves, to)
        if callee.immutable and outs and not caller.immutable:
            # and an immutable callee's result that is its input (lambda x: x, a reshape) would come back
            # to a mutable caller as a second, writable tensor over the caller's own input, which the
            # caller's framework does not know aliases it (torch: a separate version counter, so
            # autograd's checks miss writes through it)
            # (every result kept, as tensorflow's are: no need to ask which view an input)
            for i in kept if len(kept) == len(outs) else sorted({*kept, *registry.hooks(to, BridgeHooks).aliased(outs, leaves)}):
                outs[i] = caller.copy(outs[i])
        return outs, pullback

    @staticmethod
    def _own(callee: Adapter, hooks: BridgeHooks, out_leaves: list, callee_leaves: list, kept: list[int]) -> list:
        """A mutable callee's results, those it keeps (``kept``, from ``Adapter.kept``: a parameter, a
        view or detach of one) copied: handed across as they are, the next in-place update of the
        parameter would change an immutable caller's array. A view of its own input is the caller's
        memory, which it already had: not copied."""
        mine = set(hooks.aliased(out_leaves, callee_leaves))
        kept = [i for i in kept if i not in mine]
        if not kept:
            return out_leaves
        own = list(out_leaves)  # a new list: a pullback may hold the callee's, which it differentiates
        for i in kept:
            own[i] = callee.copy(own[i])
        return own

    def _written(self, hooks: BridgeHooks, watched, leaves, borrowed: str | None = None) -> InputWrittenError | None:
        """Our error for the callee's in-place writes into inputs that view the caller's immutable
        or read-only memory (None when there were none: a write into a copy, or into the caller's
        own writable memory, is the callee's business, as it would be natively). ``borrowed``: as
        ``forward``'s."""
        written = hooks.written(watched)
        if not written:
            return None
        bad = list(written) if borrowed else [i for i in written if _views_immutable(leaves[i], self.callee,
                                                                                     self.fallback)]
        if not bad:
            return None
        paths = _leaf_paths(self.skeleton)
        source = borrowed or registry.framework_of(leaves[bad[0]])
        return InputWrittenError(
            f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} wrote in place "
            f"into its input {', '.join(paths[i] for i in bad)}, a zero-copy view of the caller's {source} "
            f"tensor, which {source} treats as immutable or read-only: that memory has ALREADY been changed "
            "(eagerly the caller's tensor and anything sharing its buffer; under jax.jit or tf.function the "
            "buffer the compiled computation handed over, maybe the caller's). Pass copy_inputs=True to "
            "bb.bridge (the callee gets copies), or do not write into inputs in the callee (x = x + 1, not "
            "x.add_(1))")

    def backward(self, pullback, cotangents, to: str, on_grad: str = "warn"):
        """The callee's gradients for ``cotangents`` (``on_grad``: what a cotangent some tape watches
        says, a second order that does not cross: "drop" where the caller refuses that itself)."""
        if pullback is None:
            return [None] * len(self.diff)
        if not self.flushed and fpenv.flushes():  # (as forward)
            with fpenv.keeping():
                return self._backward(pullback, cotangents, to, on_grad)
        return self._backward(pullback, cotangents, to, on_grad)

    def _backward(self, pullback, cotangents, to: str, on_grad: str):
        callee, fallback = self.callee, self.fallback
        cts = [None if c is None else _one(c, callee, None, fallback, False, "allow", on_grad) for c in cotangents]
        grads = pullback(cts)
        return [None if g is None else _one(g, to, None, fallback, False, "allow", "drop") for g in grads]

    def recompute_backward(self, leaves, cotangents, to: str, on_grad: str = "warn", borrowed: str | None = None):
        _, pullback = self.forward(leaves, True, to, borrowed)
        return self.backward(pullback, cotangents, to, on_grad)

    def specs(self, leaves, shapes_dtypes: Callable[[Any], tuple]) -> list:
        """The output leaves' (shape, dtype name), found by one call on zeros of the inputs'
        shapes and dtypes (for callers that must declare results before running: jax under
        transformations, tensorflow graphs)."""
        if self.out_specs is None:
            inputs = [shapes_dtypes(x) for x in leaves]
            try:
                specs = self._specs_at(inputs, np.zeros)
            except Bf16BridgeError:
                raise  # ours name what is wrong, which is no matter of zeros
            except Exception as err:
                err.add_note(
                    f"(bf16bridge: the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} "
                    "is being traced, and a traced caller declares its results before it runs: they are found by "
                    "this call on zeros of the inputs' shapes and dtypes, which failed. Make the function accept "
                    "zeros, or call it eagerly)")
                raise
            if any(0 in shape for shape, _ in specs) and any(0 not in shape for shape, _ in inputs):
                # an empty result from non-empty inputs may be one whose shape depends on the values
                # (a[a > 0] of zeros), and a computation may run no callback whose results are all
                # empty: the shape is asked again on ones, and differs only where it depends on them
                self._check_fixed(specs, inputs)
            self.out_specs = specs
        assert self.out_specs is not None
        if self.caller is not None:
            self._check_held(self.out_specs)
        return self.out_specs

    def _specs_at(self, inputs: list, fill: Callable) -> list:
        """The output leaves' (shape, dtype name) for inputs of ``inputs``' (shape, dtype name),
        filled by ``fill`` (np.zeros, np.ones)."""
        outs, _ = self.forward([fill(shape, dtypes.numpy_dtype(dtype)) for shape, dtype in inputs], False, "numpy")
        return [registry.get("numpy").shape_dtype(y) for y in outs]

    def _check_fixed(self, specs: list, inputs: list) -> None:
        try:
            again = self._specs_at(inputs, np.ones)
        except Bf16BridgeError:
            raise  # ours: a non-tensor result that differs on ones is a value-dependence too (_check_declared)
        except Exception:  # noqa: BLE001 - a function that refuses ones says nothing about its shapes
            return
        if again != specs:
            i = next(i for i, (a, b) in enumerate(zip(specs, again)) if a != b) if len(again) == len(specs) else 0
            raise self._not_declared(i, again[i] if i < len(again) else None, specs[i], "on ones")

    def check_declared(self, outs, to: str) -> None:
        """Our error where results ``outs`` (tensors of ``to``, from ``forward``) differ in shape or
        dtype from the declared ones: a traced caller would take them as declared (tensorflow keeps the
        declared static shape, jax raises its own "Incorrect output shape")."""
        specs = self.out_specs
        if specs is None:
            return
        shape_dtype = registry.get(to).shape_dtype
        for i, (y, want) in enumerate(zip(outs, specs)):
            got = shape_dtype(y)
            if got != want:
                raise self._not_declared(i, got, want, "here")

    def _not_declared(self, i: int, got, want, where: str) -> UnsupportedTypeError:
        show = _shape_dtype_words
        return UnsupportedTypeError(
            f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returned "
            f"{show(got)} {where} (result leaf {i}), but {show(want)} when its results were declared (a traced "
            f"caller, as {self.caller} is here, declares them before the function runs, by one call on zeros of "
            "the inputs' shapes): a result whose shape depends on the inputs' values cannot cross a traced call. "
            "Call the function eagerly, or return a shape fixed by the inputs' shapes (pad it, or return a mask)")

    def not_batched(self, i: int, got, want) -> UnsupportedTypeError:
        """Our error for a result of another shape or dtype than the batch's, under a vectorized vmap
        method (the callee is handed the whole batch and must return batched results)."""
        show = _shape_dtype_words
        return UnsupportedTypeError(
            f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returned "
            f"{show(got)} under vmap (vmap_method={self.vmap_method!r}, result leaf {i}), where the batch's result "
            f"is {show(want)}: with that method the function is handed the whole batch (a batch dimension on its "
            "inputs) and must return results with the batch dimension jax asks for. Return batched results, or "
            "pass vmap_method='sequential' (one call per batch element)")

    def _check_held(self, specs: list) -> None:
        """Our error for a declared result the caller cannot hold (jax without 64-bit mode and
        an int64 result): eagerly ``convert`` refuses it; declared, the caller's own check would
        (a ValueError of jax's). No fallback applies: what it gives (``auto`` narrows int64 when
        every value fits) depends on values not yet computed when the results are declared."""
        caller = registry.get(self.caller)
        for i, (_, dtype) in enumerate(specs):
            why = caller.cannot_hold(dtype)
            if why is not None:
                raise UnsupportedDtypeError(
                    f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returns "
                    f"{dtype} (result leaf {i}), which {self.caller} cannot hold here: {why}. Under a "
                    f"transformation a result's dtype is declared before the function runs, so no fallback "
                    f"applies: return a dtype {self.caller} holds (cast in the function), or call it eagerly")


class BridgedFunction:
    """A function of one framework, callable with the tensors of any other."""

    #: tf.function's autograph calls an object with this attribute as it is, instead of
    #: rewriting its Python: the bridge has no tensor control flow to convert, and the callee
    #: is foreign code (tensorflow's own marker for that, read with hasattr: nothing imported)
    autograph_info__: frozenset = frozenset()

    def __init__(self, fn, callee: str, *, copy_inputs: bool = False, fallback: Fallback = "error",
                 vmap_method: str | None = None):
        self.fn = fn
        self.callee = registry.resolve(callee)
        self.copy_inputs = copy_inputs
        self.fallback = fallback
        self.vmap_method = vmap_method
        self._specs: dict = {}  # output specs by input signature, for declared-shape callers
        self._memo: dict = {}  # (caller, signature, wanted gradients) -> what the caller's adapter keeps
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r}>"

    def __call__(self, *args, **kwargs):
        # a graph compiler tracing the caller (torch.compile) must not trace the bridge: an
        # imported adapter may hand back this call wrapped to run outside its trace
        for hooks in _compilers():
            run = hooks.outside_compiler(self._call)
            if run is not None:
                return run(args, kwargs)
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict):  # (the arguments as they came: not packed again)
        leaves, skeleton, flat = trees.flatten_call(args, kwargs)
        caller = _caller_of(leaves, self.fn)
        if caller is None or caller == self.callee:
            return self.fn(*args, **kwargs)
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
        # A traced caller (jax under grad or jit, a tf graph) declares the results' shapes before
        # anything runs: they are found by one call on zeros and kept per input signature
        # (the arguments' structure, non-tensor values, each leaf's shape and dtype, and both
        # sides' run-time state: jax's x64 flag decides which results it gives and can hold).
        # An eager call runs the function now and learns its results as it goes: none of this.
        sig = trees.key(skeleton) if traced else None
        if sig is not None:
            # both sides' state: the callee's decides which results it gives (jax's x64 flag), the
            # caller's which it can hold
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


#: ((registry generation, modules imported), the imported adapters that have a graph compiler
#: to step out of): asked on every bridged call, found again when either changes
_COMPILERS: tuple = (None, ())


def _compilers() -> tuple:
    global _COMPILERS
    now = (registry._GENERATION, len(sys.modules))
    if _COMPILERS[0] != now:
        found = (registry.hooks(a.name, BridgeHooks) for a in registry.imported())
        _COMPILERS = (now, tuple(h for h in found if type(h).outside_compiler is not BridgeHooks.outside_compiler))
    return _COMPILERS[1]


def _shape_dtype_words(sd) -> str:
    """A (shape, dtype name) in an error's words; None: nothing."""
    return "nothing" if sd is None else f"{sd[1]} of shape {tuple(sd[0])}"


def _views_immutable(x, callee: str, fallback) -> bool:
    """Whether the callee's conversion of caller leaf ``x`` is a writable view of memory its owner
    treats as immutable or read-only (what ``convert`` warns about: ``Plan.alias``)."""
    try:
        return plan(x, callee, fallback=fallback).alias is not None
    except UnsupportedTypeError:  # a wrapper (a keras.Variable): the tensor it holds crossed
        inner = trees.unwrap(x)
        return inner is not None and _views_immutable(inner, callee, fallback)


def _leaf_paths(skeleton) -> list[str]:
    """Each input leaf's place in a call's (args, kwargs), as an error names it."""
    paths: list[str] = []

    def name(slot, path):
        head = f"argument {path[1]}" if path[0] == 0 else f"keyword argument {path[1]!r}"
        paths.append(head + ("" if len(path) == 2 else trees.where(path[2:])))
        return slot

    trees.map_leaves(name, skeleton)
    return paths


def _short(skeleton) -> str:
    text = repr(skeleton)
    return text if len(text) <= 160 else text[:157] + "..."


def _caller_of(leaves, fn) -> str | None:
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
           vmap_method: str | None = None) -> Callable[[Callable], BridgedFunction]:
    """Declare the framework a function is written in, so tensors of any other can call it.

    ``@bb.bridge("jax")`` over a jax function (jit-compiled or not) makes it callable with
    torch, tensorflow or numpy tensors: they are converted zero-copy where the bridge can,
    the function runs in jax, its results come back in the caller's framework, and the
    caller's autodiff (torch autograd, ``jax.grad``, ``tf.GradientTape``) reaches the
    callee's own vjp. Arguments and results are trees; non-tensor arguments pass through.

    ``copy_inputs=True``: the callee gets copies, for functions that write into their
    inputs (by default inputs are zero-copy views of the caller's tensors).
    ``fallback``: as in ``convert``, for a dtype one side cannot hold.
    ``vmap_method``: a jax caller under ``vmap`` needs one (``"sequential"``, ...; see
    ``jax.pure_callback``); without it, vmap is refused.
    """
    resolved = registry.resolve(framework)

    def wrap(fn: Callable) -> BridgedFunction:
        return BridgedFunction(fn, resolved, copy_inputs=copy_inputs, fallback=fallback, vmap_method=vmap_method)

    return wrap
