"""cast_tree and cast_module: floating weights to a lower precision in their own framework,
normalisation layers (and, asked, the head) kept in float32, by name for trees and by type for
modules; the cast model still runs; the report says what happened to every leaf."""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import bf16bridge as bb
from bf16bridge.core import dtypes
import strategies  # also loads the derandomized hypothesis profile
from bf16bridge.casting import DEFAULT_POLICY, Rule
from conftest import BF16, FRAMEWORKS, PRESENT, bits, dtype_name, fw, make

# -- rounding, in each framework ----------------------------------------------------------------

#: float32 bit patterns with a known bf16 rounding: ties to even (down and up), above a tie,
#: subnormals, the largest finite (rounds to inf), inf, -0
ROUNDING = [
    (0x3F808000, 0x3F80),  # 1 + 2^-8: a tie, the even neighbour is 1.0
    (0x3F818000, 0x3F82),  # a tie whose even neighbour is above
    (0x3F808001, 0x3F81),  # just above a tie
    (0xBF808001, 0xBF81),
    (0x00000001, 0x0000),  # the smallest subnormal rounds to zero
    (0x00400000, 0x0040),  # a subnormal kept (no flush to zero)
    (0x80400000, 0x8040),
    (0x007FFFFF, 0x0080),  # the largest subnormal rounds up to the smallest normal
    (0x7F7FFFFF, 0x7F80),  # the largest finite float32 overflows to inf
    (0x7F800000, 0x7F80),
    (0xFF800000, 0xFF80),
    (0x80000000, 0x8000),
]

#: what a NaN becomes, by framework and length (2 values, 1024 values: a vectorised loop), for
#: +NaN and -NaN, as measured here (docs/casting.md): ml_dtypes (numpy) and XLA keep the sign;
#: torch writes 0xFFFF (FACTS.md saw 0x7FC0 from its scalar code); tensorflow keeps the sign on
#: a short tensor and drops it in its vectorised loop
NAN_BITS = {
    "numpy": {2: {(0x7FC0, 0xFFC0)}, 1024: {(0x7FC0, 0xFFC0)}},
    "jax": {2: {(0x7FC0, 0xFFC0)}, 1024: {(0x7FC0, 0xFFC0)}},
    "torch": {2: {(0xFFFF, 0xFFFF), (0x7FC0, 0x7FC0)}, 1024: {(0xFFFF, 0xFFFF)}},
    "tensorflow": {2: {(0x7FC0, 0xFFC0)}, 1024: {(0x7FC0, 0x7FC0)}},
}


