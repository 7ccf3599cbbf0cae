"""A bridged callee that writes in place into its inputs: every caller x callee pair where a write
can happen. Where the callee's input is a zero-copy view of memory the caller treats as immutable
or read-only, the write is our InputWrittenError (naming the argument, saying the memory has
already changed); where it is a copy or the caller's own writable memory, it is the callee's
business, as natively."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
import weakref

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, bits, make, ptr

WRITES = {
    "add_": lambda x: x.add_(1),
    "setitem": lambda x: x.__setitem__(0, 0),
    "view": lambda x: x[::2].mul_(2),  # through a view: it shares the version counter
    "out=": lambda x: __import__("torch").add(x, 1, out=x),
    "copy_": lambda x: x.copy_(x * 3),
}


def _data():
    return np.arange(1, 7, dtype=np.float32).astype(BF16).reshape(2, 3)


def _caller(kind):
    """A caller's tensor holding _data(), and what reads its memory back as numpy bits."""
    a = _data()
    if kind == "numpy-readonly":
        a = make("numpy", a)
        a.setflags(write=False)
        return a, lambda: bits(a)
    if kind == "tf-variable":
        import tensorflow as tf

        v = tf.Variable(make("tensorflow", a))
        return v, lambda: bits(v.read_value())
    x = make(kind, a)
    return x, lambda: bits(x)


def _run(kind, fn, x):
    """Call bridged ``fn`` the way ``kind`` calls: eagerly, or inside jax.jit / tf.function."""
    if kind == "jax-jit":
        import jax

        return jax.jit(fn)(x)
    if kind == "tf-function":
        import tensorflow as tf

        return tf.function(fn)(x)
    return fn(x)


# (caller, how it calls, callee): our error expected?, the caller's memory changed afterwards?
# (None: not asserted; under jit the callback's buffer is jax's, whether it is the caller's is jax's)
TABLE = [
    ("jax", "eager", "torch", True, True),
    # on the CPU with buffer_callback the callee's inputs are copies of jax's buffers (valid only during
    # the callback): a write into one is the callee's business; with pure_callback (jax 0.4.30), a view
    # of the array jax hands it, which jax takes as immutable: ours
    ("jax", "jax-jit", "torch", "unless buffer_callback", False),
    ("tensorflow", "eager", "torch", True, True),
    ("tensorflow", "tf-function", "torch", True, True),
    ("tf-variable", "eager", "torch", True, True),
    ("numpy", "eager", "torch", False, True),  # the caller's own writable memory: native
    ("numpy-readonly", "eager", "torch", False, False),  # read-only numpy crosses into torch as a copy
    ("torch", "eager", "numpy", False, True),  # numpy over torch's memory: both mutable, native
]


def _raises_ours(how):
    """What our error looks like from where it was raised: itself eagerly; inside a compiled
    computation, that framework's runtime error carrying our message."""
    if how == "eager":
        return pytest.raises(bb.InputWrittenError, match=r"ALREADY been changed.*copy_inputs=True")
    return pytest.raises(Exception, match=r"InputWrittenError.*wrote in place into its input args\[0\]")


@pytest.mark.parametrize(("caller", "how", "callee", "error", "changed"), TABLE,
                         ids=[f"{c}-{h}->{e}" for c, h, e, _, _ in TABLE])
