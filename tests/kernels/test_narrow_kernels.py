"""kernels.to_dtype / to_float32 for every narrow dtype, and the nibble packing kernels:
bit-identical to ml_dtypes' astype, and packing in torch's own nibble order."""

import ast
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from bf16bridge import errors as bb_errors
from bf16bridge import kernels
from bf16bridge.core import dtypes
from bf16bridge.core.nibbles import GATHER_UP_TO, unpack_into
from conftest import EXCLUDED
from strategies import needs_newer_ml_dtypes, numpy_holds

FORMAT_NAMES = list(kernels.FORMATS)  # every kernel dtype but bfloat16
FLOATS = [n for n in FORMAT_NAMES if not kernels.FORMATS[n].integer]
INTS = [n for n in FORMAT_NAMES if kernels.FORMATS[n].integer]
BACKENDS = ["numpy", "ml_dtypes"]


def _dt(name):
    return np.dtype(getattr(ml_dtypes, name))


def _no_reference(name) -> bool:
    """True where this ml_dtypes lacks ``name`` (0.3.1: fp6, fp4, int2, e8m0, e4m3, e3m4): there is
    no ml_dtypes cast to compare with, and the ml_dtypes backend refuses with our error naming the
    ml_dtypes that has it (asserted here); the numpy backend's bits are checked against the
    format's own decoding instead (test_to_float32_is_exact_on_every_pattern)."""
    if numpy_holds(name):
        return False
    for call in (lambda: kernels.to_dtype(np.zeros(2, np.float32), name, backend="ml_dtypes"),
                 lambda: kernels.to_float32(np.zeros(2, np.uint8), dtype=name, backend="ml_dtypes")):
        with pytest.raises(bb_errors.UnsupportedDtypeError, match=needs_newer_ml_dtypes(name)):
            call()
    return True


def _astype(x, name):
    """ml_dtypes' own cast, as bits (the reference); a sub-byte row's padding bits cleared (ml_dtypes
    0.3.1's int4 cast leaves them unset, any value; ours are zero, as newer ml_dtypes' are)."""
    with np.errstate(invalid="ignore", over="ignore"):
        out = x.astype(_dt(name)).view(np.uint8 if _dt(name).itemsize == 1 else np.uint16)
    return out & np.uint8(kernels.FORMATS[name].mask) if name in kernels.FORMATS else out


def _every_pattern(name):
    bits = kernels.FORMATS[name].bits if name in kernels.FORMATS else 16
    return np.arange(1 << bits, dtype=np.uint8 if bits <= 8 else np.uint16).view(_dt(name))


def _f32(u):
    return np.asarray(u, dtype=np.uint32).view(np.float32)


def _near(points: np.ndarray, ulps: int) -> np.ndarray:
    """float32 bit patterns of ``points`` and their neighbours up to ``ulps`` float32 ulps away."""
    with np.errstate(over="ignore"):  # e8m0's threshold past 2**127 is inf in float32: its neighbours count too
        u = points.astype(np.float32).view(np.uint32).astype(np.int64)
    steps = np.arange(-ulps, ulps + 1)
    return (u[:, None] + steps[None, :]).reshape(-1).clip(0, 0xFFFFFFFF).astype(np.uint32)


def _inputs(name) -> np.ndarray:
    """float32 inputs for one narrow dtype: every top 16 bits with the low 16 at 0, 1, 0x7FFF,
    0x8000, 0x8001, 0xFFFF and two random (so every entry of the numpy backend's table, the
    rounding bit and the sticky bits both ways); each value of the dtype and each midpoint
    between neighbours (where ties are decided, and the overflow threshold past the largest)
    with 3 float32 ulps either side, both signs; the specials, float32 subnormals; 2**20 random."""
    rng = np.random.default_rng(10)
    lows = np.concatenate([[0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], rng.integers(0, 1 << 16, 2)]).astype(np.uint32)
    grid = ((np.arange(1 << 16, dtype=np.uint32) << 16)[:, None] | lows[None, :]).reshape(-1)
    with np.errstate(invalid="ignore"):  # bf16's signalling NaNs
        val = _every_pattern(name).astype(np.float64)
    fin = np.unique(np.abs(val[np.isfinite(val)]))
    step = fin[-1] - fin[-2] if fin.size > 1 else fin[-1]
    mids = np.concatenate([(fin[1:] + fin[:-1]) / 2, [fin[-1] + step / 2, fin[-1] + step, 2 * fin[-1]]])
    points = np.concatenate([fin, mids, [2.0 ** -126, 2.0 ** -127, 2.0 ** -149]])
    near = _near(np.concatenate([points, -points]), 3)
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
                         0xFF800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF],
                        dtype=np.uint32)
    subnormals = np.concatenate([np.arange(0, 1 << 16, dtype=np.uint32), rng.integers(0, 1 << 23, 1 << 14)])
    rand = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    u = np.concatenate([grid, near, specials, subnormals.astype(np.uint32), subnormals.astype(np.uint32) | 1 << 31,
                        rand])
    return u.view(np.float32)


