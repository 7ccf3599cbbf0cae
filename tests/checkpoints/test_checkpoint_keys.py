"""Checkpoint keys (bf16bridge/checkpoints/keys.py): what a tree may hold and the dotted keys it
saves under; what save refuses naming the key (collisions, non-tensors, metadata that is no
strings, dtypes no code holds, numpy inputs whose file would lose something, model objects, a
dataclass's non-tensor fields), empty containers named in a warning, any UTF-8 key, tied weights
under each key, and nested loads."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import pytest
import safetensors

import bf16bridge as bb
from bf16bridge.errors import CheckpointError, InvalidArgumentError
from conftest import bits
from strategies import lacks, numpy_holds
from checkpoint_cases import _st_read, _st_torch, _st_write


def _zeros(n: int, name: str):
    """``np.zeros`` of a narrow row; where this ml_dtypes lacks the row, its name (the test then
    asserts our error for it)."""
    return np.zeros(n, bb.dtypes.numpy_dtype(name)) if numpy_holds(name) else name


class _Tagged(np.ndarray):
    """An ndarray subclass with state of its own (a unit, as astropy's Quantity): a file holds values only."""

    def __new__(cls, values, unit="m"):
        a = np.asarray(values, np.float32).view(cls)
        a.unit = unit
        return a


@pytest.mark.parametrize("tree, metadata, match", [
    ({"a.b": np.zeros(1), "a": {"b": np.ones(1)}}, None, "'a.b'.*both flatten"),
    ({"a": np.zeros(1), "step": 3}, None, r"\['step'\].*not a tensor.*metadata"),
    ({"a": [np.zeros(1), "label"]}, None, r"\['a'\]\[1\].*not a tensor"),
    ({"a": np.zeros(1)}, {"step": 1000}, "metadata key 'step'.*strings"),
    ({"a": np.zeros(1)}, {1: "x"}, "metadata key 1"),
    ({"a": np.zeros(1)}, ["x"], "metadata must be a dict"),
    ({"__metadata__": np.zeros(1)}, None, "format's own"),
    ({(1, 2): np.zeros(1)}, None, r"\(1, 2\).*string keys"),
    ({"a": np.zeros(2, np.complex128)}, None, "'a'.*complex128"),
    ({"a": _zeros(3, "float4_e2m1fn")}, None, "'a'.*inside a byte"),
    ({"a": _zeros(4, "float6_e2m3fn")}, None, "'a'.*float6"),
    ({"a": np.zeros(1)}, {"k": "\ud800"}, "metadata key 'k'.*UTF-8"),  # was a bare UnicodeEncodeError
    ({"a": np.zeros(1)}, {"\udcff": "v"}, "metadata key '\\\\udcff'.*UTF-8"),
    ({"\ud800": np.zeros(1)}, None, "UTF-8"),
    # objects the walk kept as they were: once saved as an empty file, without a word
    ({"a": np.zeros(1), "ids": {1, 2}}, None, r"\['ids'\]: builtins.set is neither a tensor nor a container"),
    ({"a": np.zeros(1), "o": object()}, None, r"\['o'\]: builtins.object is neither"),
    ({"gen": (i for i in range(2))}, None, r"\['gen'\]: builtins.generator"),
    # numpy inputs whose file would lose something: once written without their mask, fields or type
    ({"m": {"x": np.ma.masked_array([1.0, 2.0], mask=[0, 1])}}, None, r"key 'm.x'.*lose its mask.*filled"),
    ({"a": _Tagged([1.0, 2.0])}, None, r"key 'a'.*_Tagged.*subclass.*np.asarray"),
    ({"a": np.zeros(2, [("i", "<i4"), ("f", "<f8")])}, None, r"key 'a'.*structured.*a\['i'\]"),
    ({"a": np.rec.array(np.zeros(2, [("i", "<i4")]))}, None, r"key 'a'.*structured.*a\['i'\]"),
    ({"a": np.array([1, "x"], object)}, None, r"key 'a'.*object.*numeric dtype"),
    ({"a": np.array(["2020-01-01"], "datetime64[D]")}, None, r"key 'a'.*datetime64\[D\].*view\(np.int64\).*metadata"),
    ({"a": np.array([5], "timedelta64[s]")}, None, r"key 'a'.*timedelta64\[s\].*view\(np.int64\)"),
    ({"a": np.array(["ab"])}, None, r"key 'a'.*<U2.*metadata="),
    ({"a": np.zeros(2, np.longdouble)}, None, r"key 'a'.*float128.*float64"),
    # no code: the way out is the narrowest exact widening the format has
    ({"a": np.zeros(2, ml_dtypes.int4)}, None, r"key 'a'.*int4.*widen it to int8.*exact"),
    ({"a": np.zeros(2, ml_dtypes.float8_e4m3b11fnuz)}, None, r"key 'a'.*e4m3b11fnuz.*widen it to bfloat16"),
    ({"a": _zeros(4, "float6_e3m2fn")}, None, r"key 'a'.*float6_e3m2fn.*widen it to bfloat16"),
], ids=["collision", "number", "string", "metadata-value", "metadata-key", "metadata-type", "reserved",
        "tuple-key", "complex128", "odd-fp4", "fp6", "metadata-surrogate", "metadata-key-surrogate",
        "key-surrogate", "set", "object", "generator", "masked", "ndarray-subclass", "structured", "recarray",
        "object-array", "datetime64", "timedelta64", "str-array", "longdouble", "int4", "e4m3b11", "fp6-widens"])
def test_save_refuses_naming_the_key(tmp_path, tree, metadata, match):
    if isinstance(tree.get("a"), str) and lacks(tree["a"]):
        return
    p = tmp_path / "m.safetensors"
    with pytest.raises(bb.Bf16BridgeError, match=match):
        bb.save(tree, p, metadata=metadata)
    assert os.listdir(tmp_path) == []


def _memmap(tmp_path):
    m = np.memmap(tmp_path / "mm.bin", np.float32, "w+", shape=(2, 3))
    m[...] = np.arange(6).reshape(2, 3)
    return m


@pytest.mark.parametrize("make", [
    lambda tmp: np.array([[1.0, -0.0], [np.nan, 4.0]], np.float32).view(np.matrix),  # (np.matrix() warns)
    _memmap,
    lambda tmp: np.arange(6, dtype=np.int16).view(np.recarray),  # a record array of a plain dtype: its values
    lambda tmp: ml_dtypes.bfloat16(-0.0),  # a numpy scalar: a 0-d tensor
], ids=["matrix", "memmap", "recarray-plain", "scalar"])
def test_save_writes_ndarray_subclasses_that_hold_only_values_as_their_values(tmp_path, make):
    x = make(tmp_path)
    bb.save({"a": x}, tmp_path / "m.safetensors")
    got = bb.load(tmp_path / "m.safetensors")["a"]
    want = np.asarray(x)
    assert type(got) is np.ndarray and got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()


@pytest.mark.frameworks("torch")
@pytest.mark.libraries("flax")
def test_keys_of_a_torch_state_dict_and_a_flax_nnx_state(tmp_path):
    import jax.numpy as jnp
    import torch
    from flax import nnx

    sd = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2)).to(torch.bfloat16).state_dict()
    bb.save(sd, tmp_path / "t.safetensors")
    back = bb.load(tmp_path / "t.safetensors", to="torch")
    assert sorted(back) == sorted(sd) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    assert all(torch.equal(back[k].view(torch.uint16), sd[k].view(torch.uint16)) for k in sd)
    model = nnx.Sequential(nnx.Linear(3, 2, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16),
                           nnx.LayerNorm(2, rngs=nnx.Rngs(0)))
    bb.save(nnx.state(model), tmp_path / "f.safetensors")  # Params saved as the arrays they hold
    params = bb.load(tmp_path / "f.safetensors", to="jax", nested=True)
    assert sorted(bb.load(tmp_path / "f.safetensors")) == ["layers.0.bias", "layers.0.kernel", "layers.1.bias",
                                                           "layers.1.scale"]
    assert bits(params["layers"]["0"]["kernel"]).tobytes() == bits(model.layers[0].kernel.value).tobytes()