def test_a_callee_writing_its_input(caller, how, callee, error, changed):
    x, read = _caller(caller)
    before = read().copy()

    def write(y):
        y[0, 0] = 9  # numpy's and torch's spelling alike
        return y * 1

    fn = bb.bridge(callee)(write)
    if error == "unless buffer_callback":
        from bf16bridge.adapters.jax import probe as jax_probe

        error = not jax_probe.buffers_here("cpu")
    if error:
        with _raises_ours(how):
            _run(how, fn, x)
    else:
        _run(how, fn, x)
    if changed is not None:
        assert (not np.array_equal(read(), before)) == changed


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_every_torch_in_place_write_into_an_immutable_callers_tensor_is_ours(caller, write):
    x = make(caller, _data())
    before = bits(x).copy()

    @bb.bridge("torch")
    def f(a, rest):
        WRITES[write](rest["w"][1])
        return a + 1

    with pytest.raises(bb.InputWrittenError, match=r"input args\[1\]\['w'\]\[1\], a zero-copy view of the "
                       rf"caller's {caller} tensor"):
        f(x, {"w": [x, make(caller, _data())]})
    assert np.array_equal(bits(x), before)  # args[0] is not the one written


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_keyword_argument_written_is_named(caller):
    fn = bb.bridge("torch")(lambda x, *, scale: scale.mul_(2) * x)
    with pytest.raises(bb.InputWrittenError, match=r"input kwargs\['scale'\], a zero-copy view"):
        fn(make(caller, _data()), scale=make(caller, _data()))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_copied_inputs_may_be_written(caller):
    x = make(caller, _data())
    before = bits(x).copy()
    got = bb.bridge("torch", copy_inputs=True)(lambda y: y.add_(1))(x)
    assert np.array_equal(bits(x), before)
    assert np.array_equal(bits(got), bits(make(caller, (_data().astype(np.float32) + 1).astype(BF16))))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_call_under_inference_mode_runs_with_its_inputs_unwatched(caller):
    """Under torch.inference_mode() the callee's inputs are inference tensors, whose version counter
    cannot be read (it raises): the call runs all the same, those inputs unwatched (docs/functions.md)."""
    import torch

    x = make(caller, _data())
    fn = bb.bridge("torch")(lambda a, b: a * 2 + b)
    with torch.inference_mode():
        got = fn(x, x)
    assert np.array_equal(bits(got), bits(make(caller, (_data().astype(np.float32) * 3).astype(BF16))))


@pytest.mark.frameworks("torch")
def test_reading_an_input_is_not_a_write():
    fn = bb.bridge("torch")(lambda x: (x * 2, x.view(-1), x.t().contiguous(), x.clone().add_(1)))
    fn(make("jax", _data()))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_the_callees_own_error_keeps_its_type_and_says_what_it_wrote(caller):
    def f(x):
        x.add_(1)
        raise KeyError("the callee's own")

    with pytest.raises(KeyError, match="the callee's own") as info:
        bb.bridge("torch")(f)(make(caller, _data()))
    assert any("wrote in place into its input args[0]" in n for n in info.value.__notes__)


@pytest.mark.parametrize(("caller", "how"), [("jax", "eager"), ("jax", "jax-jit"), ("tensorflow", "eager"),
                                           ("tensorflow", "tf-function")])
def test_a_numpy_callee_cannot_write_an_immutable_callers_tensor(caller, how):
    """numpy gets a read-only view: numpy's own error, nothing changed (nothing for us to add); under
    jax.jit too, where the callback's view is of jax's own buffer (buffer_callback: the caller's array),
    which a writable view let the callee change silently."""
    x = make(caller, _data())
    before = bits(x).copy()
    with pytest.raises(Exception, match="read-only") as info:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bb.Bf16BridgeWarning)  # (numpy has no autodiff: jax's inputs)
            jax_or_tf_result = _run(how, bb.bridge("numpy")(lambda y: y.__setitem__(0, 0) or y * 1), x)
            bits(jax_or_tf_result)
    assert info.type is ValueError or how != "eager"
    assert np.array_equal(bits(x), before)


# -- outputs that are (views of) the callee's inputs ---------------------------------------------

def _passthrough(callee, how):
    """A callee function returning its input, or a no-copy view of it, in the callee's own API."""
    if callee == "jax":
        import jax.numpy as jnp

        return {"identity": lambda x: x, "asarray": jnp.asarray, "reshape": lambda x: x.reshape(x.shape)}[how]
    if callee == "tensorflow":
        import tensorflow as tf

        return {"identity": lambda x: x, "asarray": tf.identity, "reshape": lambda x: tf.reshape(x, [-1])}[how]
    return {"identity": lambda x: x, "asarray": lambda x: x.view(x.dtype), "reshape": lambda x: x.reshape(-1)}[how]


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("how", ["identity", "asarray", "reshape"])
@pytest.mark.parametrize("callee", ["jax", "tensorflow"])
def test_an_immutable_callees_result_that_is_its_input_comes_to_torch_as_a_fresh_tensor(callee, how):
    """jax and tensorflow results are values: handed back to torch as a writable view of the caller's
    own input (a separate tensor, with its own version counter), a write into the result changed the
    input behind torch's back (and behind autograd's checks on anything that saved it)."""
    import torch

    x = make("torch", _data())
    before = bits(x).copy()
    y = bb.bridge(callee)(_passthrough(callee, how))(x)
    assert np.array_equal(bits(y).reshape(before.shape), before)
    y.add_(1)
    assert np.array_equal(bits(x), before)
    w = make("torch", _data()).requires_grad_()
    z = w * w  # saves w for its backward
    bb.bridge(callee)(_passthrough(callee, how))(w).detach().mul_(0)
    (gw,) = torch.autograd.grad(z.sum(), w)
    assert np.array_equal(bits(gw), bits(w.detach() * 2))