def test_the_kernels_take_every_narrow_row_of_the_dtype_table():
    """kernels.FORMATS (the fields a rounding needs) covers the dtype table's narrow rows, one
    value a byte, with the same bits; the packed rows go through pack_nibbles."""
    from bf16bridge.core import dtypes

    rows = {r.name: r for r in dtypes.TABLE if r.family == "narrow"}
    assert {n for n, r in rows.items() if r.packing == 1} == set(kernels.FORMATS)
    assert all(rows[n].bits == f.bits for n, f in kernels.FORMATS.items())
    assert {r.unpacked for r in rows.values() if r.packing == 2} <= set(kernels.NIBBLE_DTYPES)


@pytest.mark.parametrize("name", ["bfloat16", *FLOATS])
def test_a_rows_largest_is_its_largest_finite_value(name):
    """Dtype.largest (from the row's layout and specials, what saturate clamps to) is the largest
    finite value its patterns decode to, and ml_dtypes' finfo max."""
    row = dtypes.ROWS[name]
    val = kernels.decoded(row)
    assert row.largest == float(np.nanmax(val[np.isfinite(val)]))
    assert row.value_range == (-row.largest, row.largest)
    if not _no_reference(name):
        assert row.largest == float(ml_dtypes.finfo(_dt(name)).max)


@pytest.mark.parametrize("name", FLOATS + INTS)
def test_the_formats_decode_as_ml_dtypes_does(name):
    """decoded(): every pattern's value from the format's own fields equals ml_dtypes' value."""
    if _no_reference(name):
        return
    ours = kernels.decoded(kernels.FORMATS[name])
    theirs = _every_pattern(name).astype(np.float64)
    assert np.array_equal(ours, theirs, equal_nan=True)
    same_sign = np.signbit(ours) == np.signbit(theirs)
    assert same_sign[~np.isnan(ours)].all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FLOATS)
def test_to_dtype_is_bit_identical_to_ml_dtypes(name, backend):
    if _no_reference(name):
        return
    x = _inputs(name)
    ref = _astype(x, name)
    y = kernels.to_dtype(x, name, backend=backend)
    assert y.dtype == _dt(name) and y.shape == x.shape
    bad = np.flatnonzero(y.view(np.uint8) != ref)
    assert bad.size == 0, [(hex(x.view(np.uint32)[i]), hex(ref[i]), hex(y.view(np.uint8)[i])) for i in bad[:5]]


@pytest.mark.parametrize("name", FLOATS + INTS)
def test_the_reference_rule_is_ml_dtypes(name):
    if _no_reference(name):
        return
    x = _inputs(name)[::7]  # the table kernel above covers every input; this is the plain-arithmetic rule
    if kernels.FORMATS[name].integer:
        x = x[np.abs(x) < 2.0 ** 31]  # where C++ defines ml_dtypes' result
    np.testing.assert_array_equal(kernels.round_reference(x, name), _astype(x, name))


@pytest.mark.parametrize("name", FLOATS + INTS + ["bfloat16"])
def test_float64_rounds_through_float32_as_ml_dtypes_does(name):
    """ml_dtypes rounds float64 to float32 first for the floats (two roundings: a float64 just past
    a midpoint lands on it and ties to even) and converts integers from float64 directly."""
    if _no_reference(name):
        return
    with np.errstate(invalid="ignore"):  # bf16's signalling NaNs
        val = _every_pattern(name).astype(np.float64)
    fin = np.unique(val[np.isfinite(val)])
    mids = (fin[1:] + fin[:-1]) / 2
    x = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf), fin, [1e300, -1e300, np.nan],
                        np.random.default_rng(3).standard_normal(10_000) * fin[-1]])
    if name in INTS:
        # wrapped past the range, up to 2**30 (near 2**31 ml_dtypes' float64 path gives 0 for 2**31 - 0.75
        # but 15 for 2**31 - 1: past the range its result is the C++ cast's, not a rule)
        x = np.concatenate([x, [2.0 ** 30 - 1, -(2.0 ** 30) + 1, 2.0 ** 29 - 0.5, 1e9 + 7.5]])
        x = x[np.abs(x) < 2.0 ** 30]
    for backend in ("numpy", "ml_dtypes"):
        y = kernels.to_dtype(x, name, backend=backend)
        np.testing.assert_array_equal(y.view(np.uint8 if y.itemsize == 1 else np.uint16), _astype(x, name))
    if name in ("float8_e4m3fn", "bfloat16"):  # the double rounding shows: not the nearest float64 value
        direct = np.nextafter(mids, np.inf)
        lower = kernels.to_float32(kernels.to_dtype(direct, name)).astype(np.float64)
        assert np.count_nonzero(lower < direct) > 0


