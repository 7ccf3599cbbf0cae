"""The default policy, rounding(8) (parity.policies.DEFAULT_POLICY): every entry point uses it, the built-in
suite passes it on this machine, correct user results (a flax Dense stack against the same math in torch,
two frameworks' gradients of one loss) pass it, and crafted faults (a wrong constant, a dropped term, an
element flushed to zero, a transposed weight) fail it, in the built-in ops and in user results, each saying
which measure decided."""

import dataclasses
import inspect
import math

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import docs, outputs, policies, runner
from bf16bridge.parity.ops import OPS
from conftest import BF16


def test_the_default_lives_in_one_constant_and_every_entry_point_takes_it():
    assert policies.DEFAULT_POLICY == "rounding(8)" and parity.DEFAULT_POLICY is policies.DEFAULT_POLICY
    assert str(parity.parse(policies.DEFAULT_POLICY)) == "rounding(8)" == str(parity.rounding())
    for fn in (parity.compare, parity.run, parity.suite, parity.compare_outputs, parity.assert_outputs_close):
        assert inspect.signature(fn).parameters["policy"].default is policies.DEFAULT_POLICY, fn.__name__
    a = np.ones((4, 4), BF16)
    assert parity.compare(a, a.copy()).policy == "rounding(8)"
    assert parity.assert_parity(a, a.copy()).policy == "rounding(8)"  # policy=None: the default
    assert parity.compare_outputs(a, a.copy()).policy == "rounding(8)"
    assert "DEFAULT_POLICY" in inspect.getsource(docs.main)


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_the_builtin_suite_passes_the_default_on_this_machine():
    """Every op, every input kind, matmul over K = 16, 256, 4096, in every framework that computes here:
    what ulp(1) failed (a 2-ULP accumulation order at K=4096, jax's bf16 softmax and layer norm, torch's
    GELU cancelling and overflowing, older jax's GELU rounding erf to bf16, flushed subnormals) is what bf16
    arithmetic explains."""
    reports = parity.suite()
    assert len(reports) == 27 and all(r.passed for r in reports), [
        (r.op, [(x.name, x.explained.why) for x in r.references if not x.passed]) for r in reports if not r.passed]
    for r in reports:
        assert len(r.references) == 3 and all(x.explained.passed for x in r.references), r.op
    by_op = {r.op: r for r in reports}
    gelu = {x.name: x.explained for x in by_op["gelu [all]"].references}
    assert gelu["torch"].overflowed == 128, "torch's x * (1 + erf) overflows at the top of the range: explained"
    log = {x.name: x.explained for x in by_op["log [all]"].references}
    assert log["jax"].flushed_inputs == log["tensorflow"].flushed_inputs == 127 and log["torch"].flushed_inputs == 0
    assert not any(r.worst_regions for r in reports)  # nothing exceeds the default: no region to show


# -- crafted faults in the built-in ops: torch's definition replaced, jax's kept -------------------


def _with_torch(name: str, fn):
    o = OPS[name]
    return dataclasses.replace(o, name=f"{name} (faulty torch)", impl={**o.impl, "torch": fn})


def _flush(y, index):
    import torch

    return y.flatten().index_fill(0, torch.tensor([index]), 0).reshape(y.shape)


def _faults():
    import torch
    import torch.nn.functional as F

    erf_gelu = lambda c, s: lambda x, **p: (c * x.float() * (1 + torch.erf(x.float() / s))).bfloat16()  # noqa: E731
    return {
        # a wrong constant
        "exp with log2(e) as 1.44": ("exp", lambda x, **p: torch.exp2(x * 1.44), {}),
        "attention scaled by 1/d, not 1/sqrt(d)": (
            "attention", lambda q, k, v, **p: torch.softmax(q @ k.T / q.shape[-1], -1) @ v, {}),
        "gelu with 0.6 for 0.5": ("gelu", erf_gelu(0.6, math.sqrt(2)), {}),
        # a dropped term
        "layer norm without the mean": (
            "layer_norm", lambda x, **p: (x.float() / torch.sqrt(x.float().var(-1, unbiased=False, keepdim=True)
                                                                 + 1e-5)).bfloat16(), {}),
        "matmul without its last product": ("matmul", lambda a, b, **p: a[:, :-1] @ b[:-1], {"k": 16}),
        "gelu without 1 +": ("gelu", lambda x, **p: (0.5 * x.float() * torch.erf(x.float() / math.sqrt(2))).bfloat16(),
                             {}),
        # an element flushed to zero
        "matmul K=4096, element [5, 7] zero": ("matmul", lambda a, b, **p: _flush(a @ b, 5 * 64 + 7), {"k": 4096}),
        "tanh, one element zero": ("tanh", lambda x, **p: _flush(torch.tanh(x), 20000), {}),
        # a transposed weight
        "matmul with B transposed": ("matmul", lambda a, b, **p: a @ b.T, {"k": 64}),
        "conv2d with its filter transposed": ("conv2d", lambda x, w, **p: F.conv2d(x, w.transpose(2, 3)), {}),
    }