@pytest.mark.parametrize("how", ["identity", "asarray", "reshape"])
@pytest.mark.parametrize(("caller", "callee"), [("numpy", "torch"), ("torch", "numpy")])
def test_between_mutable_frameworks_a_result_that_is_an_input_stays_a_view(caller, callee, how):
    """torch and numpy return views natively: the caller gets one (as bridged torch or numpy code
    expects), no copy."""
    x = make(caller, _data())
    y = bb.bridge(callee)(_passthrough(callee, how))(x)
    y[...] = 0
    assert not bits(x).any()


# -- results the callee keeps: a captured constant, a parameter ----------------------------------

def _kept(callee, how, w):
    """A callee function returning ``w`` (a tensor it keeps: a captured constant, a parameter), or a
    no-copy view of it, whatever its input."""
    if how == "itself":
        return lambda x: w
    if callee == "torch":
        return {"detach": lambda x: w.detach(), "view": lambda x: w[:1]}[how]
    return {"twice": lambda x: (w, w)}[how]


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("callee", ["jax", "tensorflow"])
def test_a_constant_an_immutable_callee_returns_comes_to_torch_as_a_fresh_tensor(callee, grad):
    """A jax or tensorflow function returning an array it captured handed torch a writable view of
    that array: a write into the result changed the callee's constant (every later call saw it)."""
    w = make(callee, _data())
    before = bits(w).copy()
    x = make("torch", _data()).requires_grad_(grad)
    for how in ("itself", "twice"):
        out = bb.bridge(callee)(_kept(callee, how, w))(x)
        for y in (out if isinstance(out, tuple) else (out,)):
            assert np.array_equal(bits(y), before)
            y.detach().add_(1)
        assert np.array_equal(bits(w), before), how


def _factory(callee):
    """Callees each closing over a constant of its own as the one other holder of it (review: a count
    off by one was unguarded: every kept object in the tests had several holders)."""
    def closing(c):
        return lambda x: c

    def identity(c):
        return lambda x: tf.identity(c)

    if callee == "tensorflow":
        import tensorflow as tf

        return {"closure": closing(make(callee, _data())), "tf.function": tf.function(closing(make(callee, _data()))),
                "tf.identity": identity(make(callee, _data()))}
    import jax

    return {"closure": closing(make(callee, _data())), "jit": jax.jit(closing(make(callee, _data())))}


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("callee", ["jax", "tensorflow"])
def test_a_constant_held_once_elsewhere_or_forwarded_by_a_compiled_callee_is_copied(callee):
    """A constant only a closure holds, and a tensorflow result that is a new object over a kept buffer
    (a tf.function forwarding its captured constant, tf.identity): a torch caller's write changed them."""
    x = make("torch", _data())
    before = _data().view(np.uint16).copy()
    for how, fn in _factory(callee).items():  # (the closure's cell alone holds its constant)
        y = bb.bridge(callee)(fn)(x)
        y.add_(1)
        del y
        again = bb.bridge(callee)(fn)(x)  # what the callee hands out next time
        assert np.array_equal(bits(again), before), how


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_memory_a_torch_callee_did_not_allocate_comes_to_an_immutable_caller_as_its_own(caller):
    """torch.from_numpy of the callee's own array: one tensor on its storage (use count 1), but numpy
    owns it and the callee may write it later (review: the caller's array changed with it)."""
    state = make("numpy", _data()).view(np.uint16)  # 64-byte aligned: the caller's import takes it as it is
    import torch

    y = bb.bridge("torch")(lambda x: torch.from_numpy(state))(make(caller, _data()))
    want = state.copy()
    state += 100
    assert np.array_equal(bits(y), want)


