"""copy=False is checked, not trusted: where a step's copying is up to the framework (a hand-off or
import planned zero-copy with ``verify``), convert compares the data pointers after it, so a
framework that copies behind the plan's back gets our CopyRequiredError naming the step that
copied, never a silent copy. A real case (numpy.asarray of a jax array over foreign strides) and,
for every target, a stand-in hand-off whose import copies. copy=None takes the copy, and says so."""

import contextlib
import copy as copying
import functools
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import registry
from bf16bridge.core.adapter import Handoff
from conftest import BF16, bits, make, ptr

#: each target, from a source whose hand-off into it is replaced by one that copies
STANDIN_ROUTES = [("torch", "numpy"), ("numpy", "torch"), ("numpy", "jax"), ("numpy", "tensorflow")]


def _data():
    return np.arange(1, 65, dtype=np.uint16).view(BF16)


def _calls(to):
    """The entry points that run a plan with copy=False, each run twice: the second call takes the
    plan the first kept (convert's and convert_tree's fast path)."""
    return {
        "convert": lambda x: bb.convert(x, to, copy=False, on_alias="allow"),
        "convert_tree": lambda x: bb.convert_tree({"w": x}, to, copy=False, on_alias="allow")["w"],
    }


def _assert_refused(x, to, label, source):
    for name, call in _calls(to).items():
        for _ in range(2):
            with pytest.raises(bb.CopyRequiredError) as err:
                call(x)
            said = str(err.value)
            assert label in said and source in said and "copy=None" in said, (name, said)


def _copy_said(call, x, to, label):
    """Run ``call`` (copy=None) and return (the result, whether it says it copied: a warning naming
    the step, or a plan that says no memory is shared)."""
    p = bb.plan(x, to)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = call(x)
    worded = any(label in str(w.message) and "cop" in str(w.message) for w in caught)
    return y, worded or not p.shares_memory


# -- the real case: numpy copies a jax array whose layout it cannot take ---------------------------


@pytest.fixture
def foreign_strided_jax():
    """A jax array over a torch buffer whose size-1 dimension has a stride no row-major array has
    (jax keeps the buffer as DLPack gave it), and that buffer. Whether numpy.asarray of it copies
    depends on the jax version (jax 0.4.30 copies; newer ones cross zero-copy): either way the call
    must agree with its plan or say it did not."""
    import jax.numpy as jnp
    import torch

    t = torch.arange(16, dtype=torch.float32).as_strided((4, 1, 4), (4, 99, 1))
    j = jnp.from_dlpack(t)
    assert ptr(j) == t.data_ptr()
    return j, t


@pytest.mark.frameworks("torch", "jax")
def test_copy_false_on_a_foreign_strided_jax_array_shares_or_refuses(foreign_strided_jax):
    j, t = foreign_strided_jax
    p = bb.plan(j, "numpy", copy=False)
    assert p.zero_copy and p.shares_memory
    labels = [s.label for s in p.steps]
    if labels == ["numpy.asarray"] and ptr(np.asarray(j)) != ptr(j):  # its hand-off copies: refused
        _assert_refused(j, "numpy", "numpy.asarray", "jax")
        return
    for name, call in {**_calls("numpy"), "to_numpy": lambda x: bb.to_numpy(x, copy=False)}.items():
        for _ in range(2):
            y = call(j)
            assert ptr(y) == ptr(j), name
            np.testing.assert_array_equal(bits(y), bits(t))


@pytest.mark.frameworks("torch", "jax")
def test_copy_none_on_a_foreign_strided_jax_array_agrees_with_its_plan_or_says_it_copied(foreign_strided_jax):
    j, t = foreign_strided_jax
    p = bb.plan(j, "numpy")
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = bb.convert(j, "numpy")
        np.testing.assert_array_equal(bits(y), bits(t))
        said = any("numpy.asarray" in str(w.message) and "cop" in str(w.message) for w in caught)
        assert (ptr(y) == ptr(j)) == p.shares_memory or said


# -- a stand-in hand-off into each target, planned zero-copy, whose import copies ---------------------


def _copy_into(target, x):
    """A ``target`` tensor holding ``x``'s bf16 bits in memory of its own: an import that copies."""
    return make(target, bits(x).view(BF16))


def _register(name, module, spec):
    bb.register_adapter(name, module, types=spec.types, aliases=spec.aliases, extra=spec.extra,
                        requires=spec.requires, hooks=dict(spec.hooks) or None, replace=True)


@contextlib.contextmanager
def _handoff_that_copies(source, target):
    """``source``'s adapter, registered again with one more hand-off into ``target``: zero-copy by
    its plan, checked by pointer (``verify``), copying when it runs. Yields its label."""
    spec = registry.spec(source)
    live = registry.get(source)
    label = f"stand-in {source} -> {target} import"
    standin = copying.copy(live)  # (keeps what the live adapter found by its trials)
    extra = Handoff(source, target, label, functools.partial(_copy_into, target), lambda layout, aligned: None,
                    verify=True)
    standin.handoffs = lambda: [extra, *live.handoffs()]
    _register(source, standin, spec)
    try:
        yield label
    finally:
        _register(source, spec.instance or spec.module, spec)


@pytest.mark.parametrize("source,target", STANDIN_ROUTES)
def test_copy_false_refuses_a_handoff_that_copies_into_each_target(source, target):
    x = make(source, _data())
    with _handoff_that_copies(source, target) as label:
        p = bb.plan(x, target, copy=False)
        assert p.zero_copy and [s.label for s in p.steps] == [label], str(p)
        _assert_refused(x, target, label, source)
        y = bb.convert(x, target, copy=True)  # the way out the other way: an honest copy
        np.testing.assert_array_equal(bits(y), _data().view(np.uint16))
    assert bb.plan(x, target, copy=False).steps[0].label != label  # the adapter is back as it was


@pytest.mark.parametrize("source,target", STANDIN_ROUTES)
def test_copy_none_takes_a_handoff_that_copies(source, target):
    x = make(source, _data())
    with _handoff_that_copies(source, target):
        for _ in range(2):
            with pytest.warns(bb.Bf16BridgeWarning, match="copied"):
                y = bb.convert(x, target, on_alias="allow")
            assert ptr(y) != ptr(x)
            np.testing.assert_array_equal(bits(y), _data().view(np.uint16))


@pytest.mark.parametrize("source,target", STANDIN_ROUTES)
def test_copy_none_says_a_handoff_copied(source, target):
    x = make(source, _data())
    with _handoff_that_copies(source, target) as label:
        y, said = _copy_said(lambda v: bb.convert(v, target, on_alias="allow"), x, target, label)
    assert ptr(y) != ptr(x) and said
