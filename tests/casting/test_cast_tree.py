"""cast_tree on the trees the frameworks give: a GPT-2 state dict with a tied head, flax linen
variables and nnx state, a registered Mapping, Keras weights, containers of every framework's
leaves; tied leaves (and what is not tied: empty tensors, negated and detached views); leaves
skipped or refused (quantised floats, masked arrays, freed or deleted memory); numpy scalars and
subclasses keeping their type; importing and casting loading no framework."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, FRAMEWORKS, bits, dtype_name, fw, make


def _gpt2_state_dict(n_layer=2, d=8, vocab=11, n_ctx=4):
    """A GPT-2 shaped torch state dict with the real keys, the causal-mask buffer and the head
    tied to the token embedding (as Hugging Face's GPT2LMHeadModel.state_dict() gives them)."""
    torch = fw("torch")
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g)

    sd = {"transformer.wte.weight": w(vocab, d), "transformer.wpe.weight": w(n_ctx, d)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        sd.update({
            p + "ln_1.weight": w(d), p + "ln_1.bias": w(d),
            p + "attn.bias": torch.tril(torch.ones(n_ctx, n_ctx, dtype=torch.bool)).view(1, 1, n_ctx, n_ctx),
            p + "attn.c_attn.weight": w(d, 3 * d), p + "attn.c_attn.bias": w(3 * d),
            p + "attn.c_proj.weight": w(d, d), p + "attn.c_proj.bias": w(d),
            p + "ln_2.weight": w(d), p + "ln_2.bias": w(d),
            p + "mlp.c_fc.weight": w(d, 4 * d), p + "mlp.c_fc.bias": w(4 * d),
            p + "mlp.c_proj.weight": w(4 * d, d), p + "mlp.c_proj.bias": w(d),
        })
    sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = w(d), w(d)
    # state_dict() hands a tied weight as a second tensor over the same storage
    sd["lm_head.weight"] = sd["transformer.wte.weight"].view(vocab, d)
    return sd


@pytest.mark.frameworks("torch")
def test_gpt2_state_dict():
    torch = fw("torch")
    sd = _gpt2_state_dict()
    out, report = bb.cast_tree(sd, "bfloat16")
    assert list(out) == list(sd)
    kept = {k for k in sd if ".ln_" in k}
    assert {r.path for r in report.kept} == kept and len(kept) == 10
    assert {r.path for r in report.skipped} == {"transformer.h.0.attn.bias", "transformer.h.1.attn.bias"}
    for k, v in out.items():
        want = sd[k].dtype if k in {r.path for r in report.skipped} else (
            torch.float32 if k in kept else torch.bfloat16)
        assert v.dtype == want, k
        if k in kept or v.dtype == torch.bool:
            assert v is sd[k]  # kept at float32 / skipped: the same tensor, no copy
    np.testing.assert_array_equal(bits(out["transformer.h.0.attn.c_attn.weight"]),
                                  sd["transformer.h.0.attn.c_attn.weight"].numpy().astype(BF16).view(np.uint16))
    # the tied head stays tied: one cast tensor under both keys
    assert out["lm_head.weight"] is out["transformer.wte.weight"]
    # keep_head: the head is kept, and the embedding tied to it with it
    out, report = bb.cast_tree(sd, "bfloat16", keep_head=True)
    rows = {r.path: r for r in report.kept}
    assert rows["lm_head.weight"].rule == "head"
    assert rows["transformer.wte.weight"].rule == "head" and "same tensor as lm_head.weight" in rows[
        "transformer.wte.weight"].why
    assert out["transformer.wte.weight"].dtype == torch.float32


@pytest.mark.frameworks("torch")
def test_a_tied_leaf_kept_in_another_dtype_says_it_is_tied():
    import torch

    # a bf16 weight tied to a norm's: kept as float32 with the norm, and said so (review: the x64 check
    # reused the reason's variable and the row said fc.weight was a normalisation layer)
    w = torch.ones(4, 4, dtype=torch.bfloat16)
    out, report = bb.cast_tree({"fc.weight": w, "norm.weight": w}, "bfloat16")
    rows = {r.path: r for r in report.leaves}
    assert rows["fc.weight"].why.startswith("the same tensor as norm.weight"), rows["fc.weight"].why


@pytest.mark.frameworks("torch")
def test_cast_tree_refuses_a_torch_tensor_with_no_memory():
    import torch

    freed = torch.ones(8)
    freed.untyped_storage().resize_(0)
    for x in (freed, torch._efficientzerotensor(8)):  # torch's RuntimeError before (review)
        with pytest.raises(bb.UnsupportedTypeError, match="storage was freed"):
            bb.cast_tree({"fc.weight": x}, "bfloat16")


@pytest.mark.libraries("flax")
def test_flax_linen_variables():
    import jax
    import jax.numpy as jnp
    from flax import linen

    class Net(linen.Module):
        @linen.compact
        def __call__(self, x):
            x = linen.Dense(4)(x)
            x = linen.LayerNorm()(x)
            x = linen.BatchNorm(use_running_average=True)(x)
            return linen.Dense(2, name="head")(x)

    variables = Net().init(jax.random.key(0), jnp.ones((1, 3)))
    out, report = bb.cast_tree(variables, "bfloat16")
    dts = jax.tree_util.tree_map(lambda a: np.dtype(a.dtype).name, out)
    assert dts == {
        "params": {"Dense_0": {"kernel": "bfloat16", "bias": "bfloat16"},
                   "LayerNorm_0": {"scale": "float32", "bias": "float32"},
                   "BatchNorm_0": {"scale": "float32", "bias": "float32"},
                   "head": {"kernel": "bfloat16", "bias": "bfloat16"}},
        "batch_stats": {"BatchNorm_0": {"mean": "float32", "var": "float32"}},
    }
    assert type(out) is type(variables)
    out, report = bb.cast_tree(variables, "bfloat16", keep_head=True)
    assert out["params"]["head"]["kernel"].dtype == jnp.float32
    y = Net().apply(out, jnp.ones((1, 3), jnp.bfloat16))  # the cast parameters still run
    assert y.shape == (1, 2)


@pytest.mark.libraries("flax")
def test_flax_nnx_state_keeps_its_variables():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.lin = nnx.Linear(3, 4, rngs=rngs)
            self.norm = nnx.LayerNorm(4, rngs=rngs)
            self.rms = nnx.RMSNorm(4, rngs=rngs)

    state = nnx.state(Net(nnx.Rngs(0)))
    out, report = bb.cast_tree(state, "bfloat16")
    kernel = out["lin"]["kernel"]  # an nnx.Param (flax 0.10's state holds a VariableState of type Param)
    assert type(out) is type(state) and type(kernel) is type(state["lin"]["kernel"])
    assert getattr(kernel, "type", type(kernel)) is nnx.Param
    assert np.dtype(out["lin"]["kernel"].value.dtype) == BF16
    assert np.dtype(out["norm"]["scale"].value.dtype) == np.float32
    assert {r.path for r in report.kept} == {"norm.scale.value", "norm.bias.value", "rms.scale.value"}


def test_a_registered_mapping_whose_children_are_not_its_items_is_walked_by_its_items():
    """dm-haiku's FlatMap (its registration copied here) is a Mapping jax flattens to every nested
    leaf under positions 0, 1, ...: rebuilt by jax it would lose its keys, so the default policy
    found no layer_norm and cast it (and the report said 0..3); walked by its items it keeps both."""
    from collections.abc import Mapping

    import jax
    import jax.numpy as jnp

    class FlatMap(Mapping):
        def __init__(self, *a):
            if len(a) == 1 and isinstance(a[0], tuple) and a[0][:1] == ("__components__",):
                leaves, st = a[0][1]
                m = jax.tree_util.tree_unflatten(st, leaves)
            else:
                m = dict(*a)
            leaves, st = jax.tree_util.tree_flatten(m)
            self._structure, self._leaves, self._mapping = st, tuple(leaves), m

        def __getitem__(self, k):
            return self._mapping[k]

        def __iter__(self):
            return iter(self._mapping)

        def __len__(self):
            return len(self._mapping)

    jax.tree_util.register_pytree_node(FlatMap, lambda s: (s._leaves, s._structure),
                                       lambda st, lv: FlatMap(("__components__", (lv, st))))
    params = FlatMap({"linear": {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)},
                      "layer_norm": {"scale": jnp.ones(4), "offset": jnp.zeros(4)}})
    out, report = bb.cast_tree(params, "bfloat16")
    assert {r.path: r.after for r in report.leaves} == {
        "linear.w": "bfloat16", "linear.b": "bfloat16", "layer_norm.scale": "float32", "layer_norm.offset": "float32"}
    assert out["layer_norm"]["scale"].dtype == jnp.float32 and out["linear"]["w"].dtype == jnp.bfloat16


