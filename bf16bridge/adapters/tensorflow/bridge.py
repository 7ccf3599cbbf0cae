"""What ``bb.bridge`` asks of tensorflow (``TensorflowBridge``): which inputs a gradient tape
watches, how a foreign call joins tensorflow's autodiff eagerly (``tf.custom_gradient``) and
inside ``tf.function`` (``tf.py_function``), and tensorflow as the callee (``vjp``, ``kept``).

A gradient of a gradient through a bridged call is refused, not taken as zero: the foreign
backward runs outside tensorflow's autodiff."""

from __future__ import annotations

from bf16bridge.errors import UnsupportedTypeError
from bf16bridge.adapters.hooks import BridgeHooks, second_order_refused
from bf16bridge.adapters.tensorflow import internals
from bf16bridge.adapters.tensorflow.framework import bridge_name, tf, tf_dtype


class TensorflowBridge(BridgeHooks):
    name = "tensorflow"
    differentiates = True

    def kept(self, outs, pullback=None):
        # every result: a tf result can be a new object over a buffer the callee keeps (a captured
        # constant or Variable forwarded, tf.identity(c), a slice of c), and tensorflow tells no buffer's
        # holders; a copy for a caller that writes in place
        return list(range(len(outs)))

    def traced(self, leaves):
        return not tf.executing_eagerly()

    def differentiable_leaves(self, leaves, traced):
        # eagerly with no tape or accumulator active on this thread (one C call): none is wanted
        if not traced and internals.no_tape():
            return [False] * len(leaves)
        leaves = _read(leaves)  # (a Variable read once, for both questions)
        if internals.has_tangents(leaves):
            raise UnsupportedTypeError(
                "a bridged function called with a tensor that a tf.autodiff.ForwardAccumulator watches: "
                "forward-mode tangents do not cross to another framework, and would be lost (acc.jvp gave None); "
                "take the gradient in reverse mode (tf.GradientTape) instead")
        if not traced and not _recording(leaves):
            return [False] * len(leaves)
        return [self.differentiable(x) for x in leaves]

    def differentiable(self, x):
        # eagerly, only a tape that watches it wants its gradient; in a graph, any may
        return (x.dtype.is_floating or x.dtype.is_complex) and (not tf.executing_eagerly() or _recording([x]))

    def call_foreign(self, call, leaves):
        # a variable is read here, under the caller's tape, so its gradient flows through the read
        # (an eager tensor, the usual leaf, is no variable: told by its type)
        for x in leaves:
            if type(x) is not internals.EAGER_TENSOR:
                leaves = _read(leaves)
                break
        if not call.traced:
            if not any(call.diff):
                return call.forward(leaves, False, self.name)[0]
            return _eagerly(call, leaves)
        if internals.compiled_by_xla():
            raise UnsupportedTypeError(
                f"a bridged {call.callee} function ({getattr(call.fn, '__qualname__', call.fn)!r}) runs in "
                "Python, which XLA cannot call: not inside tf.function(jit_compile=True) (nor a Keras model compiled with "
                "jit_compile=True); drop jit_compile there, or call the bridged function outside the compiled one")
        return _in_graph(call, leaves)

    def vjp(self, fn, leaves, diff):
        # persistent: a caller may ask the pullback again (torch's retain_graph, two autograd.grad
        # calls), as jax's vjp allows; the tape lives as long as the pullback, which the caller's graph holds
        with tf.GradientTape(persistent=True) as tape:
            for x, d in zip(leaves, diff):
                if d:
                    tape.watch(x)
            outs = fn(*leaves)

        def pullback(cts):
            pairs = [(o, c) for o, c in zip(outs, cts) if c is not None and (o.dtype.is_floating or o.dtype.is_complex)]
            wrt = [x for x, d in zip(leaves, diff) if d]
            grads = iter(tape.gradient([o for o, _ in pairs], wrt, output_gradients=[c for _, c in pairs])
                         if pairs else [None] * len(wrt))
            return [next(grads) if d else None for d in diff]

        return outs, pullback


