"""The cast policies (bf16bridge/casting/rules.py): the default policy against real models' names,
keep_head finding the head by name or as the last layer, policies as data (keep=, policy=, Rule),
every default rule saying why, and the target dtypes and keywords a cast refuses."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.casting import DEFAULT_POLICY, Rule
from conftest import BF16


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


def test_keep_head_on_a_flat_weight_list_keeps_the_last_kernel_and_its_bias():
    # a Keras get_weights(): labels "0", "1"...: the last layer is the trailing bias and the kernel before it
    weights = [np.ones((4, 8), np.float32), np.ones(8, np.float32), np.ones((8, 2), np.float32), np.ones(2, np.float32)]
    out, report = bb.cast_tree(weights, "bfloat16", keep_head=True)
    assert {r.path for r in report.kept} == {"2", "3"}
    assert [a.dtype for a in out] == [BF16, BF16, np.float32, np.float32]
    assert "2, 3" in report.kept[0].why
    out, report = bb.cast_tree([np.ones(3, np.float32), np.ones(2, np.float32)], "bfloat16", keep_head=True)
    assert {r.path for r in report.kept} == {"1"}  # no leaf of two dimensions: the last leaf alone


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