def test_a_bare_tensor_has_no_key(tmp_path):
    with pytest.raises(InvalidArgumentError, match="bare tensor"):
        bb.save(np.zeros(2), tmp_path / "m.safetensors")


@pytest.mark.frameworks("torch")
def test_a_model_object_is_refused_naming_its_weights(tmp_path):
    import torch

    for tree, where in ((torch.nn.Linear(2, 2), "the root"), ({"model": torch.nn.Linear(2, 2)}, r"\['model'\]")):
        with pytest.raises(InvalidArgumentError, match=f"at {where}: torch.nn.modules.linear.Linear is a model "
                                                       "object.*state_dict"):  # once: an empty file
            bb.save(tree, tmp_path / "m.safetensors")
    assert os.listdir(tmp_path) == []


@dataclasses.dataclass
class _Config:
    w: Any
    lr: Any
    extra: Any


@pytest.mark.parametrize("lr, extra, bad", [(0.1, {}, "lr"), (np.float32(1), {"note": "kept?"}, "note"),
                                            (np.ones(1, np.float32), {"step": 7}, "step")])
def test_a_dataclass_field_that_is_not_a_tensor_is_refused_as_in_a_dict(tmp_path, lr, extra, bad):
    """A dataclass's non-tensor fields (and whole dicts inside it) were dropped without a word,
    where the same values in a dict are refused: the file lost them silently."""
    with pytest.raises(InvalidArgumentError, match=f"{bad}.*is not a tensor"):
        bb.save(_Config(np.ones(2, np.float32), lr, extra), tmp_path / "m.safetensors")
    assert os.listdir(tmp_path) == []
    bb.save(_Config(np.ones(2, np.float32), np.zeros(1, np.float32), {"b": np.ones(3, np.float32)}),
            tmp_path / "ok.safetensors")
    with bb.open(tmp_path / "ok.safetensors") as f:
        assert sorted(f.keys()) == ["extra.b", "lr", "w"]


