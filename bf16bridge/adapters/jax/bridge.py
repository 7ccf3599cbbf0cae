"""What ``bb.bridge`` asks of jax: which inputs are traced or want gradients, a foreign call run under
jax's transformations (callbacks with a custom vjp), and jax's own vjp for a jax callee."""

from __future__ import annotations

import math
import os
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from bf16bridge.adapters.hooks import BridgeHooks, second_order_refused
from bf16bridge.adapters.jax import internals
from bf16bridge.adapters.jax.callback import HostCall
from bf16bridge.core import dtypes, registry
from bf16bridge.errors import UnsupportedTypeError

_Tracer = internals.Tracer


class JaxBridge(BridgeHooks):
    name = "jax"
    differentiates = True

    def differentiable(self, x):
        # concrete arrays have no transformation watching them; tracers of inexact dtype may
        return isinstance(x, _Tracer) and jnp.issubdtype(x.dtype, jnp.inexact)

    def differentiable_leaves(self, leaves, traced):
        # concrete arrays (an eager call, asked on every one): no question per leaf
        if not traced:
            return [False] * len(leaves)
        return [self.differentiable(x) for x in leaves]

    def traced(self, leaves):
        for x in leaves:  # (a loop: a generator in any() costs more than the question, per call)
            if isinstance(x, _Tracer):
                return True
        return False

    def call_foreign(self, call, leaves):
        if not call.traced:
            return call.forward(leaves, False, self.name)[0]
        # Under a transformation the callee runs in a callback when jax runs the computation: results
        # are declared first, and the backward recomputes the forward (a callback cannot hand a Python
        # object to the next one). The function is built once per signature and kept (call.memo): jax
        # caches a callback's compiled computation by the callback's identity
        f = call.memo.get("jax") if call.memo is not None else None
        if f is None:
            f = foreign_fn(call, leaves, registry.get(self.name).shape_dtype)
            if call.memo is not None:
                call.memo["jax"] = f
        return list(f(*leaves))

    def vjp(self, fn, leaves, diff):
        wanted = [i for i, d in enumerate(diff) if d]

        def g(*chosen):
            full = list(leaves)
            for i, v in zip(wanted, chosen):
                full[i] = v
            return fn(*full)

        outs, vjp_fn = jax.vjp(g, *[leaves[i] for i in wanted])

        def pullback(cts):
            grads = iter(vjp_fn(_zeros_for_none(outs, cts)))
            return [next(grads) if d else None for d in diff]

        # for BridgeHooks.kept: what jax keeps for the backward (exp(x)'s result) is not counted
        pullback.residuals = internals.pullback_residuals(vjp_fn)  # type: ignore[attr-defined]
        return outs, pullback

    compiles = True

    def compile(self, fn, diff):
        return Compiled(fn, diff)

    def traced_value_error(self, err, compiled):
        if not isinstance(err, _TRACED_VALUE_ERRORS):
            return None
        line = _callee_line(err)
        said = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if compiled:
            how = ("bb.bridge(\"jax\") compiles the function with jax.jit (by default), where its inputs are "
                   "traced values: keep values in jax (return jnp.sum(x), not float(jnp.sum(x)) or x.item(); "
                   "jnp.where or jax.lax.cond, not Python's if, on a value), or pass bb.bridge(\"jax\", jit=False) "
                   "to run it as written")
        else:
            how = ("with a gradient wanted it runs under jax.vjp, where its inputs are traced values, as under "
                   "jax.grad: keep values in jax (return jnp.sum(x), not float(jnp.sum(x)) or x.item(); jnp.where "
                   "or jax.lax.cond, not Python's if, on a value)")
        return f"used a traced value as a Python value{line} (jax: {type(err).__name__}: {said}): {how}"


