"""Checkpoints both ways with safetensors, every dtype both sides know, bit for bit: files bb.save
writes read by safetensors' numpy and torch readers, files safetensors writes read by bb.open and
bb.load; fp4 packed in torch's nibble order, fp6 listed and raw; bf16 and fp8 saved from and loaded
into every framework; transposed and big-endian inputs written as their values."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as st_numpy

import bf16bridge as bb
from bf16bridge.checkpoints import format as fmt
from bf16bridge.errors import UnsupportedDtypeError
from conftest import FRAMEWORKS, bits, make, ptr
from strategies import lacks, needs_newer_ml_dtypes, numpy_holds
from checkpoint_cases import _file, _st_read, _st_torch, _st_write, _t, _values


#: every safetensors code one value a byte or wider, and the numpy (ml_dtypes) dtype that holds it
CODES = [code for code, (_, nbits) in fmt.CODES.items() if nbits >= 8]


#: the codes safetensors' numpy loader reads: its _TYPES table, and BF16 (0.8 reads it through
#: ml_dtypes); fp8 raises AttributeError there (numpy has no float8_e4m3fn: safetensors#682)
NUMPY_LOADER = set(st_numpy._TYPES) | {"BF16"}


def _u8(a) -> bytes:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8).tobytes()


def _saved_by_us(tmp_path, code: str):
    """Values of ``code`` (4 a row) saved by bb.save beside an int16 neighbour, with metadata: (values, path)."""
    a = _values(code)
    a = a[: len(a) // 4 * 4].reshape(-1, 4)
    p = tmp_path / "m.safetensors"
    bb.save({"layer": {"w": a}, "odd": np.arange(3, dtype=np.int16)}, p, metadata={"step": "7"})
    return a, p


@pytest.mark.parametrize("code", CODES)
def test_ours_read_by_safetensors(tmp_path, code):
    if lacks(fmt.CODES[code][0]):
        return
    a, p = _saved_by_us(tmp_path, code)
    got = _st_read(p)
    assert got["layer.w"] == (code, list(a.shape), _u8(a))
    with safetensors.safe_open(str(p), framework="np") as f:
        assert f.metadata() == {"step": "7"}
    if code in NUMPY_LOADER:
        np.testing.assert_array_equal(st_numpy.load_file(str(p))["layer.w"].view(np.uint8), a.view(np.uint8))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("code", CODES)
def test_ours_read_by_safetensors_torch(tmp_path, code):
    if lacks(fmt.CODES[code][0]):
        return
    a, p = _saved_by_us(tmp_path, code)
    with safetensors.safe_open(str(p), framework="pt") as f:
        assert f.metadata() == {"step": "7"}
    t = _st_torch().load_file(str(p))["layer.w"]  # torch holds every code wider than a nibble
    assert t.contiguous().view(__import__("torch").uint8).numpy().tobytes() == _u8(a)


@pytest.mark.parametrize("code", CODES)
def test_safetensors_read_by_ours(tmp_path, code):
    if lacks(fmt.CODES[code][0]):
        return
    a = _values(code, seed=1)
    p = tmp_path / "m.safetensors"
    _st_write(p, {"a": a, "b.c": np.arange(5, dtype=np.float32)}, metadata={"by": "safetensors"})
    with bb.open(p) as f:
        assert f.metadata == {"by": "safetensors"}
        assert f.info("a").code == code and f.info("a").shape == a.shape
        assert f.get("a").dtype == a.dtype
        assert bits(f.get("a")).tobytes() == bits(a).tobytes()
    assert bits(bb.load(p, nested=True)["b"]["c"]).tobytes() == np.arange(5, dtype=np.float32).tobytes()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "int8", "bool", "float8_e4m3fn",
                                   "float8_e5m2", "float8_e8m0fnu"])
def test_torch_saved_by_safetensors_read_by_ours(tmp_path, dtype):
    import torch

    t = torch.arange(64, dtype=torch.float32).reshape(8, 8).to(getattr(torch, dtype))
    _st_torch().save_file({"t": t}, str(tmp_path / "t.safetensors"))
    if not numpy_holds(dtype):  # the file is read, and its key refused naming the ml_dtypes that has it
        with pytest.raises(UnsupportedDtypeError, match="key 't': .*" + needs_newer_ml_dtypes(dtype)):
            bb.load(tmp_path / "t.safetensors")
        return
    got = bb.load(tmp_path / "t.safetensors")["t"]
    assert got.reshape(-1).view(np.uint8).tobytes() == t.contiguous().view(torch.uint8).numpy().tobytes()


# -- fp4 and fp6: packed, two values a byte ---------------------------------------------------

@pytest.mark.frameworks("torch")
def test_fp4_packed_by_safetensors_torch_is_unpacked_in_torchs_nibble_order(tmp_path):
    import torch

    packed = torch.arange(16, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 8)
    _st_torch().save_file({"w": packed, "b": torch.ones(3)}, str(tmp_path / "f4.safetensors"))
    with bb.open(tmp_path / "f4.safetensors") as f:
        assert (f.info("w").code, f.info("w").shape, f.info("w").packed) == ("F4", (2, 16), True)
        assert f.raw("w").tobytes() == bytes(range(16))
        if not numpy_holds("float4_e2m1fn"):
            with pytest.raises(UnsupportedDtypeError, match="'w'.*" + needs_newer_ml_dtypes("float4_e2m1fn")):
                f.get("w")
            return
        unpacked = np.stack([np.arange(16) & 0xF, np.arange(16) >> 4], axis=-1).reshape(2, 16)  # low nibble first
        got = f.get("w")
        assert got.dtype == ml_dtypes.float4_e2m1fn and got.view(np.uint8).tolist() == unpacked.tolist()
        p = f.plan("w")
        assert p.copies and "two values a byte" in p.steps[0].reason
        assert ptr(got) % 64 == 0
        with pytest.raises(bb.CopyRequiredError, match="'w'.*unpacks"):
            f.get("w", copy=False)


@pytest.mark.frameworks("torch")
def test_fp4_saved_by_us_is_read_by_safetensors_torch_as_packed_bytes(tmp_path):
    import torch

    if lacks("float4_e2m1fn"):
        return
    a = (np.arange(32, dtype=np.uint8) & 0xF).view(ml_dtypes.float4_e2m1fn).reshape(4, 8)
    bb.save({"w": a}, tmp_path / "f4.safetensors")
    t = _st_torch().load_file(str(tmp_path / "f4.safetensors"))["w"]
    assert t.dtype == torch.float4_e2m1fn_x2 and tuple(t.shape) == (4, 4)
    nibbles = np.arange(32, dtype=np.uint8) & 0xF
    assert t.view(torch.uint8).numpy().tobytes() == (nibbles[0::2] | nibbles[1::2] << 4).tobytes()  # 2i low
    assert _st_read(tmp_path / "f4.safetensors")["w"][:2] == ("F4", [4, 8])
    assert bits(bb.load(tmp_path / "f4.safetensors")["w"]).tobytes() == bits(a).tobytes()


@pytest.mark.frameworks("torch")
def test_torch_packed_fp4_is_saved_as_f4_and_read_back_by_safetensors_torch(tmp_path):
    import torch

    packed = torch.arange(16, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 8)
    if not numpy_holds("float4_e2m1fn"):  # the writer unpacks through numpy's fp4: refused, nothing written
        with pytest.raises(UnsupportedDtypeError, match=needs_newer_ml_dtypes("float4_e2m1fn")):
            bb.save({"w": packed}, tmp_path / "f4.safetensors")
        assert os.listdir(tmp_path) == []
        return
    bb.save({"w": packed}, tmp_path / "f4.safetensors")  # planned with the route's result shape [2, 16]
    assert _st_read(tmp_path / "f4.safetensors")["w"][:2] == ("F4", [2, 16])
    t = _st_torch().load_file(str(tmp_path / "f4.safetensors"))["w"]
    assert t.dtype == torch.float4_e2m1fn_x2 and tuple(t.shape) == (2, 8)
    assert t.view(torch.uint8).numpy().tobytes() == packed.view(torch.uint8).numpy().tobytes()


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("target", ["torch", "jax", "tensorflow"])
def test_fp4_moves_to_every_framework_as_bb_convert_moves_it(tmp_path, target):
    import torch

    packed = torch.arange(16, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 8)
    _st_torch().save_file({"w": packed}, str(tmp_path / "f4.safetensors"))
    with bb.open(tmp_path / "f4.safetensors") as f:
        if not numpy_holds("float4_e2m1fn"):  # read through numpy's fp4: refused, naming the key
            with pytest.raises(UnsupportedDtypeError, match="'w'.*" + needs_newer_ml_dtypes("float4_e2m1fn")):
                f.get("w", target)
            return
        assert f.plan("w", target).copies
        got = f.get("w", target)
    assert bits(got).tobytes() == bits(bb.convert(packed, target)).tobytes()


def test_fp6_is_listed_and_raw_but_not_unpacked(tmp_path):
    (tmp_path / "f6.safetensors").write_bytes(_file({"w": _t("F6_E2M3", (4,), (0, 3))}, b"abc"))
    with bb.open(tmp_path / "f6.safetensors") as f:
        assert f.info("w").packed and f.raw("w").tobytes() == b"abc"
        with pytest.raises(UnsupportedDtypeError, match="'w'.*F6_E2M3") as err:
            f.get("w")
        assert str(err.value).count(str(tmp_path)) == 1  # the file named once


# -- every framework -------------------------------------------------------------------------

@pytest.mark.parametrize("source", FRAMEWORKS)
@pytest.mark.parametrize("target", FRAMEWORKS)
def test_every_framework_saves_and_loads_bf16_bit_for_bit(tmp_path, source, target, all_bf16):
    tree = {"emb": make(source, all_bf16.view(ml_dtypes.bfloat16).reshape(256, 256)),
            "h": [{"b": make(source, all_bf16[:7].view(ml_dtypes.bfloat16))},
                  {"b": make(source, np.arange(6, dtype=np.float32).reshape(2, 3))}]}
    p = tmp_path / "m.safetensors"
    bb.save(tree, p)
    out = bb.load(p, to=target, nested=True)
    assert sorted(bb.load(p)) == ["emb", "h.0.b", "h.1.b"]
    assert type(out["emb"]).__module__.split(".")[0] in (target, "jaxlib")
    assert bits(out["emb"]).tobytes() == all_bf16.tobytes()
    assert bits(out["h"]["0"]["b"]).tobytes() == all_bf16[:7].tobytes()
    assert bits(out["h"]["1"]["b"]).tobytes() == np.arange(6, dtype=np.float32).tobytes()


def _fp8(framework: str, a: np.ndarray):
    """An fp8 tensor of ``framework`` with the bits of ``a``, by the framework's own calls."""
    if framework == "torch":
        import torch

        return torch.from_numpy(a.view(np.uint8).copy()).view(getattr(torch, a.dtype.name))
    if framework == "tensorflow":
        import tensorflow as tf

        return tf.constant(a)
    return make(framework, a)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("source", FRAMEWORKS)
