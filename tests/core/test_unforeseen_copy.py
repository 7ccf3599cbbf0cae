"""A step whose copying the framework decides (``Step.verify``) is checked by pointer under copy=None
too: a copy the plan did not foresee is said (a Bf16BridgeWarning naming the step and the input), on
every call (such a plan is not kept for the fast path), and in convert_tree once for its leaves.
copy=True checks nothing (it asks for copies); a step that ran as planned keeps its plan."""

import copy as copying
import functools
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.core import fastpath, registry
from bf16bridge.core.adapter import Handoff
from conftest import BF16, bits, make, ptr


def _data():
    return np.arange(1, 33, dtype=np.uint16).view(BF16)


def _register(name, module, spec):
    bb.register_adapter(name, module, types=spec.types, aliases=spec.aliases, extra=spec.extra,
                        requires=spec.requires, hooks=dict(spec.hooks) or None, replace=True)


@pytest.fixture
def numpy_to_torch_copies():
    """numpy's adapter with one more hand-off into torch, planned zero-copy and checked by pointer,
    that copies (``copies``: whether it copies now). Yields (label, copies)."""
    spec, live = registry.spec("numpy"), registry.get("numpy")
    label = "stand-in numpy -> torch import"
    copies = {"now": True}

    def run(a):
        return make("torch", a) if copies["now"] else _shared(a)

    standin = copying.copy(live)
    extra = Handoff("numpy", "torch", label, run, lambda layout, aligned: None, verify=True)
    standin.handoffs = lambda: [extra, *live.handoffs()]
    _register("numpy", standin, spec)
    try:
        yield label, copies
    finally:
        _register("numpy", spec.instance or spec.module, spec)


def _shared(a):
    import torch

    return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)


def _said(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = call()
    return y, [str(w.message) for w in caught if issubclass(w.category, bb.Bf16BridgeWarning)]


@pytest.mark.frameworks("torch")
def test_copy_none_says_each_unforeseen_copy(numpy_to_torch_copies):
    label, _ = numpy_to_torch_copies
    x = make("numpy", _data())
    assert bb.plan(x, "torch").shares_memory
    for _ in range(3):  # not kept: the fast path would run it unchecked
        y, said = _said(lambda: bb.convert(x, "torch"))
        assert ptr(y) != ptr(x)
        np.testing.assert_array_equal(bits(y), _data().view(np.uint16))
        assert len(said) == 1 and said[0].startswith(f"{label} copied this numpy input although the plan said "
                                                     "zero-copy"), said
    with pytest.warns(bb.Bf16BridgeWarning, match=f"{label} copied this numpy input"):
        bb.to_torch(x)


@pytest.mark.frameworks("torch")
def test_copy_none_says_it_once_for_a_tree(numpy_to_torch_copies):
    label, _ = numpy_to_torch_copies
    tree = {"a": make("numpy", _data()), "b": make("numpy", _data())}
    out, said = _said(lambda: bb.convert_tree(tree, "torch"))
    assert [s for s in said if label in s] == [f"2 leaves of this tree: {label} copied this numpy input although "
                                               "the plan said zero-copy: the torch result does not share its memory "
                                               "(copy=True asks for the copy, copy=False refuses it)"]
    assert all(ptr(out[k]) != ptr(tree[k]) for k in tree)


@pytest.mark.frameworks("torch")
def test_copy_true_checks_nothing(numpy_to_torch_copies):
    x = make("numpy", _data())
    y, said = _said(lambda: bb.convert(x, "torch", copy=True))
    assert not said and ptr(y) != ptr(x)


@pytest.mark.frameworks("torch")
def test_a_step_that_ran_as_planned_keeps_its_plan(numpy_to_torch_copies):
    label, copies = numpy_to_torch_copies
    copies["now"] = False
    x = make("numpy", _data())
    fastpath.clear()
    y, said = _said(lambda: bb.convert(x, "torch"))
    assert not said and ptr(y) == ptr(x)
    assert fastpath.plans(np.ndarray, "torch", None, "error", False, "warn", "warn", None) is not None
    copies["now"] = True  # a kept plan under copy=None reads no pointer: the hot path stays as cheap
    y, said = _said(lambda: bb.convert(x, "torch"))
    assert not said and ptr(y) != ptr(x)
    # under copy=False the kept plan checks, and the full path refuses, naming the step
    copies["now"] = False
    for _ in range(2):
        assert ptr(bb.convert(x, "torch", copy=False)) == ptr(x)
    copies["now"] = True
    with pytest.raises(bb.CopyRequiredError, match=f"copy=False, but {label} copied this numpy input"):
        bb.convert(x, "torch", copy=False)
