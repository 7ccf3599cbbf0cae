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

from bf16bridge.capabilities import cpuid as cpuid_mod
from bf16bridge.core import dtypes

#: Linux auxv keys, and the bits of Arm's bf16 and int8 matrix features in them: arm64's HWCAP2
#: (arch/arm64/include/uapi/asm/hwcap.h), 32-bit Arm's HWCAP (arch/arm/include/uapi/asm/hwcap.h)
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_HWCAP2_BF16, _HWCAP2_I8MM = 1 << 14, 1 << 13
_HWCAP_ASIMDBF16, _HWCAP_I8MM = 1 << 26, 1 << 27
#: Windows' IsProcessorFeaturePresent constants (processthreadsapi.h, Windows 11 24H2 SDK)
PF_ARM_V86_BF16_INSTRUCTIONS_AVAILABLE, PF_ARM_V82_I8MM_INSTRUCTIONS_AVAILABLE = 68, 66


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

    def _auxv(self, key: int) -> int | None:
        if self.system() != "Linux":
            return None
        import ctypes

        try:
            getauxval = ctypes.CDLL(None).getauxval
        except (OSError, AttributeError):
            return None
        getauxval.restype = ctypes.c_ulong
        getauxval.argtypes = [ctypes.c_ulong]
        return int(getauxval(key))

    def hwcap(self) -> int | None:
        """Linux's AT_HWCAP (32-bit Arm: HWCAP_ASIMDBF16 is bit 26, HWCAP_I8MM bit 27)."""
        return self._auxv(_AT_HWCAP)

    def hwcap2(self) -> int | None:
        """Linux's AT_HWCAP2 (arm64: HWCAP2_BF16 is bit 14, HWCAP2_I8MM bit 13)."""
        return self._auxv(_AT_HWCAP2)

    def sysctl(self, name: str) -> str | None:
        """A macOS sysctl's value (hw.optional.arm.FEAT_BF16, sysctl.proc_translated); None elsewhere
        or where the name is unknown."""
        if self.system() != "Darwin":
            return None
        import subprocess

        try:
            out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        return out or None

    def cpuid(self, leaf: int, subleaf: int = 0) -> cpuid_mod.Words | None:
        """x86 CPUID's (eax, ebx, ecx, edx), run on this CPU (``capabilities.cpuid``); None off x86-64."""
        return cpuid_mod.cpuid(leaf, subleaf)

    def xcr0(self) -> int | None:
        """x86 XCR0: which register states the OS saves (AVX-512's, AMX's), by XGETBV."""
        return cpuid_mod.xcr0()

    def windows_feature(self, code: int) -> bool | None:
        """Windows' IsProcessorFeaturePresent(code); None elsewhere. A Windows older than the constant
        answers False, as for a feature the CPU lacks."""
        if self.system() != "Windows":
            return None
        import ctypes

        try:
            present = ctypes.windll.kernel32.IsProcessorFeaturePresent  # type: ignore[attr-defined]
        except (AttributeError, OSError):
            return None
        return bool(present(code))

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

    def numpy_compute(self) -> tuple[str, str, str]:
        """(dtype, how, why): what np.matmul computes two bf16 arrays in, read from the loop it resolves
        (no arithmetic runs): ml_dtypes registers no bf16 matmul, so numpy widens both operands to
        float32 in software (ml_dtypes' cast) and computes in float32 whatever the CPU has."""
        if dtypes.bfloat16 is None:
            return "unknown", "failed", "numpy holds no bf16 here"
        import numpy as np

        bf = np.dtype(dtypes.bfloat16)
        try:
            loop = np.matmul.resolve_dtypes((bf, bf, None))
        except Exception as err:  # noqa: BLE001 - no loop at all, or no resolve_dtypes (numpy < 1.24)
            return "unknown", "failed", f"np.matmul.resolve_dtypes of two bf16 arrays: {type(err).__name__}: {err}"
        if loop[0] == bf:
            return "bfloat16", "read", "np.matmul has a bf16 loop here"
        return "float32", "read", (f"np.matmul has no bf16 loop: it widens bf16 operands to {loop[0]} in software "
                                   f"(ml_dtypes' cast) and computes in {loop[2]} (the loop np.matmul resolves)")

    def numpy_offsets(self) -> tuple[int, ...]:
        """Address mod 64 of fresh np.empty arrays (the probe's allocation trial)."""
        import numpy as np

        from bf16bridge.adapters.trials import allocation_offsets

        return allocation_offsets(lambda n: np.empty(n, np.uint8), lambda a: a.__array_interface__["data"][0])

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
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
_ARM64 = ("aarch64", "arm64")


def _words(info: str) -> set[str] | None:
    """The feature words of /proc/cpuinfo's "flags" (x86) or "Features" (Arm) lines; None: no such line."""
    words: set[str] | None = None
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            words = (words or set()) | set(value.split())
    return words


