"""Properties every conversion keeps, on generated inputs (issue 8 item 13, issue 16).

For any input (numpy arrays of every layout, byte order, offset and flag; torch
views with offsets, steps, zero strides and lazy conj/neg bits; jax and
tensorflow tensors; numpy scalars), any target and any keywords:

- the result holds the input's bits exactly, or the call raises a
  Bf16BridgeError, never a foreign exception;
- the input is never changed;
- ``plan()`` says what ``convert()`` did: whether it copied, shares memory,
  and whether the result is writable;
- ``copy=False`` shares memory or raises CopyRequiredError; ``copy=True``
  never shares;
- anything but None/True/False for ``copy=`` is our error;
- a writable result over memory its owner treats as read-only says so
  (Bf16BridgeWarning), in one call and along chains of up to six.

Each property runs once per kind of input (strategies.CONCEPTS), plus tables of
what no random draw should be left to find: 10**6 x 10**6 views of one element,
inputs that are not plain tensors, jax's x64 flag changing between calls,
``aligned_empty`` against ``np.empty``, and trees for ``convert_tree``.

Examples are derandomized and bounded (profile "ci" in strategies.py, about a
minute here); ``HYPOTHESIS_PROFILE=fuzz`` draws fresh, more numerous ones.
"""

from __future__ import annotations

import warnings
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import bf16bridge as bb
from conftest import BF16, FRAMEWORKS, PRESENT, by_first_word, dtype_name, fw, make, ptr, type_framework
from strategies import (
    ALIGN,
    Couple,
    CONCEPTS,
    DTYPES,
    WIDE,
    attempt,
    bad_copy_modes,
    bad_fallbacks,
    bridge_warnings,
    chains,
    copy_modes,
    fallbacks,
    nonempty,
    np_dtype,
    readonly_memory,
    result_bits,
    same_bits,
    scalar_specs,
    targets,
    trees,
    writable,
)


#: the frameworks each kind of input is made with, beyond numpy (a run without one deselects that kind)
CONCEPT_NEEDS = {"torch": ("torch",), "torch-expand": ("torch",), "jax-tf": ("jax", "tensorflow"),
                 "chained": ("torch", "jax", "tensorflow"), "chained-zero-stride": ("torch", "jax", "tensorflow"),
                 "regressions": ("torch", "jax", "tensorflow")}
#: each test runs once per kind of input (strategies.CONCEPTS), each with its own examples
concepts = pytest.mark.parametrize("concept", [pytest.param(c, marks=pytest.mark.frameworks(*CONCEPT_NEEDS.get(c, ())))
                                               for c in CONCEPTS])


def _input(data, concept):
    return data.draw(CONCEPTS[concept], label="input").build()


def _convert(x, to, **kw):
    return attempt(bb.convert, x, to, **kw)


def _plan(x, to, **kw):
    return attempt(bb.plan, x, to, **kw)


# -- bits ---------------------------------------------------------------------------


@concepts
@given(data=st.data(), to=targets, copy=copy_modes, fallback=fallbacks)
def test_result_holds_the_input_bits_or_raises_ours(concept, data, to, copy, fallback):
    x = _input(data, concept)
    want = result_bits(x)
    out = _convert(x, to, copy=copy, fallback=fallback)
    if out.ok:
        assert type_framework(out.value) == to
        assert tuple(out.value.shape) == tuple(x.shape)
        assert same_bits(out.value, want, dtype_name(x), fallback == "auto") is None, same_bits(
            out.value, want, dtype_name(x), fallback == "auto")


@concepts
@given(data=st.data(), to=targets)
def test_copy_none_succeeds_where_the_target_holds_the_dtype(concept, data, to):
    # With copy=None a copy is always allowed, so the only refusal left is a dtype
    # the target cannot hold (jax's 64-bit types without x64).
    x = _input(data, concept)
    out = _convert(x, to)
    assert out.ok or isinstance(out.error, bb.UnsupportedDtypeError), repr(out.error)


