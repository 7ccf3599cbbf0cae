"""Run in a second, small environment: NumPy 1.26, torch, and no ml_dtypes.

There numpy cannot hold bf16. import bf16bridge must still work, the probe
must say why bf16 storage is unavailable, and fallback="auto" must hand back
float32 (or raw uint16 bits when asked) with the values right.
"""

import subprocess
import sys

import numpy as np
import pytest
import torch

import bf16bridge as bb
from bf16bridge.core import dtypes
from bf16bridge import kernels


def test_the_environment_is_the_one_we_mean():
    assert np.__version__.startswith("1.26")
    with pytest.raises(ImportError):
        import ml_dtypes  # noqa: F401
    assert dtypes.bfloat16 is None and "ml_dtypes" in dtypes.ML_DTYPES_ERROR


def test_probe_says_why_bf16_storage_is_unavailable():
    caps = bb.probe()
    assert caps.numpy.bf16_storage is False
    assert "ml_dtypes is unusable" in caps.numpy.bf16_storage_why
    assert caps.numpy.version.startswith("1.26") and caps.numpy.ml_dtypes_version is None
    d = caps.decide("numpy")
    assert d.dtype == "float32" and "numpy cannot hold bf16" in d.reason
    assert "numpy bf16 storage" in str(caps)


def _all_bf16():
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_auto_gives_float32_with_the_values_right():
    t = _all_bf16()
    p = bb.plan(t, to="numpy", fallback="auto")
    assert p.dtype_out == "float32" and "numpy cannot hold bf16" in p.decision
    a = bb.convert(t, "numpy", fallback="auto")
    assert a.dtype == np.float32 and a.shape == (65536,)
    expect = (t.view(torch.int16).numpy().view(np.uint16).astype(np.uint32) << 16)
    np.testing.assert_array_equal(a.view(np.uint32), expect)  # exact, NaN payloads included


def test_bits_when_asked():
    t = _all_bf16()
    a = bb.convert(t, "numpy", fallback="bits")
    assert a.dtype == np.uint16
    np.testing.assert_array_equal(a, t.view(torch.int16).numpy().view(np.uint16))
    assert a.__array_interface__["data"][0] == t.data_ptr()  # the bits cross without a copy


def test_error_by_default_names_the_way_out():
    with pytest.raises(bb.UnsupportedDtypeError, match="fallback='float32'"):
        bb.convert(_all_bf16(), "numpy")


def test_other_dtypes_still_cross():
    a = np.arange(10, dtype=np.float32)
    t = bb.convert(a, "torch")
    assert t.dtype == torch.float32 and t.data_ptr() == a.__array_interface__["data"][0]
    back = bb.convert(t, "numpy")
    assert back.dtype == np.float32 and back.__array_interface__["data"][0] == t.data_ptr()
    np.testing.assert_array_equal(back.view(np.uint32), np.arange(10, dtype=np.float32).view(np.uint32))


def test_kernels_pick_the_torch_adapters_backend_when_torch_is_imported():
    assert "torch" in sys.modules and kernels.pick_backend("auto") == "torch"
    assert kernels.backends() == ["auto", "ml_dtypes", "numpy", "torch"]


def test_kernels_never_import_torch_for_auto():
    code = ("import sys, numpy as np; from bf16bridge import kernels; "
            "b = kernels.to_bf16(np.array([1.0, 3.140625], dtype=np.float32)); "
            "print(kernels.pick_backend('auto'), b.tolist(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["numpy", "[16256,", "16457]", "False"]


def test_kernels_work_on_bits():
    x = np.array([1.0, -0.0, 3.140625, np.inf, np.nan, 1e-40], dtype=np.float32)
    for backend in ("numpy", "torch"):
        b = kernels.to_bf16(x, backend=backend)
        assert b.dtype == np.uint16
        assert b.tolist() == [0x3F80, 0x8000, 0x4049, 0x7F80, 0x7FC0, 0x0001]
        np.testing.assert_array_equal(kernels.to_float32(b, backend=backend).view(np.uint32),
                                      b.astype(np.uint32) << 16)
    u = np.arange(1 << 16, dtype=np.uint32) << 16 | 0x8000  # every tie
    x = u.view(np.float32)
    np.testing.assert_array_equal(kernels.to_bf16(x, backend="numpy"), kernels.to_bf16(x, backend="torch"))


def test_import_pulls_no_framework():
    out = subprocess.run([sys.executable, "-c", "import sys, bf16bridge; print('torch' in sys.modules)"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_parity_and_its_pytest_plugin_import_and_compare_without_ml_dtypes():
    # the plugin loads in every pytest run of an environment with bf16bridge installed (entry point
    # pytest11): an ml_dtypes import at the top of parity made each such run fail to start
    import bf16bridge.parity.pytest_plugin  # noqa: F401
    from bf16bridge import parity

    a = np.array([1.0, -0.0, 3.5], np.float32)
    assert parity.compare(a, a.copy(), policy="exact").passed
    assert not parity.compare(a, np.array([1.0, 0.0, 3.5], np.float32), policy="exact").passed
