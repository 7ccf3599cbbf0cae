"""bb.parity.trace beyond torch against flax linen: plain functions marked with bb.parity.tap (jax under
jit, torch, numpy), flax nnx modules, Keras models; and each framework's hooks leaving the model as it was."""

from __future__ import annotations

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.adapters.hooks import TraceHooks
from bf16bridge.core import registry


def _weights(seed=0, n=16):
    return np.random.default_rng(seed).standard_normal((n, n)).astype(np.float32) / 4


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.parametrize("jit", [True, False])
def test_taps_in_plain_functions_name_the_first_tap_that_differs(jit):
    import jax
    import jax.numpy as jnp
    import torch

    w = _weights()
    wt, wj = bb.to_torch(w), bb.to_jax(w)
    tap = bb.parity.tap

    def f_torch(x):
        h = tap("h", torch.tanh(x @ wt))
        return tap("out", tap("g", h * 2) @ wt)

    def f_jax(x):
        h = tap("h", jnp.tanh(x @ wj))
        return tap("out", tap("g", h * 2) @ wj.T)  # planted: the weight transposed

    f = jax.jit(f_jax) if jit else f_jax
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    rep = bb.parity.trace(f_torch, f, x, frameworks=("torch", "jax"))
    assert [r.layer_a for r in rep.layers] == ["h", "g", "out"]
    assert [r.passed for r in rep.layers] == [True, True, False]
    assert (rep.first_divergence.layer_a, rep.first_divergence.layer_b) == ("out", "out")
    assert "no float64 run" in rep.reference
    out = f(jnp.asarray(x))  # outside a trace a tap hands its value back, and records nothing
    assert out.shape == (4, 16)


def test_a_tap_outside_a_trace_is_the_value_itself_and_a_bad_name_is_refused():
    x = np.ones(3, np.float32)
    assert bb.parity.tap("h", x) is x
    with pytest.raises(bb.errors.InvalidArgumentError, match="name must be a non-empty string"):
        bb.parity.trace(lambda v: bb.parity.tap("", v), lambda v: v, x, frameworks=("numpy", "numpy"))


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.libraries("flax")
def test_an_nnx_module_against_torch_layers_and_gradients():
    import jax
    import torch
    from flax import nnx

    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    class N(nnx.Module):
        def __init__(self, rngs):
            self.fc1, self.fc2 = nnx.Linear(16, 32, rngs=rngs), nnx.Linear(32, 16, rngs=rngs)

        def __call__(self, x):
            return self.fc2(jax.nn.relu(self.fc1(x)))

    t, n = T(), N(nnx.Rngs(0))
    for name in ("fc1", "fc2"):
        getattr(n, name).kernel.value = bb.to_jax(getattr(t, name).weight.detach()).T
        getattr(n, name).bias.value = bb.to_jax(getattr(t, name).bias.detach())
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    calls = (N.__dict__["__call__"], nnx.Linear.__dict__["__call__"])
    rep = bb.parity.trace(t, n, x, grads=True)
    assert (N.__dict__["__call__"], nnx.Linear.__dict__["__call__"]) == calls  # wrapped for the run only
    assert rep.passed, rep.text()
    assert [(r.layer_a, r.layer_b) for r in rep.layers] == [("fc1", "fc1"), ("fc2", "fc2"), ("", "")]
    assert [(g.name_a, g.name_b, g.transposed) for g in rep.grads][0] == ("fc1.weight", "fc1.kernel", True)
    getattr(n, "fc2").bias.value = getattr(n, "fc2").bias.value + 1.0  # a bias off by one: an offset per feature
    d = bb.parity.trace(t, n, x).first_divergence
    assert (d.layer_a, d.layer_b) == ("fc2", "fc2") and d.changes[0].startswith("a constant offset of 1")