BUILTIN_FAULTS = ["exp with log2(e) as 1.44", "attention scaled by 1/d, not 1/sqrt(d)", "gelu with 0.6 for 0.5",
                  "layer norm without the mean", "matmul without its last product", "gelu without 1 +",
                  "matmul K=4096, element [5, 7] zero", "tanh, one element zero", "matmul with B transposed",
                  "conv2d with its filter transposed"]


@pytest.mark.frameworks("torch", "jax")
@pytest.mark.parametrize("fault", BUILTIN_FAULTS)
def test_a_crafted_fault_in_a_builtin_op_fails_the_default(fault):
    name, fn, sizes = _faults()[fault]
    rep = parity.run(_with_torch(name, fn), frameworks=["torch", "jax"], **sizes)
    torch_, jax_ = rep.references
    assert not rep.passed and not torch_.passed and jax_.passed, (fault, torch_.explained.why)
    e = torch_.explained
    assert e.decided_by == "elementwise" and e.elementwise > 8 and "beyond 8 roundings of bf16" in e.why, e
    assert f"torch: NOT explained (elementwise): worst element {list(e.worst)}" in str(rep)
    if rep.data.get("input"):  # an op over every input: the regions say where
        assert rep.worst_regions and {g.result for g in rep.worst_regions} == {"torch"}


@pytest.mark.frameworks("torch", "jax")
def test_gelu_as_older_jax_computes_it_in_bf16_is_explained():
    """jax 0.4.30's exact GELU, x * (erf(x / sqrt(2)) + 1) / 2 with every step rounded to bf16: erf's
    bf16 rounding, cancelled by 1 + erf, is all that flushes the negative tail to zero (and x * 2
    overflows at the top): what bf16 arithmetic explains, in any environment."""
    import torch

    def bf16_erf_form(x, **p):
        return x * (torch.erf(x / torch.tensor(math.sqrt(2), dtype=x.dtype)) + 1) / 2

    rep = parity.run(_with_torch("gelu", bf16_erf_form), frameworks=["torch", "jax"])
    torch_ = rep.references[0].explained
    assert rep.passed and torch_.passed, torch_.why
    assert torch_.overflowed == 128
    tail = bf16_erf_form(torch.tensor([-3.125], dtype=torch.bfloat16))
    assert tail.item() == 0.0  # GELU(-3.125) is -0.0028: the form, not an accident of this torch, is tested


@pytest.mark.frameworks("torch", "jax")
def test_what_the_default_cannot_see_a_dropped_term_of_a_long_sum():
    """One product of 4096 left out moves each result by about 1/64 of its size: 4 roundings, which the
    default explains (rounding(k) can see no fault smaller than k roundings). Results that accumulate
    alike say it between themselves: ulp(1) and exact fail it."""
    fault = _with_torch("matmul", lambda a, b, **p: a[:, :-1] @ b[:-1])
    assert parity.run(fault, frameworks=["torch", "jax"], k=4096).passed
    assert not parity.run(fault, frameworks=["torch", "jax"], k=4096, policy="ulp(1)").passed


# -- user results: a flax Dense stack against the same math in torch, and their gradients ----------

_SIZES = (128, 256, 256, 64)


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(BF16) for a, b in zip(_SIZES, _SIZES[1:])]
    bs = [(rng.standard_normal(b) * 0.1).astype(BF16) for b in _SIZES[1:]]
    return ws, bs, rng.standard_normal((32, _SIZES[0])).astype(BF16), rng.standard_normal((32, _SIZES[-1])).astype(BF16)


def _flax_stack(ws, bs, x):
    import flax.linen as nn
    import jax.numpy as jnp

    class Stack(nn.Module):
        @nn.compact
        def __call__(self, h):
            for i, n in enumerate(_SIZES[1:]):
                h = nn.Dense(n, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)(h)
                h = nn.gelu(h, approximate=False) if i < len(ws) - 1 else h
            return h

    params = {"params": {f"Dense_{i}": {"kernel": bb.to_jax(w), "bias": bb.to_jax(b)}
                         for i, (w, b) in enumerate(zip(ws, bs))}}
    return Stack(), params


def _torch_stack(ws, bs, x, fault=None):
    import torch

    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        w = w.T if fault == "transposed weight" and i == 1 else w
        h = h @ w + (0 if fault == "dropped bias" and i == len(ws) - 1 else b)
        h = torch.nn.functional.gelu(h) if i < len(ws) - 1 else h
    if fault == "wrong constant":
        h = h * 1.1
    if fault == "element flushed":
        h = h.index_put((torch.tensor([3]), torch.tensor([5])), torch.zeros((), dtype=h.dtype))
    return h


