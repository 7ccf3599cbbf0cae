"""The capability probe: what this machine and these library versions can do
with bf16, and the fallback policy that follows.

``probe()`` runs when asked, is cached, and returns a frozen dataclass. Each
capability is found by trying it where that is cheap and safe, and each
missing one records why. It never imports a framework unless asked
(``probe(frameworks=[...])``) or already imported. The machine is read through
a ``Reader``, which tests replace to stand in for other hardware.
"""

from __future__ import annotations

import os
import platform
import sys
import threading
from dataclasses import asdict, dataclass, field

from . import dtypes, registry

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

        try:
            np.from_dlpack(np.zeros(2, dtype=dtypes.bfloat16))
            return True, "numpy exchanges bf16 over DLPack"
        except Exception as err:  # noqa: BLE001
            return False, (f"{type(err).__name__}: {err} (bf16 crosses as uint16 bits instead; "
                           "NumPy 2.5's np.dtypes.register_dlpack_dtype, once ml_dtypes uses it, lifts this)")

    def numpy_dlpack_version(self) -> str:
        import numpy as np

        from .adapters import _dlpack

        try:
            return _dlpack.protocol_version(np.zeros(1, dtype=np.uint8))
        except Exception as err:  # noqa: BLE001
            return f"none ({type(err).__name__}: {err})"


_DIST_LOCK = threading.Lock()
_DISTS: dict | None = None


def _distributions() -> dict:
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


@dataclass(frozen=True)
class NumpyCaps:
    version: str | None
    ml_dtypes_version: str | None
    bf16_storage: bool
    bf16_storage_why: str
    bf16_dlpack: bool
    bf16_dlpack_why: str
    dlpack_version: str


@dataclass(frozen=True)
class Device:
    name: str
    bf16_compute: bool | None
    why: str


@dataclass(frozen=True)
class FrameworkCaps:
    name: str
    version: str | None
    probed: bool  # imported and tried; False: only its version was read
    why: str  # why it was not probed, or what was found
    bf16_dlpack: bool | None = None
    dlpack_version: str | None = None
    devices: tuple = ()
    facts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """What dtype a conversion should produce, and why."""

    dtype: str  # "bfloat16" | "float32" | "bits"
    reason: str

    def __str__(self) -> str:
        return f"{self.dtype} ({self.reason})"


@dataclass(frozen=True)
class Capabilities:
    cpu: CPU
    numpy: NumpyCaps
    frameworks: dict  # name -> FrameworkCaps (torch, jax, tensorflow, and any registered)
    python: str

    def decide(self, target: str, *, for_compute: bool = False, device: str = "cpu",
               widen_to: str = "float32") -> Decision:
        """The dtype a bf16 tensor should arrive as in ``target``, with a one-line reason.

        bf16 where the target can hold it; ``widen_to`` ("float32", or "bits"
        for raw uint16) where it cannot. With ``for_compute=True``, also
        ``widen_to`` where the data will be computed on hardware with no bf16
        arithmetic (the CPU, or a device the framework reports).
        """
        if widen_to not in ("float32", "bits"):
            raise ValueError(f"widen_to must be 'float32' or 'bits'; got {widen_to!r}")
        target = registry.resolve(target)
        held = self._cannot_hold(target)
        if held:
            return Decision(widen_to, f"{target} cannot hold bf16 here: {held}")
        if for_compute:
            if device == "cpu":
                if not self.cpu.bf16_compute:
                    return Decision(widen_to, f"for compute on this CPU, which has no bf16 arithmetic "
                                              f"({self.cpu.why}); float32 holds every bf16 value exactly")
                return Decision("bfloat16", f"{target} holds bf16 and this CPU computes in it ({self.cpu.why})")
            dev = self._device(device)
            if dev is not None and dev.bf16_compute is False:
                return Decision(widen_to, f"for compute on {dev.name}, which has no bf16 arithmetic ({dev.why})")
            why = dev.why if dev is not None else "its bf16 support was not probed"
            return Decision("bfloat16", f"{target} holds bf16 on {device} ({why})")
        return Decision("bfloat16", f"{target} holds bf16 here" + (
            f" ({self.numpy.bf16_storage_why})" if target == "numpy" else ""))

    def _cannot_hold(self, target: str) -> str | None:
        if target == registry.HUB:  # the core's own storage, found by trying
            return None if self.numpy.bf16_storage else self.numpy.bf16_storage_why
        return registry.get(target).cannot_hold("bfloat16")

    def _device(self, device: str) -> Device | None:
        for fw in self.frameworks.values():
            for d in fw.devices:
                if d.name.split(" ")[0] == device:
                    return d
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_dict(), indent=2, default=str)

    def __str__(self) -> str:
        rows = [
            ("cpu", f"{self.cpu.arch}, {self.cpu.os}, {self.cpu.cores} cores"),
            ("cpu bf16 compute", f"{_yes(self.cpu.bf16_compute)}: {self.cpu.why}"),
            ("python", self.python),
            ("numpy", f"{self.numpy.version}, DLPack {self.numpy.dlpack_version}"),
            ("ml_dtypes", str(self.numpy.ml_dtypes_version)),
            ("numpy bf16 storage", f"{_yes(self.numpy.bf16_storage)}: {self.numpy.bf16_storage_why}"),
            ("numpy bf16 DLPack", f"{_yes(self.numpy.bf16_dlpack)}: {self.numpy.bf16_dlpack_why}"),
        ]
        for fw in self.frameworks.values():
            if not fw.probed:
                rows.append((fw.name, f"{fw.version or 'not installed'} ({fw.why})"))
                continue
            rows.append((fw.name, f"{fw.version}, DLPack {fw.dlpack_version}"))
            rows.append((f"{fw.name} bf16 DLPack", f"{_yes(fw.bf16_dlpack)}: {fw.why}"))
            for key, (value, why) in fw.facts.items():
                rows.append((f"{fw.name} {key}", f"{_yes(value)}: {why}"))
            for d in fw.devices:
                rows.append((f"{fw.name} device", f"{d.name}: bf16 compute {_yes(d.bf16_compute)} ({d.why})"))
        rows.append(("", ""))
        for target in (registry.HUB, *self.frameworks):
            if target != registry.HUB and not self.frameworks[target].probed:
                continue
            rows.append((f"decide({target!r})", str(self.decide(target))))
            rows.append(("  for_compute=True", str(self.decide(target, for_compute=True))))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)