@given(spec=scalar_specs, to=targets, copy=copy_modes)
def test_numpy_scalars_arrive_as_their_bits(spec, to, copy):
    x = spec.build()
    out = _convert(x, to, copy=copy)
    if out.ok:
        assert tuple(out.value.shape) == ()
        assert same_bits(out.value, result_bits(x), dtype_name(np.asarray(x))) is None


@given(spec=scalar_specs, to=targets)
def test_numpy_scalar_copy_false_is_decided_the_same_way_every_time(spec, to):
    # A scalar becomes a fresh 0-d array on each call, aligned or not by chance; the
    # answer to copy=False must not depend on where that array happened to land.
    x = spec.build()
    kinds = {type(_convert(x, to, copy=False).error).__name__ for _ in range(8)}
    assert len(kinds) == 1, f"copy=False on {x!r} -> {to}: {sorted(kinds)}"


@concepts
@given(data=st.data(), chain=chains)
def test_chains_of_conversions_keep_the_bits(concept, data, chain):
    x = _input(data, concept)
    want, dtype_in = result_bits(x), dtype_name(x)
    y = x
    for to, copy in chain:
        out = _convert(y, to, copy=copy)
        if not out.ok:
            continue  # our error: the chain goes on from the last value it had
        y = out.value
        assert same_bits(y, want, dtype_in) is None, (to, copy, same_bits(y, want, dtype_in))
    assert np.array_equal(result_bits(x), want), "the chain changed its input"


@concepts
@given(data=st.data(), chain=chains)
def test_every_step_of_a_chain_keeps_the_copy_promises(concept, data, chain):
    # the values a chain passes through (jax over torch memory, tf imported zero-copy)
    # are inputs too: copy=False shares or refuses, copy=True never shares
    y = _input(data, concept)
    for to, copy in chain:
        out = _convert(y, to, copy=copy)
        if not out.ok:
            assert copy is False or isinstance(out.error, bb.UnsupportedDtypeError), repr(out.error)
            continue
        if nonempty(y) and copy is not None:
            shares = ptr(out.value) == ptr(y)
            assert shares == (copy is False), f"-> {to}, copy={copy}: shares memory={shares}, in {chain}"
        y = out.value


# -- the input is never changed ---------------------------------------------------------


@concepts
@given(data=st.data(), to=targets, copy=copy_modes)
def test_input_is_unchanged_by_convert(concept, data, to, copy):
    x = _input(data, concept)
    want = result_bits(x)
    flags = np.asarray(x).flags.writeable if type_framework(x) == "numpy" else None
    _convert(x, to, copy=copy)
    assert np.array_equal(result_bits(x), want)
    if flags is not None:
        assert x.flags.writeable == flags, "convert changed the input's writeable flag"


@concepts
@given(data=st.data(), to=st.sampled_from(["numpy", "torch"]), copy=copy_modes)
def test_writing_a_result_that_shares_nothing_leaves_the_input_alone(concept, data, to, copy):
    x = _input(data, concept)
    want = result_bits(x)
    p = _plan(x, to, copy=copy)
    out = _convert(x, to, copy=copy)
    if not (out.ok and p.ok) or p.value.shares_memory or not writable(out.value) or not nonempty(x):
        return
    y = out.value
    if type_framework(y) == "torch":
        if 0 in y.stride():  # torch refuses to write through a zero stride
            return
        y.zero_()
    else:
        y[...] = 0
    assert np.array_equal(result_bits(x), want), "plan said the result shares nothing, but writing it changed the input"


# -- plan() says what convert() did --------------------------------------------------------


def _plans_and_results(x):
    """(to, copy, plan outcome, convert outcome) for every target with every copy
    mode: the plan tests check all twelve on each input."""
    for to in PRESENT:
        for copy in (None, True, False):
            yield to, copy, _plan(x, to, copy=copy), _convert(x, to, copy=copy)