@pytest.mark.parametrize("callee", ["jax", "tensorflow"])
def test_a_numpy_caller_gets_a_kept_constant_read_only_without_a_copy(callee):
    """numpy holds an immutable callee's results read-only: nothing can write them, so a kept one is
    not copied (review: a needless copy). (jit=False: jax.jit hands back a buffer of its own, not the constant.)"""
    w = make(callee, _data())
    y = bb.bridge(callee, jit=False)(lambda x: w)(_data())
    assert not y.flags.writeable and np.array_equal(bits(y), bits(w))
    if callee == "jax":  # (jax to numpy is zero-copy on the host; tensorflow's .numpy() may copy)
        assert y.ctypes.data == w.unsafe_buffer_pointer()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("how", ["itself", "detach", "view"])
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_parameter_a_torch_callee_returns_comes_to_an_immutable_caller_as_its_own(caller, how):
    """A torch function returning a tensor it keeps (a parameter, a buffer, a view of one) handed jax
    or tensorflow an array over that tensor's memory: the next in-place update of the parameter (an
    optimizer step) changed the caller's immutable array."""
    import torch

    p = torch.nn.Parameter(make("torch", _data()))
    before = bits(p).copy()
    y = bb.bridge("torch")(_kept("torch", how, p))(make(caller, _data()))
    with torch.no_grad():
        p.add_(1)
    want = before[:1] if how == "view" else before
    assert np.array_equal(bits(y), want)


@pytest.mark.parametrize(("caller", "callee"), [("torch", "jax"), ("torch", "tensorflow"), ("jax", "torch"),
                                                ("tensorflow", "torch")])
def test_a_fresh_result_still_crosses_without_a_copy(caller, callee):
    """Only what the callee keeps is copied: a result it computed crosses zero-copy, as before; but
    every tensorflow result comes to torch copied (tensorflow tells no buffer's holders, and a new
    result object can be a kept buffer: docs/functions.md says so)."""
    seen = []

    def fn(x):
        y = x * 2
        seen.append(ptr(y))
        return y

    y = bb.bridge(callee, jit=False)(fn)(make(caller, _data()))  # (a compiled callee's y has no pointer to see)
    assert (ptr(y) != seen[0]) if callee == "tensorflow" else (ptr(y) == seen[0])


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("how", ["identity", "reshape"])
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_torch_callees_view_of_its_input_comes_back_to_an_immutable_caller_without_a_copy(caller, how):
    """A view of the input is the caller's own memory, which no one writes (the callee wrote nothing:
    InputWrittenError says so otherwise): it crosses back as it is, not copied as a kept tensor."""
    x = make(caller, _data())
    y = bb.bridge("torch")(_passthrough("torch", how))(x)
    assert ptr(y) == ptr(x)


# -- what the callee keeps, told exactly: a view of an intermediate, a result only the pullback keeps --

_HELD: list = []  # holders that outlive a callee's call (a module's state, a training loop's)


def _torch_results():
    """Callee results as a torch function hands them over (that list their only holder), and which
    of them the callee keeps: memory nothing but the results holds, or memory something else holds too."""
    import torch

    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    p = torch.nn.Parameter(x.clone())

    def held(t):
        _HELD.append(t)
        return t

    def typed(t):  # the TypedStorage (deprecated, and warns so)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return t.storage()

    def saved():  # a base autograd saved for the backward: a holder in C++ only
        y = x.clone().requires_grad_() * 2
        _HELD.append(y * y)
        return [y.reshape(-1)]

    return {
        "reshape of an intermediate": (lambda: [(x * 2).reshape(-1)], []),
        "torch.split of an intermediate": (lambda: list(torch.split(x * 2, 2)), []),
        "some parts of a split (the rest dropped)": (lambda: list(torch.split(x * 2, 1))[:3], []),
        "view of a view of an intermediate": (lambda: [(x * 2).view(24)[4:]], []),
        "einsum's view (its base made in C++)": (lambda: [torch.einsum("ij,jk->ki", x, x.t())], []),
        "view of an intermediate held elsewhere": (lambda: [held(x * 2).reshape(-1)], [0]),
        "view whose sibling view is held elsewhere": (lambda: [(lambda y: (held(y[1:]), y[:1])[1])(x * 2)], [0]),
        "view of an intermediate autograd saved": (saved, [0]),
        "view of an intermediate a weak reference holds": (lambda: [(lambda y: (held(weakref.ref(y)),
                                                                                  y.reshape(-1))[1])(x * 2)], [0]),
        "view of a parameter": (lambda: [p[:1]], [0]),
        "view of a detached parameter": (lambda: [p.detach().reshape(-1)], [0]),
        "views, one of them also held elsewhere": (lambda: (lambda y: [y[:2], held(y[2:])])(x * 2), [0, 1]),
        "an intermediate and its view": (lambda: (lambda y: [y, y.reshape(-1)])(x * 2), [0, 1]),
        "one view returned twice": (lambda: [(x * 2).reshape(-1)] * 2, [0, 1]),
        # handles torch's use counts do not see: its one Python object a storage, weak references
        "view whose storage object is held elsewhere": (lambda: (lambda y: (held(y.untyped_storage()),
                                                                            [y.reshape(-1)])[1])(x * 2), [0]),
        "view whose typed storage is held elsewhere": (lambda: (lambda y: (held(typed(y)),
                                                                           [y.reshape(-1)])[1])(x * 2), [0]),
        "view a weak reference holds": (lambda: (lambda v: (held(weakref.ref(v)), [v])[1])((x * 2).reshape(-1)),
                                        [0]),
        "intermediate whose storage object is held elsewhere": (
            lambda: (lambda y: (held(y.untyped_storage()), [y])[1])(x * 2), [0]),
        "intermediate a weak reference holds": (lambda: (lambda y: (held(weakref.ref(y)), [y])[1])(x * 2), [0]),
        "intermediate whose storage a weak reference holds": (
            lambda: (lambda y: (held(weakref.ref(y.untyped_storage())), [y])[1])(x * 2), [0]),
        "an intermediate alone": (lambda: [x * 2], []),
    }