def foreign_fn(call, leaves, shape_dtype):
    """A jax function of the input leaves that runs ``call`` in callbacks, with its vjp."""
    out_avals = _declared(call, leaves, shape_dtype)
    in_avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    wanted = [i for i, d in enumerate(call.diff) if d]
    inexact = [i for i, a in enumerate(out_avals) if jnp.issubdtype(a.dtype, jnp.inexact)]
    fwd_cb, bwd_cb = _callbacks(call, len(leaves), wanted, inexact, len(out_avals))
    forward = HostCall(call, call.vmap_method, fwd_cb, out_avals, in_avals)
    # under expand_dims (and legacy_vectorized) an input vmap does not batch comes in with a size-1
    # batch dimension, and so must its gradient: broadcast, every gradient is the batch's, which vmap's
    # own transpose then sums for unbatched inputs
    backward = HostCall(call, "broadcast_all" if call.vmap_method in ("expand_dims", "legacy_vectorized")
                        else call.vmap_method, bwd_cb, [in_avals[i] for i in wanted], in_avals + out_avals)
    return _with_vjp(call, forward, backward, len(leaves), wanted, inexact)


def _declared(call, leaves, shape_dtype) -> list:
    """The results' shapes and dtypes as jax avals, declared before the callee runs."""
    out_avals = [jax.ShapeDtypeStruct(s, dtypes.numpy_dtype(d)) for s, d in call.specs(leaves, shape_dtype)]
    if not any(math.prod(a.shape) for a in out_avals) and any(math.prod(x.shape) for x in leaves):
        # jax runs no callback whose results are all empty (or none): the function would never run
        name = getattr(call.fn, '__qualname__', call.fn)
        what = (f"returns no tensor (its result: {_short(call.out_skeleton)})" if not out_avals else
                "gives no tensor result with any element")
        raise UnsupportedTypeError(
            f"the bridged {call.callee} function {name!r} {what} when its results are declared (on zeros of the "
            "inputs' shapes, and on ones), and under a jax transformation jax then never runs it: neither the "
            "function (its side effects) nor a check of its results would run. Call it eagerly, or return a "
            "non-empty tensor too (a Python number counts: it comes back as a 0-d array)")
    return out_avals


def _short(skeleton) -> str:
    text = repr(skeleton)
    return text if len(text) <= 80 else text[:77] + "..."


def _callbacks(call, n: int, wanted: list, inexact: list, n_out: int):
    """The forward's and the backward's callback. Each takes its inputs as tensors of ``to`` and gives
    its results as them (numpy on the host, the callee's own on a device whose buffers it takes);
    ``borrowed``: "jax" where the inputs view jax's buffers, None where they are the callback's own."""
    unbatched = call.vmap_method in (None, "sequential")  # results batched by vmap are jax's to check

    def fwd_cb(to, borrowed, *xs):
        outs = call.forward(list(xs), False, to, borrowed)[0]
        if unbatched:
            call.check_declared(outs, to)
        return outs

    def bwd_cb(to, borrowed, *a):
        # a gradient jax wants that the callee has not: zeros of the input as it came (batched under
        # vmap), or None on a device, where the writer zeroes jax's buffer
        given = dict(zip(inexact, a[n:]))
        grads = call.recompute_backward(list(a[:n]), [given.get(i) for i in range(n_out)], to, borrowed=borrowed)
        return [grads[i] if grads[i] is not None else np.zeros(np.shape(a[i]), np.dtype(a[i].dtype))
                if to == "numpy" else None for i in wanted]

    return fwd_cb, bwd_cb


def _with_vjp(call, forward, backward, n: int, wanted: list, inexact: list):
    """``forward`` as a jax function whose vjp runs ``backward``; differentiating that backward
    again raises our error (jax's own says only that a pure_callback has no JVP)."""
    @jax.custom_vjp
    def f(*xs):
        return forward(*xs)

    def f_fwd(*xs):
        return f(*xs), xs

    @jax.custom_jvp
    def bwd(*a):
        return tuple(backward(*a))

    @bwd.defjvp
    def bwd_jvp(primals, tangents):
        raise second_order_refused("jax", call.fn)

    def f_bwd(xs, cts):
        got = bwd(*xs, *[cts[i] for i in inexact]) if wanted else []
        full: list = [None] * n
        for i, g in zip(wanted, got):
            full[i] = g
        return tuple(full)

    f.defvjp(f_fwd, f_bwd)
    return f


