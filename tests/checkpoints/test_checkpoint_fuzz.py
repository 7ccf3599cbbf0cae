"""Fuzzing the checkpoint reader: real files (ours and safetensors'), their headers and bytes
mutated. Each mutant either raises CheckpointError (or UnsupportedDtypeError, for a valid file
of a packed dtype) or loads, and what loads is what safetensors' own reader returns for the same
bytes, bit for bit: we accept no file that safetensors refuses. Derandomized and bounded
(tests/strategies.py's profiles)."""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
import pytest
import safetensors
from hypothesis import example, given
from hypothesis import strategies as st

import bf16bridge as bb
import strategies
from bf16bridge.checkpoints import format as fmt
from bf16bridge.errors import CheckpointError, UnsupportedDtypeError
from checkpoint_cases import DECODINGS, decoding
from conftest import PRESENT


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


def _header_read(blob: bytes):
    """What reading the header answers: its keys, metadata and every entry (each a TensorInfo or its
    check's message), or the message of the file's refusal."""
    try:
        h = fmt.read(io.BytesIO(blob), "m.safetensors", len(blob))
    except CheckpointError as err:
        return str(err)
    entries = []
    for key in h.keys:
        try:
            entries.append(h.info(key))
        except CheckpointError as err:
            entries.append(str(err))
    return h.keys, dict(h.metadata), h.length, entries


@given(mutants())
def test_a_mutant_header_reads_alike_with_msgspec_and_with_json_alone(blob):
    # msgspec decodes what it can vouch for and leaves the rest to json's path: the answers are one
    answers = []
    for name in DECODINGS:
        with decoding(name):
            answers.append(_header_read(blob))
    assert answers[0] == answers[1]


# -- save -> load round trips: every input layout, every framework, every dtype the format holds ------

#: the dtypes the bridge carries that the format holds (complex128 has no code)
SAVABLE = tuple(d for d in strategies.DTYPES if d in fmt.NAMES)
#: jax holds none of these unless x64 is on: a load into jax refuses them (our error, naming the key)
WIDE = frozenset(strategies.WIDE)
_inputs = st.one_of(strategies.numpy_specs(SAVABLE), strategies.big_endian_specs.filter(lambda s: s.dtype in SAVABLE),
                    strategies.zero_stride_specs.filter(lambda s: s.dtype in SAVABLE),
                    strategies.offset_specs.filter(lambda s: s.dtype in SAVABLE),
                    strategies.torch_specs(SAVABLE), strategies.torch_expand_specs.filter(lambda s: s.dtype in SAVABLE),
                    strategies.made_specs().filter(lambda s: s.dtype in SAVABLE),
                    st.sampled_from([  # 0-d (a torch BatchNorm's num_batches_tracked), once lost its shape
                        strategies.NumpySpec("int64", (), (), (), seed=1),
                        strategies.NumpySpec("bfloat16", (), (), (), order=">", seed=2),
                        strategies.TorchSpec("bfloat16", (), (), (), neg=True, seed=3),
                        strategies.TorchSpec("float32", (), (), (), grad=True, seed=4),
                        # a lazy neg view long enough for torch's vectorised path, NaNs in it
                        strategies.TorchSpec("bfloat16", (1, 2, 2, 4, 4), (1, 1, 1, 1, 1), (0, 1, 2, 4, 3), neg=True),
                        strategies.MadeSpec("jax", "bfloat16", (), seed=5),
                        strategies.MadeSpec("tensorflow", "float16", (), seed=6)]))


def _le_bytes(bits: np.ndarray) -> bytes:
    return bits.astype(bits.dtype.newbyteorder("<")).tobytes()