@pytest.mark.frameworks("torch")
def test_a_torch_callee_keeps_a_view_only_when_something_besides_the_results_holds_its_memory():
    """A view of an intermediate ((x * 2).reshape(...), torch.split at a model's end) shares its storage
    with its base, which only the view keeps alive: the callee keeps nothing, so no copy. Anything else
    holding the base or its storage (Python, autograd's saved tensors in C++, another view) keeps it."""
    from bf16bridge.adapters.hooks import BridgeHooks
    from bf16bridge.core import registry

    adapter = registry.hooks("torch", BridgeHooks)
    for name, (results, want) in _torch_results().items():
        outs = results()
        assert want or name == "an intermediate alone" or all(t._is_view() for t in outs), name
        assert adapter.kept(outs) == want, name
        del outs
    _HELD.clear()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_view_of_a_torch_intermediate_comes_to_an_immutable_caller_without_a_copy(caller):
    """End to end: the views cross zero-copy (the caller's arrays are over the callee's memory), and a
    view of a held intermediate is still the caller's own copy: the holder's write does not reach it."""
    import torch

    seen = []

    def split(x):
        parts = torch.split(x * 2, 4)  # 4 rows of 32 bf16: 256 bytes, every part 64-byte aligned
        seen.extend(p.data_ptr() for p in parts)
        return parts

    data = np.arange(8 * 32, dtype=np.float32).astype(BF16).reshape(8, 32)
    ys = bb.bridge("torch")(split)(make(caller, data))
    assert [ptr(y) for y in ys] == seen
    assert np.array_equal(np.concatenate([bits(y) for y in ys]), bits(make("torch", data) * 2))

    def held(x):
        y = x * 2
        _HELD.append(y)
        return y.reshape(-1)

    y = bb.bridge("torch")(held)(make(caller, data))
    want = bits(y).copy()
    _HELD.pop().add_(1)
    assert np.array_equal(bits(y), want)


@pytest.mark.frameworks("jax")
@pytest.mark.parametrize("fn", ["exp", "jit(exp)"])
def test_a_jax_result_its_own_pullback_keeps_is_not_counted_as_kept(fn):
    """exp(x) under a gradient: jax's residuals hold the result for the backward, so its reference count
    says kept. Those references, and no others, are not counted (Adapter.kept's pullback)."""
    import jax
    import jax.numpy as jnp

    from bf16bridge.adapters.hooks import BridgeHooks
    from bf16bridge.core import registry

    f = {"exp": jnp.exp, "jit(exp)": jax.jit(jnp.exp)}[fn]
    adapter = registry.hooks("jax", BridgeHooks)
    x = jnp.ones((4, 4), jnp.bfloat16)
    outs, pullback = adapter.vjp(lambda x: [f(x)], [x], [True])
    assert adapter.kept(outs) == [0]  # the residual's reference: kept by the count alone
    assert adapter.kept(outs, pullback) == []
    w = jnp.full((4, 4), 2, jnp.bfloat16)  # a captured constant, and a result returned twice: still kept
    outs, pullback = adapter.vjp(lambda x: [f(x) * w, w], [x], [True])
    assert adapter.kept(outs, pullback) == [1]
    outs, pullback = adapter.vjp(lambda x: (lambda y: [y, y])(f(x)), [x], [True])
    assert adapter.kept(outs, pullback) == [0, 1]
    callee = _closing(lambda x, c: [f(x), c])  # (alive, as a bridged function holds its callee)
    outs, pullback = adapter.vjp(callee, [x], [True])
    assert adapter.kept(outs, pullback) == [1]  # one other holder: the closure's cell


