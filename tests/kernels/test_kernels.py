"""kernels.to_float32 / to_bf16: bit-identical to ml_dtypes, chunked, bounded memory."""

import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from bf16bridge import errors as bb_errors
from bf16bridge import kernels

BACKENDS = ["ml_dtypes", "numpy", "torch"]


def _float32_inputs() -> np.ndarray:
    """2**24 float32 bit patterns: every top half (sign, exponent, top mantissa: zeros,
    subnormals, normals, infs, NaNs with every payload) with 256 bottom halves, among
    them the rounding boundaries (ties 0x8000, just below and above) and the extremes."""
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x4000, 0xC000], dtype=np.uint32)
    rng = np.random.default_rng(1)
    lows = np.concatenate([lows, rng.integers(0, 1 << 16, 256 - lows.size, dtype=np.uint32)])
    highs = np.arange(1 << 16, dtype=np.uint32) << 16
    return (highs[:, None] | lows[None, :]).reshape(-1).view(np.float32)


@pytest.fixture(scope="module")
def f32_inputs():
    x = _float32_inputs()
    assert x.size >= 1 << 24
    with np.errstate(invalid="ignore"):
        ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    return x, ref


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_bf16_is_bit_identical_to_ml_dtypes(backend, f32_inputs):
    x, ref = f32_inputs
    y = kernels.to_bf16(x, backend=backend)
    assert y.dtype == np.dtype(ml_dtypes.bfloat16) and y.shape == x.shape
    bad = np.flatnonzero(y.view(np.uint16) != ref)
    assert bad.size == 0, [(hex(x.view(np.uint32)[i]), hex(ref[i]), hex(y.view(np.uint16)[i])) for i in bad[:5]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_bf16_special_values(backend):
    cases = {  # float32 bits -> bf16 bits
        0x00000000: 0x0000, 0x80000000: 0x8000,  # zeros keep their sign
        0x00000001: 0x0000, 0x00008000: 0x0000, 0x00018000: 0x0002,  # subnormal ties to even, no flush
        0x007F8000: 0x0080,  # largest subnormals round up into the normals
        0x3F808000: 0x3F80, 0x3F818000: 0x3F82,  # ties to even
        0x7F7FFFFF: 0x7F80, 0xFF7FFFFF: 0xFF80,  # overflow to inf
        0x7F800000: 0x7F80, 0xFF800000: 0xFF80,  # infs
        0x7F800001: 0x7FC0, 0xFFC00001: 0xFFC0, 0x7FFFFFFF: 0x7FC0,  # NaNs: quiet, sign kept
    }
    x = np.array(list(cases), dtype=np.uint32).view(np.float32)
    y = kernels.to_bf16(x, backend=backend).view(np.uint16)
    assert [hex(v) for v in y] == [hex(v) for v in cases.values()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_to_float32_is_exact_on_every_bf16_pattern(backend, all_bf16):
    y = kernels.to_float32(all_bf16.view(ml_dtypes.bfloat16), backend=backend)
    np.testing.assert_array_equal(y.view(np.uint32), all_bf16.astype(np.uint32) << 16)
    z = kernels.to_float32(all_bf16, backend=backend)  # uint16 bits work too
    np.testing.assert_array_equal(z.view(np.uint32), all_bf16.astype(np.uint32) << 16)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunking_does_not_change_results(backend):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 1001)).astype(np.float32)
    whole = kernels.to_bf16(x, backend=backend)
    pieces = kernels.to_bf16(x, backend=backend, chunk=997)
    np.testing.assert_array_equal(whole.view(np.uint16), pieces.view(np.uint16))
    assert pieces.shape == x.shape
    wide = kernels.to_float32(pieces, chunk=1000, backend=backend)
    np.testing.assert_array_equal(wide, kernels.to_float32(pieces, backend=backend))


@pytest.mark.parametrize("backend", ["ml_dtypes", "numpy"])
def test_threads_do_not_change_results(backend, f32_inputs):
    x, ref = f32_inputs
    y = kernels.to_bf16(x, backend=backend, threads=3, chunk=1 << 20)
    np.testing.assert_array_equal(y.view(np.uint16), ref)
    w = kernels.to_float32(y, backend=backend, threads=4, chunk=333_333)
    np.testing.assert_array_equal(w.view(np.uint32), ref.astype(np.uint32) << 16)
    with pytest.raises(ValueError, match="chunk"):
        kernels.to_bf16(x[:10], chunk=0)