@pytest.mark.libraries("keras")
def test_keras_weights_are_named_by_their_paths():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.LayerNormalization(),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2, name="predictions")])
    out, report = bb.cast_tree(model.weights, "bfloat16", keep_head=True)
    rules = {r.path.rpartition(".")[2] + "@" + r.path.split(".")[1]: r.rule for r in report.leaves}
    assert rules == {
        "kernel@dense": "", "bias@dense": "",
        "gamma@layer_normalization": "norm", "beta@layer_normalization": "norm",
        "gamma@batch_normalization": "norm", "beta@batch_normalization": "norm",
        "moving_mean@batch_normalization": "norm", "moving_variance@batch_normalization": "norm",
        "kernel@predictions": "head", "bias@predictions": "head",
    }
    assert len(out) == len(model.weights) and dtype_name(out[0]) == "bfloat16"


Pair = collections.namedtuple("Pair", "a b")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_leaves_in_every_framework(framework):
    tree = {
        "block": {"ln_1": {"weight": make(framework, np.ones(4, np.float32))},
                  "proj": (make(framework, np.arange(6, dtype=np.float32).reshape(2, 3)),)},
        "pair": Pair(make(framework, np.ones(2, np.float32)), make(framework, np.ones(2, np.float16))),
        "already": make(framework, np.ones(3, BF16)),
        "steps": make(framework, np.arange(3, dtype=np.int32)),
        "mask": make(framework, np.array([True, False])),
        "label": "not a tensor", "lr": 0.1,
    }
    out, report = bb.cast_tree(tree, "bfloat16")
    assert dtype_name(out["block"]["ln_1"]["weight"]) == "float32"
    assert dtype_name(out["block"]["proj"][0]) == "bfloat16" and type(out["block"]["proj"]) is tuple
    assert bb.framework_of(out["block"]["proj"][0]) == framework
    for k in ("already", "steps", "mask"):
        assert out[k] is tree[k]  # no copy of what needs no cast
    assert out["label"] == "not a tensor" and out["lr"] == 0.1
    assert type(out["pair"]) is Pair and dtype_name(out["pair"].b) == "bfloat16"
    assert {r.path: r.action for r in report.leaves} == {
        "block.ln_1.weight": "kept", "block.proj.0": "cast", "pair.0": "cast", "pair.1": "cast",
        "already": "unchanged", "steps": "skipped", "mask": "skipped"}
    # the input is untouched
    assert dtype_name(tree["block"]["proj"][0]) == "float32"