@pytest.mark.parametrize("name", FLOATS + ["bfloat16"])
def test_saturate_clamps_overflow_to_the_largest_finite(name):
    """saturate=True: inf and every value past the largest finite become +-largest (e8m0 has
    no negatives: those stay NaN); everything else as without it; NaN stays NaN (fp6/fp4: no
    NaN, the same zero as without)."""
    if _no_reference(name):
        return
    x = _inputs(name)
    plain = kernels.to_dtype(x, name)
    sat = kernels.to_dtype(x, name, saturate=True)
    bits = np.uint16 if name == "bfloat16" else np.uint8
    pb, sb = plain.view(bits), sat.view(bits)
    big = dtypes.ROWS[name].largest
    with np.errstate(invalid="ignore"):  # signalling NaNs
        over = np.abs(x.astype(np.float64)) > big
    np.testing.assert_array_equal(sb[~over], pb[~over])
    val = kernels.to_float32(sat).astype(np.float64)
    if name == "float8_e8m0fnu":
        over &= x > 0
    want = np.where(np.signbit(x[over]), -big, big)
    np.testing.assert_array_equal(val[over], want)
    assert np.isnan(val[np.isnan(x)]).all() or name in ("float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn")


# what overflow gives without saturate=True, per dtype: the table in docs/kernels.md
OVERFLOW = {
    "float8_e4m3fn": (0x7F, 0xFF, 0x7F),  # +overflow, -overflow, +inf: NaN (fn: no inf)
    "float8_e5m2": (0x7C, 0xFC, 0x7C),  # inf
    "float8_e4m3fnuz": (0x80, 0x80, 0x80),  # the one NaN
    "float8_e5m2fnuz": (0x80, 0x80, 0x80),
    "float8_e8m0fnu": (0xFF, 0xFF, 0xFF),  # NaN
    "float8_e4m3": (0x78, 0xF8, 0x78),  # inf
    "float8_e3m4": (0x70, 0xF0, 0x70),  # inf
    "float8_e4m3b11fnuz": (0x80, 0x80, 0x80),
    "float6_e2m3fn": (0x1F, 0x3F, 0x1F),  # no inf, no NaN: saturates anyway
    "float6_e3m2fn": (0x1F, 0x3F, 0x1F),
    "float4_e2m1fn": (0x7, 0xF, 0x7),
}


@pytest.mark.parametrize("name", FLOATS)
def test_overflow_without_saturate(name):
    big = dtypes.ROWS[name].largest
    x = np.array([big * 1.75, -big * 1.75, np.inf], dtype=np.float32)
    assert tuple(int(v) for v in kernels.to_dtype(x, name).view(np.uint8)) == OVERFLOW[name]


INT_CASES = {  # x -> (int4, uint4 bits... as values), saturate False / True
    "int4": ([2.5, -2.5, 7.9, -8.9, 8.0, 9.0, 100.0, -100.0, np.nan, np.inf, 2.0 ** 31, -0.5],
             [2, -2, 7, -8, -8, -7, 4, -4, 0, 0, 0, 0], [2, -2, 7, -8, 7, 7, 7, -8, 0, 7, 7, 0]),
    "uint4": ([2.5, 15.9, 16.0, 17.0, -1.0, -0.5, np.nan, -np.inf, 1e9],
              [2, 15, 0, 1, 15, 0, 0, 0, 0], [2, 15, 15, 15, 0, 0, 0, 0, 15]),
    "int2": ([1.9, -2.9, 2.0, 3.0, -3.0, np.nan], [1, -2, -2, -1, 1, 0], [1, -2, 1, 1, -2, 0]),
    "uint2": ([3.9, 4.0, 5.0, -1.0, np.inf], [3, 0, 1, 3, 0], [3, 3, 3, 0, 3]),
}


