"""Bridged functions fuzzed: drawn calls against the same function written natively, and the
awkward calls one by one (static values that compare equal, higher-order gradients, inputs
written after the call, results a traced caller cannot hold, deep trees, exceptions, threads,
narrow dtypes). Each test here failed before the fix it guards, or pins behaviour a fix
relies on; docs/functions.md says what is refused and why."""

from __future__ import annotations

import collections
import dataclasses
import subprocess
import sys
import textwrap
import threading
import traceback

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bf16bridge as bb
import strategies  # noqa: F401  (the derandomized, bounded "ci" profile)
from bf16bridge.errors import UnsupportedDtypeError, UnsupportedTypeError
from conftest import bits, make, type_framework
from bridge_cases import as_bridged_runs, native_vjp

AUTODIFF = ("torch", "jax", "tensorflow")
DIRECTIONS = [(a, b) for a in AUTODIFF for b in AUTODIFF if a != b]
SECOND_ORDER = "a gradient of a gradient through the bridged function"


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 0.75).astype(np.float32).astype(dtype)


def _two_outputs(x, tree, *, s):
    """Written once: *, + and a Python number mean the same in the three frameworks."""
    y = tree["y"][0]
    return {"p": x * y * s, "q": [x + y, "tag"]}


def _pick(out, used):
    return [o for o, u in zip((out["p"], out["q"][0]), used) if u]


def _native_vjp(callee, x, y, s, used, cts):
    """The callee's own vjp of the used outputs at (x, y), cotangents ``cts``: (dx, dy)."""
    return native_vjp(callee, lambda X, Y: _pick(_two_outputs(X, {"y": [Y]}, s=s), used), (x, y), cts)


def _loss(caller, outs, cts):
    """sum(out * ct) over the used outputs: the cotangent reaching each is ct, exactly."""
    if caller == "tensorflow":
        import tensorflow as tf

        return tf.add_n([tf.reduce_sum(tf.cast(o * c, tf.float32)) for o, c in zip(outs, cts)])
    return sum((o * c).sum().float() if caller == "torch" else (o * c).sum().astype(np.float32)
               for o, c in zip(outs, cts))


def _torch_input(a, layout):
    """A torch tensor with the bits of ``a`` laid out as asked (a cached plan must not be reused
    for another layout)."""
    import torch

    t = make("torch", a)
    if layout == "transposed" and t.ndim == 2:
        return make("torch", np.ascontiguousarray(a.T)).t()
    if layout == "strided" and t.ndim >= 1:
        wide = make("torch", np.repeat(a, 2, axis=-1))
        return wide[..., ::2]
    return t.clone(memory_format=torch.contiguous_format)


def _bridged_grads(caller, fn, x, y, s, used, cts, traced, layout):
    C = [make(caller, c) for c in cts]
    if caller == "torch":
        X, Y = _torch_input(x, layout).requires_grad_(), _torch_input(y, layout).requires_grad_()
        _loss("torch", _pick(fn(X, {"y": [Y]}, s=s), used), C).backward()
        return X.grad, Y.grad
    X, Y = make(caller, x), make(caller, y)
    if caller == "jax":
        import jax

        g = jax.grad(lambda X, Y: _loss("jax", _pick(fn(X, {"y": [Y]}, s=s), used), C), argnums=(0, 1))
        return (jax.jit(g) if traced else g)(X, Y)
    import tensorflow as tf

    def step(X, Y):
        with tf.GradientTape() as tape:
            tape.watch([X, Y])
            loss = _loss("tensorflow", _pick(fn(X, {"y": [Y]}, s=s), used), C)
        return tape.gradient(loss, [X, Y])

    return (tf.function(step) if traced else step)(X, Y)


@pytest.mark.frameworks("tensorflow", "torch")
@settings(max_examples=40)
@given(direction=st.sampled_from(DIRECTIONS),
       dtype=st.sampled_from([ml_dtypes.bfloat16, ml_dtypes.bfloat16, np.float32, np.float16]),
       shape=st.sampled_from([(), (0,), (5,), (2, 3), (3, 0)]),
       s=st.sampled_from([0.5, -0.0, 0.0, 2, 1, -3]),
       used=st.sampled_from([(True, True), (True, False), (False, True)]),
       traced=st.booleans(),
       layout=st.sampled_from(["contiguous", "transposed", "strided"]),
       seed=st.integers(0, 2**16))