@pytest.mark.parametrize("target", ["float16", "float32"])
def test_other_targets_and_kept_leaves_widen_to_float32(target):
    tree = {"norm": {"scale": np.ones(2, BF16)}, "dense": {"kernel": np.ones((2, 2), BF16)}}
    out, report = bb.cast_tree(tree, target)
    assert out["norm"]["scale"].dtype == np.float32  # a bf16 norm is widened (exactly) to float32
    assert out["dense"]["kernel"].dtype == np.dtype(target)
    out, report = bb.cast_tree(tree, target, keep_dtype=None)
    assert out["norm"]["scale"] is tree["norm"]["scale"]  # keep_dtype=None: kept as they are


@pytest.mark.frameworks("torch")
def test_quantised_float_leaves_are_skipped():
    torch = fw("torch")
    w8 = torch.ones(4).to(torch.float8_e4m3fn)
    out, report = bb.cast_tree({"w8": w8, "scale": torch.ones(1)}, "bfloat16")
    assert out["w8"] is w8 and [r.action for r in report.leaves] == ["skipped", "cast"]
    assert report.leaves[0].why.startswith("a quantised float") and report.leaves[0].nbytes_before == 4


def test_a_masked_array_is_refused_rather_than_cast_without_its_mask():
    # the cast made a plain array: the masked value (2.0) came back as data, the mask gone
    a = np.ma.masked_array(np.array([1.0, 2.0], np.float32), mask=[False, True])
    with pytest.raises(bb.UnsupportedTypeError, match=r"at w: a numpy masked array would lose its mask.*a\.filled"):
        bb.cast_tree({"w": a}, "bfloat16")
    out, report = bb.cast_tree({"w": a}, "float32")  # handed back as it is: nothing lost
    assert out["w"] is a and report.leaves[0].action == "unchanged"