@pytest.mark.frameworks("tensorflow")
@pytest.mark.libraries("keras")
def test_a_deque_is_saved_by_position_and_a_tf_composite_or_keras_layer_refused(tmp_path):
    # a deque: once "neither a tensor nor a container" though convert_tree walks it; a ragged tensor
    # and a Keras layer: refused with the way out convert_tree names
    import collections

    import keras
    import tensorflow as tf

    bb.save({"d": collections.deque([np.arange(2, dtype=np.float32)])}, tmp_path / "d.safetensors")
    assert list(bb.load(tmp_path / "d.safetensors")) == ["d.0"]
    layer = keras.layers.Dense(2, name="saved")
    layer.build((None, 3))
    for held, says in ((tf.ragged.constant([[1.0], []]), r"ragged tensor.*rt\.to_tensor\(\)"),
                       (layer, r"Keras layer.*layer\.weights")):
        with pytest.raises(InvalidArgumentError, match=r"at \['h'\]: .*" + says):
            bb.save({"a": np.zeros(1), "h": held}, tmp_path / "m.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["d.safetensors"]


@pytest.mark.libraries("equinox")
def test_an_equinox_modules_arrays_save_and_its_functions_are_named(tmp_path):
    """eqx.filter(model, eqx.is_array), equinox's way to keep the arrays, leaves None where a function
    was: refused as a leaf, though jax takes it as an empty subtree; and the module itself was refused
    at its activation with a way out it could not take."""
    import equinox as eqx
    import jax

    mlp = eqx.nn.MLP(4, 2, 8, depth=1, key=jax.random.PRNGKey(0))
    with pytest.raises(bb.InvalidArgumentError, match=r"at \['activation'\]: .*eqx.filter\(model, eqx.is_array\)"):
        bb.save(mlp, tmp_path / "m.safetensors")
    with pytest.warns(bb.Bf16BridgeWarning, match=r"without 2 empty containers of the tree \(\['activation'\], "
                      r"\['final_activation'\]\): .*a pytree's None"):
        bb.save(eqx.filter(mlp, eqx.is_array), tmp_path / "m.safetensors")
    got = bb.load(tmp_path / "m.safetensors")
    assert sorted(got) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]
    np.testing.assert_array_equal(got["layers.0.weight"], np.asarray(mlp.layers[0].weight))


# -- empty containers ------------------------------------------------------------------------

def test_an_empty_container_has_no_key_and_is_not_in_the_file_and_save_says_so(tmp_path):
    # docs/checkpoints.md says so: a file holds tensors under keys, not the tree's containers; an
    # optimizer state saved before its first step lost its structure without a word (review)
    p = tmp_path / "m.safetensors"
    tree = {"opt": {}, "l": [], "h": {"w": np.arange(2, dtype=np.float32), "e": ()}}
    with pytest.warns(bb.Bf16BridgeWarning, match=r"without 3 empty containers of the tree \(\['opt'\], \['l'\], "
                      r"\['h'\]\['e'\]\): .*bb\.load does not give it back"):
        bb.save(tree, p)
    assert list(bb.open(p).keys()) == ["h.w"]
    assert list(bb.load(p, nested=True)) == ["h"] and list(bb.load(p, nested=True)["h"]) == ["w"]