@concepts
@given(data=st.data())
def test_plan_and_convert_raise_alike(concept, data):
    x = _input(data, concept)
    for to, copy, p, out in _plans_and_results(x):
        assert type(p.error) is type(out.error), f"-> {to}, copy={copy}: plan: {p.error!r}; convert: {out.error!r}"


@concepts
@given(data=st.data())
def test_plan_says_whether_the_result_shares_memory(concept, data):
    x = _input(data, concept)
    for to, copy, p, out in _plans_and_results(x):
        if not (p.ok and out.ok) or not nonempty(x):
            continue
        shares = ptr(out.value) == ptr(x)
        assert p.value.shares_memory == shares, f"-> {to}, copy={copy}: convert shares={shares}, but\n{p.value}"
        if p.value.copies:
            assert not shares


@concepts
@given(data=st.data())
def test_plan_says_whether_the_result_is_writable(concept, data):
    x = _input(data, concept)
    for to, copy, p, out in _plans_and_results(x):
        if p.ok and out.ok:
            assert p.value.writable == writable(out.value), f"-> {to}, copy={copy}: plan says\n{p.value}"


@concepts
@given(data=st.data(), to=targets, copy=copy_modes, fallback=fallbacks)
def test_plan_names_the_result_dtype(concept, data, to, copy, fallback):
    x = _input(data, concept)
    p, out = _plan(x, to, copy=copy, fallback=fallback), _convert(x, to, copy=copy, fallback=fallback)
    if p.ok and out.ok:
        assert p.value.dtype_out == dtype_name(out.value)


@concepts
@given(data=st.data())
def test_result_in_tensorflow_is_aligned(concept, data):
    # tensorflow aborts the process on the first kernel over an unaligned buffer
    x = _input(data, concept)
    out = _convert(x, "tensorflow")
    if out.ok and nonempty(x):
        assert ptr(out.value) % ALIGN == 0


# -- copy modes ---------------------------------------------------------------------------


@concepts
@given(data=st.data(), to=targets)
def test_copy_true_never_shares_memory(concept, data, to):
    x = _input(data, concept)
    out = _convert(x, to, copy=True)
    assert out.ok or isinstance(out.error, bb.UnsupportedDtypeError), repr(out.error)
    if out.ok and nonempty(x):
        assert ptr(out.value) != ptr(x)


@concepts
@given(data=st.data(), to=targets, bad=bad_copy_modes)
def test_copy_false_shares_memory_or_raises_copy_required(concept, data, to, bad):
    x = _input(data, concept)
    # a call with a non-bool copy= first: it must not leave anything behind that
    # changes what copy=False does next (0 == False shares a cache key with it)
    _convert(x, to, copy=bad)
    out = _convert(x, to, copy=False)
    if out.ok:
        if nonempty(x):
            assert ptr(out.value) == ptr(x), "copy=False returned a copy"
    else:
        assert isinstance(out.error, (bb.CopyRequiredError, bb.UnsupportedDtypeError)), repr(out.error)


@concepts
@given(data=st.data(), to=targets)
def test_copy_false_succeeds_where_plan_shares_memory(concept, data, to):
    x = _input(data, concept)
    p = _plan(x, to)
    if p.ok and p.value.shares_memory:
        out = _convert(x, to, copy=False)
        assert out.ok, f"plan shares memory, but copy=False raised {out.error!r}\n{p.value}"


@concepts
@given(data=st.data(), to=targets, bad=bad_copy_modes)
def test_copy_values_other_than_none_true_false_are_our_error(concept, data, to, bad):
    x = _input(data, concept)
    for call in (_convert, _plan):
        out = call(x, to, copy=bad)
        assert not out.ok, f"copy={bad!r} was accepted"
        assert isinstance(out.error, (ValueError, TypeError))


@concepts
@given(data=st.data(), to=targets, bad=bad_fallbacks)
def test_fallback_values_outside_the_list_are_our_error(concept, data, to, bad):
    x = _input(data, concept)
    assert not _convert(x, to, fallback=bad).ok