@pytest.mark.parametrize("name", INTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_integers_truncate_and_wrap_or_saturate(name, backend):
    x, wrapped, clamped = INT_CASES[name]
    if backend == "ml_dtypes" and _no_reference(name):
        return
    x = np.array(x, dtype=np.float32)

    def ints(y):  # where this ml_dtypes lacks the row, to_dtype gives its bits: read by the format
        return (kernels.decoded(kernels.FORMATS[name])[y] if y.dtype == np.uint8 else y).astype(np.int64).tolist()

    got = ints(kernels.to_dtype(x, name, backend=backend))
    if backend == "numpy":  # ml_dtypes leaves NaN, inf and |x| >= 2**31 to the C++ cast
        assert got == wrapped
    else:
        ok = np.abs(x) < 2.0 ** 31
        assert [g for g, k in zip(got, ok) if k] == [w for w, k in zip(wrapped, ok) if k]
    assert ints(kernels.to_dtype(x, name, saturate=True, backend=backend)) == clamped


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FORMAT_NAMES)
def test_to_float32_is_exact_on_every_pattern(name, backend):
    if _no_reference(name):
        if backend == "numpy":  # its bits, named: the format's own decoding (ml_dtypes' where it has the row)
            every = np.arange(1 << kernels.FORMATS[name].bits, dtype=np.uint8)
            got = kernels.to_float32(every, dtype=name, backend=backend).astype(np.float64)
            want = kernels.decoded(kernels.FORMATS[name])
            assert np.array_equal(got, want, equal_nan=True)
            assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()
        return
    p = _every_pattern(name)
    ref = p.astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(kernels.to_float32(p, backend=backend).view(np.uint32), ref)
    bits = kernels.to_float32(p.view(np.uint8), dtype=name, backend=backend)  # its bits, named
    np.testing.assert_array_equal(bits.view(np.uint32), ref)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float4_e2m1fn", "int4", "float8_e8m0fnu"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_chunks_and_threads_do_not_change_results(name, backend):
    if _no_reference(name):
        return
    x = np.random.default_rng(4).standard_normal((37, 1001)).astype(np.float32) * 8
    whole = kernels.to_dtype(x, name, backend=backend, threads=1)
    pieces = kernels.to_dtype(x, name, backend=backend, chunk=997, threads=3)
    np.testing.assert_array_equal(whole.view(np.uint8), pieces.view(np.uint8))
    np.testing.assert_array_equal(whole.view(np.uint8), _astype(x, name).reshape(x.shape))
    wide = kernels.to_float32(pieces, chunk=333, threads=4, backend=backend)
    np.testing.assert_array_equal(wide, pieces.astype(np.float32))


def test_out_may_be_a_memory_map(tmp_path):
    x = np.linspace(-500, 500, 100_003, dtype=np.float32)
    out = np.lib.format.open_memmap(tmp_path / "y.npy", mode="w+", dtype=_dt("float8_e4m3fn"), shape=x.shape)
    kernels.to_dtype(x, "float8_e4m3fn", out=out, chunk=4096)
    out.flush()
    del out
    back = np.load(tmp_path / "y.npy", allow_pickle=False)
    np.testing.assert_array_equal(back.view(np.uint8), _astype(x, "float8_e4m3fn"))


