"""Fuzzing the checkpoint reader: real files (ours and safetensors'), their headers and bytes
mutated. Each mutant either raises CheckpointError (or UnsupportedDtypeError, for a valid file
of a packed dtype) or loads, and what loads is what safetensors' own reader returns for the same
bytes, bit for bit: we accept no file that safetensors refuses. Derandomized and bounded
(tests/strategies.py's profiles)."""

from __future__ import annotations

import json
import os
import tempfile

import ml_dtypes
import numpy as np
import safetensors
from hypothesis import given
from hypothesis import strategies as st

import bf16bridge as bb
import strategies  # noqa: F401 - loads the ci/fuzz profiles
from bf16bridge.errors import CheckpointError, UnsupportedDtypeError


def _ours() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        bb.save({"emb": np.arange(40, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(4, 10),
                 "h": [{"w": np.arange(6, dtype=np.int16)}, {"w": np.ones(3, np.float64)}],
                 "f8": np.arange(5, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn), "b": np.array([True, False])},
                p, metadata={"step": "3"})
        with open(p, "rb") as f:
            return f.read()


def _theirs() -> bytes:
    a, b = np.arange(12, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(3, 4), np.arange(3, dtype=np.int64)
    specs = {k: safetensors.TensorSpec(dtype=v.dtype.name, shape=list(v.shape), data_ptr=v.ctypes.data,
                                       data_len=v.nbytes) for k, v in {"a": a, "b": b}.items()}
    return bytes(safetensors.serialize(specs, metadata={"by": "them"}))


FILES = (_ours(), _theirs())


def _split(blob: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def _join(header, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


_VALUES = st.one_of(st.integers(-3, 300), st.just(2**64), st.floats(allow_nan=False, width=32),
                    st.text(max_size=6), st.none(), st.booleans(), st.lists(st.integers(-2, 70), max_size=4),
                    st.sampled_from(["F32", "BF16", "I8", "F8_E8M0", "F4", "F6_E2M3", "C64", "Q8"]))


@st.composite
def mutants(draw) -> bytes:
    blob = draw(st.sampled_from(FILES))
    kind = draw(st.sampled_from(["byte", "truncate", "append", "length", "field", "drop", "swap"]))
    if kind == "byte":
        i = draw(st.integers(0, len(blob) - 1))
        return blob[:i] + bytes([draw(st.integers(0, 255))]) + blob[i + 1:]
    if kind == "truncate":
        return blob[:draw(st.integers(0, len(blob) - 1))]
    if kind == "append":
        return blob + draw(st.binary(min_size=1, max_size=16))
    if kind == "length":
        n = int.from_bytes(blob[:8], "little") + draw(st.integers(-16, 16))
        return max(n, 0).to_bytes(8, "little") + blob[8:]
    header, data = _split(blob)
    keys = [k for k in header if k != "__metadata__"]
    key = draw(st.sampled_from(keys))
    if kind == "field":
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "__metadata__"]))
        if field == "__metadata__":
            header["__metadata__"] = {"k": draw(_VALUES)}
        elif field == "shape" or field == "data_offsets":
            entry = list(header[key][field])
            if entry and draw(st.booleans()):
                entry[draw(st.integers(0, len(entry) - 1))] = draw(_VALUES)
                header[key][field] = entry
            else:
                header[key][field] = draw(_VALUES)
        else:
            header[key][field] = draw(_VALUES)
    elif kind == "drop":
        del header[key]
    else:  # two tensors' offsets exchanged: data_offsets out of order, sizes wrong
        other = draw(st.sampled_from(keys))
        header[key]["data_offsets"], header[other]["data_offsets"] = (
            header[other]["data_offsets"], header[key]["data_offsets"])
    return _join(header, data)


def _theirs_read(blob: bytes):
    try:
        return {k: (v["dtype"], list(v["shape"]), bytes(v["data"])) for k, v in safetensors.deserialize(blob)}
    except BaseException as err:  # noqa: BLE001 - their refusal (a pyo3 panic is a BaseException)
        if isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise
        return None


@given(mutants())
def test_a_mutant_is_refused_or_read_as_safetensors_reads_it(blob):
    theirs = _theirs_read(blob)
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        with open(p, "wb") as f:
            f.write(blob)
        try:
            with bb.open(p) as ck:
                ours = {}
                for key in ck.keys():
                    info = ck.info(key)
                    raw = ck.raw(key).tobytes()
                    if not info.packed:
                        assert ck.get(key).reshape(-1).view(np.uint8).tobytes() == raw
                    ours[key] = (info.code, list(info.shape), raw)
        except CheckpointError as err:
            assert p in str(err)
            return
        except UnsupportedDtypeError:
            assert theirs is not None  # a valid file of a dtype we do not unpack
            return
    assert theirs is not None, f"we read a file safetensors refuses: {ours}"
    assert ours == theirs
