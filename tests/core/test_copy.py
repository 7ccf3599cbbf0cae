"""copy=True always copies; copy=False never does (or raises); inputs are never modified."""

import ml_dtypes
import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, PAIRS, aligned_copy, bits, make, ptr


def _data():
    return np.arange(1, 65, dtype=np.uint16).view(BF16)


@pytest.mark.parametrize("src,dst", PAIRS)
def test_copy_true_gives_fresh_memory(src, dst):
    x = make(src, _data())
    p = bb.plan(x, to=dst, copy=True)
    assert p.copies and not p.shares_memory
    y = bb.convert(x, dst, copy=True)
    assert ptr(y) != ptr(x)
    np.testing.assert_array_equal(bits(y), bits(x))
    if dst in ("numpy", "torch"):
        assert p.writable
        y[0] = 5.0  # writing to the copy leaves the source alone
        np.testing.assert_array_equal(bits(x), _data().view(np.uint16))


@pytest.mark.parametrize("src,dst", PAIRS)
def test_copy_false_on_zero_copy_route(src, dst):
    x = make(src, _data())
    y = bb.convert(x, dst, copy=False, on_alias="allow")
    assert ptr(y) == ptr(x)


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("dst", ["numpy", "torch", "jax", "tensorflow"])
def test_zero_copy_results_share_memory_both_ways(dst):
    import torch

    t = torch.zeros(8, dtype=torch.bfloat16)
    y = bb.convert(t, dst)
    t[0] = 2.0  # torch is mutable; every zero-copy result sees the write
    assert bits(y)[0] == np.array(2.0, dtype=BF16).view(np.uint16)


def test_invalid_copy_and_fallback_values():
    a = _data()
    with pytest.raises(ValueError, match="copy must be"):
        bb.convert(a, "torch", copy="yes")
    with pytest.raises(ValueError, match="fallback must be"):
        bb.convert(a, "torch", fallback="float16")


@pytest.mark.parametrize("src,dst", [("torch", "jax"), ("jax", "torch")])
def test_copy_true_copies_a_device_tensor_on_its_device(src, dst):
    """A device input (described as on cuda:0; planned here on CPU): copy=True copies on the device;
    only a host-only target (numpy) takes it to the host."""
    from bf16bridge.core import registry
    from bf16bridge.core import planner as routes

    s = registry.get(src).describe(make(src, np.zeros(8, BF16)))._replace(device="cuda:0")
    assert [st.kind for st in routes.plan_for(s, src, dst, copy=True).steps if st.copies] == ["copy"]
    assert [st.kind for st in routes.plan_for(s, src, "numpy", copy=True).steps if st.copies] == ["to_host"]