@concepts
@given(data=st.data(), to=targets, fallback=st.sampled_from(["error", "float32", "bits"]))
def test_for_compute_without_auto_is_our_error(concept, data, to, fallback):
    x = _input(data, concept)
    assert not _convert(x, to, fallback=fallback, for_compute=True).ok


# -- aliasing memory its owner treats as read-only -----------------------------------------


@concepts
@given(data=st.data(), to=st.sampled_from(["numpy", "torch"]), copy=copy_modes)
def test_writable_alias_of_readonly_memory_warns(concept, data, to, copy):
    # jax and tensorflow export their buffers without a read-only flag, and torch
    # cannot mark a tensor read-only: a writable result over such memory lets a
    # write change an "immutable" array. The call must say so (Bf16BridgeWarning).
    x = _input(data, concept)
    out = _convert(x, to, copy=copy)
    if out.ok and nonempty(x) and readonly_memory(x) and writable(out.value) and ptr(out.value) == ptr(x):
        assert bridge_warnings(out), f"{type_framework(x)} read-only memory -> writable {to} alias, no warning"


@concepts
@given(data=st.data(), chain=chains)
def test_chains_never_make_readonly_memory_writable_silently(concept, data, chain):
    x = _input(data, concept)
    if not (readonly_memory(x) and nonempty(x)):
        return
    y, warned = x, False
    for to, copy in chain:
        out = _convert(y, to, copy=copy)
        if not out.ok:
            continue
        y, warned = out.value, warned or bool(bridge_warnings(out))
        if writable(y) and ptr(y) == ptr(x):
            assert warned, f"read-only {type_framework(x)} memory is writable through {to} after {chain}"


# -- huge views: nothing to copy into -------------------------------------------------------

_N = 10**6  # a 10**6 x 10**6 view of one element: 2 TB if anything copies it


def _huge(kind):
    one = np.ones(1, np.uint16).view(BF16)
    if kind == "numpy broadcast_to":
        return np.broadcast_to(one, (_N, _N))
    if kind == "numpy as_strided, writable":
        return np.lib.stride_tricks.as_strided(one, (_N, _N), (0, 0), writeable=True)
    torch = fw("torch")
    t = torch.from_numpy(one.view(np.uint16)).view(torch.bfloat16)
    return t.expand(_N, _N) if kind == "torch expand" else t.as_strided((_N, _N), (0, 0))


@pytest.mark.parametrize("copy", [None, True, False])
@pytest.mark.parametrize("to", FRAMEWORKS)
@pytest.mark.parametrize("kind", by_first_word(["numpy broadcast_to", "numpy as_strided, writable",
                                                "torch expand", "torch as_strided"]))
def test_huge_broadcast_views_share_memory_or_raise_ours(kind, to, copy):
    # A copy of such a view cannot be allocated: the bridge must refuse before
    # allocating, naming the size, never leak MemoryError or torch's RuntimeError.
    x = _huge(kind)
    out = _convert(x, to, copy=copy)
    if out.ok:
        y = out.value
        assert ptr(y) == ptr(x) and tuple(y.shape) == (_N, _N)
        assert result_bits(y[-1:, -1:]).tolist() == [0x0001]
    else:
        assert copy is False or isinstance(out.error, MemoryError), repr(out.error)


# -- inputs that are not plain tensors -------------------------------------------------------


def _exotic(kind):
    if kind == "jax random key":
        return fw("jax").random.key(0)
    torch = fw("torch") if kind.startswith("torch ") else None
    if kind == "torch nested tensor":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nested tensors are a prototype and say so
            return torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    if kind == "torch sparse":
        return torch.zeros(3, 3, dtype=torch.bfloat16).to_sparse()
    if kind == "torch meta":
        return torch.empty(3, dtype=torch.bfloat16, device="meta")
    if kind == "torch quantized":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated in torch, still made
            return torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8)
    return {
        "numpy masked": np.ma.masked_array(np.zeros(3, BF16), mask=[0, 1, 0]),
        "numpy object": np.array([1, None], dtype=object),
        "numpy str": np.array(["a", "b"]),
        "numpy datetime64": np.array(["2026-01-01"], dtype="datetime64[D]"),
        "numpy record": np.zeros(3, [("a", "f4"), ("b", BF16)]),
        "python list": [1.0, 2.0],
        "python float": 1.0,
        "None": None,
    }[kind]


