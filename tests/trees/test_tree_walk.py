"""The walk behind convert_tree and plan_tree (bf16bridge/trees/walk.py: map_leaves, flatten, fill):
the containers users have (Python's own, dataclasses, flax nnx, equinox, keras variables, optree nodes,
torch state dicts) walked, every tensor leaf reached, structure and wrappers kept, the input untouched;
flatten and fill give what the full walk gives."""

from __future__ import annotations

import collections
import os
import tempfile
from collections import OrderedDict, namedtuple

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, bits, make, type_framework
from tree_cases import _bf16


Pair = namedtuple("Pair", "w b")


def _tensor_leaves(tree, framework):
    import jax

    cls = {"torch": __import__("torch").Tensor, "numpy": np.ndarray}[framework]
    return jax.tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, cls))


# -- the libraries' trees and wrappers: flax nnx, equinox, keras, optree, torch state dicts -------


@pytest.mark.frameworks("torch")
def test_flax_nnx_state_keeps_its_variables_with_new_values():
    import jax.numpy as jnp
    import torch
    from flax import nnx

    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
    state = nnx.state(model)
    out = bb.convert_tree(state, "torch", on_alias="allow")
    assert type(out) is type(state)
    # the wrapper, with its metadata, around a torch tensor: an nnx.Param (flax 0.10's state holds a
    # VariableState of type Param)
    assert type(out["kernel"]) is type(state["kernel"])
    assert getattr(out["kernel"], "type", type(out["kernel"])) is nnx.Param
    leaves = _tensor_leaves(out, "torch")
    assert len(leaves) == 2 and all(isinstance(t, torch.Tensor) for t in leaves)
    np.testing.assert_array_equal(bits(out["kernel"].value), bits(model.kernel.value))


@pytest.mark.libraries("flax")
def test_a_single_variable_converts_by_its_value():
    import jax.numpy as jnp
    from flax import nnx

    p = nnx.Param(jnp.asarray(_bf16((3,))))
    np.testing.assert_array_equal(bits(bb.to_torch(p, on_alias="allow")), bits(p.value))


