"""cast_tree and cast_module, fuzzed: trees of every framework and dtype with tied leaves, and torch
models of every norm kind with ties, buffers and user hooks; the policy keeps what it says, the
report says what was done (to the dtype each result has), inputs stay untouched, ties stay tied,
the cast model runs and a second cast changes nothing."""

from __future__ import annotations

import collections

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import bf16bridge as bb
import strategies  # also loads the derandomized hypothesis profile
from bf16bridge.casting import Rule
from conftest import BF16, PRESENT, dtype_name, fw, make


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