EXOTIC = by_first_word(["jax random key", "torch nested tensor", "torch sparse", "torch meta", "torch quantized",
                        "numpy masked", "numpy object", "numpy str", "numpy datetime64", "numpy record",
                        "python list", "python float", "None"])


@pytest.mark.parametrize("to", FRAMEWORKS)
@pytest.mark.parametrize("kind", EXOTIC)
def test_inputs_that_are_not_plain_tensors_raise_ours(kind, to):
    x = _exotic(kind)
    for call in (_convert, _plan):
        assert not call(x, to).ok


# -- jax's 64-bit flag, read at every call -----------------------------------------------------


@given(flags=st.lists(st.booleans(), min_size=2, max_size=6), dtype=st.sampled_from(sorted(WIDE)),
       src=st.sampled_from([f for f in ("numpy", "torch", "tensorflow") if f in PRESENT]))
def test_jax_64_bit_types_follow_the_x64_flag_at_each_call(flags, dtype, src):
    # jax narrows 64-bit types unless jax_enable_x64 is on, and the flag can change
    # at run time: each call must read it (a route cached under the other setting
    # narrows silently or refuses wrongly).
    jax = fw("jax")
    # (astype again: numpy 1.x's uint64 * a Python int is an array of ulonglong, which the test's own
    # torch.from_numpy refuses; bb.convert takes it, tests/core/test_input_kinds.py)
    a = (np.arange(1, 7, dtype=np.uint8).astype(dtype) * (2**40 + 1 if dtype != "complex128" else 1)).astype(dtype)
    x = make(src, a)
    want = result_bits(x)
    before = jax.config.jax_enable_x64
    try:
        for on in flags:
            jax.config.update("jax_enable_x64", on)
            out = _convert(x, "jax")
            if on:
                assert out.ok, repr(out.error)
                assert same_bits(out.value, want, dtype) is None
            else:
                assert isinstance(out.error, bb.UnsupportedDtypeError), f"x64 off, {dtype} gave {out.value!r}"
    finally:
        jax.config.update("jax_enable_x64", before)


# -- aligned_empty is numpy's empty, aligned ----------------------------------------------------


@given(shape=st.one_of(st.integers(-3, 5), st.lists(st.integers(-3, 5), max_size=4).map(tuple)),
       dtype=st.sampled_from([*DTYPES, "nope", "object"]))
def test_aligned_empty_agrees_with_numpy_empty(shape, dtype):
    try:
        want = np.empty(shape, dtype=np_dtype(dtype) if dtype in DTYPES else dtype)
    except (TypeError, ValueError):
        with pytest.raises(bb.Bf16BridgeError):
            bb.aligned_empty(shape, dtype)
        return
    if want.dtype == object:
        with pytest.raises(bb.Bf16BridgeError):  # not a dtype the bridge carries
            bb.aligned_empty(shape, dtype)
        return
    got = bb.aligned_empty(shape, dtype)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.flags.c_contiguous and got.flags.writeable
    if got.size:  # numpy gives an empty slice its base's pointer: nothing to align
        assert got.__array_interface__["data"][0] % ALIGN == 0


# -- trees ----------------------------------------------------------------------------------