def _f32(u32) -> np.ndarray:
    return np.asarray(u32, dtype=np.uint32).view(np.float32)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_float32_rounds_to_nearest_even_in_each_framework(framework):
    src = _f32([u for u, _ in ROUNDING])
    out, report = bb.cast_tree({"w": make(framework, src)}, "bfloat16")
    assert bb.framework_of(out["w"]) == framework and dtype_name(out["w"]) == "bfloat16"
    np.testing.assert_array_equal(bits(out["w"]), np.array([b for _, b in ROUNDING], np.uint16))
    assert [r.action for r in report.leaves] == ["cast"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("n", [2, 1024])
def test_nan_stays_nan_with_each_framework_s_bits(framework, n):
    src = _f32([0x7FC00000, 0xFFC00000] * (n // 2))
    out, _ = bb.cast_tree([make(framework, src)], "bfloat16")
    got = bits(out[0])
    pair = (int(got[0]), int(got[1]))
    assert pair in NAN_BITS[framework][n], [hex(b) for b in pair]
    assert (got[0::2] == pair[0]).all() and (got[1::2] == pair[1]).all()


@pytest.mark.parametrize("framework", FRAMEWORKS)
@given(raw=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_rounding_matches_ml_dtypes_bit_for_bit(framework, raw):
    src = _f32(raw)
    with np.errstate(invalid="ignore"):
        want = src.astype(ml_dtypes.bfloat16).view(np.uint16)
    out, _ = bb.cast_tree((make(framework, src),), "bfloat16")
    got = bits(out[0])
    nan = np.isnan(src)
    np.testing.assert_array_equal(got[~nan], want[~nan])
    assert ((got[nan] & 0x7F80) == 0x7F80).all() and (got[nan] & 0x7F).all()  # still NaN


@pytest.fixture
def x64():
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_float64_rounds_twice_like_ml_dtypes_in_every_framework(framework, x64):
    # 1 + 2^-8 + 2^-30 lies above the bf16 tie 1 + 2^-8: rounded once it is 1 + 2^-7 (0x3F81); every
    # framework here goes through float32 first (1 + 2^-8 exactly), then ties to even: 1.0 (0x3F80)
    src = np.array([1 + 2**-8 + 2**-30, -(1 + 2**-8 + 2**-30), 0.1, 1e300], np.float64)
    with np.errstate(over="ignore"):
        want = src.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert want[0] == 0x3F80 and want[3] == 0x7F80
    out, report = bb.cast_tree({"w": make(framework, src)}, "bfloat16")
    np.testing.assert_array_equal(bits(out["w"]), want)
    assert report.leaves[0].before == "float64" and report.bytes_before == 32 and report.bytes_after == 8


_FLOATS = ("bfloat16", "float16", "float32", "float64")


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("src,dst", [(s, d) for s in _FLOATS for d in _FLOATS if s != d])
def test_every_cast_between_the_floats_gives_ml_dtypes_bits(framework, src, dst, x64):
    """Every exponent (subnormals too) under mantissas at and beside each tie: cast_tree's bits are
    numpy's (ml_dtypes') in every framework. tensorflow's own casts flush subnormals between float64
    and the others, and from float32 and bf16 to float64 (a widening said to be exact): 40,926 of
    240k float32 values came back 0. torch rounds float64 -> float16 through float32 (Tensor.to), one
    float16 ulp off near a tie: documented, and checked here to be the only difference."""
    from bf16bridge.adapters.trials import _rounding_probe

    a = _rounding_probe(src)
    out, report = bb.cast_tree({"w": make(framework, a)}, dst, policy=())
    assert report.leaves[0].action == "cast" and dtype_name(out["w"]) == dst
    got = bb.convert(out["w"], "numpy", copy=True)
    with np.errstate(all="ignore"):  # NaN patterns and overflows warn in numpy's casts
        want = a.astype(dtypes.numpy_dtype(dst))
        twice = a.astype(np.float32).astype(np.float16)  # what docs/casting.md says torch gives from float64
        nan = np.isnan(want.astype(np.float64))
        assert np.isnan(got[nan].astype(np.float64)).all()
    differ = bits(got)[~nan] != bits(want)[~nan]
    if framework == "torch" and (src, dst) == ("float64", "float16"):
        np.testing.assert_array_equal(bits(got)[~nan], bits(twice)[~nan])
        assert differ.any()  # (else the doc's exception is wrong)
    else:
        assert not differ.any(), f"{int(differ.sum())} of {differ.size} values differ, e.g. {a[~nan][differ][:3]}"


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("in_graph", [False, True], ids=["eager", "tf.function"])
def test_tensorflow_casts_in_numpy_keep_the_gradient(in_graph):
    """Where tf.cast gives other bits, the cast is ml_dtypes' in numpy with tf.cast's gradient,
    eagerly and inside a tf.function (under a tape too). There it runs on tensorflow's threads,
    which flush subnormals for numpy as well (a numpy_function gave tf.cast's zeros): they are kept
    for the cast (fpenv). Under jit_compile it cannot leave the compiled graph: our error."""
    from bf16bridge.adapters.tensorflow import probe as tf_probe

    import tensorflow as tf

    assert not tf_probe.rounds_as_ml_dtypes("float32", "float64")  # (else this tests nothing)
    a = np.array([1e-39, -3e-39, 1.5, 2.0], np.float32)
    want = bits(a.astype(np.float64))
    v = tf.Variable(a)

    def cast(x):
        out = bb.cast_tree({"w": x}, "float64", policy=())[0]["w"]
        return out, tf.reduce_sum(out * tf.constant([1.0, 2.0, 3.0, 4.0], tf.float64))

    run = tf.function(cast) if in_graph else cast
    with tf.GradientTape() as tape:
        out, loss = run(v)
    np.testing.assert_array_equal(bits(out), want)
    np.testing.assert_array_equal(tape.gradient(loss, v).numpy(), [1, 2, 3, 4])
    if in_graph:
        with pytest.raises(bb.UnsupportedTypeError, match="flush subnormals.*jit_compile"):
            tf.function(cast, jit_compile=True)(tf.constant(a))


@pytest.mark.parametrize("kw", [dict(dtype="float64"), dict(dtype="bfloat16", keep="w", keep_dtype="float64")],
                         ids=["dtype", "keep_dtype"])
def test_jax_without_x64_refuses_float64_rather_than_report_it(kw):
    # jax without x64 makes astype(float64) float32: the report once said "cast float32 -> float64"
    import jax
    import jax.numpy as jnp

    assert not jax.config.jax_enable_x64
    with pytest.raises(bb.UnsupportedDtypeError, match=r"at w: .*float64.*jax_enable_x64"):
        bb.cast_tree({"w": jnp.ones(3, jnp.float32)}, **kw)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_report_says_the_dtype_the_result_has(framework, x64):
    out, report = bb.cast_tree({"w": make(framework, np.ones(3, np.float32)), "n": make(framework, np.ones(2))},
                               "float64", keep="n", keep_dtype="float16")
    for name, row in (("w", report.leaves[0]), ("n", report.leaves[1])):
        assert dtype_name(out[name]) == row.after, (name, row)
    assert [r.after for r in report.leaves] == ["float64", "float16"]


# -- the default policy against real names ---------------------------------------------------------

#: (label, the rule that keeps it; None: cast). Names from the models' own state dicts and
#: parameter trees: GPT-2, BERT, Llama, ViT (HF and timm), torchvision ResNet, CLIP, T5, flax, Keras.
REAL_NAMES = [
    ("transformer.h.0.ln_1.weight", "norm-abbreviation"),
    ("transformer.h.0.ln_2.bias", "norm-abbreviation"),
    ("transformer.ln_f.weight", "norm-abbreviation"),
    ("transformer.h.0.attn.c_attn.weight", None),
    ("transformer.h.0.mlp.c_fc.weight", None),
    ("transformer.wte.weight", None),
    ("lm_head.weight", None),
    ("bert.embeddings.LayerNorm.weight", "norm"),
    ("bert.encoder.layer.0.attention.output.LayerNorm.bias", "norm"),
    ("bert.encoder.layer.0.attention.self.query.weight", None),
    ("cls.predictions.transform.LayerNorm.gamma", "norm"),
    ("model.layers.0.input_layernorm.weight", "norm"),
    ("model.layers.0.post_attention_layernorm.weight", "norm"),
    ("model.layers.0.self_attn.q_norm.weight", "norm"),
    ("model.layers.0.self_attn.rotary_emb.inv_freq", "rotary"),
    ("model.layers.0.mlp.gate_proj.weight", None),
    ("model.norm.weight", "norm"),
    ("vit.encoder.layer.0.layernorm_before.weight", "norm"),
    ("vit.layernorm.bias", "norm"),
    ("blocks.0.norm1.weight", "norm"),
    ("fc_norm.weight", "norm"),
    ("blocks.0.mlp.fc1.weight", None),
    ("bn1.weight", "norm-abbreviation"),
    ("layer1.0.bn2.running_mean", "norm-abbreviation"),
    ("layer1.0.downsample.0.weight", None),
    ("layer1.0.downsample.1.weight", "batch-norm-layer"),
    ("layer1.0.downsample.1.running_var", "batch-statistics"),
    ("layer1.0.conv1.weight", None),
    ("fc.weight", None),
    ("visual.ln_pre.weight", "norm-abbreviation"),
    ("encoder.block.0.layer.0.layer_norm.weight", "norm"),
    ("params.LayerNorm_0.scale", "norm"),
    ("params.BatchNorm_0.bias", "norm"),
    ("batch_stats.BatchNorm_0.var", "norm"),
    ("params.Dense_0.kernel", None),
    ("sequential.batch_normalization.moving_variance", "norm"),
    ("params.kernel_init_scale", None),  # "ln" inside a word is no layer name
]


def test_default_policy_on_real_names():
    tree = {label: np.zeros(2, np.float32) for label, _ in REAL_NAMES}
    _, report = bb.cast_tree(tree, "bfloat16")
    got = {r.path: (r.rule or None) for r in report.leaves}
    assert got == dict(REAL_NAMES)
    assert {r.path for r in report.cast} == {label for label, rule in REAL_NAMES if rule is None}


#: keep_head=True on real names: (labels, the ones kept as the head, the rule)
HEADS = [
    (["transformer.h.0.attn.c_attn.weight", "lm_head.weight"], {"lm_head.weight"}, "head"),
    (["bert.pooler.dense.weight", "classifier.weight", "classifier.bias"], {"classifier.weight", "classifier.bias"},
     "head"),
    (["vit.encoder.layer.0.output.dense.weight", "heads.head.weight"], {"heads.head.weight"}, "head"),
    (["layer4.1.conv2.weight", "fc.weight", "fc.bias"], {"fc.weight", "fc.bias"}, "head-top-level"),
    (["layers.0.feed_forward.w1.weight", "output.weight"], {"output.weight"}, "head-top-level"),
    (["params.Dense_0.kernel", "params.Dense_1.kernel", "params.Dense_1.bias"],
     {"params.Dense_1.kernel", "params.Dense_1.bias"}, "head (last layer)"),
    # flax linen: batch_stats come after params; the last layer is the last one the policy does not keep
    (["params.Dense_0.kernel", "params.BatchNorm_0.scale", "params.Dense_1.kernel", "batch_stats.BatchNorm_0.var"],
     {"params.Dense_1.kernel", "params.BatchNorm_0.scale", "batch_stats.BatchNorm_0.var"}, None),
]


@pytest.mark.parametrize("labels, head, rule", HEADS)
def test_keep_head_finds_the_head_by_name_or_as_the_last_layer(labels, head, rule):
    tree = {label: np.ones(2, np.float32) for label in labels}
    out, report = bb.cast_tree(tree, "bfloat16", keep_head=True)
    assert {r.path for r in report.kept} == head
    if rule is not None:
        assert {r.rule for r in report.kept} == {rule}
    else:
        assert {r.path for r in report.kept if r.rule == "head (last layer)"} == {"params.Dense_1.kernel"}
    assert all(out[k].dtype == (np.float32 if k in head else BF16) for k in labels)
    _, plain = bb.cast_tree(tree, "bfloat16")
    assert not {r.path for r in plain.kept if r.rule.startswith("head")}  # without keep_head, no head


# -- trees the frameworks give ------------------------------------------------------------------

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


# -- the policy as data -------------------------------------------------------------------------------

def test_policy_is_overridable():
    tree = {"h.0.ln_1.weight": np.ones(2, np.float32), "h.0.attn.c_attn.weight": np.ones(2, np.float32),
            "wte.weight": np.ones(2, np.float32)}
    _, r = bb.cast_tree(tree, "bfloat16", keep=["attn\\.c_attn"])
    assert {x.path: x.rule for x in r.kept} == {"h.0.ln_1.weight": "norm-abbreviation",
                                                "h.0.attn.c_attn.weight": "attn\\.c_attn"}
    _, r = bb.cast_tree(tree, "bfloat16", policy=())
    assert not r.kept and len(r.cast) == 3
    mine = Rule("embeddings", r"^wte\.", "embeddings stay exact for our lookup tests")
    _, r = bb.cast_tree(tree, "bfloat16", policy=[mine])
    assert [(x.path, x.rule, x.why) for x in r.kept] == [("wte.weight", "embeddings", mine.why)]
    _, r = bb.cast_tree(tree, "bfloat16", policy=DEFAULT_POLICY + (mine,))
    assert len(r.kept) == 2


def test_every_default_rule_says_why():
    for rule in DEFAULT_POLICY + bb.casting.HEAD_POLICY + bb.casting.DEFAULT_KEEP_TYPES:
        assert len(rule.why) > 30 and rule.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_POLICY[0].pattern = "x"  # type: ignore[misc]


# -- the report ------------------------------------------------------------------------------------------

def test_report_lists_every_leaf_and_the_bytes():
    tree = {"ln_f": {"weight": np.ones(10, np.float32)}, "fc": {"weight": np.ones((10, 10), np.float32)},
            "emb": np.ones(5, BF16), "step": np.array(3, np.int64)}
    _, report = bb.cast_tree(tree, "bfloat16")
    assert [(r.path, r.action, r.before, r.after, r.nbytes_before, r.nbytes_after) for r in report.leaves] == [
        ("ln_f.weight", "kept", "float32", "float32", 40, 40),
        ("fc.weight", "cast", "float32", "bfloat16", 400, 200),
        ("emb", "unchanged", "bfloat16", "bfloat16", 10, 10),
        ("step", "skipped", "int64", "int64", 8, 8),
    ]
    assert report.bytes_before == 458 and report.bytes_after == 258
    assert [r.path for r in report.cast] == ["fc.weight"] and [r.path for r in report.skipped] == ["step"]
    text = str(report)
    assert text.splitlines()[0] == "cast to bfloat16: 4 leaves, 458 B -> 258 B"
    assert "ln_f.weight: kept float32 [norm-abbreviation]" in text
    assert "fc.weight: cast float32 -> bfloat16" in text and "step: skipped int64 (not floating)" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.dtype = "float16"  # type: ignore[misc]


def test_docs_show_every_rule_and_a_real_report():
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "casting.md").read_text(encoding="utf-8")
    for rule in DEFAULT_POLICY + bb.casting.HEAD_POLICY + bb.casting.DEFAULT_KEEP_TYPES:
        assert f"| `{rule.name}` |" in doc, rule.name
    tree = {"ln_f": {"weight": np.ones(10, np.float32)}, "fc": {"weight": np.ones((10, 10), np.float32)},
            "emb": np.ones(5, BF16), "step": np.array(3, np.int64)}
    # the page's own session (tests/test_docs_examples.py runs it) prints this report, to its last line
    assert '[1])\n' + str(bb.cast_tree(tree, "bfloat16")[1]) + "\n```" in doc
    for framework, by_n in NAN_BITS.items():  # the NaN table says what the test measures
        for n, pairs in by_n.items():
            assert any(f"{a:#06X}, {b:#06X}".replace("0X", "0x") in doc for a, b in pairs), (framework, n)


def test_report_str_stays_short_for_a_large_model():
    tree = {f"h.{i}.w": np.ones(1, np.float32) for i in range(100)}
    text = str(bb.cast_tree(tree, "bfloat16")[1])
    assert "... 60 more (report.leaves lists every one)" in text and len(text.splitlines()) < 50


# -- bad input -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, says", [
    ("bf16", "'bf16' is not a dtype name bf16bridge knows"),
    ("int8", "int8 is not a floating dtype"),
    ("bool", "bool is not a floating dtype"),
    (np.int32, "int32 is not a floating dtype"),
    (object(), "is not a dtype name bf16bridge knows"),
    ("float8_e4m3fn", "a cast to float8_e4m3fn needs scales (quantisation)"),
    (ml_dtypes.float8_e5m2, "a cast to float8_e5m2 needs scales"),
    ("int4", "int4 is not a floating dtype"),
    (None, "None is not a dtype name bf16bridge knows"),  # np.dtype(None) is float64: it cast to that
])
def test_bad_target_dtype(dtype, says):
    for call in (bb.cast_tree, bb.cast_module):
        with pytest.raises(bb.InvalidArgumentError) as err:
            call({"w": np.ones(2, np.float32)}, dtype)
        assert says in str(err.value) and "bfloat16, float16, float32, float64" in str(err.value)


@pytest.mark.frameworks("torch")
def test_quantised_float_leaves_are_skipped():
    torch = fw("torch")
    w8 = torch.ones(4).to(torch.float8_e4m3fn)
    out, report = bb.cast_tree({"w8": w8, "scale": torch.ones(1)}, "bfloat16")
    assert out["w8"] is w8 and [r.action for r in report.leaves] == ["skipped", "cast"]
    assert report.leaves[0].why.startswith("a quantised float") and report.leaves[0].nbytes_before == 4


def test_numpy_dtype_objects_are_taken():
    out, _ = bb.cast_tree([np.ones(2, np.float32)], ml_dtypes.bfloat16)
    assert out[0].dtype == BF16


@pytest.mark.parametrize("kwargs, says", [
    ({"keep": [3]}, "neither a pattern (str) nor a bf16bridge.casting.Rule"),
    ({"keep": 3}, "3 is neither a pattern (str) nor a bf16bridge.casting.Rule"),  # was Python's TypeError
    ({"policy": 3.5}, "3.5 is neither a pattern (str) nor a bf16bridge.casting.Rule"),
    ({"keep": ["("]}, "is not a regular expression"),
    ({"keep_head": "yes"}, "keep_head must be True or False"),
    ({"keep_dtype": "int8"}, "int8 is not a floating dtype"),
])
def test_bad_arguments(kwargs, says):
    with pytest.raises(bb.InvalidArgumentError) as err:
        bb.cast_tree({"w": np.ones(2, np.float32)}, "bfloat16", **kwargs)
    assert says in str(err.value)


def test_a_masked_array_is_refused_rather_than_cast_without_its_mask():
    # the cast made a plain array: the masked value (2.0) came back as data, the mask gone
    a = np.ma.masked_array(np.array([1.0, 2.0], np.float32), mask=[False, True])
    with pytest.raises(bb.UnsupportedTypeError, match=r"at w: a numpy masked array would lose its mask.*a\.filled"):
        bb.cast_tree({"w": a}, "bfloat16")
    out, report = bb.cast_tree({"w": a}, "float32")  # handed back as it is: nothing lost
    assert out["w"] is a and report.leaves[0].action == "unchanged"


def test_cast_module_refuses_what_is_no_model():
    with pytest.raises(bb.UnsupportedTypeError, match="use cast_tree"):
        bb.cast_module({"w": np.ones(2, np.float32)}, "bfloat16")


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


# -- cast_module (torch) ------------------------------------------------------------------------------

def _block_model():
    """A small GPT-2 style model: token and position embeddings, two pre-norm transformer blocks
    with LayerNorm, a final LayerNorm and a head tied to the token embedding."""
    torch = fw("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
            self.ln_2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            h = self.ln_1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))

    class Tiny(nn.Module):
        def __init__(self, d=16, vocab=32, n_ctx=8):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_ctx, d)
            self.h = nn.ModuleList([Block(d), Block(d)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    torch.manual_seed(0)
    return Tiny().eval()


@pytest.mark.frameworks("torch")
def test_cast_module_keeps_norms_float32_and_still_runs():
    torch = fw("torch")
    model = _block_model()
    ids = torch.randint(0, 32, (2, 8))
    with torch.no_grad():
        want = model(ids)
    params_before = {n: p for n, p in model.named_parameters()}
    out, report = bb.cast_module(model, "bfloat16")
    assert out is model  # in place, as Module.to
    for name, p in model.named_parameters():
        assert p is params_before[name]  # the same Parameter objects (an optimizer still holds them)
        assert p.dtype == (torch.float32 if ".ln_" in f".{name}" else torch.bfloat16), name
    seen = []
    norm_forward = torch.nn.functional.layer_norm

    def spy(x, *args, **kwargs):  # what the kept LayerNorm computes on
        seen.append((x.dtype, args[1].dtype))
        return norm_forward(x, *args, **kwargs)

    model.h[0].mlp[0].register_forward_pre_hook(lambda m, a: seen.append(("linear", a[0].dtype)) and None)
    torch.nn.functional.layer_norm = spy
    try:
        with torch.no_grad():
            got = model(ids)
    finally:
        torch.nn.functional.layer_norm = norm_forward
    assert got.dtype == torch.bfloat16
    # every LayerNorm got float32 input and weights; the Linear after one got bf16
    assert seen.count((torch.float32, torch.float32)) == 5 and ("linear", torch.bfloat16) in seen
    assert len(seen) == 6
    err = (got.float() - want).abs().max() / want.abs().max()
    assert err < 0.05, float(err)
    assert {r.rule for r in report.kept} == {"type layer-norm"} and len(report.kept) == 10
    assert any("forward hooks on 5 kept module(s)" in n for n in report.notes)


@pytest.mark.frameworks("torch")
def test_kept_norm_computes_in_float32_on_the_upcast_input():
    # Intel-style mixed precision: a bf16 Linear, then the LayerNorm in float32 on the exact widening
    # of its bf16 input, rounded back to bf16 once, then a bf16 Linear; checked bit for bit
    torch = fw("torch")
    nn = torch.nn
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 4))
    ref = [m.weight.detach().clone() for m in model], [m.bias.detach().clone() for m in model]
    x = torch.randn(5, 8).to(torch.bfloat16)
    bb.cast_module(model, "bfloat16")
    assert model[1].weight.dtype == torch.float32 and model[0].weight.dtype == torch.bfloat16
    with torch.no_grad():
        got = model(x)
        h = torch.nn.functional.linear(x, ref[0][0].bfloat16(), ref[1][0].bfloat16())
        h = torch.nn.functional.layer_norm(h.float(), (16,), ref[0][1], ref[1][1]).bfloat16()
        want = torch.nn.functional.linear(h, ref[0][2].bfloat16(), ref[1][2].bfloat16())
    np.testing.assert_array_equal(bits(got), bits(want))