def _yes(v) -> str:
    return {True: "yes", False: "no", None: "unknown"}[v]


# -- reading the CPU -------------------------------------------------------------

_X86_FLAGS = ("avx512_bf16", "amx_bf16", "avx512f", "avx2")
_ARM_FLAGS = ("bf16", "i8mm")


def _cpu(reader: Reader) -> CPU:
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
        flags = set(f for f in _ARM_FLAGS if f in words)
        source = "cpuinfo"
        if hw is not None:
            source = "HWCAP2"
            if hw & _HWCAP2_BF16:
                flags.add("bf16")
            if hw & _HWCAP2_I8MM:
                flags.add("i8mm")
        mac = reader.sysctl("hw.optional.arm.FEAT_BF16")
        if mac is not None:
            source = "sysctl"
            if mac == "1":
                flags.add("bf16")
        flags_t = tuple(f for f in _ARM_FLAGS if f in flags)
        bf16 = "bf16" in flags_t
        why = f"FEAT_BF16 present ({source})" if bf16 else f"no FEAT_BF16 ({source})"
        return CPU(arch, system, reader.cpu_count(), flags_t, bf16, why)
    return CPU(arch, system, reader.cpu_count(), (), False, f"bf16 arithmetic on {arch} is not known to this probe")


# -- frameworks ------------------------------------------------------------------


def _framework(name: str, reader: Reader, asked: bool) -> FrameworkCaps:
    spec = registry.spec(name)
    module = spec.requires or name
    version = reader.version(module)
    if not (asked or reader.imported(module)):
        why = "not imported; probe(frameworks=[%r]) imports and tries it" % name if version else "not installed"
        return FrameworkCaps(name, version, False, why)
    try:
        adapter = registry.get(name)
    except ImportError as err:
        return FrameworkCaps(name, version, False, str(err))
    import numpy as np

    from .adapters import _dlpack

    try:
        sample = adapter.from_dlpack(np.zeros(2, dtype=np.uint16))
        dl_version = _dlpack.protocol_version(sample)
    except Exception as err:  # noqa: BLE001
        return FrameworkCaps(name, version, True, f"DLPack import failed: {type(err).__name__}: {err}", False)
    try:
        bf = adapter.bitview(sample, "bfloat16")
        adapter.from_dlpack(bf)  # its own bf16 out and back in over DLPack
        ok, why = True, "exports and imports bf16 over DLPack"
    except Exception as err:  # noqa: BLE001
        ok, why = False, f"{type(err).__name__}: {err}"
    devices = tuple(Device(*d) for d in adapter.devices())
    return FrameworkCaps(name, version, True, why, ok, dl_version, devices, adapter.facts())


# -- the entry point ----------------------------------------------------------------

_CACHE: dict = {}
_LOCK = threading.Lock()


def probe(frameworks=None, *, reader: Reader | None = None, refresh: bool = False) -> Capabilities:
    """What this machine can do with bf16. Cached (``refresh=True`` probes again).

    ``frameworks``: names to import and try ("all" for every registered one);
    others are tried only if already imported, and otherwise reported by version.
    """
    names = [n for n in registry.names() if n != registry.HUB]
    if frameworks == "all":
        asked = frozenset(names)
    else:
        asked = frozenset(registry.resolve(f) for f in (frameworks or ()))
    key = (asked, frozenset(n for n in names if sys.modules.get(registry.spec(n).requires or n)))
    if reader is None:
        with _LOCK:
            if not refresh and key in _CACHE:
                return _CACHE[key]
    r = reader or Reader()
    storage, storage_why = r.ml_dtypes()
    dl, dl_why = r.numpy_bf16_dlpack() if storage else (False, "numpy holds no bf16 here")
    caps = Capabilities(
        cpu=_cpu(r),
        numpy=NumpyCaps(r.version("numpy"), r.version("ml_dtypes"), storage, storage_why, dl, dl_why,
                        r.numpy_dlpack_version()),
        frameworks={n: _framework(n, r, n in asked) for n in names},
        python=platform.python_version(),
    )
    if reader is None:
        with _LOCK:
            _CACHE[key] = caps
    return caps
