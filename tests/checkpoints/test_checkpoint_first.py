"""A checkpoint's first get, on the paths that make it cheap in a fresh process: into numpy without
asking the planner (the map's own array: what plan() says), and into the other frameworks by running
the plan that decided it, not planning again. Each answers as plan() says and as a later get (the
ordinary convert path) answers: the same bits, zero-copy exactly where plan() says so, and the
same errors, naming the file and the key."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.checkpoints import format as fmt
from bf16bridge.errors import CopyRequiredError, InvalidArgumentError, UnsupportedDtypeError
from conftest import FRAMEWORKS, bits, ptr
from strategies import lacks, numpy_holds

#: keys of the file below: one a code numpy holds one value an element, at an aligned and at an odd
#: offset (the routes of jax and tensorflow copy there), and a packed F4
TENSORS = {
    "w": np.arange(64, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(8, 8),
    "odd": np.arange(3, dtype=np.uint16).view(ml_dtypes.bfloat16),
    "f8": np.arange(16, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
    "i": np.arange(5, dtype=np.int32),
}
if numpy_holds("float4_e2m1fn"):  # (an ml_dtypes without it: test_a_first_get_of_packed_fp4... says so)
    TENSORS["fp4"] = np.arange(16, dtype=np.uint8).view(bb.dtypes.numpy_dtype("float4_e2m1fn")).reshape(2, 8)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("first") / "m.safetensors"
    bb.save(TENSORS, p)
    return p


def _shares(x, view: np.ndarray) -> bool | None:
    """Whether ``x`` begins where ``view`` does; None for a tensor no means gives the address of
    (tensorflow's fp8: its DLPack export refuses the dtype)."""
    try:
        return ptr(x) == ptr(view)
    except Exception:  # noqa: BLE001 - tensorflow's own error type
        return None


def _raw(path, key) -> bytes:
    with bb.open(path) as f:
        return f.raw(key).tobytes()


@pytest.mark.parametrize("copy", [None, False, True])
@pytest.mark.parametrize("target", FRAMEWORKS)
@pytest.mark.parametrize("key", ["w", "odd", "f8", "i"])
def test_a_first_get_answers_as_plan_says_and_as_a_later_get(path, key, target, copy):
    raw = _raw(path, key)
    with bb.open(path) as f:
        try:
            p = f.plan(key, target, copy=copy)
        except (CopyRequiredError, UnsupportedDtypeError) as err:  # a route copy=False refuses, or no fp8
            with pytest.raises(type(err)) as first:
                f.get(key, target, copy=copy)
            assert str(path) in str(first.value) and repr(key) in str(first.value)
            return
        first = f.get(key, target, copy=copy)  # a fresh Checkpoint: decided now, on the path under test
        view = f.array(key)
        again = f.get(key, target, copy=copy)  # decided before: the ordinary path
        assert bits(first).tobytes() == bits(again).tobytes() == raw
        shares = (_shares(first, view), _shares(again, view))
        assert shares in ((not p.copies,) * 2, (None, None)), (p.copies, shares)


@pytest.mark.parametrize("bad", [{"copy": 0}, {"copy": "yes"}, {"fallback": "nope"}])
def test_a_first_get_into_numpy_refuses_keywords_as_plan_does(path, bad):
    with bb.open(path) as f:
        with pytest.raises(InvalidArgumentError) as planned:
            f.plan("w", "numpy", **bad)
        with pytest.raises(InvalidArgumentError) as got:
            f.get("w", "numpy", **bad)
    assert str(planned.value) in str(got.value) and str(path) in str(got.value) and "'w'" in str(got.value)


def test_a_first_get_into_numpy_refuses_what_it_cannot_read(tmp_path):
    # F6 packs four values in three bytes in an order no reader here defines: raw() only
    p = tmp_path / "f6.safetensors"
    text = b'{"six":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}}'
    p.write_bytes(len(text).to_bytes(8, "little") + text + b"\0\1\2")
    with bb.open(p) as f:
        with pytest.raises(UnsupportedDtypeError, match="'six' is F6_E2M3"):
            f.get("six")
        assert f.raw("six").tobytes() == b"\0\1\2"


@pytest.mark.parametrize("copy", [None, True])
def test_a_first_get_of_packed_fp4_into_numpy_unpacks(path, tmp_path, copy):
    if lacks("float4_e2m1fn"):  # a file's F4 into numpy: our error, naming the key and the ml_dtypes
        p = tmp_path / "f4.safetensors"
        text = b'{"fp4":{"dtype":"F4","shape":[2,8],"data_offsets":[0,8]}}'
        p.write_bytes(len(text).to_bytes(8, "little") + text + bytes(range(8)))
        with bb.open(p) as f:
            with pytest.raises(UnsupportedDtypeError, match="'fp4'.*upgrade ml_dtypes"):
                f.get("fp4", copy=copy)
            assert f.raw("fp4").tobytes() == bytes(range(8))
        return
    with bb.open(path) as f:
        out = f.get("fp4", copy=copy)
        assert f.plan("fp4", copy=copy).copies
    assert out.dtype == TENSORS["fp4"].dtype and out.tobytes() == TENSORS["fp4"].tobytes()


def test_max_dims_is_what_this_numpy_makes():
    n = fmt.max_dims()
    np.empty((1,) * n, np.uint8)
    with pytest.raises(ValueError):
        np.empty((1,) * (n + 1), np.uint8)


@pytest.mark.parametrize("target", FRAMEWORKS)
def test_copy_zero_is_refused_after_copy_false_was_decided(path, target):
    # 0 == False: a decision cached for copy=False once answered copy=0 into numpy, unchecked
    with bb.open(path) as f:
        f.get("w", target, copy=False)
        with pytest.raises(InvalidArgumentError, match="copy must be None"):
            f.get("w", target, copy=0)