@pytest.mark.frameworks("torch")
def test_empty_tensors_are_not_tied_to_each_other():
    # every empty torch tensor has data_ptr 0: two of them are still two tensors
    torch = fw("torch")
    out, report = bb.cast_tree({"ln_f.weight": torch.zeros(0), "w": torch.zeros(0)}, "bfloat16")
    assert [(r.path, r.action) for r in report.leaves] == [("ln_f.weight", "kept"), ("w", "cast")]
    assert out["w"].dtype == torch.bfloat16 and out["ln_f.weight"].dtype == torch.float32


@pytest.mark.frameworks("torch")
def test_a_lazily_negated_view_is_not_tied_to_its_storage():
    """c.imag and c.conj().imag share c's storage, offset, shape and strides: the second is the first
    negated by a lazy bit (torch's is_neg). Taken for tied weights, b came back with a's values."""
    torch = fw("torch")
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    tree = {"a": c.imag, "b": c.conj().imag}
    assert tree["b"].is_neg()
    out, report = bb.cast_tree(tree, "bfloat16")
    for key in tree:
        np.testing.assert_array_equal(bits(out[key]), bits(tree[key].resolve_neg().to(torch.bfloat16)), err_msg=key)
    assert not [n for n in report.notes if "tied" in n], report.notes


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("order", ["parameter first", "detached first"])
def test_a_detached_view_of_a_parameter_is_not_tied_to_it(order):
    """p and p.detach() share everything but autograd: cast once for both, the detached leaf came
    back in p's graph (requires_grad, a grad_fn), or p came back detached, by the keys' order."""
    torch = fw("torch")
    p = torch.nn.Parameter(torch.randn(3, 3))
    items = [("a", p), ("b", p.detach())]
    out, _ = bb.cast_tree(dict(items if order == "parameter first" else items[::-1]), "bfloat16")
    assert out["a"].requires_grad and out["a"].grad_fn is not None
    assert not out["b"].requires_grad and out["b"].grad_fn is None
    np.testing.assert_array_equal(bits(out["a"].detach()), bits(out["b"]))


def test_a_numpy_scalar_or_subclass_keeps_its_type_as_astype_keeps_it():
    """cast_tree casts as ndarray.astype does: np.float32(1.5) became a 0-d array and an np.matrix a
    plain array, whose * is elementwise, not a matrix product."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # numpy's word on np.matrix itself
        m = np.matrix([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
        out, report = bb.cast_tree({"m": m, "s": np.float32(1.5), "a": np.ones(2, np.float32)}, "float16", policy=())
        assert type(out["m"]) is np.matrix and (out["m"] * out["m"]).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    assert type(out["s"]) is np.float16 and out["s"] == 1.5
    assert type(out["a"]) is np.ndarray and out["a"].dtype == np.float16
    assert [r.action for r in report.leaves] == ["cast"] * 3


@pytest.mark.frameworks("jax")
def test_cast_tree_of_a_deleted_jax_array_is_our_error():
    import jax.numpy as jnp

    a = jnp.ones(4, jnp.float32)
    a.delete()
    with pytest.raises(bb.UnsupportedTypeError,
                       match=r"at \['a'\]: this jax array was deleted .*convert the array the donating call returned"):
        bb.cast_tree({"a": a}, "bfloat16")


def test_import_loads_no_framework():
    code = textwrap.dedent("""
        import sys, numpy as np
        import bf16bridge as bb
        out, report = bb.cast_tree({"ln_f": {"w": np.ones(2, np.float32)}, "w": np.ones(2, np.float32)}, "bfloat16")
        print(sorted(m for m in ("torch", "jax", "jaxlib", "tensorflow", "keras") if m in sys.modules), len(report.kept))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] 1"