_PEAK_SCRIPT = r"""
import json, sys
import numpy as np, ml_dtypes
from bf16bridge import kernels

n, chunk, threads = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

def peak_extra(fn):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status("VmRSS")
    fn()
    return status("VmHWM") - before

x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
out = np.full(n, 7, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
wide = np.full(n, 7, dtype=np.float32)
for _ in range(2):  # warm up: the thread pool, the tables
    kernels.to_float32(kernels.to_dtype(x[:4 * chunk], "float8_e4m3fn", chunk=chunk, threads=threads),
                       chunk=chunk, threads=threads)
res = {"to_dtype": peak_extra(lambda: kernels.to_dtype(x, "float8_e4m3fn", out=out, chunk=chunk, threads=threads)),
       "to_float32": peak_extra(lambda: kernels.to_float32(out, out=wide, chunk=chunk, threads=threads)),
       "meter": peak_extra(lambda: np.ones(n, dtype=np.float32))}
print(json.dumps(res))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc/self/clear_refs")
def test_extra_memory_is_bounded_by_a_chunk():
    n, chunk, threads = 1 << 23, 1 << 16, 2
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(n), str(chunk), str(threads)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["meter"] >= n * 4 * 0.9, res
    limit = threads * chunk * 32  # 4 MiB; the input is 32 MiB
    assert res["to_dtype"] < limit and res["to_float32"] < limit, res


@pytest.mark.parametrize("call, error, match", [
    (lambda: kernels.to_dtype(np.zeros(3, np.float16), "float8_e4m3fn"), bb_errors.UnsupportedDtypeError,
     "float32 or float64"),
    (lambda: kernels.to_dtype(np.zeros(3, np.float32), "float7"), bb_errors.UnsupportedDtypeError,
     "float8_e4m3fn, float8_e5m2"),
    (lambda: kernels.to_dtype(np.zeros((4, 4), np.float32).T, "int4"), bb_errors.CopyRequiredError,
     "np.ascontiguousarray"),
    (lambda: kernels.to_dtype(np.zeros(3, np.float32), "float8_e5m2", backend="torch"),
     bb_errors.InvalidArgumentError, "backend for float8_e5m2 must be one of auto, ml_dtypes, numpy"),
    (lambda: kernels.to_dtype(np.zeros(3, np.float32), "float8_e5m2", saturate="yes"),
     bb_errors.InvalidArgumentError, "saturate must be True or False"),
    (lambda: kernels.to_dtype(np.zeros(3, np.float32), "int4", out=np.zeros(3, np.uint8)),
     bb_errors.InvalidArgumentError, "out must be a writable C-contiguous int4 array of shape"),
    (lambda: kernels.to_float32(np.zeros(3, np.uint8)), bb_errors.UnsupportedDtypeError, "bfloat16"),
    (lambda: kernels.to_float32(np.zeros(3, _dt("int4")), dtype="uint4"), bb_errors.UnsupportedDtypeError,
     r"to_float32\(dtype='uint4'\) takes a uint4 array or its uint8 bits"),
    (lambda: kernels.pack_nibbles(np.zeros((2, 3), _dt("int4"))), bb_errors.InvalidArgumentError,
     r"last dimension, which must be even; got shape \(2, 3\) \(pad it"),
    (lambda: kernels.pack_nibbles(np.zeros((), _dt("int4"))), bb_errors.InvalidArgumentError,  # (its own way out)
     r"got a 0-d array \(pass a.reshape\(1\) padded"),
    (lambda: kernels.pack_nibbles(np.array([1, 16], np.uint8)), bb_errors.InvalidArgumentError,
     "must hold 0..15; this one holds 16"),
    (lambda: kernels.pack_nibbles(np.zeros(2, _dt("float8_e4m3fn"))), bb_errors.UnsupportedDtypeError,
     "4-bit dtype"),
    (lambda: kernels.unpack_nibbles(np.zeros(2, np.int8), "int4"), bb_errors.UnsupportedDtypeError,
     "packed bytes"),
    (lambda: kernels.unpack_nibbles(np.zeros(2, np.uint8), "int2"), bb_errors.UnsupportedDtypeError,
     "4-bit dtype"),
])
def test_bad_inputs_get_our_errors(call, error, match):
    with pytest.raises(error, match=match) as err:
        call()
    assert isinstance(err.value, bb_errors.Bf16BridgeError)


# -- packing, against torch's own code --------------------------------------------------


def _torch_helpers():
    """torch's own fp4 pack and unpack, run from torch's installed files. common_quantized
    imports expecttest (not installed here), so its packing functions and constants are taken
    from its source and run as they are; the unpacking is torch.onnx's exporter's."""
    import torch
    import torch.testing._internal as internal
    from torch.onnx._internal.exporter._type_casting import unpack_float4x2_as_uint8

    path = os.path.join(os.path.dirname(internal.__file__), "common_quantized.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    wanted = {"_n_ones", "_f32_to_floatx_unpacked", "down_size", "pack_uint4", "_bfloat16_to_float4_e2m1fn_x2"}
    nodes = [n for n in tree.body
             if (isinstance(n, ast.FunctionDef) and n.name in wanted)
             or (isinstance(n, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in n.targets)
                 and all(e.id.isupper() for t in n.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])))]
    ns = {"torch": torch, "Tensor": torch.Tensor}
    exec(compile(ast.Module(nodes, []), path, "exec"), ns)  # noqa: S102 - torch's own source
    assert wanted <= set(ns)
    return torch, ns, unpack_float4x2_as_uint8


def _all_pairs(name):
    """Every pair of 4-bit patterns, as a (16, 32) array of that dtype: row i holds (i, 0..15)."""
    p = np.arange(16, dtype=np.uint8)
    return np.stack([np.repeat(p, 16), np.tile(p, 16)], axis=1).reshape(16, 32).view(_dt(name))


@pytest.mark.frameworks("torch")
def test_fp4_packing_is_torchs():
    torch, ns, unpack = _torch_helpers()
    # every pair of fp4 values, read by the format (ml_dtypes' reading: test_the_formats_decode_as_ml_dtypes_does)
    values = kernels.decoded(kernels.FORMATS["float4_e2m1fn"])[_all_pairs("uint4").view(np.uint8)].astype(np.float32)
    packed_by_torch = ns["_bfloat16_to_float4_e2m1fn_x2"](torch.from_numpy(values).to(torch.bfloat16))
    assert packed_by_torch.dtype == torch.float4_e2m1fn_x2 and tuple(packed_by_torch.shape) == (16, 16)
    ours = kernels.pack_nibbles(kernels.to_dtype(values, "float4_e2m1fn"))
    assert ours.shape == (16, 16)
    np.testing.assert_array_equal(ours, packed_by_torch.view(torch.uint8).numpy())
    # and torch's unpacking of its own bytes gives what ours gives
    np.testing.assert_array_equal(unpack(packed_by_torch), kernels.unpack_nibbles(ours, "uint8"))
    back = kernels.unpack_nibbles(packed_by_torch.view(torch.uint8).numpy(), "float4_e2m1fn")
    np.testing.assert_array_equal(back.view(np.uint8), _all_pairs("uint4").view(np.uint8))
    # rounding: torch's packer rounds to nearest even and clamps, as saturate=True does
    x = np.random.default_rng(5).uniform(-8, 8, (64, 256)).astype(np.float32)
    x = torch.from_numpy(x).to(torch.bfloat16)
    np.testing.assert_array_equal(
        kernels.pack_nibbles(kernels.to_dtype(x.float().numpy(), "float4_e2m1fn", saturate=True)),
        ns["_bfloat16_to_float4_e2m1fn_x2"](x).view(torch.uint8).numpy())


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("name", ["int4", "uint4"])
def test_int4_packing_is_torchs_pack_uint4(name):
    torch, ns, _ = _torch_helpers()
    a = _all_pairs(name)
    theirs = ns["pack_uint4"](torch.from_numpy(np.ascontiguousarray(a.view(np.uint8))))
    np.testing.assert_array_equal(kernels.pack_nibbles(a), theirs.numpy())


@pytest.mark.parametrize("name", kernels.NIBBLE_DTYPES + ("uint8",))
def test_unpack_inverts_pack(name):
    a = _all_pairs("uint4").view(np.uint8)
    # where this ml_dtypes lacks the dtype (0.3.1: float4_e2m1fn) the nibbles come back as uint8, as documented
    a = a if name == "uint8" or not numpy_holds(name) else a.view(_dt(name))
    a = np.broadcast_to(a, (3, 16, 32))[:, ::2]  # not contiguous: packed through a copy
    packed = kernels.pack_nibbles(a)
    assert packed.shape == (3, 8, 16) and packed.dtype == np.uint8
    back = kernels.unpack_nibbles(packed, name)
    assert back.shape == a.shape and back.dtype == a.dtype
    np.testing.assert_array_equal(back.view(np.uint8), a.view(np.uint8))
    out = np.empty((3, 8, 16), np.uint8)
    assert kernels.pack_nibbles(a, out=out) is out


@pytest.mark.parametrize("offset", [0, 1])  # a source at an odd address: its byte pairs unaligned
@pytest.mark.parametrize("n", [1, 7, GATHER_UP_TO, GATHER_UP_TO + 1,  # the table lookup's edge
                               kernels.BLOCK - 1, kernels.BLOCK + 3, 2 * kernels.BLOCK + 1])
def test_nibbles_over_blocks_and_odd_addresses_are_the_one_liners(n, offset):
    # every byte value, past the kernels' block edges, against numpy's one-liners (a byte's low
    # nibble first, then its high one)
    raw = np.resize(np.arange(256, dtype=np.uint8), n + offset)[::-1].copy()
    b = raw[offset:]
    unpacked = kernels.unpack_nibbles(b, "uint8")
    np.testing.assert_array_equal(unpacked, np.stack([b & 0xF, b >> 4], axis=-1).reshape(-1))
    assert unpacked.shape == (2 * n,) and unpacked.dtype == np.uint8
    np.testing.assert_array_equal(kernels.pack_nibbles(unpacked), b)
    src = np.empty(2 * n + offset, np.uint8)[offset:]
    src[...] = unpacked
    np.testing.assert_array_equal(kernels.pack_nibbles(src), (src[1::2] << 4) | (src[0::2] & 0xF))


@pytest.mark.parametrize("n", [GATHER_UP_TO // 2, 4 * GATHER_UP_TO])  # by table, by elementwise calls
def test_unpack_nibbles_of_a_strided_input_into_out(n):
    # every byte value, in rows of which every other one is taken (not contiguous), into a given out=
    b = np.resize(np.arange(256, dtype=np.uint8), (2 * n // 64, 64))[::2]
    want = np.stack([b & 0xF, b >> 4], axis=-1).reshape(b.shape[0], -1)
    out = np.empty(want.shape, _dt("float4_e2m1fn") if numpy_holds("float4_e2m1fn") else np.uint8)
    assert kernels.unpack_nibbles(b, "float4_e2m1fn", out=out) is out
    np.testing.assert_array_equal(out.view(np.uint8), want)
    with pytest.raises(bb_errors.InvalidArgumentError, match="out must be"):
        kernels.unpack_nibbles(b, "float4_e2m1fn", out=np.empty(want.shape, np.int8))


@pytest.mark.parametrize("n", [GATHER_UP_TO, GATHER_UP_TO + 1])
def test_unpack_into_is_unpack_nibbles_without_the_checks(n):
    b = np.resize(np.arange(256, dtype=np.uint8), (2, n))[:, ::-1]  # every byte, not contiguous
    out = np.empty((2, 2 * n), np.uint8)
    assert unpack_into(b, out) is out
    np.testing.assert_array_equal(out, kernels.unpack_nibbles(b, "uint8"))


def _doc_row(name: str) -> str:
    """docs/kernels.md's row for a float dtype, from what the kernels do."""
    f = kernels.FORMATS[name]
    big = dtypes.ROWS[name].largest
    x = np.array([big * 1.75, -big * 1.75, np.inf, -np.inf, np.nan, -np.nan, -0.0, -1e-30], dtype=np.float32)
    p = kernels.to_dtype(x, name).view(np.uint8)
    s = kernels.to_dtype(x, name, saturate=True).view(np.uint8)

    def h(*v):
        return " / ".join(f"0x{int(b):02X}" for b in v)

    return (f"| {name} | {f.ebits}/{f.mbits}/{f.bias} | {big:g} | {h(p[0], p[1])} | {h(p[2], p[3])} | "
            f"{h(p[4], p[5])} | {h(p[6])} | {h(p[7])} | {h(s[0], s[1])} | {h(s[2], s[3])} | {h(s[4], s[5])} |")