@pytest.mark.frameworks("torch", "tensorflow")  # its inputs are made by every framework
@given(st.lists(_inputs, min_size=1, max_size=4), st.sampled_from(PRESENT))
@example([strategies.TorchSpec("bfloat16", (1, 2, 2, 4, 4), (1, 1, 1, 1, 1), (0, 1, 2, 4, 3), neg=True)], "numpy")
def test_a_saved_tree_loads_bit_for_bit_in_every_framework_and_in_safetensors(specs, target):
    tensors = {f"t{i}": s.build() for i, s in enumerate(specs)}
    want = {k: strategies.value_bits(strategies.as_numpy(x)) for k, x in tensors.items()}
    shapes = {k: tuple(x.shape) for k, x in tensors.items()}
    #: a torch view with the lazy neg bit: a NaN's bits are torch's to choose when the bit is resolved
    #: (0x7FC0 on its scalar path, the payload with the sign flipped on its vectorised one), so the
    #: file holds a NaN where the input does, not necessarily the same NaN
    lazy_neg = {f"t{i}" for i, s in enumerate(specs) if getattr(s, "neg", False)}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        bb.save(tensors, p)
        with open(p, "rb") as f:  # safetensors' own reader sees the values, little-endian, in their shapes
            theirs = {k: (v["dtype"], tuple(v["shape"]), bytes(v["data"])) for k, v in safetensors.deserialize(f.read())}
        file_bits = {}
        for k, x in tensors.items():
            code, shape, data = theirs[k]
            assert (code, shape) == (fmt.NAMES[strategies.as_numpy(x).dtype.name], shapes[k]), k
            file_bits[k] = np.frombuffer(data, want[k].dtype.newbyteorder("<")).astype(want[k].dtype)
            if k in lazy_neg:
                a = np.frombuffer(data, strategies.as_numpy(x).dtype.newbyteorder("<")).reshape(-1)
                same = (file_bits[k] == want[k]) | (np.isnan(a.astype(np.float32)) & np.isnan(
                    strategies.as_numpy(x).reshape(-1).astype(np.float32)))
                assert same.all(), k
            else:
                assert data == _le_bytes(want[k]), k
        with bb.open(p) as ck:  # what the file holds arrives bit for bit
            for k in tensors:
                if target == "jax" and ck.info(k).dtype in WIDE:
                    with pytest.raises(bb.Bf16BridgeError, match=repr(k)):
                        ck.get(k, target)
                    continue
                y = ck.get(k, target)
                assert tuple(y.shape) == shapes[k], k
                assert np.array_equal(strategies.result_bits(y), file_bits[k]), k


#: the narrow floats the format holds one or two a byte (fp6 is listed only: read raw), of those numpy
#: holds here (an ml_dtypes without a row has no array of it: test_checkpoint_interop.py asserts our error)
NARROW = tuple(name for code, (name, bits) in fmt.CODES.items()
               if name.startswith(("float8", "float4")) and code not in fmt.UNPACKED and strategies.numpy_holds(name))


@st.composite
def narrow_arrays(draw):
    """A numpy array of a narrow float: every byte pattern it has (fp4: 16, one a byte), sliced and
    transposed; an fp4 array of an odd count has an element appended or is refused (below)."""
    name = draw(st.sampled_from(NARROW))
    shape, steps, perm = draw(strategies.shapes_and_steps(max_dims=3))
    base = tuple(n * abs(k) for n, k in zip(shape, steps))
    seed = draw(st.integers(0, 2**16))
    patterns = 16 if name.startswith("float4") else 256
    raw = np.random.default_rng(seed).integers(0, patterns, math.prod(base), dtype=np.uint8)
    a = raw.view(fmt.numpy_dtype(name)).reshape(base)
    return a[(*(slice(None, None, k) for k in steps), ...)].transpose(perm)


def _f4_packed(a: np.ndarray) -> bytes:
    """Two values a byte, element 2i in the low nibble (safetensors' F4, torch's float4_e2m1fn_x2)."""
    u = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()


