"""One call of a bridged function across frameworks: its forward and its backward.

A call:

1. flattens the arguments (``trees.flatten``): the tensor leaves must share one framework, the
   caller's; everything else passes through unchanged;
2. converts each leaf to the callee's framework (zero-copy where the bridge can);
3. runs the function (with the callee's own vjp when a gradient is wanted: ``BridgeHooks.vjp``);
4. converts the result's leaves back to the caller's framework.

How the caller's autodiff takes a foreign backward is the caller's ``BridgeHooks.call_foreign``,
which hands a ``ForeignCall`` around. A backward converts the incoming cotangents to the callee,
runs the callee's pullback and converts the gradients back: each gradient is the callee's own
vector-Jacobian product, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bf16bridge.adapters.hooks import BridgeHooks
from bf16bridge.core import fpenv
from bf16bridge.core import registry
from bf16bridge.core.adapter import Adapter
from bf16bridge.core.convert import OnGrad, convert, convert_into, plan
from bf16bridge.errors import Bf16BridgeError, InputWrittenError, UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.functions import callee as running
from bf16bridge.functions.declared import DeclaredResults
from bf16bridge.functions.paths import input_paths, result_paths
from bf16bridge.functions.writes import input_written, views_immutable
from bf16bridge.trees import walk as trees


class ForeignCall(DeclaredResults):
    """One call of a bridged function, as the caller's adapter sees it.

    ``forward(leaves, want_vjp, to)`` runs the callee on the input leaves (tensors of
    any framework: the caller's, or numpy inside a callback) and returns the
    output leaves as tensors of framework ``to``, with a handle for ``backward``.
    ``backward(handle, cotangents, to)`` returns one gradient per input leaf (None
    where there is none) as tensors of ``to``. ``recompute_backward`` does both for
    callers that cannot keep a Python handle between forward and backward (traced
    graphs): the forward runs again, with the callee's vjp. What a traced caller
    declares before the callee runs is ``DeclaredResults``'s.
    """

    __slots__ = ("fn", "callee", "skeleton", "diff", "copy_inputs", "fallback", "out_skeleton", "vmap_method", "memo",
                 "caller", "flat", "traced", "flushed", "numbers", "compiled")

    def __init__(self, fn, callee, skeleton, diff, copy_inputs, fallback, vmap_method, caller=None, flat=False):
        self.fn = fn
        self.callee = callee
        self.caller = caller  # the framework whose tensors called (None: not known)
        self.skeleton = skeleton  # (args, kwargs) with the tensor leaves taken out
        #: the skeleton is ((SLOT,) * n, {}): the leaves are the positional arguments, as they are
        #: (a traced call's arguments may not have taken flatten_call's fast walk: checked here)
        self.flat = flat or (type(skeleton) is tuple and len(skeleton) == 2 and skeleton[1] == {}
                             and type(skeleton[0]) is tuple and all(s is trees.SLOT for s in skeleton[0]))
        self.diff = diff  # per input leaf: does the caller want its gradient?
        self.copy_inputs = copy_inputs
        self.fallback = fallback
        self.vmap_method = vmap_method
        self.out_skeleton: Any = None  # the result's tree, leaves taken out, once known
        self._declared = None
        self.out_specs = None
        #: what a caller adapter keeps between calls of one signature (input structure, non-tensor
        #: values, leaves' shapes and dtypes, which want gradients); None when it cannot be keyed
        self.memo: dict | None = None
        #: whether the caller is being traced (asked once a call: the caller's hooks read this)
        self.traced = False
        #: whether the calling thread flushes subnormals (fpenv): a callee run later on a runtime's
        #: thread that flushes computes as it would have here
        self.flushed = fpenv.flushes()
        #: the results' Python numbers, as the last run gave them: ((position among the result leaves,
        #: 0-d numpy array), ...) (functions.numbers)
        self.numbers: tuple = ()
        #: the callee compiled for this call's signature (``BridgeHooks.compile``), or None: run as written
        self.compiled: Any = None

    # -- the pieces every caller hook uses -----------------------------------------------
    # convert, every leaf both ways: no warning (the bridge says what crosses), gradients by the bridge
    def _inputs(self, leaves):
        to = self.callee
        out: list = []
        try:
            convert_into(out, leaves, to, True if self.copy_inputs else None, self.fallback, "allow", "drop")
        except Bf16BridgeError as err:  # which argument, and where a fallback goes
            i = len(out)
            raise self._crossing(err, input_paths(self.skeleton)[i], leaves[i], to) from None
        return out

    def _crossing(self, err: Bf16BridgeError, path: str, x, to: str) -> Bf16BridgeError:
        """``err`` (``convert``'s, for leaf ``x`` at ``path`` going to ``to``) saying which function and
        leaf, and, for a dtype ``to`` cannot hold, the fallback that would take it, spelled as a bridge's."""
        way = ""
        if isinstance(err, UnsupportedDtypeError) and self.fallback == "error":
            for fallback in ("auto", "float32", "bits"):
                try:
                    plan(x, to, fallback=fallback)
                except Bf16BridgeError:
                    continue
                way = (f". A bridged call's fallback= goes to the bridge: bb.bridge(\"{self.callee}\", "
                       f"fallback=\"{fallback}\")")
                break
        return type(err)(f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r}, "
                         f"{path} (to {to}): {err}{way}")

    def _flat_fn(self, *callee_leaves):
        out_leaves, aux = running.run(self.fn, self.callee, self.caller, self.skeleton, self.flat, *callee_leaves)
        self._take(aux)
        return out_leaves

    def _take(self, aux: running.Aux) -> None:
        """What a run gave beside its tensors: the result's skeleton (checked against the declared
        one where a traced caller declared it) and its Python numbers."""
        skeleton, self.numbers = aux
        if self.out_skeleton is not None:  # declared (traced): what the caller will be handed
            self._check_declared(skeleton)
        self.out_skeleton = skeleton

    def _outputs(self, out_leaves, to):
        out: list = []
        try:
            return convert_into(out, out_leaves, to, None, self.fallback, "allow", "drop")
        except Bf16BridgeError as err:  # which function and result, and where a fallback goes
            i = len(out)
            at = [j for j in range(len(out_leaves) + len(self.numbers)) if j not in dict(self.numbers)]
            raise self._crossing(err, result_paths(self.out_skeleton)[at[i]], out_leaves[i], to) from None

    def _with_numbers(self, outs: list, to: str) -> list:
        """``outs`` with the results' Python numbers put back at their places, as 0-d tensors of ``to``
        (copies: a compiled callee's numbers are the same arrays every call)."""
        full = list(outs)
        for i, array in self.numbers:
            full.insert(i, convert(array, to, copy=True, on_alias="allow"))
        return full

    def forward(self, leaves, want_vjp: bool, to: str, borrowed: str | None = None):
        """The callee's results for ``leaves`` as tensors of ``to`` (and its pullback, with ``want_vjp``).
        ``borrowed``: the framework whose immutable buffers the leaves are, whatever type they come as (what
        a runtime hands its callback): a callee's write into any is our error. None: the leaves' own types
        say (a callback's own copies are its business)."""
        if not self.flushed and fpenv.flushes():  # on a runtime's thread that flushes subnormals
            with fpenv.keeping():
                return self._forward(leaves, want_vjp, to, borrowed)
        return self._forward(leaves, want_vjp, to, borrowed)

    def _forward(self, leaves, want_vjp: bool, to: str, borrowed: str | None = None):
        callee_leaves = self._inputs(leaves)
        callee = registry.get(self.callee)
        hooks = registry.hooks(self.callee, BridgeHooks)
        # inputs view the caller's tensors: a callee's write into one over immutable memory changes
        # the caller's; where the callee's framework sees writes (watch_writes), that is our error
        watched = None if self.copy_inputs else hooks.watch_writes(callee_leaves)
        vjp = want_vjp and any(self.diff)
        try:
            out_leaves, pullback = self._run(hooks, callee_leaves, vjp)
        except Exception as err:
            if watched is not None and (bad := self._written(hooks, watched, leaves, borrowed)):
                err.add_note(str(bad))  # the callee's own error first, and what it did before it
            why = hooks.traced_value_error(err, self.compiled is not None and not vjp)
            if why is not None:  # the framework's own error, from deep inside its tracer: ours instead
                raise UnsupportedTypeError(
                    f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} {why}") from None
            raise
        if watched is not None and (bad := self._written(hooks, watched, leaves, borrowed)):
            raise bad
        caller = registry.get(to)
        kept: list[int] = []
        # results the callee keeps, where one side writes in place and the other takes them as
        # immutable, are copied on the mutable side; a caller whose results are read-only writes none
        if out_leaves and callee.immutable != caller.immutable and not caller.marks_readonly:
            kept = hooks.kept(out_leaves, pullback)
            if kept and not callee.immutable:  # kept by a mutable callee (a parameter): copied before it changes
                out_leaves, kept = self._own(callee, hooks, out_leaves, callee_leaves, kept), []
        outs = self._outputs(out_leaves, to)
        if callee.immutable and outs and not caller.immutable:
            # a result that is the callee's input would reach a mutable caller as a second writable
            # tensor over its own input, unseen by its autodiff's checks: copied, as kept ones are
            every = len(kept) == len(outs)
            for i in kept if every else sorted({*kept, *registry.hooks(to, BridgeHooks).aliased(outs, leaves)}):
                outs[i] = caller.copy(outs[i])
        if self.numbers:
            outs = self._with_numbers(outs, to)
        return outs, pullback

    def _run(self, hooks: BridgeHooks, callee_leaves: list, vjp: bool) -> tuple[list, Any]:
        """The callee's tensor results (and its pullback, with ``vjp``): compiled where ``compiled`` is set."""
        run = self.compiled
        if run is None:
            if vjp:
                return hooks.vjp(self._flat_fn, callee_leaves, self.diff)
            return self._flat_fn(*callee_leaves), None
        if vjp:
            out_leaves, aux, pullback = run.vjp(callee_leaves)
        else:
            (out_leaves, aux), pullback = run.forward(callee_leaves), None
        self._take(aux)
        return out_leaves, pullback

    @staticmethod
    def _own(callee: Adapter, hooks: BridgeHooks, out_leaves: list, callee_leaves: list, kept: list[int]) -> list:
        """A mutable callee's results, those it keeps (``kept``, from ``BridgeHooks.kept``: a parameter,
        a view or detach of one) copied: handed across as they are, the next in-place update of the
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
        bad = list(written) if borrowed else [i for i in written
                                              if views_immutable(leaves[i], self.callee, self.fallback)]
        if not bad:
            return None
        source = borrowed or registry.framework_of(leaves[bad[0]])
        return input_written(self.fn, self.callee, self.skeleton, bad, source)

    def backward(self, pullback, cotangents, to: str, on_grad: OnGrad = "warn"):
        """The callee's gradients for ``cotangents`` (``on_grad``: what a cotangent some tape watches
        says, a second order that does not cross: "drop" where the caller refuses that itself)."""
        if pullback is None:
            return [None] * len(self.diff)
        try:
            if not self.flushed and fpenv.flushes():  # (as forward)
                with fpenv.keeping():
                    return self._backward(pullback, cotangents, to, on_grad)
            return self._backward(pullback, cotangents, to, on_grad)
        except Bf16BridgeError as err:  # raised from the caller's autodiff: our frames end here
            if getattr(err, running.RAISED_IN_CALLEE, False):
                raise
            raise err.with_traceback(None) from None

    def _backward(self, pullback, cotangents, to: str, on_grad: OnGrad):
        callee, fallback = self.callee, self.fallback
        if self.numbers:
            cotangents = self._without_numbers(cotangents)
        grads = _at_one(pullback, cotangents)
        if grads is None:
            cts = [None if c is None else convert(c, callee, fallback=fallback, on_alias="allow", on_grad=on_grad)
                   for c in cotangents]
            grads = pullback(cts)
        return [None if g is None else convert(g, to, fallback=fallback, on_alias="allow", on_grad="drop")
                for g in grads]

    def _without_numbers(self, cotangents: list) -> list:
        """The cotangents of the callee's tensor results: those of its Python numbers dropped, once
        checked to be none or zeros (a number is a constant to the callee: no gradient crosses it)."""
        at = dict(self.numbers)
        for i in at:
            c = cotangents[i]
            if c is not None and np.any(np.asarray(convert(c, "numpy", on_alias="allow", on_grad="drop")) != 0):
                raise UnsupportedTypeError(
                    f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returned a "
                    f"Python number at {result_paths(self.out_skeleton)[i]} (float(), int(), .item() or a constant), "
                    f"and {self.caller or 'the caller'} asks for a gradient through it: a Python number carries "
                    "none (it came back as a 0-d tensor, a constant). Return it as a tensor (x.sum(), not "
                    "x.sum().item()) for its gradient to flow")
        return [c for i, c in enumerate(cotangents) if i not in at]

    def recompute_backward(self, leaves, cotangents, to: str, on_grad: OnGrad = "warn", borrowed: str | None = None):
        """``forward`` with the callee's vjp, then ``backward``: for callers that keep no handle between them."""
        _, pullback = self.forward(leaves, True, to, borrowed)
        return self.backward(pullback, cotangents, to, on_grad)


def _at_one(pullback, cotangents: list) -> list | None:
    """The pullback's gradients computed with the forward for a cotangent of exactly 1 (``at_one``: one
    scalar result), where the one cotangent is that (loss.backward()); None otherwise."""
    ones = getattr(pullback, "at_one", None)
    if ones is None or len(cotangents) != 1 or cotangents[0] is None:
        return None
    # a 0-d tensor on the host (the scalar result's cotangent): read by Python's float(), exactly
    if float(cotangents[0]) != 1.0:
        return None
    # taken once: they reach the caller zero-copy, where its autodiff may accumulate into them in place
    pullback.at_one = None
    return ones