def test_drawn_calls_give_the_callees_own_forward_and_vjp_bit_for_bit(direction, dtype, shape, s, used, traced,
                                                                       layout, seed):
    """Two outputs (one unused: a None cotangent), a nested argument, a keyword, a static
    number (-0.0 and ints too), 0-d and empty tensors, a torch caller's strided inputs, under
    jit / tf.function or eagerly: forward and gradients are the callee's own, bit for bit."""
    caller, callee = direction
    x, y = _data(shape, dtype, seed), _data(shape, dtype, seed + 1)
    cts = [_data(shape, dtype, seed + 2 + i) for i, u in enumerate(used) if u]
    fn = bb.bridge(callee)(_two_outputs)

    out = fn(make(caller, x), {"y": [make(caller, y)]}, s=s)
    # (jax: compiled, as the bridge runs it, where XLA may round x * y * s once)
    want = as_bridged_runs(callee, lambda X, Y: _pick(_two_outputs(X, {"y": [Y]}, s=s), (True, True)))(
        make(callee, x), make(callee, y))
    assert out["q"][1] == "tag"
    for got, w in zip((out["p"], out["q"][0]), want):
        assert type_framework(got) == caller
        np.testing.assert_array_equal(bits(got), bits(w))

    dx, dy = _bridged_grads(caller, fn, x, y, s, used, cts, traced, layout)
    want_dx, want_dy = _native_vjp(callee, x, y, s, used, cts)
    assert type_framework(dx) == caller and type_framework(dy) == caller
    for got, want in ((dx, want_dx), (dy, want_dy)):
        if all(used):
            np.testing.assert_array_equal(bits(got), bits(want))
        else:  # an unused output's cotangent may arrive as explicit zeros: -0 + 0 is +0 (functions.md)
            _equal_but_for_the_sign_of_zero(got, want)


def _equal_but_for_the_sign_of_zero(got, want):
    g, w = bits(got), bits(want)
    odd = g != w
    sign = np.array(1 << (8 * g.itemsize - 1), g.dtype)
    assert ((g[odd] | sign) == sign).all() and ((w[odd] | sign) == sign).all(), (g, w)


# -- static values: a traced caller keeps what it learned per signature ---------------------------


def _traced(caller, fn):
    if caller == "jax":
        import jax

        return jax.jit(fn)
    import tensorflow as tf

    return tf.function(fn)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