def _rms_model():
    """Llama's RMSNorm as Hugging Face writes it (a plain Module named LlamaRMSNorm): computes in
    float32 and returns ``weight * x``, which is float32 when the weight is."""
    torch = fw("torch")
    nn = torch.nn

    class LlamaRMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.variance_epsilon = eps

        def forward(self, hidden_states):
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(8, 8), LlamaRMSNorm(8), nn.Linear(8, 8))


@pytest.mark.frameworks("torch")
def test_hooks_are_what_lets_a_kept_norm_feed_a_cast_layer():
    torch = fw("torch")
    x = torch.randn(3, 8).to(torch.bfloat16)
    model, report = bb.cast_module(_rms_model(), "bfloat16", autocast_kept=False)
    assert model[1].weight.dtype == torch.float32 and report.kept[0].rule == "type rms-norm"
    with pytest.raises(RuntimeError, match="dtype"):  # float32 out of the norm into a bf16 Linear
        model(x)
    model, report = bb.cast_module(_rms_model(), "bfloat16")
    assert model(x).dtype == torch.bfloat16


@pytest.mark.frameworks("torch")
def test_torch_norm_types_are_kept():
    torch = fw("torch")
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4), nn.InstanceNorm2d(4, affine=True),
                          nn.LocalResponseNorm(2), nn.Flatten(), nn.LazyLinear(3), nn.RMSNorm(3), nn.LayerNorm(3))
    x = torch.randn(2, 3, 6, 6)
    model(x)  # materialise the lazy layer
    model.eval()
    bb.cast_module(model, "bfloat16")
    kept = {type(m).__name__ for m in model if any(t.dtype == torch.float32 for t in m.parameters(recurse=False))}
    assert kept == {"BatchNorm2d", "GroupNorm", "InstanceNorm2d", "RMSNorm", "LayerNorm"}
    assert model[1].running_var.dtype == torch.float32 and model[1].num_batches_tracked.dtype == torch.int64
    assert model[0].weight.dtype == torch.bfloat16
    assert model(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.frameworks("torch")
def test_cast_module_keep_head():
    torch = fw("torch")
    model = _block_model()
    ids = torch.randint(0, 32, (2, 8))
    _, report = bb.cast_module(model, "bfloat16", keep_head=True)
    assert model.lm_head.weight.dtype == torch.float32
    assert model.wte.weight is model.lm_head.weight  # still tied
    assert "wte.weight is tied to lm_head.weight: kept in float32 with it" in report.notes
    assert model(ids).dtype == torch.float32  # the head computes, and returns, float32
    # no module named like a head: the last Linear
    nn = torch.nn
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    _, report = bb.cast_module(seq, "bfloat16", keep_head=True)
    assert {r.path: r.rule for r in report.kept} == {"2.weight": "head (last linear)", "2.bias": "head (last linear)"}
    assert seq(torch.randn(1, 4).bfloat16()).dtype == torch.float32


@pytest.mark.frameworks("torch")
def test_cast_module_copy_hooks_keep_types_and_grads():
    torch = fw("torch")
    model = _block_model()
    copy, _ = bb.cast_module(model, "bfloat16", inplace=False)
    assert copy is not model and model.h[0].attn.in_proj_weight.dtype == torch.float32
    assert not model.h[0].ln_1._forward_hooks  # the original got no hooks
    # a second cast replaces the hooks of the first rather than adding more
    bb.cast_module(copy, "bfloat16")
    assert len(copy.h[0].ln_1._forward_hooks) == 1 and len(copy.h[0].ln_1._forward_pre_hooks) == 1
    # keep_types: replace the default (nothing kept), or name a class
    plain = _block_model()
    plain.h[0].mlp[0].weight.grad = torch.ones_like(plain.h[0].mlp[0].weight)
    _, report = bb.cast_module(plain, "bfloat16", keep_types=(), keep=[r"attn\.out_proj"])
    assert plain.h[0].ln_1.weight.dtype == torch.bfloat16
    assert plain.h[0].mlp[0].weight.grad.dtype == torch.bfloat16  # the gradient follows its parameter
    assert {r.path for r in report.kept} == {"h.0.attn.out_proj.weight", "h.0.attn.out_proj.bias",
                                             "h.1.attn.out_proj.weight", "h.1.attn.out_proj.bias"}
    other = _block_model()
    bb.cast_module(other, "float16", keep_types=[torch.nn.Embedding])
    assert other.wte.weight.dtype == torch.float32 and other.ln_f.weight.dtype == torch.float16


@pytest.mark.frameworks("torch")
def test_hooks_cast_keyword_inputs_and_nested_outputs():
    torch = fw("torch")
    nn = torch.nn
    seen = []

    class ResidualLayerNorm(nn.Module):  # kept by its class name; takes a keyword, returns a dict
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(4)

        def forward(self, x, *, residual=None, scale=2):
            seen.append((x.dtype, residual.dtype, scale))
            y = self.norm(x + residual)
            return {"out": y, "stats": (y.mean(-1), torch.ones(1, dtype=torch.int64)), "scale": scale}

    model = ResidualLayerNorm()
    bb.cast_module(model, "bfloat16")
    x = torch.randn(2, 4).bfloat16()
    out = model(x, residual=x, scale=3)
    assert seen == [(torch.float32, torch.float32, 3)]
    assert out["out"].dtype == torch.bfloat16 and out["stats"][0].dtype == torch.bfloat16
    assert out["stats"][1].dtype == torch.int64 and out["scale"] == 3


# -- the reviewer's findings (issue 11, R2) ---------------------------------------------------------


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("keep", [[r"^0\.weight$"], [r"^0\.bias$"]])
def test_a_keep_pattern_matching_part_of_a_module_keeps_all_of_it_and_the_model_runs(keep):
    torch = fw("torch")
    nn = torch.nn
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    _, report = bb.cast_module(seq, "bfloat16", keep_types=(), keep=keep)
    assert {r.path for r in report.kept} == {"0.weight", "0.bias"}
    assert seq[0].weight.dtype == seq[0].bias.dtype == torch.float32 and seq[2].weight.dtype == torch.bfloat16
    widened = next(r for r in report.kept if r.path != keep[0].strip("^$").replace("\\", ""))
    assert "of the same module (0)" in widened.why
    assert seq(torch.randn(3, 4).bfloat16()).dtype == torch.bfloat16  # hooked: runs on bf16 inputs


def test_keep_head_on_a_flat_weight_list_keeps_the_last_kernel_and_its_bias():
    # a Keras get_weights(): labels "0", "1"...: the last layer is the trailing bias and the kernel before it
    weights = [np.ones((4, 8), np.float32), np.ones(8, np.float32), np.ones((8, 2), np.float32), np.ones(2, np.float32)]
    out, report = bb.cast_tree(weights, "bfloat16", keep_head=True)
    assert {r.path for r in report.kept} == {"2", "3"}
    assert [a.dtype for a in out] == [BF16, BF16, np.float32, np.float32]
    assert "2, 3" in report.kept[0].why
    out, report = bb.cast_tree([np.ones(3, np.float32), np.ones(2, np.float32)], "bfloat16", keep_head=True)
    assert {r.path for r in report.kept} == {"1"}  # no leaf of two dimensions: the last leaf alone


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("kwargs, says", [
    ({"keep_types": "Batch["}, "'Batch[' is not a regular expression"),
    ({"keep_dtype": None}, "keep_dtype=None (kept leaves left as they are) is cast_tree's"),
    ({"keep_types": 3}, "keep_types: 3 is not a class"),  # was Python's TypeError (int not iterable)
    ({"keep": 3}, "3 is neither a pattern (str) nor a bf16bridge.casting.Rule"),
])
def test_cast_module_bad_arguments_raise_ours(kwargs, says):
    torch = fw("torch")
    with pytest.raises(bb.InvalidArgumentError) as err:
        bb.cast_module(torch.nn.Linear(2, 2), "bfloat16", **kwargs)
    assert says in str(err.value)


@pytest.mark.frameworks("torch")
def test_cast_module_casts_inv_freq_that_cast_tree_keeps_unless_asked():
    # documented: cast_module keeps by type, cast_tree by name; keep= brings them together
    torch = fw("torch")
    nn = torch.nn

    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8), persistent=False)

        def forward(self, x):
            return x * self.inv_freq[0]

    model = nn.Sequential(Rotary(), nn.Linear(4, 4))
    _, tree_report = bb.cast_tree({"0.inv_freq": model[0].inv_freq, "1.weight": model[1].weight.detach()})
    assert {r.path for r in tree_report.kept} == {"0.inv_freq"}
    bb.cast_module(model, "bfloat16")
    assert model[0].inv_freq.dtype == torch.bfloat16
    other = nn.Sequential(Rotary(), nn.Linear(4, 4))
    _, report = bb.cast_module(other, "bfloat16", keep=[r"(?:^|\.)inv_freq$"])
    assert other[0].inv_freq.dtype == torch.float32 and {r.path for r in report.kept} == {"0.inv_freq"}
    assert other(torch.ones(2, 4).bfloat16()).dtype == torch.bfloat16


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