def _closing(fn):
    """``fn(x, c)`` with a constant ``c`` that the returned function's closure alone holds."""
    import jax.numpy as jnp

    c = jnp.full((4, 4), 3, jnp.bfloat16)
    return lambda x: fn(x, c)


def test_the_references_a_pullback_holds_are_counted_once_each_and_only_in_its_containers():
    """Adapter.kept's discount: each reference a container (a list, tuple, dict, partial) holds once, a
    container reached twice walked once, and nothing inside other objects (a function's closure): those
    keep the result kept."""
    import functools

    from bf16bridge.adapters.cpython import held_in as _held_in

    o, other = object(), object()
    inner = [o, other]
    root = (inner, inner, {"k": (o,)}, functools.partial(print, o), lambda: o)
    assert _held_in(root, {id(o)}) == {id(o): 3}
    assert _held_in(None, {id(o)}) == {}


@pytest.mark.frameworks("torch", "jax")
def test_a_jax_result_only_its_pullback_keeps_comes_to_torch_zero_copy_and_torch_guards_it(monkeypatch):
    """No copy of exp(x) for a torch caller under a gradient; the gradient is jax's, bit for bit; a write
    into the result before the backward is torch's own error (it saved the result), as natively, not a
    silently wrong gradient from a changed residual."""
    import jax
    import jax.numpy as jnp
    import torch

    from bf16bridge.core import registry

    torch_adapter = type(registry.get("torch"))
    copies = []
    copy = torch_adapter.copy
    monkeypatch.setattr(torch_adapter, "copy", lambda self, t: copies.append(t) or copy(self, t))
    data = (np.arange(8 * 32, dtype=np.float32) / 64).astype(BF16).reshape(8, 32)
    x = make("torch", data).requires_grad_()
    y = bb.bridge("jax")(jnp.exp)(x)
    assert copies == []
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    _, pullback = jax.vjp(jnp.exp, make("jax", data))
    (want,) = pullback(jnp.ones((8, 32), jnp.bfloat16))
    assert np.array_equal(bits(g), bits(want))
    y = bb.bridge("jax")(jnp.exp)(x)
    with torch.no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.frameworks("torch", "tensorflow")
@pytest.mark.parametrize("how", ["row slice", "tf.split", "reshape"])
def test_a_slice_split_or_reshape_of_a_tensorflow_constant_comes_to_torch_as_a_fresh_tensor(how):
    """Eager tensorflow hands out its constant's own buffer (at an offset for a row slice or a split)
    as a new result object: why every tensorflow result is kept (a test of the result's own buffer alone
    would miss the offset ones)."""
    import tensorflow as tf

    c = tf.constant((np.arange(64 * 32, dtype=np.float32) / 8).astype(BF16).reshape(64, 32))
    before = bits(c).copy()
    fn = {"row slice": lambda x: c[16:32], "tf.split": lambda x: tf.split(c, 4)[1],
          "reshape": lambda x: tf.reshape(c, [-1])}[how]
    bridged = bb.bridge("tensorflow")(fn)
    y = bridged(make("torch", _data()))
    assert np.array_equal(bits(y).reshape(-1), bits(fn(None)).reshape(-1))
    y.add_(1)
    assert np.array_equal(bits(c), before)


@pytest.mark.frameworks("torch")
def test_kept_is_calibrated_outside_a_dispatch_mode_the_adapter_is_first_imported_under():
    # a mode that keeps every tensor it sees, active at the adapter's first use, made a lone tensor's
    # counts look held: a callee's kept intermediate and a parameter's detach then read as not kept
    code = textwrap.dedent('''
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from bf16bridge.adapters.hooks import BridgeHooks
        from bf16bridge.core import registry

        class Keep(TorchDispatchMode):
            seen = []
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                self.seen.append(out)
                return out

        first = [torch.ones(4, 6)]
        with Keep():
            adapter = registry.hooks("torch", BridgeHooks)
            adapter.kept(first)  # imported, and calibrated, here
        held, x = [], torch.ones(4, 6)
        y = x * 2
        held.append(y)
        p = torch.nn.Parameter(torch.ones(4, 6))
        print(adapter.kept([y.reshape(-1)]), adapter.kept([p.detach()]), adapter.kept([(x * 2).reshape(-1)]))
    ''')
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[-2] == "[0] [0] []", run.stdout
