"""Reading the machine: CPU features, package versions, and what this NumPy
and ml_dtypes do with bf16, all through a ``Reader`` that tests replace to
stand in for other hardware. ``bf16bridge.capabilities.probing`` turns these readings
into the probe's answer and the fallback policy.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from bf16bridge.core import dtypes

#: linux auxv keys and bits for Arm's bf16 and int8 matrix features
_AT_HWCAP2 = 26
_HWCAP2_BF16 = 1 << 14
_HWCAP2_I8MM = 1 << 13


class Reader:
    """Where the probe reads the machine. Tests subclass this to stand in for other hardware."""

    def machine(self) -> str:
        return platform.machine().lower()

    def system(self) -> str:
        return platform.system()

    def cpu_count(self) -> int:
        return os.cpu_count() or 1

    def cpuinfo(self) -> str:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def hwcap2(self) -> int | None:
        if self.system() != "Linux":
            return None
        import ctypes

        try:
            getauxval = ctypes.CDLL(None).getauxval
        except (OSError, AttributeError):
            return None
        getauxval.restype = ctypes.c_ulong
        getauxval.argtypes = [ctypes.c_ulong]
        return int(getauxval(_AT_HWCAP2))

    def sysctl(self, name: str) -> str | None:
        """macOS feature flags (hw.optional.arm.FEAT_BF16)."""
        if self.system() != "Darwin":
            return None
        import subprocess

        try:
            return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    def version(self, package: str) -> str | None:
        """Installed version of the distribution that provides top-level ``package``."""
        from importlib import metadata

        for dist in _distributions().get(package, [package]):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return None

    def imported(self, module: str) -> bool:
        return module in sys.modules

    def ml_dtypes(self) -> tuple[bool, str]:
        """Whether ml_dtypes' bf16 works with this numpy, tried, and why not."""
        if dtypes.bfloat16 is None:
            return False, f"ml_dtypes is unusable: {dtypes.ML_DTYPES_ERROR}"
        import numpy as np

        try:
            a = np.array([1.0, -0.0, 3.5, np.inf], dtype=np.float32)
            back = a.astype(dtypes.bfloat16).astype(np.float32)
            ok = bool(np.array_equal(back.view(np.uint32), a.view(np.uint32)))
        except Exception as err:  # noqa: BLE001 - any failure means no bf16 storage
            return False, f"ml_dtypes bf16 failed with this numpy: {type(err).__name__}: {err}"
        if not ok:
            return False, "ml_dtypes bf16 gave wrong values with this numpy"
        return True, f"ml_dtypes {self.version('ml_dtypes')} bf16 arrays work with numpy {np.__version__}"

    def numpy_bf16_dlpack(self) -> tuple[bool, str]:
        """Whether numpy exports and imports bf16 over DLPack (NumPy 2.5's dtype registry), tried."""
        if dtypes.bfloat16 is None:
            return False, "numpy holds no bf16 here"
        import numpy as np

        from bf16bridge.core import registry

        # building the numpy adapter registers bf16 and fp8 with NumPy 2.5's DLPack dtype registry
        # where ml_dtypes has not (adapters/_numpy_registry.py); it imports no framework
        registry.get("numpy")
        from bf16bridge.adapters.numpy import REGISTRATION

        a = np.arange(4, dtype=np.uint16).view(dtypes.bfloat16)
        try:
            b = np.from_dlpack(a)
        except Exception as err:  # noqa: BLE001
            return False, f"{type(err).__name__}: {err} (bf16 crosses as uint16 bits instead; {REGISTRATION})"
        if b.dtype != a.dtype or bytes(b.view(np.uint8)) != bytes(a.view(np.uint8)):
            # another dtype took DLPack's bf16 code in numpy's registry first (NumPy 2.5)
            return False, (f"np.from_dlpack of a bf16 array gives {b.dtype}: another dtype holds DLPack's bf16 "
                           f"code in numpy's registry (bf16 crosses as uint16 bits instead; {REGISTRATION})")
        who = "registered by bf16bridge" if "bfloat16" in REGISTRATION.registered else "mapped by numpy or ml_dtypes"
        return True, f"numpy exchanges bf16 over DLPack ({who})"

    def numpy_dlpack_version(self) -> str:
        import numpy as np

        from bf16bridge.adapters import dlpack as _dlpack

        try:
            return _dlpack.protocol_version(np.zeros(1, dtype=np.uint8))
        except Exception as err:  # noqa: BLE001
            return f"none ({type(err).__name__}: {err})"


_DIST_LOCK = threading.Lock()
_DISTS: Mapping[str, list[str]] | None = None


def _distributions() -> Mapping[str, list[str]]:
    global _DISTS
    with _DIST_LOCK:
        if _DISTS is None:
            from importlib import metadata

            _DISTS = metadata.packages_distributions()
        return _DISTS


@dataclass(frozen=True)
class CPU:
    arch: str
    os: str
    cores: int
    flags: tuple  # the bf16-relevant flags found (avx512_bf16, amx_bf16, avx512f, avx2 / bf16, i8mm)
    bf16_compute: bool
    why: str


# -- reading the CPU -------------------------------------------------------------

_X86_FLAGS = ("avx512_bf16", "amx_bf16", "avx512f", "avx2")
_ARM_FLAGS = ("bf16", "i8mm")


def read_cpu(reader: Reader) -> CPU:
    """The CPU's bf16-relevant flags and whether it computes in bf16, with why."""
    arch, system = reader.machine(), reader.system()
    info = reader.cpuinfo()
    words = set()
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words.update(value.split())
    if arch in ("x86_64", "amd64", "i386", "i686", "x86"):
        flags = tuple(f for f in _X86_FLAGS if f in words)
        bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
        if not info:
            why = "could not read the CPU flags (no /proc/cpuinfo)"
        elif bf16:
            why = " and ".join(f.upper() for f in flags if f in ("avx512_bf16", "amx_bf16")) + " present"
        else:
            why = "no AVX512_BF16 or AMX_BF16 among the CPU flags"
        return CPU(arch, system, reader.cpu_count(), flags, bf16, why)
    if arch in ("aarch64", "arm64") or arch.startswith("armv8"):
        hw = reader.hwcap2()
        found = set(f for f in _ARM_FLAGS if f in words)
        source = "cpuinfo"
        if hw is not None:
            source = "HWCAP2"
            if hw & _HWCAP2_BF16:
                found.add("bf16")
            if hw & _HWCAP2_I8MM:
                found.add("i8mm")
        mac = reader.sysctl("hw.optional.arm.FEAT_BF16")
        if mac is not None:
            source = "sysctl"
            if mac == "1":
                found.add("bf16")
        flags_t = tuple(f for f in _ARM_FLAGS if f in found)
        bf16 = "bf16" in flags_t
        if bf16:
            why = f"FEAT_BF16 present ({source})"
        elif source == "cpuinfo" and not info:  # nothing read: no cpuinfo, no HWCAP2, no sysctl (Windows)
            why = "could not read the CPU features (no /proc/cpuinfo, HWCAP2 or sysctl)"
        else:
            why = f"no FEAT_BF16 ({source})"
        return CPU(arch, system, reader.cpu_count(), flags_t, bf16, why)
    return CPU(arch, system, reader.cpu_count(), (), False, f"bf16 arithmetic on {arch} is not known to this probe")
