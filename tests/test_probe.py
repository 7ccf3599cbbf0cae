"""The capability probe and the fallback policy, on this machine and on machines it stands in for."""

import dataclasses
import importlib
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16, aligned_copy, bits

probe_mod = importlib.import_module("bf16bridge.capabilities")


class FakeReader(probe_mod.Reader):
    """A machine described by its parts."""

    def __init__(self, arch="x86_64", flags="", hwcap2=None, ml_dtypes=(True, "ml_dtypes works"), system="Linux"):
        self._arch, self._flags, self._hwcap2, self._ml, self._system = arch, flags, hwcap2, ml_dtypes, system

    def machine(self):
        return self._arch

    def system(self):
        return self._system

    def cpu_count(self):
        return 8

    def cpuinfo(self):
        key = "Features" if self._arch == "aarch64" else "flags"
        return f"processor\t: 0\n{key}\t\t: {self._flags}\n"

    def hwcap2(self):
        return self._hwcap2

    def sysctl(self, name):
        return None

    def ml_dtypes(self):
        return self._ml

    def numpy_bf16_dlpack(self):
        return False, "numpy <= 2.4 has no bf16 DLPack"


X86_BF16 = "fpu sse avx2 avx512f avx512_bf16 amx_bf16"
X86_PLAIN = "fpu sse avx2 avx512f"


@pytest.mark.parametrize("reader,compute,why", [
    (FakeReader("x86_64", X86_BF16), True, "AVX512_BF16 and AMX_BF16 present"),
    (FakeReader("x86_64", X86_PLAIN), False, "no AVX512_BF16 or AMX_BF16"),
    (FakeReader("aarch64", "fp asimd bf16 i8mm"), True, "FEAT_BF16 present (cpuinfo)"),
    (FakeReader("aarch64", "fp asimd", hwcap2=1 << 14), True, "FEAT_BF16 present (HWCAP2)"),
    (FakeReader("aarch64", "fp asimd", hwcap2=0), False, "no FEAT_BF16 (HWCAP2)"),
    (FakeReader("riscv64", ""), False, "not known"),
])
def test_cpu_bf16_compute(reader, compute, why):
    caps = bb.probe(reader=reader)
    assert caps.cpu.bf16_compute is compute
    assert why in caps.cpu.why
    d = caps.decide("numpy", for_compute=True)
    assert d.dtype == ("bfloat16" if compute else "float32")
    assert (why in d.reason) and d.reason
    assert caps.decide("numpy").dtype == "bfloat16"  # storage alone never needs widening


def test_arm_flags_recorded():
    caps = bb.probe(reader=FakeReader("aarch64", "fp", hwcap2=(1 << 14) | (1 << 13)))
    assert caps.cpu.flags == ("bf16", "i8mm")


def test_numpy_without_ml_dtypes_decides_float32_with_a_reason():
    caps = bb.probe(reader=FakeReader("x86_64", X86_BF16, ml_dtypes=(False, "ml_dtypes is unusable: No module")))
    assert not caps.numpy.bf16_storage and "No module" in caps.numpy.bf16_storage_why
    d = caps.decide("numpy")
    assert d.dtype == "float32" and "numpy cannot hold bf16" in d.reason and "No module" in d.reason
    assert caps.decide("numpy", widen_to="bits").dtype == "bits"
    assert "numpy bf16 storage  no" in str(caps) or "no: ml_dtypes is unusable" in str(caps)


def test_real_probe_is_cached_frozen_and_json_ready():
    caps = bb.probe()
    assert bb.probe() is caps
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.cpu = None
    d = json.loads(json.dumps(caps.to_dict(), default=str))
    assert d["cpu"]["arch"] and d["numpy"]["bf16_storage"] is True
    assert caps.numpy.bf16_dlpack is False and "BufferError" in caps.numpy.bf16_dlpack_why  # numpy <= 2.4
    assert caps.numpy.dlpack_version.startswith("1.")


def test_probe_of_frameworks_tries_them():
    caps = bb.probe(frameworks="all", refresh=True)
    for name in ("torch", "jax", "tensorflow"):
        fw = caps.frameworks[name]
        assert fw.probed and fw.version and fw.bf16_dlpack is True, fw
    assert caps.frameworks["torch"].facts["uint16"][0] is True
    assert caps.frameworks["jax"].facts["x64"][0] is False
    assert caps.frameworks["torch"].dlpack_version.startswith("1.")


def test_probe_imports_no_framework_unless_asked():
    code = textwrap.dedent("""
        import sys, json
        import bf16bridge as bb
        caps = bb.probe()
        assert not any(m in sys.modules for m in ("torch", "jax", "tensorflow")), "imported a framework"
        assert not caps.frameworks["torch"].probed and caps.frameworks["torch"].version
        assert "probe(frameworks=" in caps.frameworks["torch"].why
        caps = bb.probe(frameworks=["pt"])
        assert caps.frameworks["torch"].probed and not caps.frameworks["jax"].probed
        assert "jax" not in sys.modules and "tensorflow" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.fixture
def machine(monkeypatch):
    """Make convert()'s probe see a machine of the test's choosing."""

    def use(reader):
        monkeypatch.setattr(probe_mod, "Reader", lambda: reader)
        monkeypatch.setattr(probe_mod, "_CACHE", {})

    return use


@pytest.mark.parametrize("src", ["torch", "jax", "tensorflow", "numpy"])
def test_auto_for_compute_on_a_cpu_without_bf16_gives_float32(machine, src, all_bf16):
    from conftest import make

    machine(FakeReader("x86_64", X86_PLAIN))
    x = make(src, all_bf16.view(BF16))
    p = bb.plan(x, to="numpy", fallback="auto", for_compute=True)
    assert p.dtype_out == "float32" and "no bf16 arithmetic" in p.decision and p.copies
    assert "no bf16 arithmetic" in str(p)
    y = bb.convert(x, "numpy", fallback="auto", for_compute=True)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y.view(np.uint32), all_bf16.astype(np.uint32) << 16)  # exact widening


@pytest.mark.parametrize("dst", ["numpy", "torch", "jax", "tensorflow"])
def test_auto_keeps_bf16_where_it_fits(machine, dst, all_bf16):
    machine(FakeReader("x86_64", X86_BF16))
    a = aligned_copy(all_bf16.view(BF16))
    p = bb.plan(a, to=dst, fallback="auto", for_compute=True)
    assert p.dtype_out == "bfloat16" and "fallback='auto'" in p.decision and not p.copies
    np.testing.assert_array_equal(bits(bb.convert(a, dst, fallback="auto")), all_bf16)


def test_for_compute_needs_auto():
    with pytest.raises(ValueError, match="fallback='auto'"):
        bb.convert(np.zeros(2, BF16), "torch", for_compute=True)


def test_probe_cli_text_and_json():
    out = subprocess.run([sys.executable, "-m", "bf16bridge", "probe", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert "bf16_compute" in d["cpu"] and d["numpy"]["bf16_storage"] is True
    out = subprocess.run([sys.executable, "-m", "bf16bridge", "probe"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "cpu bf16 compute" in out.stdout and "decide('numpy')" in out.stdout