def test_the_core_count_is_read_once(monkeypatch, f32_inputs):
    """os.cpu_count() costs 12 to 60 us a call here, more than a 1 KiB conversion: the kernels read
    the cores once, at import, and split work over them (every backend, every dtype) without asking
    again."""
    x, ref = f32_inputs

    def asked():
        raise AssertionError("a kernel asked os.cpu_count() during a call")

    monkeypatch.setattr(os, "cpu_count", asked)
    monkeypatch.setattr(os, "sched_getaffinity", asked, raising=False)
    for backend in ("ml_dtypes", "numpy"):
        y = kernels.to_bf16(x, backend=backend, chunk=1 << 20)
        np.testing.assert_array_equal(y.view(np.uint16), ref)
        np.testing.assert_array_equal(kernels.to_float32(y, backend=backend).view(np.uint32),
                                      ref.astype(np.uint32) << 16)
    e4 = kernels.to_dtype(x[:1000], "float8_e4m3fn")
    assert kernels.to_float32(e4).dtype == np.float32


# Run in a fresh process: the peak resident set (Linux VmHWM, reset through
# /proc/self/clear_refs) sees every allocator, torch's included, which tracemalloc does
# not (a 32 MiB torch.empty shows 152 bytes there); a fresh process also has no freed heap
# in which unbounded temporaries could hide without raising the resident set.
_PEAK_SCRIPT = r"""
import json, sys
import numpy as np, ml_dtypes
from bf16bridge import errors as bb_errors
from bf16bridge import kernels

backend, n, chunk, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if backend == "torch":
    import torch

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

def peak_extra(fn):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current resident set
    before = status("VmRSS")
    fn()
    return status("VmHWM") - before

x = np.ones(n, dtype=np.float32)
out = np.full(n, 7, dtype=ml_dtypes.bfloat16)  # written, so resident (np.zeros pages are not, yet)
wide = np.full(n, 7, dtype=np.float32)
small = np.ones(4 * chunk, dtype=np.float32)
for _ in range(2):  # warm up: the thread pool, torch's own state, numpy's caches
    kernels.to_float32(kernels.to_bf16(small, chunk=chunk, backend=backend, threads=threads),
                       chunk=chunk, backend=backend, threads=threads)
res = {
    "to_bf16": peak_extra(lambda: kernels.to_bf16(x, out=out, chunk=chunk, backend=backend, threads=threads)),
    "to_float32": peak_extra(lambda: kernels.to_float32(out, out=wide, chunk=chunk, backend=backend,
                                                        threads=threads)),
    "exact": bool((wide == x).all()),
}
# the meter itself: a fresh buffer of n float32 shows up, from torch's allocator too
res["meter"] = peak_extra(lambda: torch.ones(n, dtype=torch.float32) if backend == "torch"
                          else np.ones(n, dtype=np.float32))
print(json.dumps(res))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc/self/clear_refs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_extra_memory_is_bounded_by_a_chunk(backend):
    n, chunk, threads = 1 << 23, 1 << 16, 2  # 32 MiB of float32 in 256 KiB chunks, two at a time
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, backend, str(n), str(chunk), str(threads)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["exact"]
    assert res["meter"] >= n * 4 * 0.9, f"the meter misses a {n * 4}-byte buffer: {res}"
    # a piece's temporaries are a few bytes an element: 2 threads x 65,536 elements x 32 B is
    # 4 MiB, an eighth of the input; unchunked, the integer kernels take several times the input
    limit = threads * chunk * 32
    for what in ("to_bf16", "to_float32"):
        assert res[what] < limit, f"{what} on {backend}: peak {res[what]:,} extra bytes, limit {limit:,} ({res})"


def test_out_may_be_a_memory_map(tmp_path):
    x = np.linspace(-3, 3, 100_003, dtype=np.float32)
    out = np.lib.format.open_memmap(tmp_path / "y.npy", mode="w+", dtype=ml_dtypes.bfloat16, shape=x.shape)
    kernels.to_bf16(x, out=out, chunk=4096)
    out.flush()
    del out
    back = np.load(tmp_path / "y.npy", allow_pickle=False)  # read back from the file
    np.testing.assert_array_equal(back.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_progress_bar_when_asked(capsys):
    kernels.to_float32(np.zeros(10_000, dtype=ml_dtypes.bfloat16), chunk=1000, progress=True)
    err = capsys.readouterr().err
    assert "bf16 -> float32" in err and "100.0%" in err
    kernels.to_float32(np.zeros(10_000, dtype=ml_dtypes.bfloat16), chunk=1000)
    assert capsys.readouterr().err == ""  # quick conversions stay quiet


@pytest.mark.parametrize("call, label", [
    (lambda: kernels.to_dtype(np.zeros(10, np.float64), "float8_e4m3fn", progress=True), "float64 -> float8_e4m3fn"),
    (lambda: kernels.to_dtype(np.zeros(10, np.float64), "bfloat16", progress=True), "float64 -> bfloat16"),
    (lambda: kernels.to_float32(np.zeros(10, ml_dtypes.float8_e5m2), progress=True), "float8_e5m2 -> float32"),
])
def test_progress_bar_of_one_piece_names_the_conversion(call, label, capsys):
    """A small input runs as one piece on the calling thread, and its bar's label is built only
    when the bar shows: it still names the conversion."""
    call()
    err = capsys.readouterr().err
    assert f"\r{label} [" in err and "100.0%" in err, err


@pytest.mark.parametrize("call, error, match", [
    (lambda: kernels.to_bf16(np.zeros(3, dtype=np.float64)), bb_errors.UnsupportedDtypeError, "float32"),
    (lambda: kernels.to_float32(np.zeros(3, dtype=np.float32)), bb_errors.UnsupportedDtypeError, "bfloat16"),
    (lambda: kernels.to_bf16(np.zeros((4, 4), dtype=np.float32).T), bb_errors.CopyRequiredError,
     r"C-contiguous.*np.ascontiguousarray"),
    (lambda: kernels.to_bf16(np.zeros(3, dtype=np.float32), out=np.zeros(4, dtype=ml_dtypes.bfloat16)),
     bb_errors.InvalidArgumentError, r"out must be a writable C-contiguous bfloat16 array of shape \(3,\)"),
    (lambda: kernels.to_bf16(np.zeros(3, dtype=np.float32), backend="cuda"), bb_errors.InvalidArgumentError,
     "backend must be"),
    (lambda: kernels.to_bf16(np.zeros(10, dtype=np.float32), chunk=0), bb_errors.InvalidArgumentError,
     "chunk must be a positive number"),
    # byte-swapped arrays share the name ('>f4' is "float32"): read as ours, their bytes were wrong values
    (lambda: kernels.to_bf16(np.ones(3, dtype=">f4")), bb_errors.UnsupportedDtypeError,
     r"got dtype float32 in the other byte order \(>f4\) \(byte-swapped: pass x.astype\(x.dtype.newbyteorder\('='\)\)"),
    (lambda: kernels.to_bf16(np.ones(3, dtype=">u4")), bb_errors.UnsupportedDtypeError, "got dtype uint32 in the other byte order .>u4. .byte-swapped"),
    (lambda: kernels.to_float32(np.full(3, 0x3F80, dtype=">u2")), bb_errors.UnsupportedDtypeError,
     "got dtype uint16 in the other byte order .>u2. .byte-swapped"),
    (lambda: kernels.to_dtype(np.ones(3, dtype=">f4"), "bfloat16"), bb_errors.UnsupportedDtypeError, "got dtype >f4"),
    (lambda: kernels.to_float32(np.ones(3, np.float32).astype(ml_dtypes.bfloat16).astype(
        np.dtype(ml_dtypes.bfloat16).newbyteorder(">"))), bb_errors.UnsupportedDtypeError,
     r"got dtype bfloat16 in the other byte order \(>V2\) \(byte-swapped"),
])
def test_bad_inputs_get_our_errors(call, error, match):
    with pytest.raises(error, match=match) as err:
        call()
    assert isinstance(err.value, bb_errors.Bf16BridgeError)


def _overlapping(case):
    """(the call, the input's bits before) for an out= that overlaps its input's memory."""
    if case == "widen":  # bf16 in the first half of its own float32 out: 1,048,539 of 1 Mi were wrong
        buf = np.zeros(1 << 20, np.float32)
        src = buf.view(np.uint16)[: 1 << 20].view(ml_dtypes.bfloat16)
        src[:] = np.arange(1 << 20, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
        return (lambda: kernels.to_float32(src, out=buf, chunk=4096)), buf
    if case == "round":  # float32 rounded into a uint16 view of itself: wrong with threads=2
        x = np.linspace(-3, 3, 1 << 20, dtype=np.float32)
        return (lambda: kernels.to_bf16(x, out=x.view(ml_dtypes.bfloat16)[: x.size], threads=2)), x
    if case == "narrow":
        x = np.linspace(-3, 3, 1 << 12, dtype=np.float32)
        return (lambda: kernels.to_dtype(x, "float8_e4m3fn", out=x.view(ml_dtypes.float8_e4m3fn)[: x.size])), x
    a = (np.arange(16, dtype=np.uint8) & 0xF).view(ml_dtypes.int4)  # pack_nibbles into itself
    return (lambda: kernels.pack_nibbles(a, out=a.view(np.uint8)[:8])), a


@pytest.mark.parametrize("case", ["widen", "round", "narrow", "pack"])
def test_an_out_that_overlaps_the_input_is_refused(case):
    """Chunks (and threads) write results over input not yet read: wrong values, silently."""
    call, held = _overlapping(case)
    before = held.copy()
    with pytest.raises(bb_errors.InvalidArgumentError, match="out overlaps the input's memory"):
        call()
    np.testing.assert_array_equal(held.view(np.uint8), before.view(np.uint8))  # nothing written


def test_auto_backend_is_ml_dtypes_here():
    assert kernels.pick_backend() == "ml_dtypes"


def test_kernels_name_no_framework():
    """The torch backend lives in the torch adapter; kernels.py asks the registry (docstrings may name it)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(kernels))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    words = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            words |= {a.name.split(".")[0] for a in n.names} | {(getattr(n, "module", None) or "").split(".")[0]}
        elif isinstance(n, ast.Name):
            words.add(n.id)
        elif isinstance(n, ast.Attribute):
            words.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            words |= set(n.value.replace("'", " ").replace('"', " ").split())
    assert not words & {"torch", "jax", "tensorflow", "tf", "_widen_torch", "_round_torch"}