@pytest.mark.parametrize("dtype,first,second", [
    (np.float32, 0.0, -0.0),    # equal, but x * -0.0 flips every sign bit
    (np.int32, 1, 1.0),         # equal, but x * 1.0 is float32 and x * 1 stays int32
], ids=["signed-zero", "int-float"])
def test_static_values_that_compare_equal_are_distinct_signatures(caller, dtype, first, second):
    """A traced caller kept the callee (and its results' dtypes) per signature, and a signature
    took 0.0 == -0.0 and 1 == 1.0 as the same: the second call ran with the first's value."""
    fn = bb.bridge("torch")(lambda x, s: x * s)
    a = np.arange(1, 4).astype(dtype)
    for s in (first, second):
        got = _traced(caller, lambda x: fn(x, s))(make(caller, a))
        want = make("torch", a) * s
        assert bb.dtypes.name_of_numpy(np.asarray(got).dtype) == str(want.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(bits(got), bits(want))


@dataclasses.dataclass(frozen=True)
class _Config:
    x: object
    scale: float


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_static_values_inside_a_dataclass_argument_are_keyed_by_bits_too(caller):
    """A frozen dataclass compares its fields with ==: Config(x, 0.0) == Config(x, -0.0)."""
    fn = bb.bridge("torch")(lambda c: c.x * c.scale)
    a = np.arange(1, 4).astype(np.float32)
    for s in (0.0, -0.0):
        got = _traced(caller, lambda x: fn(_Config(x, s)))(make(caller, a))
        np.testing.assert_array_equal(bits(got), bits(make("torch", a) * s))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_non_tensor_result_computed_from_values_is_refused_when_traced(caller):
    """Under jit / tf.function the results' tree comes from the call on zeros: {"n": "0.0"} came
    back for every input, silently. Now the run that differs raises ours (inside the compiled
    computation: the framework's runtime error carries our message). (A number would come back as a
    0-d tensor, computed each run: a string is what stays in the tree; jit=False: a jax callee that
    reads a value in Python runs as written.)"""
    callee = "torch" if caller == "jax" else "jax"
    fn = bb.bridge(callee, jit=False)(lambda x: {"y": x * 2, "n": f"{float(x.sum())}", "tag": "kept"})
    x = make(caller, np.ones(3, np.float32))
    eager = fn(x)
    assert eager["n"] == "3.0" and eager["tag"] == "kept"
    traced = _traced(caller, lambda x: fn(x)["y"])
    with pytest.raises(Exception, match="must not depend on the inputs' values"):
        traced(x)
    zeros = traced(make(caller, np.zeros(3, np.float32)))  # what was declared: no error
    np.testing.assert_array_equal(bits(zeros), np.zeros(3, np.uint32))


class _Tag:  # compared by identity, as any plain class: a fresh one each run has no value to differ
    pass


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller", ["jax", "tensorflow"])
def test_a_fresh_plain_object_among_the_results_is_not_taken_for_a_changed_value(caller):
    """The declared-results check compared objects by their own ==: a plain object made anew in
    each run (identity equality) differed from the one found on zeros, and the traced call was
    refused although no value had changed."""
    callee = "torch" if caller == "jax" else "jax"
    fn = bb.bridge(callee)(lambda x: (x * 2, _Tag()))
    x = make(caller, np.ones(3, np.float32))
    got = _traced(caller, lambda x: fn(x)[0])(x)
    np.testing.assert_array_equal(bits(got), bits(make(caller, np.full(3, 2, np.float32))))


@pytest.mark.frameworks("tensorflow", "torch")
def test_the_callees_state_is_part_of_a_traced_callers_signature():
    """A jax callee's results depend on jax's x64 flag (jnp.arange: int32, or int64 under x64): a
    tf.function traced with x64 off was reused, stale, after x64 was turned on (tensorflow's
    error: int32 declared, int64 given). Run in a fresh process: x64 is process-wide."""
    code = textwrap.dedent("""
        import tensorflow as tf, jax, jax.numpy as jnp, bf16bridge as bb
        fn = bb.bridge("jax")(lambda x: (x * 2, jnp.arange(3)))
        x = tf.ones(3)
        assert [r.dtype.name for r in tf.function(lambda x: fn(x))(x)] == ["float32", "int32"]
        jax.config.update("jax_enable_x64", True)
        out = tf.function(lambda x: fn(x))(x)
        assert [r.dtype.name for r in out] == ["float32", "int64"], out
        assert out[1].numpy().tolist() == [0, 1, 2]
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]


# -- what is refused, with our error --------------------------------------------------------------


@bb.bridge("jax")
def _jax_cube(x):
    return x ** 3


@bb.bridge("torch")
def _torch_cube(x):
    return x ** 3


@pytest.mark.frameworks("torch")
def test_torch_second_order_is_refused_first_order_under_create_graph_is_kept():
    """torch ran the backward with create_graph=True and got gradients with no graph: a second
    derivative missed the callee's part, silently (6x instead of 12x below)."""
    import torch

    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    g, = torch.autograd.grad((_jax_cube(x) + x ** 3).sum(), x, create_graph=True)
    np.testing.assert_array_equal(bits(g), bits(6 * x.detach() ** 2))  # the first order, whole
    with pytest.raises(UnsupportedTypeError, match=SECOND_ORDER):
        torch.autograd.grad(g.sum(), x)


@pytest.mark.frameworks("torch")
def test_jax_second_order_is_refused_with_our_error():
    import jax
    import jax.numpy as jnp

    x = jnp.asarray([1.0, -2.0, 3.0])
    np.testing.assert_array_equal(bits(jax.grad(lambda x: _torch_cube(x).sum())(x)), bits(3 * x ** 2))
    with pytest.raises(UnsupportedTypeError, match=SECOND_ORDER):
        jax.grad(lambda x: jax.grad(lambda x: _torch_cube(x).sum())(x).sum())(x)


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "tf.function"])
def test_tensorflow_second_order_is_refused_with_our_error(in_function):
    """A nested tape got the callee's part of the second derivative as None: 6x instead of 12x."""
    import tensorflow as tf

    def second(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(_jax_cube(x)) + tf.reduce_sum(x ** 3)
            g = inner.gradient(y, x)
        return g, outer.gradient(g, x)

    run = tf.function(second) if in_function else second
    # inside tf.function too: autograph re-raises ours as ours (tests/core/test_errors.py)
    with pytest.raises(UnsupportedTypeError, match=SECOND_ORDER):
        run(tf.constant([1.0, -2.0, 3.0]))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("transform", ["grad", "vmap", "jacrev", "vjp"])
def test_torch_func_transforms_are_refused_with_our_error(transform):
    """torch.func hands its own wrapper tensors: torch said "must override the setup_context
    staticmethod" (grad, jacrev) or "Cannot access data pointer of Tensor" (vmap)."""
    import torch

    fn = bb.bridge("jax")(lambda x: x * x)
    run = {"grad": torch.func.grad(lambda x: fn(x).sum()), "vmap": torch.func.vmap(fn),
           "jacrev": torch.func.jacrev(fn), "vjp": lambda x: torch.func.vjp(fn, x)}[transform]
    with pytest.raises(UnsupportedTypeError, match="under a torch.func transform"):
        run(torch.ones(2, 3))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("transform", ["jvp", "jacfwd", "hessian"])
def test_jax_forward_mode_is_refused_by_jax_as_documented(transform):
    """docs/functions.md: forward mode through a bridged call is refused by jax itself (a
    custom_vjp function has no JVP)."""
    import jax
    import jax.numpy as jnp

    f = bb.bridge("torch")(lambda x: x * x)
    x = jnp.ones(3)
    run = {"jvp": lambda: jax.jvp(f, (x,), (x,)), "jacfwd": lambda: jax.jacfwd(f)(x),
           "hessian": lambda: jax.hessian(lambda x: f(x).sum())(x)}[transform]
    with pytest.raises(TypeError, match="custom_vjp"):
        run()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_a_bridged_call_on_a_captured_tensor_runs_under_a_torch_func_transform(transform):
    """The refusal is for torch.func's wrapper tensors: a bridged call that sees only a plain
    tensor the transformed function captured was refused too, though it worked before."""
    import torch

    g = bb.bridge("jax")(lambda c: c * 2.0)
    c = torch.arange(3.0)
    if transform == "vmap":
        got = torch.func.vmap(lambda x: x + g(c))(torch.ones(2, 3))
        assert got.tolist() == [[1.0, 3.0, 5.0], [1.0, 3.0, 5.0]]
    else:
        got = torch.func.grad(lambda x: (x * g(c)).sum())(torch.ones(3))
        assert got.tolist() == [0.0, 2.0, 4.0]


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("callee", ["jax", "tensorflow"])
@pytest.mark.parametrize("written", ["input", "output"])
def test_a_tensor_written_after_the_call_fails_the_backward_as_it_would_natively(callee, written):
    """The callee's pullback keeps zero-copy views of the inputs (and may of its outputs): one
    written in place before the backward gave a wrong gradient, silently (22 for 2); natively
    torch refuses that backward by its version counters, and now it does here too."""
    import torch

    fn = bb.bridge(callee)(lambda x: x * x)
    w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x = w * 1
    y = fn(x)
    (x if written == "input" else y).add_(10)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dtype", ["int64", "float64"])
def test_a_result_a_traced_jax_caller_cannot_hold_gets_our_error(dtype):
    """Without 64-bit mode, jax's own ValueError ('result_shape_dtypes cannot specify 64-bit
    types') came out of pure_callback; eagerly convert refuses with ours. Ours now, both ways."""
    import jax
    import jax.numpy as jnp
    import torch

    fn = bb.bridge("torch", fallback="auto")(lambda x: x.to(getattr(torch, dtype)))
    with pytest.raises(UnsupportedDtypeError, match=f"returns {dtype} .*declared before the function runs"):
        jax.jit(fn)(jnp.ones(3))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("through", ["convert_tree", "bridge"])
def test_a_tree_too_deep_to_walk_gets_our_error_and_a_deep_one_still_crosses(through):
    import torch

    def nest(n):
        tree = torch.ones(2)
        for _ in range(n):
            tree = [tree]
        return tree

    run = (lambda t: bb.convert_tree(t, to="jax")) if through == "convert_tree" else bb.bridge("jax")(lambda t: t)
    got = run(nest(100))  # past the bridge's plain walk (64 levels): the full walk takes it
    for _ in range(100):
        got = got[0]
    assert type_framework(got) == ("jax" if through == "convert_tree" else "torch")
    with pytest.raises(UnsupportedTypeError, match="nested too deeply to walk"):
        run(nest(3000))


class _Boom(Exception):
    pass


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("caller,traced", [("torch", False), ("jax", True), ("tensorflow", True),
                                           ("tensorflow", False)])
def test_an_exception_in_the_callee_reaches_the_caller_as_it_was_raised(caller, traced):
    """The callee's own exception, with the callee's frame in its traceback (under jit and
    tf.function it is raised by the call that finds the results' shapes, at trace time)."""
    callee = "jax" if caller != "jax" else "torch"

    def explode(x):
        raise _Boom("inside the callee")

    fn = bb.bridge(callee)(explode)
    run = _traced(caller, fn) if traced else fn
    with pytest.raises(_Boom, match="inside the callee") as got:
        run(make(caller, np.ones(3, np.float32)))
    assert "explode" in [f.name for f in traceback.extract_tb(got.value.__traceback__)]


@pytest.mark.parametrize("caller,callee", [("torch", "jax"), ("jax", "torch")])
def test_two_threads_calling_one_bridged_function_get_their_own_results(caller, callee):
    fn = bb.bridge(callee)(lambda w, x: w * x + w)
    direct = as_bridged_runs(callee, fn.fn)  # (jax: compiled, where XLA may fuse w * x + w into one rounding)
    errors: list = []

    def run(i):
        try:
            for k in range(15):
                w, x = _data((4,), np.float32, 100 * i + k), _data((4,), np.float32, 100 * i + k + 50)
                got, want = fn(make(caller, w), make(caller, x)), direct(make(callee, w), make(callee, x))
                np.testing.assert_array_equal(bits(got), bits(want))
        except Exception as err:  # collected: an assertion in a thread would be lost
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.frameworks("tensorflow", "torch")
@given(caller=st.sampled_from(AUTODIFF), callee=st.sampled_from(AUTODIFF),
       dtype=st.sampled_from(["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"]),
       shape=st.sampled_from([(), (0,), (7,), (16, 16)]))
def test_fp8_arguments_and_results_cross_bit_for_bit(caller, callee, dtype, shape):
    """Every fp8 bit pattern (NaNs included) into the callee and back out unchanged."""
    pattern = bb.dtypes.all_patterns(dtype)
    a = np.resize(pattern, shape)
    fn = bb.bridge(callee)(lambda x: {"same": x, "again": [x]})
    got = fn(make(caller, a))
    for y in (got["same"], got["again"][0]):
        assert type_framework(y) == caller
        np.testing.assert_array_equal(bits(y), a.view(np.uint8))


# -- trees: drawn containers through convert_tree and a bridged call --------------------------------

_Pair = collections.namedtuple("_Pair", "left right")


@dataclasses.dataclass
class _Box:
    item: object
    label: str = "box"


def _trees(leaf):
    """Nested dicts (OrderedDict, defaultdict too), lists, tuples, namedtuples, dataclasses, with
    tensor leaves and kept values (None, strings, numbers, -0.0)."""
    kept = st.sampled_from([None, "s", 3, -0.0, True, b"b"])
    return st.recursive(
        st.one_of(leaf, kept),
        lambda sub: st.one_of(
            st.lists(sub, max_size=3),
            st.lists(sub, max_size=3).map(tuple),
            st.dictionaries(st.sampled_from(["a", "b", 7]), sub, max_size=3),
            st.dictionaries(st.sampled_from(["a", "b"]), sub, max_size=2).map(collections.OrderedDict),
            st.dictionaries(st.sampled_from(["a", "b"]), sub, max_size=2).map(
                lambda d: collections.defaultdict(list, d)),
            st.builds(_Pair, sub, sub),
            st.builds(_Box, sub),
        ),
        max_leaves=8)


def _same_tree(got, want, framework):
    """The same containers (types, keys, order, kept values) with the leaves' bits."""
    if isinstance(want, np.ndarray):
        assert type_framework(got) == framework
        np.testing.assert_array_equal(bits(got), bits(want))
        return
    assert type(got) is type(want)
    if isinstance(want, dict):
        assert list(got) == list(want)
        if isinstance(want, collections.defaultdict):
            assert got.default_factory is want.default_factory
        for k in want:
            _same_tree(got[k], want[k], framework)
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same_tree(g, w, framework)
    elif isinstance(want, _Box):
        assert got.label == want.label
        _same_tree(got.item, want.item, framework)
    else:
        assert repr(got) == repr(want)  # -0.0 stays -0.0, True stays True


_LEAVES = st.builds(lambda n, seed: _data((n,), ml_dtypes.bfloat16, seed), st.integers(0, 3), st.integers(0, 99))


@pytest.mark.frameworks("tensorflow", "torch")
@given(tree=_trees(_LEAVES), source=st.sampled_from(AUTODIFF), target=st.sampled_from(AUTODIFF))
def test_drawn_trees_cross_with_their_containers_and_bits(tree, source, target):
    def to(t, framework):  # numpy leaves as tensors of ``framework``, by the test's own means
        if isinstance(t, np.ndarray):
            return make(framework, t)
        if isinstance(t, dict):
            out = type(t)(t.default_factory) if isinstance(t, collections.defaultdict) else type(t)()
            out.update((k, to(v, framework)) for k, v in t.items())
            return out
        if isinstance(t, _Pair):
            return _Pair(*(to(v, framework) for v in t))
        if isinstance(t, (list, tuple)):
            return type(t)(to(v, framework) for v in t)
        if isinstance(t, _Box):
            return _Box(to(t.item, framework), t.label)
        return t

    src = to(tree, source)
    _same_tree(bb.convert_tree(src, to=target, on_alias="allow"), tree, target)
    # across frameworks a Python number comes back as a 0-d tensor of the caller (a call in one framework
    # runs the function as it is)
    _same_tree(bb.bridge(target)(lambda t: t)(src), tree if source == target else _numbers_as_arrays(tree, source),
               source)


def _numbers_as_arrays(t, framework):
    """``t`` with each Python number as the 0-d array a bridged call gives ``framework`` for it: int64 and
    float64 (jax without x64: int32 and float32), bool."""
    if type(t) in (bool, int, float):
        narrow = framework == "jax" and not _x64()
        kind = {bool: "bool", int: "int32" if narrow else "int64", float: "float32" if narrow else "float64"}
        return np.asarray(t, kind[type(t)])
    if isinstance(t, dict):
        out = type(t)(t.default_factory) if isinstance(t, collections.defaultdict) else type(t)()
        out.update((k, _numbers_as_arrays(v, framework)) for k, v in t.items())
        return out
    if isinstance(t, _Pair):
        return _Pair(*(_numbers_as_arrays(v, framework) for v in t))
    if isinstance(t, (list, tuple)):
        return type(t)(_numbers_as_arrays(v, framework) for v in t)
    if isinstance(t, _Box):
        return _Box(_numbers_as_arrays(t.item, framework), t.label)
    return t


def _x64() -> bool:
    import jax

    return bool(jax.config.jax_enable_x64)