USER_FAULTS = ["wrong constant", "dropped bias", "element flushed", "transposed weight"]


@pytest.mark.libraries("flax")
@pytest.mark.frameworks("torch", "jax")
def test_a_flax_dense_stack_and_the_same_math_in_torch_pass_and_crafted_faults_fail():
    ws, bs, x, _ = _weights()
    model, params = _flax_stack(ws, bs, x)
    y_jax = model.apply(params, bb.to_jax(x))
    tw, tb, tx = [bb.to_torch(w) for w in ws], [bb.to_torch(b) for b in bs], bb.to_torch(x)
    good = parity.compare(_torch_stack(tw, tb, tx), y_jax)
    assert good.passed and good.pairs[0].identical_fraction < 0.9, good  # not bit-identical, yet explained
    assert not parity.compare(_torch_stack(tw, tb, tx), y_jax, policy="ulp(1)").passed  # what the issue saw
    decided = {}
    for fault in USER_FAULTS:
        rep = parity.compare(_torch_stack(tw, tb, tx, fault), y_jax)
        (p,) = rep.pairs
        assert not rep.passed and not p.passed and not p.explained.passed, (fault, p.explained.why)
        decided[fault] = p.explained.decided_by
        assert "beyond 16 roundings of bf16" in p.explained.why and p.explained.why in str(rep)
    assert decided == {"wrong constant": "normwise", "dropped bias": "elementwise", "element flushed": "elementwise",
                       "transposed weight": "elementwise"}, decided


def _grads(ws, bs, x, target, fault=None):
    """The gradients of a mean squared error, in jax (the stack in flax) and in torch (the same math),
    with ``fault`` made in torch's."""
    import jax
    import jax.numpy as jnp
    import torch

    tw = [bb.to_torch(w).requires_grad_() for w in ws]
    tb = [bb.to_torch(b).requires_grad_() for b in bs]
    diff = _torch_stack(tw, tb, bb.to_torch(x)) - bb.to_torch(target)
    if fault == "dropped term":  # the last example of the batch left out of the sum
        (diff[:-1] ** 2).sum().div(diff.numel()).backward()
    else:
        (diff ** 2).mean().backward()
    model, params = _flax_stack(ws, bs, x)
    g = jax.grad(lambda p: ((model.apply(p, bb.to_jax(x)) - jnp.asarray(target)) ** 2).mean())(params)
    mine = {f"Dense_{i}": {"kernel": w.grad, "bias": b.grad} for i, (w, b) in enumerate(zip(tw, tb))}
    if fault == "wrong constant":  # one gradient scaled by a forgotten 1 / 0.8
        mine["Dense_0"]["kernel"] = mine["Dense_0"]["kernel"] / 0.8
    elif fault == "element flushed":  # its largest element
        bias = mine["Dense_1"]["bias"]
        mine["Dense_1"]["bias"] = bias.index_fill(0, bias.float().abs().argmax().reshape(1), 0)
    elif fault == "transposed weight":
        mine["Dense_1"]["kernel"] = mine["Dense_1"]["kernel"].T
    return g, {"params": mine}


@pytest.mark.libraries("flax")
@pytest.mark.frameworks("torch", "jax")
def test_two_frameworks_gradients_of_one_loss_pass_compare_outputs_and_crafted_faults_fail():
    ws, bs, x, target = _weights(1)
    g, mine = _grads(ws, bs, x, target)
    rep = parity.compare_outputs(g, mine)
    assert rep.passed() and rep.failures() == () and len(rep.leaves) == 6, str(rep)
    assert all(leaf.passed and leaf.explained.passed for leaf in rep.leaves)
    assert rep.max_rel > 1, "elements next to zero differ by more than their own size: explained all the same"
    parity.assert_outputs_close(g, mine)
    assert not parity.compare_outputs(g, mine, policy="ulp(1)").passed()  # what the issue saw
    failing = {}
    for fault in USER_FAULTS[:1] + ["dropped term"] + USER_FAULTS[2:]:
        g, bad = _grads(ws, bs, x, target, fault)
        rep = parity.compare_outputs(g, bad)
        failing[fault] = sorted((leaf.path.split("'")[3] + "." + leaf.path.split("'")[5], leaf.explained.decided_by)
                                for leaf in rep.leaves if not leaf.passed)
        assert all(f"{leaf.path}: beyond rounding(8)" in "\n".join(rep.failures()) for leaf in rep.leaves
                   if not leaf.passed)
        with pytest.raises(parity.OutputsDifferError, match="beyond rounding"):
            parity.assert_outputs_close(g, bad)
    assert failing["wrong constant"] == [("Dense_0.kernel", "normwise")], failing
    assert failing["element flushed"] == [("Dense_1.bias", "elementwise")], failing
    assert failing["transposed weight"] == [("Dense_1.kernel", "elementwise")], failing
    assert failing["dropped term"], failing