class _NoFields(NamedTuple):  # optax's EmptyState: a state with nothing in it
    pass


@dataclasses.dataclass
class _EmptyData:
    pass


@pytest.mark.parametrize("empty, where", [
    ({"s": (_NoFields(),)}, r"\['s'\]\[0\]"),
    ({"s": {"d": _EmptyData()}}, r"\['s'\]\['d'\]"),
    ({"a": {}, "b": {}, "c": {}, "d": [], "e": ()}, r"\['a'\], \['b'\], \['c'\] and 2 more"),
])
def test_save_names_empty_containers_of_every_kind_and_writes_nothing_where_that_warning_is_an_error(
        tmp_path, empty, where):
    p = tmp_path / "m.safetensors"
    bb.save({"old": np.zeros(1, np.float32)}, p)
    before = p.read_bytes()
    with pytest.raises(bb.Bf16BridgeWarning, match=f"empty containers? of the tree \\({where}\\)"):
        bb.save({"w": np.ones(2, np.float32), **empty}, p)  # (the suite's filters make warnings errors)
    assert p.read_bytes() == before and os.listdir(tmp_path) == ["m.safetensors"]  # nothing written


@pytest.mark.parametrize("tree", [{}, [], {"w": np.ones(1, np.float32)}])
def test_save_of_an_empty_tree_or_one_without_empty_containers_says_nothing(tmp_path, tree):
    # an empty root loads back as what it was ({}; a list as a dict, as lists always do), as safetensors'
    # save_file({}) does: nothing is lost, nothing to say
    p = tmp_path / "m.safetensors"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bb.save(tree, p)
    assert {k: v.tolist() for k, v in bb.load(p).items()} == ({"w": [1.0]} if tree else {})


# -- keys in the file ------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["", ".", "ünï.日本語", "emoji🙂", "a\x00b", "k" * 100_000, "a..b", " "])
def test_any_utf8_key_round_trips_and_safetensors_reads_it(tmp_path, key):
    p = tmp_path / "m.safetensors"
    a = np.arange(3, dtype=np.int16)
    bb.save({key: a}, p, metadata={key: key})
    assert _st_read(p) == {key: ("I16", [3], a.astype("<i2").tobytes())}
    with safetensors.safe_open(str(p), "np") as f:
        assert f.metadata() == {key: key}
    assert list(bb.load(p)) == [key] and bb.load(p)[key].tolist() == [0, 1, 2]


@pytest.mark.frameworks("torch")
def test_tied_weights_and_views_of_one_storage_are_written_under_each_key(tmp_path):
    import torch

    torch.manual_seed(0)
    emb = torch.nn.Embedding(8, 4).to(torch.bfloat16)
    head = torch.nn.Linear(4, 8, bias=False).to(torch.bfloat16)
    head.weight = emb.weight
    tree = {"wte.weight": emb.weight, "lm_head.weight": head.weight, "row": emb.weight[3], "col": emb.weight[:, 1]}
    bb.save(tree, tmp_path / "m.safetensors")
    theirs = _st_torch().load_file(tmp_path / "m.safetensors")
    for k, t in tree.items():
        assert theirs[k].shape == t.shape and torch.equal(theirs[k].view(torch.int16), t.detach().view(torch.int16)), k
    ours = bb.load(tmp_path / "m.safetensors", to="torch")
    assert ours["wte.weight"].data_ptr() != ours["lm_head.weight"].data_ptr()  # separate tensors, as docs say


def test_nested_load_refuses_a_key_that_is_also_a_prefix(tmp_path):
    _st_write(tmp_path / "m.safetensors", {"a": np.zeros(1, np.float32), "a.b": np.zeros(1, np.float32)})
    assert sorted(bb.load(tmp_path / "m.safetensors")) == ["a", "a.b"]
    with pytest.raises(CheckpointError, match="nested=False"):
        bb.load(tmp_path / "m.safetensors", nested=True)