def _offset_bf16(readonly: bool, offset: int):
    raw = np.zeros(200, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    a = raw[start:start + 16].view(ml_dtypes.bfloat16)
    a.flags.writeable = not readonly
    return a


# (read-only, bytes past a 64-byte boundary, target) -> the reasons plan() gives for its copies:
# only what forces the copy (torch cannot hold read-only memory; jax and tensorflow take read-only
# memory but copy or refuse an unaligned buffer; torch takes an unaligned one)
COPY_REASONS = [
    (True, 0, "torch", ["the input is read-only and torch cannot hold read-only memory"]),
    (True, 2, "torch", ["the input is read-only and torch cannot hold read-only memory"]),
    (True, 0, "jax", []),
    (True, 2, "jax", ["not 64-byte aligned"]),
    (True, 2, "tensorflow", ["not 64-byte aligned"]),
    (False, 2, "torch", []),
    (False, 2, "tensorflow", ["not 64-byte aligned"]),
]


@pytest.mark.parametrize("readonly, offset, target, reasons", COPY_REASONS)
def test_a_copy_says_only_what_forces_it(readonly, offset, target, reasons):
    """A read-only unaligned numpy array copied for tensorflow was said to copy because "tensorflow
    cannot hold read-only memory" (it can), and for torch because "not 64-byte aligned" (torch takes
    any alignment)."""
    p = bb.plan(_offset_bf16(readonly, offset), to=target)
    assert [s.reason for s in p.steps if s.copies] == reasons, str(p)


@pytest.mark.parametrize("case, hint", [pytest.param("jax fp8 bit-cast", None, marks=pytest.mark.frameworks("torch")),
                                        ("transposed", "contiguous"),
                                        pytest.param("read-only", "writable", marks=pytest.mark.frameworks("torch"))])
def test_copy_false_names_only_a_way_out_that_exists(case, hint):
    """copy=False's error ended "or make the input contiguous and aligned" even where the copy is
    the route's own (jax's bit-cast copies whatever its input): it names what of the input could
    change, or only copy=None."""
    import jax.numpy as jnp

    x, to, kw = {
        "jax fp8 bit-cast": (jnp.zeros(4, jnp.float8_e4m3b11fnuz), "torch", {"fallback": "bits"}),
        # (not 64-byte aligned: an aligned transpose crosses zero-copy into a jax that keeps it, on NumPy 2.5)
        "transposed": (aligned_copy(np.zeros((4, 4), ml_dtypes.bfloat16), offset_bytes=2).T, "jax", {}),
        "read-only": (_offset_bf16(True, 0), "torch", {}),
    }[case]
    with pytest.raises(bb.CopyRequiredError, match="pass copy=None to allow the copy") as got:
        bb.convert(x, to, copy=False, **kw)
    said = str(got.value)
    if hint is None:
        assert "make the input" not in said, said
    else:
        assert f"make the input {hint}" in said, said


def _at_page_offset(nbytes: int, offset: int) -> np.ndarray:
    """bf16 data ``offset`` bytes into a 4 KiB page, every byte distinct from its neighbours."""
    raw = np.empty(nbytes + 8192, np.uint8)
    start = (-raw.ctypes.data) % 4096 + offset
    a = raw[start:start + nbytes].view(np.uint16)
    a[...] = np.arange(a.size, dtype=np.uint16) * 40503  # odd: every pattern, in no simple order
    return a.view(BF16)


@pytest.mark.parametrize("target", ["jax", "tensorflow"])
@pytest.mark.parametrize("offset", [2, 16, 48, 62, 1040, 4030])
def test_a_large_unaligned_copy_lands_at_its_sources_page_offset(target, offset):
    """A large unaligned numpy array copied for jax or tensorflow was copied into a buffer 64-byte
    aligned wherever numpy's allocation put it: into fresh memory, this machine's memcpy (glibc's,
    non-temporal stores) ran about 1.4x slower whenever the destination's offset in its 4 KiB page
    is more than 64 bytes past the source's (numpy's allocations sit 16 bytes into a page, the copy
    at 64; docs/routes.md). The copy now starts at the source's page offset, rounded up to 64."""
    from bf16bridge.core.memory import PAGE_MATCH_FROM

    x = _at_page_offset(PAGE_MATCH_FROM + 4096, offset)
    y = bb.convert(x, target)
    assert ptr(y) % 64 == 0
    assert ptr(y) % 4096 == -(-offset // 64) * 64 % 4096, (ptr(y) % 4096, offset)
    np.testing.assert_array_equal(bits(y), x.view(np.uint16))


def test_a_small_copy_keeps_its_small_slack():
    """Below PAGE_MATCH_FROM the copy is only 64-byte aligned: the extra 4 KiB a page offset needs
    would cost more memory than the copy saves time (no difference measured there)."""
    from bf16bridge.core.memory import PAGE_MATCH_FROM

    x = _at_page_offset(PAGE_MATCH_FROM - 2, 16)
    y = bb.convert(x, "numpy", copy=True)
    assert ptr(y) % 64 == 0 and y.base is not None and y.base.nbytes <= x.nbytes + 64
    np.testing.assert_array_equal(bits(y), x.view(np.uint16))


@pytest.mark.frameworks("torch")
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_a_large_torch_copy_faults_no_more_pages_than_np_copy(layout):
    """torch's own allocation of a large copy (torch.empty) faulted in every 4 KiB page of fresh
    memory: 8192 page faults for 32 MiB where np.copy of the same bytes took 528 (numpy asks the
    kernel for huge pages), about half the time of a transposed tensor's copy (torch (transposed)
    -> jax or tensorflow) and most of a contiguous one's. From FRESH_MEMORY_FROM bytes on, the
    torch adapter copies into numpy's memory. Counted, not timed: where the kernel gives no huge
    pages, both fault every page and this still holds."""
    import resource

    import torch

    from bf16bridge.core.memory import FRESH_MEMORY_FROM

    side = int((FRESH_MEMORY_FROM // 2) ** 0.5) + 1
    a = np.arange(side * side, dtype=np.uint16).reshape(side, side)
    t = torch.from_numpy(a).view(torch.bfloat16)
    x = t.T if layout == "transposed" else t

    def faults(f):
        """The page faults of each of three calls (after a first: whatever it initialises); the
        allocator may hand either side memory already touched, so ours counts at its fewest,
        np.copy's at its most."""
        f()
        counts = []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            y = f()
            counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            del y
        return counts

    ours, floor = min(faults(lambda: bb.convert(x, "torch", copy=True))), max(faults(lambda: np.copy(a)))
    assert ours <= floor + floor // 4 + 64, (ours, floor)
    y = bb.convert(x, "torch", copy=True)
    assert y.is_contiguous() and y.dtype == torch.bfloat16 and y.shape == x.shape and ptr(y) % 64 == 0
    np.testing.assert_array_equal(bits(y), np.ascontiguousarray(a.T if layout == "transposed" else a))


_JAX_TO_TF = r"""
import sys
import numpy as np, jax, jax.numpy as jnp, tensorflow as tf
import bf16bridge as bb
sys.path.insert(0, sys.argv[1])
from conftest import bits, ptr

for n in (1, 2, 3, 6, 8, 16, 100, 1000, 5000):
    # jax's own results and copies (jax 0.4.30 allocates them 16, 32 or 48 bytes past a 64-byte boundary)
    x = (jnp.arange(n, dtype=jnp.float32) * 1.5 - 7).astype(jnp.bfloat16)
    for v in (x, jnp.array(x, copy=True)):
        for copy in (None, True):
            y = bb.convert(v, "tensorflow", copy=copy)
            assert ptr(y) % 64 == 0, (n, copy, ptr(y) % 64, bb.plan(v, to="tensorflow", copy=copy))
            z = y * tf.constant(2, tf.bfloat16)  # a tf kernel: on an unaligned buffer, the process aborts
            np.testing.assert_array_equal(bits(z), bits(v * jnp.bfloat16(2)))
            np.testing.assert_array_equal(bits(bb.convert(y, "tensorflow", copy=True)), bits(v))
print("ok")
"""


@pytest.mark.frameworks("jax", "tensorflow")
def test_jax_arrays_reach_tensorflow_aligned():
    """jax 0.4.30 allocates its CPU buffers 16 bytes aligned, not 64: the jax adapter said every jax
    array was aligned, so one crossed into tensorflow zero-copy, and the next tf kernel on it (a
    multiply, or convert's own DeepCopy) aborted the process ("Check failed: IsAligned()"). A child
    process, since the failure is an abort."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", _JAX_TO_TF, here], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), (out.returncode, out.stderr[-3000:])