def test_the_docs_table_is_what_the_kernels_do():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "kernels.md"), encoding="utf-8") as f:
        doc = f.read()
    missing = [_doc_row(n) for n in FLOATS if _doc_row(n) not in doc]
    assert not missing, "docs/kernels.md's table differs; the rows now:\n" + "\n".join(missing)


@pytest.mark.frameworks("torch")
def test_how_torchs_own_fp8_casts_relate_to_ours():
    """docs/kernels.md, "torch differs": torch's CPU .to(float8_e4m3fn) saturates (our
    saturate=True); e5m2 is ours but for the NaN pattern; the fnuz types are ours."""
    import torch

    rng = np.random.default_rng(6)
    u = np.concatenate([rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32),
                        np.arange(0, 1 << 32, 1 << 14, dtype=np.uint64).astype(np.uint32)])
    x = u.view(np.float32)
    nan = np.isnan(x)

    def theirs(name):
        return torch.from_numpy(x).to(getattr(torch, name)).view(torch.uint8).numpy()

    np.testing.assert_array_equal(theirs("float8_e4m3fn"), kernels.to_dtype(x, "float8_e4m3fn", saturate=True)
                                  .view(np.uint8))
    e5m2 = theirs("float8_e5m2")
    np.testing.assert_array_equal(e5m2[~nan], kernels.to_dtype(x[~nan], "float8_e5m2").view(np.uint8))
    assert set(e5m2[nan].tolist()) == {0x7F, 0xFF}
    for name in ("float8_e4m3fnuz", "float8_e5m2fnuz"):
        np.testing.assert_array_equal(theirs(name), kernels.to_dtype(x, name).view(np.uint8))


