"""convert_tree and plan_tree (bf16bridge/trees/convert.py): every tensor leaf converted bit for bit or
refused naming its path, a bad target refused as convert refuses it, one warning a call, the cached
leaf path, plan_tree's account of copies, aliases and dropped gradients, on_unsupported='keep' and
fallback='auto' leaf by leaf."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bits, fw, make, type_framework
from tree_cases import _bf16


@pytest.mark.frameworks("torch")
def test_state_dict_to_jax_and_back():
    import torch

    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    sd = model.state_dict()
    params = bb.convert_tree(sd, to="jax")
    assert type(params) is type(sd) and list(params) == list(sd)
    for k in sd:
        assert type_framework(params[k]) == "jax"
        np.testing.assert_array_equal(bits(params[k]), bits(sd[k]))
    back = bb.convert_tree(params, to="torch", on_alias="allow")
    assert all(torch.equal(back[k].view(torch.uint16), sd[k].view(torch.uint16)) for k in sd)


@pytest.mark.frameworks("torch")
def test_errors_name_the_leaf():
    import torch

    tree = {"layer": {"w": torch.ones(2, dtype=torch.float64)}}
    with pytest.raises(bb.UnsupportedDtypeError, match=r"\['layer'\]\['w'\]"):
        bb.convert_tree(tree, "jax")


@pytest.mark.frameworks("torch")
def test_a_data_leaf_that_cannot_cross_raises_with_its_path_unless_kept():
    tree = {"a": {"labels": np.array(["x", "y"]), "w": _bf16((2,))}}
    with pytest.raises(bb.UnsupportedDtypeError, match=r"\['a'\]\['labels'\]"):
        bb.convert_tree(tree, "torch")
    with pytest.warns(bb.Bf16BridgeWarning, match=r"on_unsupported='keep' kept 1 leaf .*\['a'\]\['labels'\]"):
        out = bb.convert_tree(tree, "torch", on_unsupported="keep")
    assert out["a"]["labels"] is tree["a"]["labels"]
    with pytest.raises(bb.InvalidArgumentError):
        bb.convert_tree(tree, "torch", on_unsupported="drop")  # type: ignore[arg-type]


@pytest.mark.frameworks("torch")  # fills the plan cache by a walk to torch
@pytest.mark.parametrize("to", [["torch"], {"torch": 1}, None, 3, "nonsense"], ids=repr)
@pytest.mark.parametrize("on_unsupported", ["raise", "keep"])
def test_a_bad_target_is_refused_as_convert_refuses_it_even_with_keep(to, on_unsupported):
    # a list once reached the cached leaf path's dict lookup (a raw TypeError); a name no
    # framework has was a leaf's error, which on_unsupported="keep" kept silently
    x = make("numpy", _bf16((4,)))
    with pytest.raises(bb.UnknownFrameworkError):
        bb.convert(x, to)
    bb.convert_tree({"w": x}, "torch")  # the leaf type now has cached plans
    with pytest.raises(bb.UnknownFrameworkError):
        bb.convert_tree({"w": x}, to, on_unsupported=on_unsupported)


def test_an_array_like_of_no_registered_framework_is_not_passed_through_silently():
    class Foreign:
        def __array__(self, dtype=None, copy=None):
            return np.zeros(2)

    with pytest.raises(bb.UnsupportedTypeError, match=r"\['x'\]"):
        bb.convert_tree({"x": Foreign()}, "torch")
    assert bb.convert_tree({"x": 3, "s": "label", "n": None}, "torch") == {"x": 3, "s": "label", "n": None}


@pytest.mark.frameworks("torch")
def test_tree_warns_once_per_call_with_a_count():
    j = make("jax", _bf16((4,)))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        bb.convert_tree({"a": j, "b": [j, j]}, "torch")
    assert len(said) == 1 and said[0].category is bb.Bf16BridgeWarning
    assert str(said[0].message).startswith("3 leaves of this tree:")
    assert said[0].filename == __file__


@pytest.mark.frameworks("torch")
def test_auto_narrows_64_bit_integers_for_jax_only_when_every_value_fits():
    import jax
    import torch

    assert not jax.config.jax_enable_x64
    sd = torch.nn.BatchNorm1d(4).state_dict()  # num_batches_tracked is int64
    with pytest.raises(bb.UnsupportedDtypeError, match=r"num_batches_tracked.*fallback='auto'"):
        bb.convert_tree(sd, "jax")
    out = bb.convert_tree(sd, "jax", fallback="auto")
    assert out["num_batches_tracked"].dtype == np.int32 and int(out["num_batches_tracked"]) == 0
    p = bb.plan(np.array([1, 2], np.int64), "jax", fallback="auto")
    assert p.dtype_out == "int32" and "every value fits" in p.decision
    # the plan cannot know the values it will meet: it says the narrowing is conditional
    big = bb.plan(np.array([2**40, 1], np.int64), "jax", fallback="auto")
    assert "checked when converting: otherwise UnsupportedDtypeError" in big.decision
    edge = np.array([2**31 - 1, -(2**31)], np.int64)
    np.testing.assert_array_equal(np.asarray(bb.to_jax(edge, fallback="auto")), edge)
    for too_big in (np.array([2**31], np.int64), np.array([-(2**31) - 1], np.int64)):
        with pytest.raises(bb.UnsupportedDtypeError, match="jax_enable_x64"):
            bb.to_jax(too_big, fallback="auto")
    assert np.asarray(bb.to_jax(np.array([2**32 - 1], np.uint64), fallback="auto")).dtype == np.uint32


@pytest.mark.libraries("keras")
@pytest.mark.parametrize("backend", ["jax", "torch", "tensorflow"])
def test_to_keras_means_the_running_keras_backend(backend):
    """Keras picks its backend once per process: each backend in a fresh one."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import os
        os.environ["KERAS_BACKEND"] = "{backend}"
        import numpy as np, ml_dtypes, keras, bf16bridge as bb
        a = bb.aligned_empty(4); a[...] = np.arange(4)
        v = keras.Variable(np.arange(3, dtype=np.float32))
        y = bb.convert(a, to="keras")
        print(bb.framework_of(y), bb.framework_of(bb.convert_tree({{"v": v}}, to="keras")["v"]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == [backend, backend], out.stderr[-2000:]


# -- the cached leaf path: each leaf type planned once per call ---------------------------------


@pytest.mark.frameworks("torch")
def test_the_cached_leaf_path_converts_and_says_what_the_first_call_did():
    j = make("jax", _bf16((4,)))
    ro = bb.aligned_empty(4)
    ro[...] = _bf16((4,), seed=1)
    ro.flags.writeable = False  # torch cannot hold read-only memory: this leaf copies
    tree = {"a": j, "b": [j, j], "r": ro, "s": "label", "n": 3}
    for _ in range(3):  # the first call plans each leaf; the others take the plans kept per leaf type
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            out = bb.convert_tree(tree, "torch")
        assert [str(w.message)[:21] for w in said] == ["3 leaves of this tree"]
        assert out["s"] == "label" and out["n"] == 3
        for y, x in ((out["a"], j), (out["b"][1], j), (out["r"], ro)):
            np.testing.assert_array_equal(bits(y), bits(x))
        assert out["a"].data_ptr() == j.unsafe_buffer_pointer()  # zero-copy
        assert out["r"].data_ptr() != ro.ctypes.data  # copied
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            bb.convert_tree(tree, "torch", on_alias="allow")
        with pytest.raises(bb.CopyRequiredError, match=r"\['a'\]"):
            bb.convert_tree(tree, "torch", on_alias="error")


@pytest.mark.frameworks("torch")
def test_the_cached_leaf_path_runs_plans_that_check_their_result():
    import torch

    # torch -> jax: jax decides whether its import copies, so the plan checks the pointer
    sd = {"w": torch.arange(64, dtype=torch.bfloat16), "b": [torch.ones(64, dtype=torch.bfloat16)]}
    for _ in range(3):
        out = bb.convert_tree(sd, "jax")
        out_strict = bb.convert_tree(sd, "jax", copy=False)
        for tree in (out, out_strict):
            np.testing.assert_array_equal(bits(tree["w"]), bits(sd["w"]))
            np.testing.assert_array_equal(bits(tree["b"][0]), bits(sd["b"][0]))
            assert tree["w"].unsafe_buffer_pointer() == sd["w"].data_ptr()  # torch allocates aligned


# -- plan_tree: what each leaf's conversion would do --------------------------------------------


@pytest.mark.frameworks("torch")
def test_plan_tree_says_what_copies_and_what_aliases():
    aligned = bb.aligned_empty(64)
    aligned[...] = _bf16((64,))
    readonly = aligned.copy()
    readonly.flags.writeable = False
    tree = {"ok": aligned, "ro": readonly, "j": make("jax", _bf16((4,))), "bad": np.array(["s"])}
    p = bb.plan_tree(tree, "torch")
    assert [w for w, _ in p.leaves] == ["['ok']", "['ro']", "['j']", "['bad']"]
    assert p.copied_bytes == readonly.nbytes and p.zero_copy_bytes == aligned.nbytes + 8
    assert p.aliases == ("['j']",)
    assert [w for w, _ in p.errors] == ["['bad']"]
    text = str(p)
    assert "read-only" in text and "refused" in text
    assert p.to_dict()["copied_bytes"] == readonly.nbytes


@pytest.mark.frameworks("torch", "tensorflow")
def test_plan_tree_says_which_leaves_drop_their_gradient():
    """What convert_tree would warn about a leaf's gradient, plan_tree lists too: a torch tensor
    that requires grad, a tf tensor a tape watches; not an unwatched one."""
    import tensorflow as tf
    import torch

    w, x, quiet = torch.ones(2, requires_grad=True), tf.constant([1.0, 2.0]), tf.constant([3.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        p = bb.plan_tree({"w": w, "x": x, "quiet": quiet}, "numpy")
    assert p.drops_grad == ("['w']", "['x']"), p
    assert "['x']: takes part in autodiff; its gradient does not cross" in str(p)
    assert p.to_dict()["drops_grad"] == ["['w']", "['x']"]


# -- on_unsupported='keep': what it keeps, said; what it does not keep ------------------------------


@pytest.mark.frameworks("tensorflow", "torch")
@pytest.mark.parametrize("tree, to, kw, error", [
    ({"g": "torch-grad"}, "jax", dict(on_grad="error"), bb.UnsupportedTypeError),
    ({"r": "numpy-reversed"}, "torch", dict(copy=False), bb.CopyRequiredError),
    ({"j": "jax"}, "torch", dict(on_alias="error"), bb.CopyRequiredError),
], ids=["on_grad-error", "copy-false", "on_alias-error"])
def test_keep_does_not_keep_a_refusal_the_caller_asked_for(tree, to, kw, error):
    import jax.numpy as jnp
    import torch

    make_leaf = {"torch-grad": lambda: fw("torch").ones(3, requires_grad=True),
                 "numpy-reversed": lambda: np.ones(3, np.float32)[::-1],
                 "jax": lambda: jnp.ones(3, jnp.bfloat16)}
    tree = {k: make_leaf[v]() for k, v in tree.items()}
    with pytest.raises(error, match=r"at \['[grj]'\]"):
        bb.convert_tree(tree, to, on_unsupported="keep", **kw)


def test_keep_keeps_a_leaf_whose_values_the_fallback_refuses():
    """plan() routes int64 to a jax without x64 under fallback='auto' (narrowed, checked), but values
    past int32 are refused at conversion: under on_unsupported='keep' that leaf cannot cross either,
    so it is kept, said, and its neighbour converted (the fuzzer found it raising)."""
    import jax

    assert not jax.config.jax_enable_x64
    big, small = np.array([-(2 ** 62)], np.int64), np.array([5], np.int64)
    with pytest.raises(bb.UnsupportedDtypeError, match=r"at \['big'\]: .*every value fits"):
        bb.convert_tree({"big": big, "small": small}, "jax", fallback="auto")
    with pytest.warns(bb.Bf16BridgeWarning, match=r"kept 1 leaf .*not in jax: \['big'\]"):
        out = bb.convert_tree({"big": big, "small": small}, "jax", fallback="auto", on_unsupported="keep")
    assert out["big"] is big and isinstance(out["small"], jax.Array) and out["small"].tolist() == [5]


def test_keep_says_what_it_kept_that_the_target_cannot_hold():
    import jax

    assert not jax.config.jax_enable_x64
    tree = {"i": np.arange(3), "w": np.zeros(2, np.float32)}
    with pytest.warns(bb.Bf16BridgeWarning, match=r"kept 1 leaf .*not in jax: \['i'\]"):
        out = bb.convert_tree(tree, "jax", on_unsupported="keep")
    assert out["i"] is tree["i"] and not isinstance(out["w"], np.ndarray)
    assert "1 refused" in str(bb.plan_tree(tree, "jax"))