@pytest.mark.frameworks("torch")
def test_cast_module_of_a_lazy_module_or_one_deepcopy_cannot_copy_says_why():
    torch = fw("torch")
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.LayerNorm(4))
    with pytest.raises(bb.UnsupportedTypeError, match=r"0\.weight is not made yet.*LazyLinear.*forward pass first"):
        bb.cast_module(lazy, "bfloat16")
    lazy(torch.ones(2, 3))  # made: cast as any other
    assert bb.cast_module(lazy, "bfloat16")[0][0].weight.dtype == torch.bfloat16

    import threading

    model = torch.nn.Linear(2, 2)
    model.lock = threading.Lock()
    with pytest.raises(bb.UnsupportedTypeError, match=r"deepcopy.*cannot pickle.*inplace=True"):
        bb.cast_module(model, "bfloat16", inplace=False)
    assert model.weight.dtype == torch.float32


@pytest.mark.frameworks("torch")
def test_keep_head_prefers_a_module_named_head_to_a_hidden_top_level_fc():
    """A hidden Linear named fc registered before a module named head: the head rule wins (the
    top-level-fc rule once picked fc, whose hooks fed float32 into the cast head: the model crashed)."""
    torch = fw("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm, self.head = nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.norm(self.fc(x)))

    torch.manual_seed(0)
    model = Net().eval()
    _, report = bb.cast_module(model, "bfloat16", keep_head=True)
    assert {r.path: r.rule for r in report.kept if not r.rule.startswith("type")} == {
        "head.weight": "head", "head.bias": "head"}
    assert (model.fc.weight.dtype, model.head.weight.dtype) == (torch.bfloat16, torch.float32)
    assert model(torch.randn(2, 8).bfloat16()).dtype == torch.float32


# -- compare_outputs: adversarial values and trees ---------------------------------------------------

_SPECIAL = st.sampled_from([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0])
_FINITE = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def _output_pairs(draw):
    """A reference and a candidate leaf of the same shape: moderate values with NaN, inf and zeros
    sprinkled in, and a power of two to scale both by (exact in float64 while nothing overflows)."""
    n = draw(st.integers(1, 12))
    r = np.array(draw(st.lists(st.one_of(_FINITE, _FINITE, _FINITE, _SPECIAL), min_size=n, max_size=n)))
    c = np.array(draw(st.lists(st.one_of(_FINITE, _FINITE, _FINITE, _SPECIAL), min_size=n, max_size=n)))
    return r, c, draw(st.sampled_from([600, 1000, -600, -1000]))


def _oracle(r: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    """rel_norm and cosine over the elements finite on both sides, by math.hypot and math.fsum
    (no overflow: hypot scales, and the dot product is summed of scaled terms)."""
    both = np.isfinite(r) & np.isfinite(c)
    vr, vc = r[both].tolist(), c[both].tolist()
    nr, nc = math.hypot(*vr), math.hypot(*vc)  # hypot scales: no overflow, no underflow
    nd = math.hypot(*(b - a for a, b in zip(vr, vc)))  # |values| <= 2**1000 * 1e3: no overflow
    rel = (nd / nr) if nr else (0.0 if nd == 0 else math.inf)
    if not (nr and nc):
        return rel, (1.0 if nr == nc else 0.0)
    return rel, max(-1.0, min(1.0, math.fsum((a / nr) * (b / nc) for a, b in zip(vr, vc))))


@given(st.lists(_output_pairs(), min_size=1, max_size=3))
@example([(np.array([0.0, 0.0, 2.0]), np.array([0.0, 0.0, 5e-324]), 600)])  # vectors 1e300 apart in size
def test_compare_outputs_is_right_at_any_scale_with_nan_and_inf_around(pairs):
    """Leaves scaled to 2**1000 (float64 outputs; squares past float64's range) once overflowed the
    sums of squares (a RuntimeWarning, then rel_norm and cosine NaN); at 2**-1000 they underflowed."""
    ref = {f"o{i}": r * 2.0 ** k for i, (r, c, k) in enumerate(pairs)}
    cand = {f"o{i}": c * 2.0 ** k for i, (r, c, k) in enumerate(pairs)}
    rep = bb.parity.compare_outputs(ref, cand)  # warnings are errors: none may escape
    for leaf, r, c in zip(rep.leaves, ref.values(), cand.values()):
        rel, cos = _oracle(r, c)
        assert leaf.rel_norm == pytest.approx(rel, rel=1e-9, abs=1e-12), leaf.path
        assert leaf.cosine == pytest.approx(cos, rel=1e-9, abs=1e-12), leaf.path
        both = np.isfinite(r) & np.isfinite(c)
        assert leaf.finite_compared == int(both.sum())
        with np.errstate(invalid="ignore"):
            held = (np.isnan(r) & np.isnan(c)) | (r == c)  # the same NaN/inf on both sides
        assert leaf.new_nonfinite == int((~np.isfinite(c) & ~held).sum())
    rel, cos = _oracle(np.concatenate(list(ref.values())), np.concatenate(list(cand.values())))
    assert rep.rel_norm == pytest.approx(rel, rel=1e-9, abs=1e-12)
    assert rep.cosine == pytest.approx(cos, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("shape, axis, rows, skipped", [((2, 0), -1, 0, 2), ((0, 3), -1, 0, 0), ((3, 0, 2), 1, 0, 6),
                                                         ((2, 1), -1, 2, 0)])
def test_logits_with_no_class_or_no_row(shape, axis, rows, skipped):
    """A class axis of length 0 once raised numpy's ValueError (reshape(-1, 0)): its rows have no
    finite logit and are left out, as a row of -inf is."""
    a = np.ones(shape)
    rep = bb.parity.compare_outputs(a, a, logits=axis)
    assert (rep.rows, rep.leaves[0].rows_skipped, rep.kl_mean) == (rows, skipped, 0.0 if rows else None)


def test_logits_far_apart_give_defined_kl_without_warnings():
    r, c = np.array([[1e308, -1e308]]), np.array([[1e308, 1e308]])
    rep = bb.parity.compare_outputs(r, c, logits=True)
    assert rep.kl_mean == pytest.approx(math.log(2)) and rep.top1 == 1.0
    assert rep.rel_norm == pytest.approx(math.sqrt(2)) and rep.cosine == 0.0


@pytest.mark.parametrize("ref, cand, says", [
    ({"a": np.ones(2), "b": [np.ones(2)]}, {"a": np.ones(2), "b": [np.ones(3)]}, r"\['b'\]\[0\] has shape \(3,\)"),
    ({"a": np.ones(2)}, {"a": np.ones(2), "z": np.ones(1)}, r"the reference lacks \['z'\]"),
    ({"a": np.ones(2), "i": np.arange(2)}, {"a": np.ones(2), "i": np.arange(2)}, r"leaf at \['i'\] is int64"),
    ({"c": np.ones(2, np.complex64)}, {"c": np.ones(2, np.complex64)}, r"\['c'\] is complex64"),
    ([np.ones(2)], (np.ones(2), np.ones(2)), r"the reference lacks \[1\]"),
    (np.ones(()), np.ones(()), "logits axis -1 is out of range for the leaf at the root of shape"),
])
def test_compare_outputs_mismatches_are_our_error_naming_the_path(ref, cand, says):
    from bf16bridge.parity.outputs import OutputMismatchError

    with pytest.raises(OutputMismatchError, match=says):
        bb.parity.compare_outputs(ref, cand, logits=True if says.startswith("logits") else False)


# -- cast_tree and cast_module, fuzzed: the policy keeps what it says, and the report says what was done --

_PARTS = ("ln_1", "norm", "attn", "mlp", "lm_head", "fc", "weight", "bias", "0", "Dense_1", "x")
#: leaf dtypes: floating ones (cast or kept), and what a cast never touches
_LEAF_DTYPES = ("float32", "float32", "float16", "float64", "bfloat16", "int32", "bool", "complex64",
                "float8_e4m3fn")


@st.composite
def _cast_trees(draw):
    """A nested dict of tensors of every framework and many dtypes, some of them the same tensor
    at two paths (tied), and plain-pattern rules to keep by."""
    n = draw(st.integers(1, 7))
    paths = draw(st.lists(st.lists(st.sampled_from(_PARTS), min_size=1, max_size=3).map(tuple),
                          min_size=n, max_size=n, unique_by=lambda p: p))
    paths = [p for p in paths if not any(q != p and q == p[:len(q)] for q in paths)]  # no leaf above a dict
    leaves = []
    for i, _ in enumerate(paths):
        if leaves and draw(st.integers(0, 4)) == 0:
            leaves.append(leaves[draw(st.integers(0, len(leaves) - 1))])  # tied: the same spec again
            continue
        framework = draw(st.sampled_from(PRESENT))
        name = draw(st.sampled_from(_LEAF_DTYPES if framework != "jax" else
                                    [d for d in _LEAF_DTYPES if d not in ("float64", "complex64")]))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        leaves.append((framework, name, shape, draw(st.integers(0, 2**16)), i))
    rules = draw(st.lists(st.sampled_from(_PARTS[:6]), max_size=2))
    return paths, leaves, rules, draw(st.sampled_from(["bfloat16", "float16", "float32"])), \
        draw(st.sampled_from(["float32", None]))


def _leaf(framework, name, shape, seed):
    rng = np.random.default_rng(seed)
    if name == "bool":
        a = rng.integers(0, 2, shape).astype(bool)
    elif name in ("int32",):
        a = rng.integers(-9, 9, shape).astype(np.int32)
    elif name == "float8_e4m3fn":
        a = rng.standard_normal(shape).astype(ml_dtypes.float8_e4m3fn)
    else:  # finite values: NaN bits differ by framework (tested above), values do not
        a = (rng.standard_normal(shape) * 100).astype(np.float64).astype(
            BF16 if name == "bfloat16" else np.dtype(name))
    if framework == "torch" and name == "float8_e4m3fn":
        torch = fw("torch")
        return torch.from_numpy(a.view(np.uint8).copy()).view(torch.float8_e4m3fn)
    return make(framework, a)


def _raw(x) -> bytes:
    """Any framework's tensor's bytes, 0-d complex and torch's fp8 too, by the framework's own calls."""
    if bb.framework_of(x) == "torch" and x.dtype.itemsize == 1:
        torch = fw("torch")
        return x.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(strategies.as_numpy(x)).reshape(-1).view(np.uint8).tobytes()


def _set(tree: dict, path: tuple, value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


@pytest.mark.frameworks("torch")
@given(_cast_trees())
@example(([("lm_head", "weight"), ("x", "weight"), ("norm",)],  # a head tied to an embedding, kept by its rule
          [("torch", "float32", (2, 3), 1, 0), ("torch", "float32", (2, 3), 1, 0), ("jax", "bfloat16", (2,), 2, 2)],
          ["lm_head", "norm"], "bfloat16", "float32"))
def test_cast_tree_keeps_what_the_policy_says_and_the_report_says_what_it_did(case):
    import re

    paths, specs, rules, target, keep_dtype = case
    made: dict = {}
    tree: dict = {}
    for path, spec in zip(paths, specs):
        x = made.setdefault(spec[4], _leaf(*spec[:4]))
        _set(tree, path, x)
    flat = {".".join(p): made[s[4]] for p, s in zip(paths, specs)}
    before = {k: _raw(x) for k, x in flat.items()}
    out, report = bb.cast_tree(tree, target, policy=[Rule(r, re.escape(r), "test") for r in rules],
                               keep_dtype=keep_dtype)
    rows = {r.path: r for r in report.leaves}
    assert set(rows) == set(flat)
    kept_data = {id(flat[k]) for k in flat if any(re.search(re.escape(r), k, re.IGNORECASE) for r in rules)}
    for key, x in flat.items():
        y, row = out, rows[key]
        for part in key.split("."):
            y = y[part]
        name = dtype_name(x)
        assert (row.before, row.after) == (name, dtype_name(y)), key  # the report says what came out
        assert _raw(x) == before[key], key  # the input is untouched
        if name not in ("float32", "float16", "float64", "bfloat16"):
            assert row.action == "skipped" and y is x, key
            continue
        kept = id(x) in kept_data  # by a rule on this path, or tied to a path a rule keeps
        want = (keep_dtype or name) if kept else target
        assert row.action == ("kept" if kept else "unchanged" if name == target else "cast"), key
        assert row.after == want, key
        if want == name:
            assert y is x, key  # no copy of what needs no cast
        else:  # rounded as ml_dtypes rounds (float64 through float32, as every framework does)
            a = np.asarray(bb.convert(x, "numpy", on_alias="allow"))
            src = a.astype(np.float32) if a.dtype == np.float64 and want == "bfloat16" else a
            assert _raw(y) == src.astype(BF16 if want == "bfloat16" else np.dtype(want)).reshape(-1).tobytes(), key
        for other, z in flat.items():  # tied stays tied: one result for one tensor
            if z is x:
                w = out
                for part in other.split("."):
                    w = w[part]
                assert w is y, (key, other)
    assert report.bytes_before == sum(r.nbytes_before for r in report.leaves)


_MIDDLE = ("proj", "norm", "block", "mlp", "0")
_LAST = ("head", "classifier", "lm_head", "proj", "out")


@st.composite
def _models(draw):
    """A torch Sequential of Linear (with and without bias), norms of every kind (affine or not,
    with and without running statistics), ReLU, Dropout and nested Sequentials; the last Linear
    sometimes tied to the first; a floating and an integer buffer; a user's hooks; and the
    cast_module keywords. Only the last module may be named like a head: a head's hooks return
    float32, so a head in the middle feeds float32 to what follows (docs/casting.md)."""
    kinds = draw(st.lists(st.sampled_from(["linear", "linear-nobias", "layernorm", "layernorm-plain", "batchnorm",
                                           "batchnorm-nostats", "rmsnorm", "groupnorm", "relu", "dropout",
                                           "nested"]), min_size=1, max_size=6))
    names = [f"{draw(st.sampled_from(_MIDDLE))}{i}" for i in range(len(kinds) - 1)]
    names.append(draw(st.sampled_from(_LAST)))
    return (tuple(zip(names, kinds)), draw(st.booleans()), draw(st.booleans()), draw(st.booleans()),
            dict(dtype=draw(st.sampled_from(["bfloat16", "float16"])), keep_head=draw(st.booleans()),
                 inplace=draw(st.booleans()),
                 keep=draw(st.sampled_from([None, ["weight"], ["bias"], ["proj"], ["0"], ["out"]]))))


def _build(layers, tie, buffers, user_hooks):
    torch = fw("torch")
    nn = torch.nn
    make_one = {"linear": lambda: nn.Linear(8, 8), "linear-nobias": lambda: nn.Linear(8, 8, bias=False),
                "layernorm": lambda: nn.LayerNorm(8), "layernorm-plain": lambda: nn.LayerNorm(8, elementwise_affine=False),
                "batchnorm": lambda: nn.BatchNorm1d(8), "batchnorm-nostats": lambda: nn.BatchNorm1d(
                    8, track_running_stats=False), "rmsnorm": lambda: nn.RMSNorm(8), "groupnorm": lambda: nn.GroupNorm(2, 8),
                "relu": nn.ReLU, "dropout": lambda: nn.Dropout(0.1),
                "nested": lambda: nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))}
    torch.manual_seed(0)
    model = nn.Sequential(collections.OrderedDict((name, make_one[kind]()) for name, kind in layers)).eval()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if tie and len(linears) >= 2:
        linears[-1].weight = linears[0].weight
    if buffers:
        model.register_buffer("scale", torch.tensor(1.5))
        model.register_buffer("steps", torch.tensor(3))
    if user_hooks and linears:
        linears[0].register_forward_hook(lambda m, i, o: o + 0)
        linears[-1].register_forward_pre_hook(lambda m, i: None)
    return model


@pytest.mark.frameworks("torch")
@given(_models())
@example(((("block0", "nested"), ("proj", "linear-nobias")), True, False, False,  # proj tied to block0.0's weight
          dict(dtype="bfloat16", keep_head=False, inplace=True, keep=["proj"])))
@example(((("norm0", "batchnorm"), ("norm1", "batchnorm"), ("norm2", "batchnorm"), ("out", "linear-nobias")),
          False, False, False, dict(dtype="float16", keep_head=False, inplace=False, keep=None)))  # mostly kept
def test_cast_module_runs_reports_what_it_did_and_a_second_call_changes_nothing(case):
    """Once failed: a Linear whose weight was kept only through a tie (to a kept module's) and
    whose bias was cast got no hooks, and the model raised 'self and mat2 must have the same dtype'."""
    import copy

    torch = fw("torch")
    layers, tie, buffers, user_hooks, kw = case
    model = _build(layers, tie, buffers, user_hooks)
    reference = copy.deepcopy(model)
    before = {k: _raw(v) for k, v in model.state_dict().items()}
    x = torch.randn(3, 8)
    cast, report = bb.cast_module(model, **kw)
    dt = getattr(torch, kw["dtype"])
    held = dict(cast.named_parameters(remove_duplicate=False)) | dict(cast.named_buffers(remove_duplicate=False))
    assert {r.path for r in report.leaves} == set(held)
    for r in report.leaves:
        assert dtype_name(held[r.path]) == r.after, r  # the report says what the model holds
        assert r.action == ("skipped" if r.before == "int64" else "kept" if r.after == "float32"
                            else "cast"), r
    if not kw["inplace"]:
        assert cast is not model
        assert {k: _raw(v) for k, v in model.state_dict().items()} == before  # the original untouched
    y = cast(x.to(dt))  # the promise: the cast model runs on inputs of the dtype it was cast to
    again, report2 = bb.cast_module(cast, **{**kw, "inplace": True})
    assert again is cast and not report2.cast
    assert [(r.path, r.after) for r in report2.leaves] == [(r.path, r.after) for r in report.leaves]
    assert torch.equal(cast(x.to(dt)), y)  # hooks replaced, not stacked
    # check_cast feeds the cast model its cast dtype, however much is kept, where a parameter was
    # cast; a model whose parameters were all kept (only buffers cast) takes its inputs as given;
    # buffers decide only for a model without parameters
    rep = bb.parity.check_cast(reference, cast, x)
    params = dict(cast.named_parameters(remove_duplicate=False))
    if any(r.action == "cast" for r in report.leaves if (r.path in params) == bool(params)):
        assert rep.leaves[0].candidate_dtype == dtype_name(y) and f"cast to {kw['dtype']}" in rep.fed
    else:
        assert "candidate the inputs as given" in rep.fed, rep.fed


@pytest.mark.parametrize("order", ["<", ">"])
def test_cast_tree_of_a_byte_swapped_bf16_array_keeps_its_values(order):
    # the numpy adapter's widening took a big-endian bf16 array's bytes as native (audit): wrong values
    x = np.array([1.0, 2.0, -3.5, 100.0, 0.0, -0.0], np.float32)
    a = x.astype(ml_dtypes.bfloat16).astype(np.dtype(ml_dtypes.bfloat16).newbyteorder(order))
    out, _ = bb.cast_tree({"w": a}, "float32")
    np.testing.assert_array_equal(np.asarray(out["w"]).astype("<f4").view(np.uint32), x.view(np.uint32))


@pytest.mark.frameworks("torch")
def test_cast_module_lists_a_module_s_own_leaves_as_torch_names_them():
    # read off the dicts Module._apply walks: an unset bias (None), a buffer set to None and one
    # parameter registered under two names in one module are what named_parameters(recurse=False) says
    torch = fw("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.LayerNorm(4))
    model[0].register_buffer("scale", None)
    model[0].register_buffer("mask", torch.ones(4))
    model[0].alias = model[0].weight
    expected = [f"{name}.{leaf}" if name else leaf for name, m in model.named_modules()
                for leaf, _ in (*m.named_parameters(recurse=False), *m.named_buffers(recurse=False))]
    _, report = bb.cast_module(model, "bfloat16")
    assert [r.path for r in report.leaves] == expected == ["0.weight", "0.mask", "1.weight", "1.bias"]
    assert model[0].weight.dtype == torch.bfloat16 and model[0].alias is model[0].weight
    assert model[0].mask.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32  # the norm kept


def test_cast_tree_under_jit_gives_ml_dtypes_bits_or_says_why_it_cannot():
    """float32 subnormals to bf16 inside jax.jit: ml_dtypes' bits where this jax's cast gives them
    (0.10); where it flushes them (0.4.30, the oldest declared), the cast outside a trace goes through
    numpy, and under one it is our error naming the way out, never jax's flushed bits or a raw error."""
    import jax
    import jax.numpy as jnp

    from bf16bridge.adapters.jax import probe as jax_probe

    a = np.array([1e-39, 1.5, -3e-39, 2.0], np.float32)
    want = a.astype(ml_dtypes.bfloat16).view(np.uint16)
    outside = bb.cast_tree({"w": jnp.asarray(a)}, "bfloat16")[0]["w"]
    np.testing.assert_array_equal(np.asarray(outside).view(np.uint16), want)
    traced = jax.jit(lambda x: bb.cast_tree({"w": x}, "bfloat16")[0]["w"])
    if jax_probe.host_cast(np.dtype(np.float32), "bfloat16"):
        with pytest.raises(bb.UnsupportedTypeError, match="cast outside the traced function, or upgrade jax"):
            traced(jnp.asarray(a))
    else:
        np.testing.assert_array_equal(np.asarray(traced(jnp.asarray(a))).view(np.uint16), want)


@pytest.mark.libraries("keras")
@pytest.mark.frameworks("torch")
def test_cast_module_of_a_keras_model_under_its_torch_backend_points_to_cast_tree():
    """Under Keras's torch backend a Keras model is a torch Module whose weights sit in the model's own
    parameter dict, not on its layers: keep_types missed its LayerNormalization, whose gamma and beta
    were cast to bf16 without a word. Refused, naming cast_tree(model.weights), as on the other backends."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import os
        os.environ["KERAS_BACKEND"] = "torch"
        import keras, bf16bridge as bb
        inp = keras.Input((8,))
        x = keras.layers.LayerNormalization(name="layer_normalization")(keras.layers.Dense(16)(inp))
        model = keras.Model(inp, keras.layers.Dense(4)(x))
        try:
            bb.cast_module(model, "bfloat16")
        except bb.UnsupportedTypeError as err:
            print("refused:", err)
        print([str(w.value.dtype) for w in model.weights])
        out, report = bb.cast_tree(model.weights, "bfloat16")
        print([r.action for r in report.leaves])
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and len(lines) == 3, run.stderr[-2000:]
    assert lines[0].startswith("refused: cast_module: ") and "cast_tree(model.weights)" in lines[0]
    assert set(eval(lines[1])) == {"torch.float32"}  # nothing was cast before the refusal
    assert eval(lines[2]).count("kept") == 2  # the norm's gamma and beta, by their Keras paths


@pytest.mark.frameworks("tensorflow")
def test_cast_tree_in_a_tf_function_with_an_unknown_dimension():
    """A tf.function traced with a None dimension: the byte count was a raw TypeError (int * None); the
    cast is made, and the report says its bytes are not known."""
    import tensorflow as tf

    reports = []

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def f(x):
        out, report = bb.cast_tree({"w": x}, "float64", policy=())
        reports.append(report)
        return out["w"]

    a = np.array([1e-39, -3e-39, 1.5], np.float32)
    np.testing.assert_array_equal(bits(f(tf.constant(a))), bits(a.astype(np.float64)))
    assert reports[0].leaves[0].action == "cast" and reports[0].bytes_before == 0
    assert reports[0].notes == ("1 leaves (w) have a dimension not known while traced (None): their bytes count 0",)