def _eagerly(call, leaves) -> list:
    """The foreign call as one op of tensorflow's eager autodiff: its backward the callee's."""
    @tf.custom_gradient
    def eager(*xs):
        outs, pullback = call.forward(list(xs), True, "tensorflow")

        def grad(*cts):
            if not tf.executing_eagerly():
                # traced into a graph (tape.jacobian's pfor): there a py_function's gradient is zeros, silently
                raise UnsupportedTypeError(
                    f"the gradient of the bridged {call.callee} function "
                    f"{getattr(call.fn, '__qualname__', call.fn)!r} was traced into a graph, as "
                    "tape.jacobian and tape.batch_jacobian do by default (pfor): pass "
                    "experimental_use_pfor=False to them (the rows one by one, each an eager gradient)")
            return _first_order_only(call, call.backward(pullback, list(cts), "tensorflow"), xs)

        return outs, grad

    return list(eager(*leaves))


def _in_graph(call, leaves) -> list:
    """Inside tf.function: the callee runs when the graph runs, through py_function; results are
    declared first, and the backward recomputes the forward."""
    specs = call.specs(leaves, _static_shape_dtype)
    n = len(leaves)

    @tf.custom_gradient
    def graph(*xs):
        def run(*a):
            got = call.forward(list(a), False, "tensorflow")[0]
            call.check_declared(got, "tensorflow")  # (the graph keeps the declared static shapes)
            return got

        outs = tf.py_function(run, list(xs), Tout=[tf_dtype(d) for _, d in specs])
        for o, (shape, _) in zip(outs, specs):
            o.set_shape(shape)

        def grad(*cts):
            def back(*a):
                # py_function records this body under a tape of its own, which a gradient of the gradient
                # asks: refused there, not zeros, so the cotangents' conversion need not warn of it
                grads = call.recompute_backward(list(a[:n]), list(a[n:]), "tensorflow", "drop")
                return _refused_beyond(call, [tf.zeros_like(x) if g is None else g for x, g in zip(a[:n], grads)],
                                       a)

            gs = tf.py_function(back, [*xs, *cts], Tout=[x.dtype for x in xs])
            return _first_order_only(call, [g if d else None for g, d in zip(gs, call.diff)], xs)

        return outs, grad

    return list(graph(*leaves))


def _refused_beyond(call, grads: list, inputs) -> list:
    """``grads`` as they are, through an op whose own gradient (with respect to any of ``inputs``)
    raises our error: tensorflow's autodiff would take the foreign backward's second-order part as zero."""
    @tf.custom_gradient
    def refuse(*ts):
        def grad(*_):
            raise second_order_refused("tensorflow", call.fn)

        return [tf.identity(t) for t in ts[:len(grads)]], grad

    return list(refuse(*grads, *inputs))


def _first_order_only(call, grads, xs):
    """``grads`` as they are; where a tape records the inputs ``xs`` while they are computed (a
    gradient of this gradient may be asked for), through an op whose gradient raises our error."""
    live = [i for i, g in enumerate(grads) if g is not None]
    if not live or not _recording(list(xs)):
        return grads
    out = list(grads)
    for i, g in zip(live, _refused_beyond(call, [grads[i] for i in live], xs)):
        out[i] = g
    return out


def _recording(leaves) -> bool:
    """Whether a gradient tape watches any of ``leaves`` (no tape: no custom gradient needed); a
    tf.Variable is read under the tape by call_foreign, so what will be read is asked."""
    return internals.records_backprop(_read(leaves))


def _read(leaves) -> list:
    """``leaves`` with each tf.Variable read (tf.identity), as call_foreign reads them under the
    caller's tape: what a tape or an accumulator watches is the read."""
    return [tf.identity(x) if isinstance(x, tf.Variable) else x for x in leaves]


def _static_shape_dtype(x):
    shape = tuple(x.shape)
    if any(d is None for d in shape):
        raise UnsupportedTypeError(
            f"inside tf.function a bridged function needs static shapes; got {x.shape}: give the "
            "tf.function an input_signature with full shapes, or call it eagerly"
        )
    return shape, bridge_name(x.dtype) or x.dtype.name


HOOKS = TensorflowBridge()