@pytest.mark.frameworks("torch")
@given(narrow_arrays(), st.sampled_from(["numpy", "jax", "torch"]))
def test_narrow_floats_round_trip_bit_for_bit_and_pack_as_safetensors_does(a, target):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        if a.dtype.name.startswith("float4") and a.size % 2:
            with pytest.raises(UnsupportedDtypeError, match="'w'.*inside a byte"):
                bb.save({"w": a}, p)
            assert os.listdir(d) == []
            return
        bb.save({"w": a}, p)
        with open(p, "rb") as f:
            (key, theirs), = safetensors.deserialize(f.read())
        data = _f4_packed(a) if a.dtype.name.startswith("float4") else np.ascontiguousarray(a).tobytes()
        assert (theirs["dtype"], list(theirs["shape"]), bytes(theirs["data"])) == (fmt.NAMES[a.dtype.name],
                                                                                     list(a.shape), data)
        if target == "torch" and a.dtype.name.startswith("float4") and a.shape[-1] % 2:
            with pytest.raises(UnsupportedDtypeError, match="'w'.*packed two values a byte along the last"):
                bb.load(p, to=target)  # torch's float4_e2m1fn_x2 pairs values along the last dimension
            return
        y = bb.load(p, to=target)["w"]
        if target == "torch":
            import torch

            if a.dtype.name.startswith("float4"):  # torch holds fp4 packed, two a byte: the file's bytes
                assert y.dtype == torch.float4_e2m1fn_x2 and tuple(y.shape) == (*a.shape[:-1], a.shape[-1] // 2)
                assert y.contiguous().view(torch.uint8).numpy().tobytes() == data
                return
            got = y.contiguous().view(torch.uint8).numpy()
        else:
            got = np.asarray(y).view(np.uint8)
        assert tuple(y.shape) == a.shape
        assert got.tobytes() == np.ascontiguousarray(a).view(np.uint8).tobytes()


# -- the file changing under an open handle ----------------------------------------------------------

_UNDER = """
import os, sys, numpy as np, bf16bridge as bb
p, how = sys.argv[1], sys.argv[2]
w = np.arange(1 << 16, dtype=np.float32)
bb.save({"a": w, "b": w + 1}, p)
f = bb.open(p)
view = f.get("b")
if how == "replaced":
    bb.save({"a": np.zeros(3, np.float32)}, p)  # a new file renamed over the old one
    assert np.array_equal(view, w + 1) and np.array_equal(f.get("a", copy=True), w)
    print("old bytes kept", flush=True)
elif how == "truncated-copy":
    os.truncate(p, 100)  # another writer rewriting the file in place
    try:
        f.get("a", copy=True)
    except bb.CheckpointError as err:
        print("ours:", err, flush=True)
else:
    os.truncate(p, 100)
    print("touching", flush=True)
    print(float(view.sum()), flush=True)  # pages past the new end: SIGBUS
"""


@pytest.mark.parametrize("how, rc, says", [("replaced", 0, "old bytes kept"),
                                           ("truncated-copy", 0, "ours: .*the file ended .* bytes early"),
                                           ("truncated-view", -signal.SIGBUS, "touching")])
def test_a_file_changed_under_an_open_checkpoint(tmp_path, how, rc, says):
    """docs/checkpoints.md: a replaced file keeps its old bytes for the open handle; a file truncated
    in place makes a copying read our error and kills a process touching a view (SIGBUS)."""
    r = subprocess.run([sys.executable, "-c", _UNDER, str(tmp_path / "m.safetensors"), how],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == rc, r.stderr[-2000:]
    assert re.search(says, r.stdout), r.stdout


# -- load_for_target: its decisions, the probe's, and its report against what it returned -----------

#: the file dtypes drawn (one a byte or wider, and F4), and the dtypes load_for_target may be asked for
_FILE_DTYPES = tuple(d for d in ("bfloat16", "bfloat16", "float16", "float32", "float64", "int32", "int64", "bool",
                                  "uint8", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn")
                     if strategies.numpy_holds(d))


@st.composite
def _target_cases(draw):
    names = draw(st.lists(st.sampled_from(_FILE_DTYPES), min_size=1, max_size=5))
    shapes = [tuple(draw(st.lists(st.integers(0, 3), max_size=2))) + (2,) for _ in names]  # F4: an even count
    return (names, shapes, draw(st.integers(0, 2**16)), draw(st.sampled_from(PRESENT)),
            draw(st.sampled_from(["auto", "bfloat16", "float16", "float32", "float64"])), draw(st.booleans()))


@given(_target_cases())
def test_load_for_target_does_what_its_report_says(case):
    from bf16bridge.capabilities.probing import probe
    from bf16bridge.checkpoints.target import FP8

    names, shapes, seed, target, dtype, for_compute = case
    rng = np.random.default_rng(seed)
    tensors = {}
    for i, (name, shape) in enumerate(zip(names, shapes)):  # every bit pattern: NaN, inf, -0 included
        dt = fmt.numpy_dtype(name)
        if name in ("int32", "int64"):  # values int32 holds: jax's fallback narrows int64 to them (checked)
            tensors[f"t{i}"] = rng.integers(-2**31, 2**31, shape).astype(dt)
            continue
        top = 16 if name.startswith("float4") else 2 if name == "bool" else 256
        tensors[f"t{i}"] = rng.integers(0, top, math.prod(shape) * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)
    floating = [n for n in names if n not in ("int32", "int64", "bool", "uint8")]
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "m.safetensors")
        bb.save(tensors, p)
        if target == "jax" and floating and (dtype == "float64" or (dtype == "auto" and "float64" in names)):
            with pytest.raises(UnsupportedDtypeError, match="float64.*jax_enable_x64"):  # no fallback exists
                bb.load_for_target(p, target, dtype=dtype, for_compute=for_compute, fallback="auto")
            return
        out, report = bb.load_for_target(p, target, dtype=dtype, for_compute=for_compute, fallback="auto")
    assert [k.key for k in report.keys] == list(out)
    for k in report.keys:
        a, y = tensors[k.key], out[k.key]
        assert k.dtype_in == a.dtype.name
        # the report says what the caller got: read off the framework's own tensor, not the report's helper
        name, shape = str(getattr(y.dtype, "name", y.dtype)).removeprefix("torch."), tuple(int(d) for d in y.shape)
        assert (k.dtype_out, k.shape_out, k.shape_in) == (name, shape, a.shape), k
        if k.dtype_out == "float4_e2m1fn_x2":  # torch holds fp4 packed, two a byte: its values tested above
            continue
        held = y if target == "numpy" else strategies.as_numpy(bb.convert(y, "numpy", on_alias="allow"))
        assert (held.dtype.name, held.shape) == (k.dtype_out, a.shape), k  # the report says what came back
        if a.dtype.name in ("int32", "int64", "bool", "uint8"):  # never cast (int64 into jax: the fallback)
            assert k.dtype_out == a.dtype.name or (target == "jax" and k.dtype_out == "int32"), k
            assert np.array_equal(held.astype(a.dtype), a), k
            continue
        if dtype != "auto":
            assert k.dtype_out == dtype, k
        elif a.dtype.name == "bfloat16":
            assert k.dtype_out == probe().decide(target, for_compute=for_compute).dtype, k
        elif a.dtype.name in FP8:  # float32 for compute; for storage as it is where the target holds it
            assert k.dtype_out == "float32" if for_compute else k.dtype_out in (a.dtype.name, "float32"), k
        else:
            assert k.dtype_out == a.dtype.name, k
        with np.errstate(all="ignore"):  # values as ml_dtypes casts them (out of range: inf)
            expect = a.astype(held.dtype)
            back = held.astype(a.dtype)
            nan = np.isnan(a.astype(np.float64))
            nan_kept = np.isnan(held[nan].astype(np.float64)).all()  # ml_dtypes warns casting a NaN
        assert np.array_equal(held[~nan], expect[~nan]) and nan_kept, k
        if k.exact:  # every value of the file's dtype survives: the way back gives the file's values
            assert np.array_equal(back[~nan].view(np.uint8), a[~nan].view(np.uint8)), k