@pytest.mark.libraries("flax")
def test_an_nnx_state_is_read_the_same_under_any_warnings_filter(tmp_path):
    """flax 0.12 deprecates Variable.value: read under a filter of "error" (pytest -W error), it raised,
    the Param was taken for no wrapper, and bb.save wrote keys 'kernel.value' and 'bias.value', silently;
    under the default filter each read warned in the user's run. Read through get_value(), neither."""
    import warnings

    import jax.numpy as jnp
    from flax import nnx

    state = nnx.state(nnx.Linear(3, 2, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (any warning raised: a deprecated read too)
        bb.save(state, tmp_path / "s.safetensors")
        out = bb.convert_tree(state, "numpy", on_alias="allow")
        one = bb.convert(nnx.Param(jnp.ones(2, jnp.bfloat16)), "numpy", on_alias="allow")
    with bb.open(tmp_path / "s.safetensors") as f:
        assert sorted(f.keys()) == ["bias", "kernel"]
    assert len(_tensor_leaves(out, "numpy")) == 2 and one.dtype.name == "bfloat16"


@pytest.mark.frameworks("torch")
def test_unwrap_returns_plain_tensors_for_wrapped_values():
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    state = nnx.state(nnx.Linear(3, 2, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16))
    out = bb.convert_tree(state, "torch", on_alias="allow", unwrap=True)
    kernel = out["kernel"]
    assert isinstance(kernel, torch.Tensor)  # the Param is gone: a plain tensor
    np.testing.assert_array_equal(bits(kernel), bits(state["kernel"].value))
    assert not any(isinstance(x, nnx.Variable) for x in jax.tree_util.tree_leaves(
        out, is_leaf=lambda x: isinstance(x, (nnx.Variable, torch.Tensor))))


@pytest.mark.libraries("equinox")
def test_equinox_module_is_walked():
    import equinox as eqx
    import jax
    import torch

    mlp = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    out = bb.convert_tree(mlp, "torch", on_alias="allow")
    assert out is not mlp and type(out) is type(mlp)
    want = [w for w in jax.tree_util.tree_leaves(mlp) if isinstance(w, jax.Array)]
    got = jax.tree_util.tree_leaves(out)
    assert not any(isinstance(g, jax.Array) for g in got)  # no array left behind
    got = [g for g in got if isinstance(g, torch.Tensor)]
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        np.testing.assert_array_equal(bits(g), bits(w))


@pytest.mark.libraries("keras")
def test_keras_variables_convert_by_their_value():
    import keras
    import torch

    v = keras.Variable(np.arange(3, dtype=np.float32))
    assert isinstance(bb.to_torch(v, on_alias="allow"), torch.Tensor)
    out = bb.convert_tree({"weights": [v, 7]}, "numpy")
    assert isinstance(out["weights"][0], np.ndarray) and out["weights"][1] == 7
    np.testing.assert_array_equal(out["weights"][0], np.arange(3, dtype=np.float32))


@pytest.mark.libraries("keras")
@pytest.mark.parametrize("to", ["torch", "jax", "numpy"])
def test_plan_plans_a_keras_variable_as_convert_converts_it(to):
    # plan once refused what convert (and plan_tree) took by its value
    import keras

    v = keras.Variable(np.arange(3, dtype=np.float32))
    p = bb.plan(v, to)
    y = bb.convert(v, to, on_alias="allow")
    assert p.source == bb.plan(v.value, to).source and p.dtype_out == "float32" and p.result_shape in (None, (3,))
    np.testing.assert_array_equal(bb.to_numpy(y, on_alias="allow"), np.arange(3, dtype=np.float32))
    with pytest.raises(bb.UnsupportedTypeError, match="builtins.object is not a tensor"):
        bb.plan(object(), to)


@pytest.mark.libraries("optree")
def test_optree_registered_nodes_are_walked():
    import optree
    import torch

    @optree.dataclasses.dataclass(namespace="bf16bridge-test")
    class Pair:
        w: object
        n: object

    out = bb.convert_tree({"p": Pair(make("torch", _bf16((4,))), 3)}, "numpy")
    assert type(out["p"]) is Pair and out["p"].n == 3
    assert isinstance(out["p"].w, np.ndarray)
    assert not isinstance(out["p"].w, torch.Tensor)
    np.testing.assert_array_equal(bits(out["p"].w), bits(_bf16((4,))))


@pytest.mark.frameworks("torch")
def test_torch_state_dict_keeps_its_metadata():
    import torch

    sd = torch.nn.Linear(2, 2).to(torch.bfloat16).state_dict()
    out = bb.convert_tree(sd, "numpy")
    assert type(out) is type(sd) and out._metadata == sd._metadata
    np.testing.assert_array_equal(bits(out["weight"]), bits(sd["weight"]))


# -- the containers of Python's own: each walked, its type and what it holds kept ---------------


@pytest.mark.frameworks("torch")
def test_nested_containers_and_non_tensor_leaves():
    import torch

    tree = {"a": [torch.ones(2, dtype=torch.bfloat16), (np.zeros(3, np.float32), "name")],
            "b": Pair(torch.zeros(1), None), "step": 7, "od": OrderedDict(x=torch.ones(1))}
    out = bb.convert_tree(tree, "tf")
    assert type_framework(out["a"][0]) == "tensorflow" and type_framework(out["a"][1][0]) == "tensorflow"
    assert out["a"][1][1] == "name" and out["step"] == 7 and out["b"].b is None
    assert isinstance(out["b"], Pair) and isinstance(out["a"][1], tuple) and isinstance(out["od"], OrderedDict)
    assert type_framework(tree["a"][0]) == "torch"  # the input tree is not modified


@pytest.mark.frameworks("tensorflow", "torch")
def test_plain_dataclasses_are_walked():
    import dataclasses

    import torch

    @dataclasses.dataclass(frozen=True)
    class Layer:
        w: object
        name: str
        cache: object = dataclasses.field(default=None, init=False)

    layer = Layer(make("torch", _bf16((3,))), "dense")
    out = bb.convert_tree({"l": [layer]}, "numpy")
    got = out["l"][0]
    assert type(got) is Layer and got.name == "dense" and isinstance(got.w, np.ndarray)
    assert isinstance(layer.w, torch.Tensor)  # the input is not modified
    np.testing.assert_array_equal(bits(got.w), bits(_bf16((3,))))


@pytest.mark.frameworks("torch")
def test_a_dataclass_is_rebuilt_without_running_its_init_again():
    """A dataclass comes back with each field converted and nothing else: its __post_init__ does not
    run again (one that doubles a field doubled it again; one that coerces to torch handed torch
    tensors back from a conversion to numpy), and init=False fields keep their values and are walked
    (dataclasses.replace reset them to their defaults, and bb.save left their tensors out)."""
    import dataclasses

    import torch

    @dataclasses.dataclass
    class Scaled:
        w: object
        step: int = dataclasses.field(default=0, init=False)
        ema: dict = dataclasses.field(default_factory=dict, init=False)

        def __post_init__(self):
            self.w = torch.as_tensor(self.w) * 2

    @dataclasses.dataclass(frozen=True, slots=True)
    class Frozen:
        w: object

    @dataclasses.dataclass
    class Unset:
        w: object
        unset: object = dataclasses.field(init=False)  # never assigned: no value, not a child

    x = Scaled(torch.arange(3, dtype=torch.bfloat16))
    x.step, x.ema["w"] = 1000, torch.ones(2, dtype=torch.bfloat16)
    for tree in (x, Frozen(torch.arange(3, dtype=torch.bfloat16)), Unset(torch.arange(3, dtype=torch.bfloat16))):
        out = bb.convert_tree(tree, "numpy")
        assert type(out) is type(tree) and isinstance(out.w, np.ndarray)
        np.testing.assert_array_equal(bits(out.w), bits(tree.w))
    assert not hasattr(out, "unset")
    out = bb.convert_tree(x, "numpy")
    assert out.step == 1000 and isinstance(out.ema["w"], np.ndarray) and x.ema["w"].dtype == torch.bfloat16
    import threading

    @dataclasses.dataclass(frozen=True)
    class Immutable:  # an immutable value's idiom: copying it is itself
        w: object

        def __copy__(self):
            return self

    @dataclasses.dataclass
    class Locked:  # an attribute its pickling state leaves out
        w: object

        def __post_init__(self):
            self._lock = threading.Lock()

        def __getstate__(self):
            return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    value, locked = Immutable(torch.ones(2, dtype=torch.bfloat16)), Locked(torch.ones(2, dtype=torch.bfloat16))
    out = bb.convert_tree(value, "numpy")
    assert out is not value and isinstance(out.w, np.ndarray) and isinstance(value.w, torch.Tensor)
    assert bb.convert_tree(locked, "numpy")._lock is locked._lock
    cast, report = bb.cast_tree(x, "float32")
    assert [r.path for r in report.leaves] == ["w", "ema.w"] and cast.w.tolist() == [0.0, 2.0, 4.0]
    @dataclasses.dataclass
    class TrainState:
        params: dict
        ema: dict = dataclasses.field(default_factory=dict, init=False)

    state = TrainState({"w": torch.zeros(2)})
    state.ema["w"] = torch.ones(2)
    with tempfile.TemporaryDirectory() as d:
        bb.save(state, os.path.join(d, "x.safetensors"))
        assert sorted(bb.load(os.path.join(d, "x.safetensors"))) == ["ema.w", "params.w"]


@pytest.mark.frameworks("jax")
def test_a_chainmap_keeps_its_maps_and_the_values_they_hide():
    """A ChainMap was rebuilt from what it showed: one map, the value a nearer map hides gone."""
    near, far = _bf16((2,)), _bf16((3,))
    chain = collections.ChainMap({"a": near}, {"a": far, "b": far})
    out = bb.convert_tree(chain, "jax")
    assert type(out) is collections.ChainMap and len(out.maps) == 2
    for got, want in ((out.maps[1]["a"], far), (out.maps[1]["b"], far), (out["a"], near)):
        assert type_framework(got) == "jax"
        np.testing.assert_array_equal(bits(got), bits(want))
    with tempfile.TemporaryDirectory() as d:  # each map under its place: no two leaves on one key
        bb.save(chain, os.path.join(d, "c.safetensors"))
        assert sorted(bb.load(os.path.join(d, "c.safetensors"))) == ["0.a", "1.a", "1.b"]


@pytest.mark.frameworks("torch")
def test_a_deque_is_walked_as_a_sequence_keeping_its_type_and_maxlen():
    import torch

    t = torch.ones(4, dtype=torch.bfloat16)
    tree = {"d": collections.deque([t, 3], maxlen=5), "u": collections.UserList([t])}
    out = bb.convert_tree(tree, "numpy")
    assert type(out["d"]) is collections.deque and out["d"].maxlen == 5 and out["d"][1] == 3
    assert type(out["u"]) is collections.UserList
    for y in (out["d"][0], out["u"][0]):
        assert isinstance(y, np.ndarray)
        np.testing.assert_array_equal(bits(y), bits(t))
    assert tree["d"][0] is t  # the input untouched
    assert "2 leaves: 2 zero-copy" in str(bb.plan_tree(tree, "numpy"))


# -- flatten and fill (a bridged call's arguments and results): the plain walk and the full one --


def _walked(tree):
    """flatten by the full walk alone."""
    from bf16bridge.trees import walk as trees

    leaves: list = []

    def take(x, path):
        leaves.append(x)
        return trees.SLOT

    return leaves, trees.map_leaves(take, tree)


def _same(a, b) -> bool:
    """The same tree: the same container types, the same objects at the leaves, equal plain values."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b or (isinstance(a, (str, bytes, int, float, complex)) and a == b)


def _deep(n, leaf):
    tree = leaf
    for _ in range(n):
        tree = [tree]
    return tree


_PLAIN_AND_NOT = {
    "plain": lambda t: ((t[0], t[1], 3, "s", None), {"k": t[2], "n": [1.5, b"x", np.str_("label"), True, 2j]}),
    "a namedtuple": lambda t: (Pair(t[0], None), {}),
    "a dict subclass": lambda t: ((collections.OrderedDict(w=t[0]),), {"d": collections.defaultdict(list, a=t[1])}),
    "deeper than the plain walk goes": lambda t: ((_deep(100, t[0]), t[1]), {}),
    "an object the registry does not know": lambda t: ((t[0], object), {}),
}


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("name", list(_PLAIN_AND_NOT))
def test_flatten_and_fill_give_what_the_full_walk_gives(name):
    import torch

    from bf16bridge.trees import walk as trees

    with pytest.raises(bb.UnsupportedDtypeError):
        bb.to_torch(np.str_("x"))  # numpy's type for a string is now a registered type: still a label
    tensors = [torch.zeros(2, dtype=torch.bfloat16) for _ in range(3)]
    tree = _PLAIN_AND_NOT[name](tensors)
    leaves, skeleton = trees.flatten(tree)
    want_leaves, want_skeleton = _walked(tree)
    assert [id(x) for x in leaves] == [id(x) for x in want_leaves] and leaves
    assert _same(skeleton, want_skeleton)
    assert _same(trees.fill(skeleton, leaves), tree)


def test_flatten_refuses_a_cycle_the_plain_walk_gives_up_on():
    from bf16bridge.core import registry
    from bf16bridge.trees import walk as trees

    loop: list = [np.zeros(2, BF16)]
    loop.append(loop)
    assert registry.framework_of(loop[0]) == "numpy"  # a known tensor type: the plain walk starts
    with pytest.raises(bb.UnsupportedTypeError, match="contains itself"):
        trees.flatten((loop,))