class Compiled:
    """A bridged jax function's forward and its vjp, each a ``jax.jit`` (``JaxBridge.compile``): traced once
    per input shapes and dtypes, and the pullback's application compiled too. ``aux`` (what ``fn`` gives
    beside its tensors) is kept from the trace, by the inputs' shapes and dtypes."""

    def __init__(self, fn, diff):
        self.diff = list(diff)
        self.aux: dict = {}
        wanted = [i for i, d in enumerate(diff) if d]

        def forward(*xs):
            outs, self.aux[_avals(xs)] = fn(*xs)
            return outs

        def with_vjp(*xs):
            def chosen_only(*chosen):
                full = list(xs)
                for i, v in zip(wanted, chosen):
                    full[i] = v
                outs, self.aux[_avals(xs)] = fn(*full)
                return outs

            outs, vjp_fn = jax.vjp(chosen_only, *[xs[i] for i in wanted])
            # one scalar result (a loss): its gradients for a cotangent of one, in this same program, for
            # the backward a caller's loss.backward() asks (no second program, no cotangent to import)
            scalar = len(outs) == 1 and outs[0].shape == () and jnp.issubdtype(outs[0].dtype, jnp.inexact)
            return outs, vjp_fn, vjp_fn([jnp.ones_like(outs[0])]) if scalar else None

        self._forward = jax.jit(forward)
        self._vjp = jax.jit(with_vjp)
        self._apply = jax.jit(_apply)

    def forward(self, leaves):
        outs = self._forward(*leaves)
        return outs, self.aux[_avals(leaves)]  # (set by the trace: jax traces whenever these are new)

    def vjp(self, leaves):
        outs, vjp_fn, at_one = self._vjp(*leaves)
        diff, apply = self.diff, self._apply

        def pullback(cts):
            grads = iter(apply(vjp_fn, _zeros_for_none(outs, cts)))
            return [next(grads) if d else None for d in diff]

        # for BridgeHooks.kept: what jax keeps for the backward (exp(x)'s result) is not counted
        pullback.residuals = internals.pullback_residuals(vjp_fn)  # type: ignore[attr-defined]
        # on the host, where a caller's cotangent is read at no cost (on a device, reading it would wait)
        if at_one is not None and _on_host(outs[0]):
            ones = iter(at_one)
            pullback.at_one = [next(ones) if d else None for d in diff]  # type: ignore[attr-defined]
        return outs, self.aux[_avals(leaves)], pullback


def _on_host(x) -> bool:
    return all(d.platform == "cpu" for d in x.devices())


def _apply(vjp_fn, cts):
    return vjp_fn(cts)


def _avals(xs) -> tuple:
    return tuple((x.shape, x.dtype) for x in xs)


def _zeros_for_none(outs, cts) -> list:
    """The cotangents, zeros where there is none (jax's vjp takes no None): float0 for an integer output."""
    return [c if c is not None else
            (jnp.zeros_like(o) if jnp.issubdtype(o.dtype, jnp.inexact) else np.zeros(o.shape, jax.dtypes.float0))
            for o, c in zip(outs, cts)]


#: jax's errors for a traced value used where a Python one is needed (float(x), if x > 0, np.asarray(x), x[x > 0]),
#: those this jax has
_TRACED_VALUE_ERRORS = tuple(getattr(jax.errors, n) for n in (
    "ConcretizationTypeError", "TracerIntegerConversionError", "TracerArrayConversionError",
    "NonConcreteBooleanIndexError") if hasattr(jax.errors, n))
#: the folders of bf16bridge and of jax: a frame in neither is the user's
_OURS = (os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep,
         os.path.dirname(os.path.abspath(jax.__file__)) + os.sep)


def _callee_line(err: BaseException) -> str:
    """The innermost frame of ``err`` outside jax and bf16bridge (the callee's line that used the traced
    value) as " at file:line (code)"; "" where there is none."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_OURS) and "jaxlib" not in path.split(os.sep):
            return f" at {frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    return ""


HOOKS = JaxBridge()