def _same_tree(got, want, to):
    """None if ``got`` is ``want`` with every numpy leaf moved to ``to`` bit for bit and
    every container of the same type (a defaultdict with its factory); else what differs."""
    if isinstance(want, np.ndarray):
        if type_framework(got) != to:
            return f"a leaf arrived as {type(got).__name__}"
        return same_bits(got, result_bits(want), dtype_name(want))
    if type(got) is not type(want):
        return f"{type(want).__name__} came back as {type(got).__name__}"
    if isinstance(want, dict):
        if list(got) != list(want):
            return f"keys {list(want)} came back as {list(got)}"
        if isinstance(want, defaultdict) and got.default_factory is not want.default_factory:
            return "a defaultdict lost its factory"
        pairs = [(got[k], want[k]) for k in want]
    elif isinstance(want, (list, tuple)):
        if len(got) != len(want):
            return f"{len(want)} items came back as {len(got)}"
        pairs = list(zip(got, want))
    else:
        return None if got == want else f"the leaf {want!r} came back as {got!r}"
    return next((d for d in (_same_tree(g, w, to) for g, w in pairs) if d), None)


def _tree_bits(tree):
    return [result_bits(x).tolist() for x in _leaves(tree)]


def _leaves(tree):
    if isinstance(tree, np.ndarray):
        return [tree]
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return [leaf for item in items for leaf in _leaves(item)]


def _has_couple(tree):
    if isinstance(tree, Couple):
        return True
    items = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    return any(_has_couple(item) for item in items)


@given(tree=trees, to=targets)
def test_convert_tree_keeps_every_container_and_moves_every_leaf(tree, to):
    out = attempt(bb.convert_tree, tree, to)
    if not out.ok:
        # a tuple subclass whose constructor takes other arguments cannot be rebuilt:
        # our error is the right answer for it, and only for it
        assert _has_couple(tree), repr(out.error)
        return
    assert _same_tree(out.value, tree, to) is None, _same_tree(out.value, tree, to)


@given(tree=trees, to=targets)
def test_convert_tree_leaves_its_input_alone(tree, to):
    before = _tree_bits(tree)
    attempt(bb.convert_tree, tree, to)
    assert _tree_bits(tree) == before


@pytest.mark.parametrize("to", FRAMEWORKS)
def test_convert_tree_of_a_tree_that_contains_itself_is_our_error(to):
    loop = [np.zeros(2, BF16)]
    loop.append(loop)
    assert not attempt(bb.convert_tree, loop, to).ok


# -- the copies of large inputs, on small ones ---------------------------------------------------


@pytest.mark.parametrize("concept", [
    pytest.param(c, marks=pytest.mark.frameworks(*CONCEPT_NEEDS.get(c, ())))
    for c in ["numpy", "offset", "big-endian", "torch", "torch-expand", "regressions"]])
@given(data=st.data(), to=targets)
def test_copies_made_as_large_ones_keep_the_bits(concept, data, to):
    """A large copy is made differently (core.memory: at its source's page offset from
    PAGE_MATCH_FROM bytes on; torch's into numpy's memory from FRESH_MEMORY_FROM on); with both
    limits at 0, every input takes those paths: the bits arrive, and a numpy copy of a contiguous
    input starts at the input's page offset rounded up to 64."""
    from bf16bridge.core import memory

    x = _input(data, concept)
    want = result_bits(x)
    limits = memory.PAGE_MATCH_FROM, memory.FRESH_MEMORY_FROM
    memory.PAGE_MATCH_FROM = memory.FRESH_MEMORY_FROM = 0
    try:
        out = _convert(x, to, copy=True)
    finally:
        memory.PAGE_MATCH_FROM, memory.FRESH_MEMORY_FROM = limits
    if not out.ok:
        return  # what it raises is test_result_holds_the_input_bits_or_raises_ours's concern
    y = out.value
    assert tuple(y.shape) == tuple(x.shape)
    assert same_bits(y, want, dtype_name(x)) is None, same_bits(y, want, dtype_name(x))
    if nonempty(y) and to != "jax":  # (jax allocates its own copies)
        assert ptr(y) % ALIGN == 0
    if (to == "numpy" and isinstance(x, np.ndarray) and x.flags.c_contiguous and x.dtype.isnative
            and x.size and ptr(x) % x.dtype.itemsize == 0):
        assert ptr(y) % 4096 == -(-(ptr(x) % 4096) // ALIGN) * ALIGN % 4096