@pytest.mark.frameworks("torch", "tensorflow")
@pytest.mark.libraries("keras")
def test_a_keras_model_whose_dense_layer_applies_its_activation_inside_is_named_there():
    import keras
    import torch

    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    t = T()
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)

    def keras_port(fused: bool):
        act = "gelu" if fused else None
        layers = [keras.Input((16,)), keras.layers.Dense(32, activation=act, name="fc1")]
        layers += [] if fused else [keras.layers.Activation(lambda v: keras.activations.gelu(v, approximate=False),
                                                             name="act")]
        m = keras.Sequential(layers + [keras.layers.Dense(16, name="fc2")])
        for name in ("fc1", "fc2"):
            lin = getattr(t, name)
            m.get_layer(name).set_weights([bb.to_numpy(lin.weight.detach()).T, bb.to_numpy(lin.bias.detach())])
        return m

    rep = bb.parity.trace(t, keras_port(fused=False), x, grads=True)
    assert rep.passed and rep.unpaired_b == ("act",), rep.text()
    assert [g.name_b for g in rep.grads] == ["fc1/kernel", "fc1/bias", "fc2/kernel", "fc2/bias"]
    rep = bb.parity.trace(t, keras_port(fused=True), x)  # Dense(activation="gelu"): fc1's output is after it
    assert (rep.first_divergence.layer_a, rep.first_divergence.layer_b) == ("fc1", "fc1")
    assert rep.layer("fc2").passed  # the same function overall


@pytest.mark.frameworks("torch")
def test_the_torch_hooks_leave_no_hook_behind_and_the_model_unchanged():
    import torch

    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    before = {k: v.clone() for k, v in m.state_dict().items()}
    seen = []
    registry.hooks("torch", TraceHooks).run(m, (torch.ones(2, 4),), lambda *a: seen.append(a[:2]), True)
    assert [s for s in seen if s[1] == "output"] == [("0", "output"), ("1", "output"), ("", "output")]
    assert [s for s in seen if s[1] == "input"] == [("", "input"), ("0", "input"), ("1", "input")]
    assert all(not mod._forward_hooks and not mod._forward_pre_hooks for mod in m.modules())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert registry.hooks("torch", TraceHooks).float64_copy(m)(torch.ones(2, 4, dtype=torch.float64)).dtype \
        == torch.float64
    assert m[0].weight.dtype == torch.float32  # the float64 run swaps widened copies in; the model stays


@pytest.mark.frameworks("torch")
def test_a_layer_called_twice_is_two_rows_and_a_tuple_output_a_row_per_tensor():
    import torch

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shared, self.split = torch.nn.Linear(4, 4), torch.nn.Identity()

        def forward(self, x):
            y = self.shared(self.shared(x))
            return self.split((y, y * 2))

    m = Twice()
    rep = bb.parity.trace(m, m, np.ones((2, 4), np.float32), reference=None)
    assert [r.layer_a for r in rep.layers] == ["shared", "shared#2", "split[0]", "split[1]", "[0]", "[1]"]
    assert rep.passed and all(r.error == 0 and r.sqnr_db == float("inf") for r in rep.layers)
    with pytest.raises(bb.errors.MissingKeyError, match="no paired layer is named 'sharde'.*close: shared"):
        rep.layer("sharde")


@pytest.mark.frameworks("torch")
def test_the_judged_side_is_compared_as_it_runs_and_what_was_kept_for_it_is_freed():
    import torch

    from bf16bridge.parity.tracing import names, run

    m = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(6)))
    hooks = registry.hooks("torch", TraceHooks)
    x = run.side_inputs((np.ones((2, 8), np.float32),), "torch")
    side = run.Side(m, "torch", hooks, x, True)
    base = run.first_run(side, None, 8)
    assert len(base.values) == 7  # six layers and the model: one side's activations, kept
    pairing = names.Pairing(base.order, pairs=None, rename=None, by="name", stored_is_a=True)
    depth, _ = run.depths(base.order)
    held = []
    m[3].register_forward_hook(lambda *a: held.append(len(base.values)))  # before the trace's own hook on it
    rows, _, _ = run.judged_run(run.Side(m, "torch", hooks, x, False), base, pairing, depth, 8)
    assert held == [4] and len(rows) == 7 and not base.values  # layers 0-2 freed as soon as each was judged


def test_gradients_of_a_plain_function_are_refused_naming_the_way_out():
    f = lambda x: bb.parity.tap("h", x * 2)  # noqa: E731
    with pytest.raises(bb.errors.UnsupportedTypeError, match="gradients of function in numpy.*grads=False"):
        bb.parity.trace(f, f, np.ones(3, np.float32), frameworks=("numpy", "numpy"), grads=True)


@pytest.mark.frameworks("torch")
def test_a_torch_model_dropping_at_random_is_refused_until_it_is_in_eval_mode():
    import torch

    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
    x = np.ones((2, 4), np.float32)
    with pytest.raises(bb.errors.InvalidArgumentError, match=r"dropout '1' drops at random.*call model\.eval\(\)"):
        bb.parity.trace(m, m, x)
    assert bb.parity.trace(m.eval(), m, x).passed