_FOREIGN_ADAPTER = r"""
import sys
import numpy as np
from bf16bridge.core import registry
from bf16bridge import kernels
from bf16bridge.kernels import bits
from bf16bridge.core.adapter import Adapter
from bf16bridge.adapters.hooks import KernelHooks

class Box:
    pass

class BoxAdapter(Adapter, KernelHooks):  # its kernel hooks on the adapter itself
    name = "box"
    offers_kernels = True
    calls = 0

    def widen_bits(self, src, dst):
        BoxAdapter.calls += 1
        np.left_shift(src, 16, out=dst, dtype=np.uint32)

    def round_bits(self, src, dst):
        BoxAdapter.calls += 1
        bits.ROUND_BITS["numpy"](src, dst)

registry.register_adapter("box", BoxAdapter(), types=(f"{__name__}:Box",))
x = np.array([1.0, -2.5, 3.140625, np.inf, np.nan], dtype=np.float32)
b = kernels.to_bf16(x, backend="box", chunk=2, threads=1)
w = kernels.to_float32(b, backend="box", chunk=2, threads=1)
print(kernels.backends(), kernels.pick_backend("box"), b.view(np.uint16).tolist(),
      (w.view(np.uint32) == (b.view(np.uint16).astype(np.uint32) << 16)).all(), BoxAdapter.calls,
      sorted(m for m in ("torch", "jax", "tensorflow") if m in sys.modules))
"""


def test_an_adapter_offering_kernels_is_a_backend():
    out = subprocess.run([sys.executable, "-c", _FOREIGN_ADAPTER], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("] ", 1) == [
        "['auto', 'ml_dtypes', 'numpy', 'box'",
        "box [16256, 49184, 16457, 32640, 32704] True 6 []\n",
    ]


@pytest.mark.parametrize("name, error, match", [
    ("cuda", bb_errors.InvalidArgumentError, "backend must be one of auto, ml_dtypes, numpy"),
    ("jax", bb_errors.InvalidArgumentError, "backend must be one of"),  # offers no kernels
    (None, bb_errors.InvalidArgumentError, "backend must be one of"),
])
def test_unknown_backends_are_refused(name, error, match):
    with pytest.raises(error, match=match):
        kernels.pick_backend(name)