# torch's .to(torch.float32) of every fp8 byte where it differs from ml_dtypes' widening (and
# ours, which is ml_dtypes'): NaN only, in another encoding. docs/kernels.md, "torch differs".
_TORCH_WIDENED_NANS = {
    "float8_e4m3fn": {0x7F: 0x7FF00000, 0xFF: 0xFFF00000},
    "float8_e5m2": {0x7D: 0x7FE00000, 0x7F: 0x7FE00000, 0xFD: 0xFFE00000, 0xFF: 0xFFE00000},
    "float8_e4m3fnuz": {0x80: 0x7F800001},
    "float8_e5m2fnuz": {0x80: 0x7F800001},
    "float8_e8m0fnu": {0xFF: 0x7F800001},
}


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("name", sorted(_TORCH_WIDENED_NANS))
def test_how_torchs_own_fp8_widening_relates_to_ours(name):
    if _no_reference(name):
        return
    """torch widens every non-NaN fp8 byte as we (and ml_dtypes) do; its NaNs keep the payload
    (e5m2) or come out as another NaN (0x7F800001 for the one NaN of fnuz and e8m0), where
    ml_dtypes gives the canonical quiet NaN."""
    import torch

    every = np.arange(256, dtype=np.uint8)
    theirs = torch.from_numpy(every).view(getattr(torch, name)).to(torch.float32).numpy().view(np.uint32)
    ours = kernels.to_float32(every.view(np.dtype(getattr(ml_dtypes, name)))).view(np.uint32)
    differ = {int(i): int(theirs[i]) for i in np.nonzero(theirs != ours)[0]}
    assert differ == _TORCH_WIDENED_NANS[name]
    assert np.isnan(ours[list(differ)].view(np.float32)).all()
    assert np.isnan(theirs[list(differ)].view(np.float32)).all()



#: the sub-byte types something packs: pack_nibbles the 4-bit ones, jax its 2- and 4-bit ones (float6
#: is packed by none: jax and torch cannot hold it, and bb.save refuses it)
_SUB_BYTE = [n for n in FORMAT_NAMES if kernels.FORMATS[n].bits in (2, 4) and hasattr(ml_dtypes, n)]