def read_cpu(reader: Reader) -> CPU:
    """The CPU's bf16-relevant flags and whether it computes in bf16, with why and where each was read."""
    arch, system = reader.machine().lower(), reader.system()
    if arch in _X86:
        flags, why = _x86(reader, system)
        bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
        if bf16:
            why = " and ".join(f.upper() for f in flags if f in ("avx512_bf16", "amx_bf16")) + f" present ({why})"
        elif "could not" not in why and "Rosetta" not in why:
            why = f"no AVX512_BF16 or AMX_BF16 among the CPU flags ({why})"
        return CPU(arch, system, reader.cpu_count(), flags, bf16, why)
    if arch in _ARM64 or arch.startswith("armv") or arch == "arm":
        found, source = (_arm64 if arch in _ARM64 else _arm32)(reader, system)
        flags = tuple(f for f in _ARM_FLAGS if f in found)
        if "bf16" in flags:
            why = f"FEAT_BF16 present ({source})"
        elif source.startswith("could not"):
            why = source
        else:
            why = f"no FEAT_BF16 ({source})"
        return CPU(arch, system, reader.cpu_count(), flags, "bf16" in flags, why)
    return CPU(arch, system, reader.cpu_count(), (), False, f"bf16 arithmetic on {arch} is not known to this probe")


def _x86(reader: Reader, system: str) -> tuple[tuple, str]:
    """x86: the kernel's list where there is one (/proc/cpuinfo: what the CPU has and the OS enabled);
    under Rosetta 2, no AVX-512 at all; elsewhere (Windows, an Intel Mac) CPUID and XCR0, run here."""
    words = _words(reader.cpuinfo())
    if words is not None:
        return tuple(f for f in _X86_FLAGS if f in words), "/proc/cpuinfo flags"
    if system == "Darwin" and reader.sysctl("sysctl.proc_translated") == "1":
        feat = reader.sysctl("hw.optional.arm.FEAT_BF16")
        return (), ("an x86-64 Python under Rosetta 2 on Apple silicon, which translates no AVX-512 (so no "
                    "AVX512_BF16); an arm64 Python reads FEAT_BF16 here"
                    + (f" (hw.optional.arm.FEAT_BF16 = {feat})" if feat is not None else ""))
    found, where = cpuid_mod.decode(reader.cpuid, reader.xcr0())
    if where.startswith(("could not", "CPUID has no")):
        return (), f"could not read the CPU flags: no /proc/cpuinfo flags, and {where}"
    return tuple(f for f in _X86_FLAGS if f in found), where


def _arm64(reader: Reader, system: str) -> tuple[set[str], str]:
    """arm64: Linux's AT_HWCAP2 (else /proc/cpuinfo's Features), macOS's sysctl, Windows'
    IsProcessorFeaturePresent."""
    if system == "Windows":
        bf16 = reader.windows_feature(PF_ARM_V86_BF16_INSTRUCTIONS_AVAILABLE)
        if bf16 is None:
            return set(), "could not read the CPU features (IsProcessorFeaturePresent unavailable)"
        i8mm = reader.windows_feature(PF_ARM_V82_I8MM_INSTRUCTIONS_AVAILABLE)
        return ({"bf16"} if bf16 else set()) | ({"i8mm"} if i8mm else set()), (
            "IsProcessorFeaturePresent(PF_ARM_V86_BF16_INSTRUCTIONS_AVAILABLE); Windows before 11 24H2 "
            "answers no for every CPU" if not bf16 else "IsProcessorFeaturePresent")
    mac = reader.sysctl("hw.optional.arm.FEAT_BF16")
    if mac is not None:
        return ({"bf16"} if mac == "1" else set()) | (
            {"i8mm"} if reader.sysctl("hw.optional.arm.FEAT_I8MM") == "1" else set()), "sysctl"
    hw = reader.hwcap2()
    if hw is not None:
        return ({"bf16"} if hw & _HWCAP2_BF16 else set()) | ({"i8mm"} if hw & _HWCAP2_I8MM else set()), "HWCAP2"
    words = _words(reader.cpuinfo())
    if words is None:
        return set(), "could not read the CPU features (no /proc/cpuinfo, HWCAP2 or sysctl)"
    return words & set(_ARM_FLAGS), "cpuinfo"


def _arm32(reader: Reader, system: str) -> tuple[set[str], str]:
    """32-bit Arm (armv7l, armv8l: a 32-bit userland, on an arm64 kernel too): Linux's AT_HWCAP bits
    26 and 27, else /proc/cpuinfo's asimdbf16 and i8mm words (HWCAP2 bit 14 means something else there)."""
    hw = reader.hwcap()
    if hw is not None:
        return ({"bf16"} if hw & _HWCAP_ASIMDBF16 else set()) | ({"i8mm"} if hw & _HWCAP_I8MM else set()), "HWCAP"
    words = _words(reader.cpuinfo())
    if words is None:
        return set(), "could not read the CPU features (no /proc/cpuinfo or HWCAP)"
    return ({"bf16"} if "asimdbf16" in words else set()) | ({"i8mm"} if "i8mm" in words else set()), "cpuinfo"
