"""cast_module (torch): norms kept in float32 by type, computing on the widened input, hooked so
that a kept layer feeds a cast one; keep_head (a module named like a head, else the last Linear);
a copy or in place, hooks replaced not stacked, keep_types and keep patterns widening a whole
module; a module's own leaves as torch names them; what it refuses (no model, a lazy module, one
deepcopy cannot copy, a Keras model under the torch backend, bad keywords)."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bits, fw


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


def test_cast_module_refuses_what_is_no_model():
    with pytest.raises(bb.UnsupportedTypeError, match="use cast_tree"):
        bb.cast_module({"w": np.ones(2, np.float32)}, "bfloat16")


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
