"""core.fastpath and torch tensors that take part in autodiff: such an input runs a kept plan (the
key says it requires grad, and the plan detaches it first), which serves no other input: not one of
the same layout without grad, not another keyword choice; its results are the full path's, bit for
bit, and the gradient of a bridged call still flows."""

import warnings

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bits, ptr

pytestmark = pytest.mark.frameworks("torch")


def _grad_tensor(n: int = 64):
    import torch

    return torch.arange(n, dtype=torch.float32).to(torch.bfloat16).requires_grad_()


@pytest.mark.parametrize("to", ["numpy", "torch", "jax", "tensorflow"])
def test_a_tensor_that_requires_grad_takes_the_kept_plan(to, torch_described):
    t = _grad_tensor()
    first = bb.convert(t, to, on_grad="drop")
    assert torch_described  # planned once
    torch_described.clear()
    for _ in range(3):
        y = bb.convert(t, to, on_grad="drop")
        assert not torch_described  # the kept plan: nothing described again
        np.testing.assert_array_equal(bits(y), bits(first))
        assert ptr(y) == ptr(t)  # zero-copy, as the plan it keeps
    if to == "torch":  # detached, not the input itself: its gradient does not cross
        assert y is not t and not y.requires_grad and y.grad_fn is None


def test_the_kept_plan_gives_the_full_paths_bits():
    from bf16bridge.core import fastpath

    t = _grad_tensor(256)
    kept = [bb.convert(t, to, on_grad="drop") for to in ("numpy", "jax", "tensorflow", "torch") for _ in range(2)]
    fastpath.clear()
    full = [bb.convert(t, to, on_grad="drop") for to in ("numpy", "jax", "tensorflow", "torch")]
    for i, y in enumerate(full):
        for k in kept[2 * i:2 * i + 2]:
            np.testing.assert_array_equal(bits(k), bits(y))
            assert type(k) is type(y)


def test_grad_and_plain_tensors_of_one_layout_keep_plans_apart():
    import torch

    t = _grad_tensor()
    plain = torch.arange(64, dtype=torch.float32).to(torch.bfloat16)
    for _ in range(3):  # in turn: each must get its own plan, whichever was kept first
        with pytest.warns(bb.Bf16BridgeWarning, match="requires grad"):
            bb.convert(t, "numpy")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the plain tensor warns of nothing
            assert bb.convert(plain, "torch") is plain  # not detached: the input itself
            np.testing.assert_array_equal(bits(bb.convert(plain, "numpy")), bits(plain))
        got = bb.convert(t, "torch", on_grad="drop")
        assert got is not t and not got.requires_grad


def test_on_grad_choices_keep_plans_apart():
    t = _grad_tensor()
    for _ in range(3):
        with pytest.warns(bb.Bf16BridgeWarning, match="requires grad"):
            bb.convert(t, "jax")  # said on every call, the kept plan's too
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            bb.convert(t, "jax", on_grad="drop")
        with pytest.raises(bb.UnsupportedTypeError, match="on_grad='drop'"):
            bb.convert(t, "jax", on_grad="error")  # refused on every call: never kept


def test_a_tree_of_tensors_that_require_grad_warns_once_a_call():
    import torch

    tree = {"w": _grad_tensor(), "b": _grad_tensor(8), "plain": torch.zeros(4, dtype=torch.bfloat16)}
    for _ in range(3):
        with pytest.warns(bb.Bf16BridgeWarning, match="2 leaves of this tree") as got:
            out = bb.convert_tree(tree, "numpy")
        assert len([w for w in got if "requires grad" in str(w.message)]) == 1
        for k in tree:
            np.testing.assert_array_equal(bits(out[k]), bits(tree[k]))


def test_under_no_grad_leaf_and_non_leaf_tensors_take_kept_plans(torch_described):
    import torch

    t = _grad_tensor()
    non_leaf = t * 2  # a grad_fn, not a leaf
    assert not non_leaf.is_leaf and non_leaf.requires_grad
    for x in (t, non_leaf, t):
        bb.convert(x, "torch", on_grad="drop")
        torch_described.clear()
        with torch.no_grad():  # still requires grad: the data crosses detached
            y = bb.convert(x, "torch", on_grad="drop")
        assert not torch_described
        assert ptr(y) == ptr(x) and not y.requires_grad and y.grad_fn is None
        np.testing.assert_array_equal(bits(y), bits(x))


def test_a_kept_plan_does_not_serve_a_tensor_with_a_tangent():
    import torch
    import torch.autograd.forward_ad as fwad

    t = _grad_tensor()
    for x in (t, t, t.detach(), t.detach()):  # kept plans for tensors with and without grad
        bb.convert(x, "numpy", on_grad="error" if x is not t else "drop")
    with fwad.dual_level():
        dual = fwad.make_dual(t.detach(), torch.ones_like(t.detach()))
        with pytest.raises(bb.UnsupportedTypeError, match="tangent"):
            bb.convert(dual, "numpy", on_grad="error")


@pytest.mark.frameworks("jax")
def test_the_gradient_of_a_bridged_call_flows_call_after_call():
    import jax
    import torch

    f = bb.bridge("jax")(lambda a, b: jax.numpy.sum(a * b))
    a, b = _grad_tensor(), _grad_tensor().detach().flip(0).requires_grad_()
    want = None
    for _ in range(3):  # the later calls take kept plans
        a.grad = b.grad = None
        f(a, b).backward()
        got = (bits(a.grad), bits(b.grad))
        np.testing.assert_array_equal(got[0], bits(b.detach()))
        np.testing.assert_array_equal(got[1], bits(a.detach()))
        if want is not None:
            np.testing.assert_array_equal(got[0], want[0])
        want = got
    with torch.no_grad():  # forward only, on inputs that require grad
        np.testing.assert_array_equal(bits(f(a, b)), bits(f(a.detach(), b.detach())))


@pytest.mark.parametrize("kind", ["meta", "sparse", "nested"])
def test_kept_plans_do_not_serve_tensors_without_plain_memory(kind):
    import torch

    for x in (torch.zeros(3, dtype=torch.bfloat16), _grad_tensor(3)):  # kept plans for plain tensors
        for _ in range(2):
            bb.convert(x, "numpy", on_grad="drop")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype and say so
        odd = {"meta": lambda: torch.empty(3, dtype=torch.bfloat16, device="meta").requires_grad_(),
               "sparse": lambda: torch.zeros(3, dtype=torch.bfloat16).to_sparse(),
               "nested": lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]).to(torch.bfloat16)}[kind]()
    with pytest.raises(bb.UnsupportedTypeError):
        bb.convert(odd, "numpy", on_grad="drop")
