"""load_for_target (bf16bridge/checkpoints/target.py): dtype="auto" widening bf16 exactly where the
probe says float32 and keeping it where it says bf16, explicit dtypes cast every floating tensor
(saying how many values a narrowing cast lost), fp4 and fp8 as floating types, the fallback its
error names, and a report whose dtypes, shapes, bytes and "copied" are the results' own."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge.checkpoints import format as fmt
from bf16bridge.errors import InvalidArgumentError, UnsupportedDtypeError
from conftest import FRAMEWORKS, bits
from strategies import lacks, numpy_holds
from checkpoint_cases import _np_dtype


def _mixed(tmp_path):
    p = tmp_path / "m.safetensors"
    w = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16)
    bb.save({"w": w, "ids": np.arange(4, dtype=np.int32), "f32": np.linspace(0, 1, 5, dtype=np.float32),
             "f8": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2)}, p)
    return p, w


class _Probe:
    def __init__(self, dtype):
        self.dtype = dtype

    def decide(self, target, *, for_compute=False, device="cpu", widen_to="float32"):
        from bf16bridge.capabilities.probing import Decision

        return Decision(self.dtype, f"stub: {target} {for_compute} {device}")


@pytest.mark.parametrize("target", FRAMEWORKS)
def test_auto_widens_bf16_exactly_where_the_probe_says_float32(tmp_path, monkeypatch, target):
    from bf16bridge.capabilities import probing as capabilities

    p, w = _mixed(tmp_path)
    monkeypatch.setattr(capabilities, "probe", lambda: _Probe("float32"))
    out, report = bb.load_for_target(p, to=target)
    widened = w.astype(np.float32)
    assert bits(out["w"]).tobytes() == widened.view(np.uint32).tobytes()  # NaN payloads and -0 too
    r = report["w"]
    assert (r.dtype_in, r.dtype_out, r.exact, r.copied) == ("bfloat16", "float32", True, True)
    assert r.reason == f"stub: {target} True cpu"
    assert report["ids"].dtype_out == "int32" and "not a floating" in report["ids"].reason
    assert report["f32"].dtype_out == "float32"
    assert report["f8"].dtype_out == "float32" and report["f8"].exact  # for compute: fp8 widens
    assert report.nbytes_out == report.nbytes_in + (1 << 17) + 3 * 256
    assert {k.key for k in report.changed} == {"w", "f8"}


def test_auto_keeps_bf16_where_the_probe_says_bf16(tmp_path, monkeypatch):
    from bf16bridge.capabilities import probing as capabilities

    p, w = _mixed(tmp_path)
    monkeypatch.setattr(capabilities, "probe", lambda: _Probe("bfloat16"))
    out, report = bb.load_for_target(p, to="numpy", for_compute=False)
    assert bits(out["w"]).tobytes() == w.view(np.uint16).tobytes()
    assert (report["w"].dtype_out, report["w"].copied) == ("bfloat16", False)
    assert report["f8"].dtype_out == "float8_e5m2"  # for storage, numpy holds it
    assert "w: bfloat16" in str(report["w"]) and report.to_dict()["keys"][0]["key"] == report.keys[0].key


@pytest.mark.frameworks("torch")
def test_the_real_probe_decides_for_this_machine(tmp_path):
    from bf16bridge.capabilities.probing import probe

    p, _ = _mixed(tmp_path)
    _, report = bb.load_for_target(p, to="torch")
    assert report["w"].reason == probe().decide("torch", for_compute=True).reason


@pytest.mark.parametrize("dtype, exact_bf16, exact_f32", [("float32", True, True), ("float64", True, True),
                                                          ("float16", False, False), ("bfloat16", True, False)])
def test_explicit_dtypes_cast_every_floating_tensor(tmp_path, dtype, exact_bf16, exact_f32):
    p, w = _mixed(tmp_path)
    out, report = bb.load_for_target(p, to="numpy", dtype=dtype)
    finite = np.isfinite(w.astype(np.float32))
    with np.errstate(over="ignore", invalid="ignore"):
        expect = w.astype(np.float32).astype(fmt.numpy_dtype(dtype))
    assert out["w"].dtype.name == dtype
    assert bits(out["w"][finite]).tobytes() == bits(expect[finite]).tobytes()
    assert (report["w"].exact, report["f32"].exact) == (exact_bf16, exact_f32)
    assert out["ids"].dtype == np.int32
    if dtype != "bfloat16":
        assert ("(exact)" if exact_bf16 else "(rounded") in report["w"].reason


@pytest.mark.parametrize("name, values, dtype, says", [
    ("bfloat16", [1e5, -1e6, 1e-8, 1.0, float("inf"), float("nan")], "float16",
     ["2 values past float16's range became inf", "1 nonzero value below float16's smallest became 0"]),
    ("float32", [3e38, 1e-42, 1.0], "bfloat16", ["1 nonzero value below bfloat16's smallest became 0"]),
    ("float64", [1e300, 2.0], "float32", ["1 value past float32's range became inf"]),
    ("float32", [1.1, 2.0], "float16", []),  # rounded, none lost
])
def test_load_for_target_says_how_many_values_a_narrowing_cast_lost(tmp_path, name, values, dtype, says):
    # a cast asked for once said only "rounded to nearest even" while values became inf or 0
    bb.save({"w": np.array(values, np.float64).astype(fmt.numpy_dtype(name))}, tmp_path / "m.safetensors")
    out, report = bb.load_for_target(tmp_path / "m.safetensors", "numpy", dtype=dtype)
    k = report["w"]
    assert not k.exact and "rounded to nearest even" in k.reason
    for s in says:
        assert s in k.reason, k.reason
    if not says:
        assert "became" not in k.reason, k.reason
    with np.errstate(all="ignore"):
        want = np.array(values, np.float64).astype(fmt.numpy_dtype(name)).astype(fmt.numpy_dtype(dtype))
    assert out["w"].tobytes() == want.tobytes()


def test_load_for_target_refuses_unknown_dtypes(tmp_path):
    p, _ = _mixed(tmp_path)
    with pytest.raises(InvalidArgumentError, match="'int8'"):
        bb.load_for_target(p, dtype="int8")


def test_load_for_target_takes_the_fallback_its_error_names_and_reports_the_dtype_it_gives(tmp_path):
    import jax

    assert not jax.config.jax_enable_x64
    p = tmp_path / "bn.safetensors"  # a torch BatchNorm's state: num_batches_tracked is a 0-d int64
    bb.save({"bn.weight": np.ones(4, ml_dtypes.bfloat16), "bn.num_batches_tracked": np.array(7, np.int64)}, p)
    with pytest.raises(UnsupportedDtypeError, match="'bn.num_batches_tracked'.*fallback='auto'"):
        bb.load_for_target(p, "jax")
    out, report = bb.load_for_target(p, "jax", fallback="auto")  # the way out the error names (once refused)
    k = report["bn.num_batches_tracked"]
    assert (k.dtype_in, k.dtype_out, out["bn.num_batches_tracked"].dtype.name) == ("int64", "int32", "int32")
    assert "fallback='auto'" in k.reason and int(out["bn.num_batches_tracked"]) == 7
    # the weight as the probe decides jax computes here (float32 where XLA widens bf16 dots on this CPU)
    want = bb.probe().decide("jax", for_compute=True).dtype
    assert report["bn.weight"].dtype_out == out["bn.weight"].dtype.name == want
    assert set(report.changed) == ({k} if want == "bfloat16" else {report["bn.weight"], k})


@pytest.mark.frameworks("tensorflow")
def test_load_for_target_says_copied_for_fp8_that_tensorflow_copies(tmp_path):
    # tensorflow gives no pointer for fp8 (no DLPack): whether the result shares the map is the
    # plan's answer, not "shared, to be safe" (which kept the pages and said "view of the file")
    p = tmp_path / "m.safetensors"
    bb.save({"w": np.arange(64, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)}, p)
    out, report = bb.load_for_target(p, "tensorflow", for_compute=False)
    assert report["w"].dtype_out == "float8_e4m3fn" and report["w"].copied
    assert "copied" in str(report["w"])
    assert bits(out["w"]).tolist() == list(range(64))


@pytest.mark.parametrize("dtype, target, nbytes_out", [("float32", "numpy", 32 * 4), ("bfloat16", "torch", 32 * 2),
                                                       ("auto", "numpy", 32), ("auto", "torch", 16)])
def test_load_for_target_casts_fp4_as_a_floating_type_and_counts_the_results_bytes(tmp_path, dtype, target,
                                                                                   nbytes_out):
    p = tmp_path / "f4.safetensors"
    if lacks("float4_e2m1fn"):  # an F4 file (as safetensors writes it) is refused naming the file and key
        hdr = b'{"w":{"dtype":"F4","shape":[4,8],"data_offsets":[0,16]}}'
        p.write_bytes(len(hdr).to_bytes(8, "little") + hdr + bytes(range(16)))
        with pytest.raises(bb.UnsupportedDtypeError, match=r"f4.safetensors: key 'w': .*upgrade ml_dtypes"):
            bb.load_for_target(p, target, dtype=dtype)
        return
    nibbles = np.arange(32, dtype=np.uint8) & 0xF
    a = nibbles.view(ml_dtypes.float4_e2m1fn).reshape(4, 8)
    bb.save({"w": a}, p)  # 16 bytes in the file
    out, report = bb.load_for_target(tmp_path / "f4.safetensors", target, dtype=dtype)
    k = report["w"]
    assert k.nbytes_in == 16 and k.nbytes_out == nbytes_out
    assert "not a floating type" not in k.reason
    if dtype == "auto":  # torch holds it packed, two a byte, and the report says so
        assert k.dtype_out == ("float4_e2m1fn_x2" if target == "torch" else "float4_e2m1fn") and "packed" in k.reason
        assert k.shape_out == ((4, 4) if target == "torch" else (4, 8)) and k.shape_in == (4, 8)
        assert bits(out["w"]).tobytes() == bits(bb.convert(a, target)).tobytes()
    else:
        assert k.dtype_out == dtype and k.exact and k.copied
        assert bits(out["w"]).tobytes() == bits(bb.convert(a.astype(_np_dtype(
            fmt.NAMES[dtype])), target)).tobytes()


@pytest.mark.parametrize("target", FRAMEWORKS)
@pytest.mark.parametrize("dtype, for_compute", [("auto", True), ("auto", False), ("float32", True), ("bfloat16", True)])
def test_load_for_target_reports_the_dtype_and_shape_each_result_has_for_every_file_dtype(tmp_path, target, dtype,
                                                                                          for_compute):
    # torch holds F4 packed (float4_e2m1fn_x2, two values a byte, the last dimension halved): the
    # report once said float4_e2m1fn and the file's shape for it
    tensors = {}
    for code, (name, _) in fmt.CODES.items():
        if code in fmt.UNPACKED or (target == "jax" and name == "float64"):  # (no float64 in jax without x64)
            continue
        if not numpy_holds(name):  # no array of it to save here (test_safetensors_read_by_ours: its error)
            continue
        top = 16 if code == "F4" else 2 if code == "BOOL" else 64
        raw = np.arange(24 * _np_dtype(code).itemsize, dtype=np.uint8) % top
        small = _np_dtype(code).kind in "iu"  # values int32 holds: jax's fallback narrows int64 to them
        tensors[name] = (np.arange(24).astype(_np_dtype(code)) if small else raw.view(_np_dtype(code))).reshape(2, 3, 4)
    p = tmp_path / "all.safetensors"
    bb.save(tensors, p)
    out, report = bb.load_for_target(p, target, dtype=dtype, for_compute=for_compute, fallback="auto")
    for k in report.keys:
        y = out[k.key]  # read off the framework's own tensor, not through the helper the report uses
        held = str(getattr(y.dtype, "name", y.dtype)).removeprefix("torch.")
        assert (k.dtype_out, k.shape_out) == (held, tuple(int(d) for d in y.shape)), k
        assert k.shape_in == (2, 3, 4), k
        if k.shape_out != k.shape_in:
            assert "float4_e2m1fn_x2" in k.reason and "[2, 3, 2]" in str(k), k


def test_a_report_names_a_key_it_lacks_with_our_error(tmp_path):
    p = tmp_path / "m.safetensors"
    bb.save({"n": np.ones(3, np.float32)}, p)
    _, report = bb.load_for_target(p, to="numpy")
    assert report["n"].key == "n"
    with pytest.raises(bb.MissingKeyError, match="'nope' is not in this report"):
        report["nope"]