@pytest.mark.parametrize("target", FRAMEWORKS)
def test_every_framework_saves_and_loads_fp8_bit_for_bit(tmp_path, source, target, dtype):
    a = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, dtype)).reshape(4, 64)  # NaNs, -0 included
    bb.save({"w": _fp8(source, a)}, tmp_path / "m.safetensors")
    assert _st_read(tmp_path / "m.safetensors")["w"] == (fmt.NAMES[dtype], [4, 64], a.tobytes())
    out = bb.load(tmp_path / "m.safetensors", to=target)["w"]
    assert type(out).__module__.split(".")[0] in (target, "jaxlib")
    assert _bytes(out) == a.tobytes()


def _bytes(x) -> bytes:
    """Any framework's tensor's bytes, by its own calls (torch's .numpy() refuses fp8)."""
    if type(x).__module__.split(".")[0] == "torch":
        import torch

        return x.contiguous().view(torch.uint8).numpy().tobytes()
    return np.asarray(x.numpy() if hasattr(x, "numpy") and not isinstance(x, np.ndarray) else x).tobytes()


@pytest.mark.frameworks("torch")
def test_transposed_and_big_endian_inputs_are_written_as_their_values(tmp_path):
    import torch

    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    be = np.arange(5, dtype=">i4")
    bb.save({"t": t.T, "be": be}, tmp_path / "m.safetensors")
    got = _st_read(tmp_path / "m.safetensors")
    assert got["t"][2] == t.T.contiguous().view(torch.uint16).numpy().tobytes()
    assert got["be"] == ("I32", [5], np.arange(5, dtype="<i4").tobytes())