def _bits32(a):
    return np.asarray(a).astype(np.float32).view(np.uint32)


def _packings(name):
    """Every way a sub-byte array one value a byte gets packed: pack_nibbles (4-bit types), the
    route to torch's float4_e2m1fn_x2 and bb.save's F4 (fp4), and jax, which packs its sub-byte
    types itself (device_put in convert, and in from_shards); each returns the values read back."""
    import jax

    import bf16bridge as bb

    out = {}
    if kernels.FORMATS[name].bits == 4:
        out["pack_nibbles"] = lambda a: kernels.unpack_nibbles(kernels.pack_nibbles(a), name)
    if name == "float4_e2m1fn":
        if "torch" not in EXCLUDED:  # (a run without torch: .venv-numpy25)
            out["convert to torch"] = lambda a: bb.convert(bb.convert(a, to="torch"), to="numpy")

        def saved(a, n=[0]):
            n[0] += 1
            path = os.path.join(_SAVES, f"{n[0]}.safetensors")
            bb.save({"w": a}, path)
            return bb.load(path, to="numpy")["w"]
        out["bb.save"] = saved
    try:
        bb.plan(np.zeros(4, _dt(name)), to="jax")
    except bb_errors.UnsupportedDtypeError:
        assert out, f"nothing packs {name} here: drop it from _SUB_BYTE"
        return out
    out["convert to jax"] = lambda a: np.asarray(bb.convert(a, to="jax"))
    one = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    out["from_shards to jax"] = lambda a: np.asarray(bb.from_shards(
        [bb.shards.Shard((slice(0, a.size),), "cpu", a)], "jax", sharding=one, shape=a.shape))
    return out


_SAVES = ""


@pytest.mark.parametrize("name", _SUB_BYTE)
def test_every_byte_of_a_sub_byte_type_packs_to_the_value_ml_dtypes_reads_or_is_refused(name, tmp_path):
    """ml_dtypes keeps a sub-byte value in a byte's low bits, but float4_e2m1fn reads the high bits
    too (0x11 is -0.5), and a view of other bytes can hold them. Packing keeps the low bits: every
    one of the 256 bytes either keeps its value through each packing or is refused, naming the byte
    and a way out that keeps ml_dtypes' values (which then packs)."""
    global _SAVES
    _SAVES = str(tmp_path)
    every = np.arange(256, dtype=np.uint8).view(_dt(name))
    refused = {}
    for how, run in _packings(name).items():
        for byte in range(256):
            a = np.array([0, 0, byte, 0], np.uint8).view(_dt(name))
            try:
                back = run(a)
            except bb_errors.InvalidArgumentError as err:
                assert f"byte 0x{byte:02X} at flat index 2" in str(err) and "a.astype(np.float32)" in str(err)
                refused.setdefault(how, set()).add(byte)
                continue
            np.testing.assert_array_equal(_bits32(back), _bits32(a), err_msg=f"{how}, byte 0x{byte:02X}")
        fixed = every.astype(np.float32).astype(every.dtype)
        np.testing.assert_array_equal(_bits32(run(fixed)), _bits32(every), err_msg=how)
    if name == "float4_e2m1fn":  # ml_dtypes reads its high bits: they are refused in every packing
        assert all(refused.get(how, set()) >= {0x10, 0x11, 0x80, 0xF7} for how in _packings(name)), refused
        assert not any(0x1F in r or 0x0F in r for r in refused.values())  # read as -6 either way
    else:  # its ints read the low bits only: nothing refused, every byte packed as ml_dtypes reads it
        assert refused == {}


@pytest.mark.parametrize("name", [n for n in FORMAT_NAMES if hasattr(ml_dtypes, n)])
def test_every_byte_widens_to_the_value_ml_dtypes_reads_in_it(name):
    """A sub-byte value lives in a byte's low bits, but a view of other bytes may set the rest,
    and ml_dtypes reads them (as fp4's and fp6's sign; the integer types ignore them): to_float32
    (both backends, the dtype and its uint8 bits) and parity's reading give ml_dtypes' value for
    each of the 256 bytes."""
    from bf16bridge.parity import metrics

    every = np.arange(256, dtype=np.uint8)
    theirs = every.view(_dt(name)).astype(np.float32)
    for backend in BACKENDS:
        for got in (kernels.to_float32(every.view(_dt(name)), backend=backend),
                    kernels.to_float32(every, dtype=name, backend=backend)):
            np.testing.assert_array_equal(got.view(np.uint32), theirs.view(np.uint32), err_msg=backend)
    read = metrics.to_float64(every.view(_dt(name)))
    same = (read == theirs) & (np.signbit(read) == np.signbit(theirs)) | (np.isnan(read) & np.isnan(theirs))
    assert same.all(), [hex(i) for i in np.flatnonzero(~same)[:8]]
