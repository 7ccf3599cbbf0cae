"""The capability probe: what this machine and these library versions can do
with bf16, and the fallback policy that follows.

``probe()`` runs when asked, is cached, and returns a frozen dataclass. Each
capability is found by trying it where that is cheap and safe, and each
missing one records why. It never imports a framework unless asked
(``probe(frameworks=[...])``) or already imported. The machine is read through
a ``Reader``, which tests replace to stand in for other hardware.
"""

from __future__ import annotations

import platform
import sys
import threading
import types
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Literal

import numpy as np

from bf16bridge.adapters.hooks import ProbeHooks
from bf16bridge.core.autograph import plain_python
from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.core import versions
from bf16bridge.errors import InvalidArgumentError
from bf16bridge.capabilities.machine import CPU, Reader, read_cpu

__all__ = ["CPU", "Capabilities", "Decision", "Device", "DtypeSupport", "FrameworkCaps", "NarrowCompute", "NumpyCaps",
           "Reader", "probe"]


def _frozen(obj, name: str, kind) -> None:
    """Store a field of a frozen dataclass as a read-only mapping or a tuple, whatever it was given as."""
    value = getattr(obj, name)
    object.__setattr__(obj, name, types.MappingProxyType(dict(value)) if kind is dict else tuple(value))


@dataclass(frozen=True)
class DtypeSupport:
    """What one framework does with one dtype here: holds it, and sends and takes it over DLPack.

    ``holds`` is the adapter's answer (``cannot_hold``, found by trying where the adapter is
    imported); export and import are tried on a tensor of that framework (its own export, then its
    own import of that export). ``None``: not tried (it does not hold the dtype, or its own export
    fails, so its import has nothing of its own to take); then the adapter's declaration is given
    in the reason. Where trying and the adapter's declaration (what the planner follows) disagree,
    the reason says so.
    """

    dtype: str
    holds: bool
    holds_why: str
    dlpack_export: bool | None
    export_why: str
    dlpack_import: bool | None
    import_why: str


@dataclass(frozen=True)
class NarrowCompute:
    """A tiny matmul on fp8 inputs, tried on one device (the adapter's ``narrow_compute``)."""

    dtype: str
    device: str
    how: str  # "native" | "emulated" | "no" | "unknown"
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
    tested: str = ""  # numpy's and ml_dtypes' versions against the tested ranges
    #: {dtype: DtypeSupport} for the dtypes beyond NumPy's own (bf16 and the narrow ones); read-only
    dtypes: Mapping = field(default_factory=dict)

    def __post_init__(self):
        _frozen(self, "dtypes", dict)


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
    #: {name: (value, why)}, found by trying: the DLPack entry points (``Tensor.__dlpack__``,
    #: and where it is missing the way around it), then what the adapter's ``facts()`` adds
    facts: Mapping = field(default_factory=dict)  # stored read-only
    tested: str | None = None  # the version against the range CI tests (bf16bridge.core.versions)
    #: {dtype: DtypeSupport} for the dtypes beyond NumPy's own; empty when not probed; read-only
    dtypes: Mapping = field(default_factory=dict)
    #: NarrowCompute for each fp8 dtype it holds and each device it computes on
    narrow_compute: tuple = ()

    def __post_init__(self):
        _frozen(self, "devices", tuple)
        _frozen(self, "facts", dict)
        _frozen(self, "dtypes", dict)
        _frozen(self, "narrow_compute", tuple)


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
    frameworks: Mapping  # name -> FrameworkCaps (torch, jax, tensorflow, and any registered); read-only
    python: str

    def __post_init__(self):
        _frozen(self, "frameworks", dict)

    def decide(self, target: str, *, for_compute: bool = False, device: str = "cpu",
               widen_to: str = "float32") -> Decision:
        """The dtype a bf16 tensor should arrive as in ``target``, with a one-line reason.

        bf16 where the target can hold it; ``widen_to`` ("float32", or "bits"
        for raw uint16) where it cannot. With ``for_compute=True``, also
        ``widen_to`` where the data will be computed on hardware with no bf16
        arithmetic (the CPU, or a device the framework reports).
        """
        if widen_to not in ("float32", "bits"):
            raise InvalidArgumentError(f"widen_to must be 'float32' or 'bits'; got {widen_to!r}")
        if not isinstance(device, str):
            raise InvalidArgumentError(f"device must be a str ('cpu', 'cuda:0', ...); got {device!r}")
        target = registry.resolve(target)
        held = self._cannot_hold(target)
        if held:
            return Decision(widen_to, f"{target} cannot hold bf16 here: {held}")
        if for_compute:
            if _on_cpu(device):  # ("cpu:0" and "CPU" too: they were taken as an unknown device, and kept bf16)
                if not self.cpu.bf16_compute:
                    return Decision(widen_to, f"for compute on this CPU, which has no bf16 arithmetic "
                                              f"({self.cpu.why}); float32 holds every bf16 value exactly")
                return Decision("bfloat16", f"{target} holds bf16 and this CPU computes in it ({self.cpu.why})")
            dev = self._device(device)
            if dev is not None and dev.bf16_compute is False:
                return Decision(widen_to, f"for compute on {dev.name}, which has no bf16 arithmetic ({dev.why})")
            if dev is None:
                return Decision("bfloat16", f"{target} holds bf16; no framework here reports a device {device!r}, "
                                            "so its bf16 arithmetic is not known: the data stays bf16")
            return Decision("bfloat16", f"{target} holds bf16 on {device} ({dev.why})")
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
        """Plain dicts, lists of tuples and values: a copy the caller may change."""
        return _plain(self)

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
            ("tested versions", self.numpy.tested),
            ("numpy bf16 storage", f"{_yes(self.numpy.bf16_storage)}: {self.numpy.bf16_storage_why}"),
            ("numpy bf16 DLPack", f"{_yes(self.numpy.bf16_dlpack)}: {self.numpy.bf16_dlpack_why}"),
        ]
        for fw in self.frameworks.values():
            if not fw.probed:
                rows.append((fw.name, f"{fw.version or 'not installed'} ({fw.why})"))
                if fw.version:
                    rows.append((f"{fw.name} tested", fw.tested))
                continue
            rows.append((fw.name, f"{fw.version}, DLPack {fw.dlpack_version}"))
            rows.append((f"{fw.name} tested", fw.tested))
            rows.append((f"{fw.name} bf16 DLPack", f"{_yes(fw.bf16_dlpack)}: {fw.why}"))
            for key, (value, why) in fw.facts.items():
                rows.append((f"{fw.name} {key}", f"{_yes(value)}: {why}"))
            for d in fw.devices:
                rows.append((f"{fw.name} device", f"{d.name}: bf16 compute {_yes(d.bf16_compute)} ({d.why})"))
        for fw in self.frameworks.values():
            for c in fw.narrow_compute:
                rows.append((f"{fw.name} {c.device} {c.dtype} matmul", f"{c.how}: {c.why}"))
        rows.append(("", ""))
        for target in (registry.HUB, *self.frameworks):
            if target != registry.HUB and not self.frameworks[target].probed:
                continue
            rows.append((f"decide({target!r})", str(self.decide(target))))
            rows.append(("  for_compute=True", str(self.decide(target, for_compute=True))))
        width = max(len(k) for k, _ in rows)
        out = "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)
        return out + ("\n\n" + self.dtype_table() if self.frameworks or self.numpy.dtypes else "")

    def dtype_table(self, fmt: Literal["text", "markdown"] = "text") -> str:
        """Which probed framework holds each dtype and speaks it over DLPack (out, in), then why not."""
        from bf16bridge.cli.tables import table

        held = {registry.HUB: self.numpy.dtypes, **{n: fw.dtypes for n, fw in self.frameworks.items() if fw.probed}}
        names = list(dict.fromkeys(d for m in held.values() for d in m))
        if not names:
            return ""
        rows = [[d, *(_cell(m.get(d)) for m in held.values())] for d in names]
        grouped: dict = {}  # (framework, what, why) -> dtypes, so that one reason is said once
        for fw, m in held.items():
            for d, sup in m.items():
                if not sup.holds:
                    grouped.setdefault((fw, "", sup.holds_why), []).append(d)
                elif sup.export_why == sup.import_why and not sup.dlpack_export:
                    grouped.setdefault((fw, " DLPack export and import", sup.export_why), []).append(d)
                else:
                    for way, ok, why in (("export", sup.dlpack_export, sup.export_why),
                                         ("import", sup.dlpack_import, sup.import_why)):
                        if not ok or "declares" in why:
                            grouped.setdefault((fw, f" DLPack {way}", why), []).append(d)
        out = table(["dtype (held; DLPack out/in)", *held], rows, fmt)
        if not grouped:
            return out
        bullet, gap = ("- ", "\n\n") if fmt == "markdown" else ("  ", "\n")
        notes = [f"{bullet}{fw} {', '.join(ds)}{what}: {why}".replace("\n", " ") for (fw, what, why), ds in grouped.items()]
        return f"{out}\n\nwhy not:{gap}" + "\n".join(notes)


def _plain(obj):
    if is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_plain(v) for v in obj)
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def _yes(v) -> str:
    return {True: "yes", False: "no", None: "unknown"}[v]


def _cell(sup: DtypeSupport | None) -> str:
    if sup is None:
        return "-"
    if not sup.holds:
        return "no"
    ways = "/".join(w for w, ok in (("out", sup.dlpack_export), ("in", sup.dlpack_import)) if ok)
    return f"yes; DLPack {ways}" if ways else "yes; no DLPack"


# -- dtypes ------------------------------------------------------------------------


def probed_dtypes() -> tuple[str, ...]:
    """The dtypes the probe lists: the table's rows beyond NumPy's own, in the table's order."""
    return tuple(d for d in dtypes.NAMES if d not in dtypes.STANDARD)


def _fp8(dtype: str) -> bool:
    """An 8-bit float row beyond NumPy's own: the ones fp8 matmuls take."""
    r = dtypes.ROWS[dtype]
    return r.family != "standard" and r.kind == "float" and r.bits == 8


def _first_line(err: BaseException, limit: int = 200) -> str:
    text = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _sample(adapter, dtype: str):
    """A small tensor of ``dtype`` in ``adapter``'s framework: numpy's values (of the row a packed
    row unpacks to) converted there, else its bit carrier from numpy, viewed."""
    from bf16bridge.adapters.numpy import aligned_empty
    from bf16bridge.core.convert import convert

    row = dtypes.ROWS[dtype]
    carrier = aligned_empty((4,), np.dtype(row.carrier or dtype))
    carrier[...] = 0
    if adapter.name == registry.HUB:
        return adapter.bitview(carrier, dtype) if row.carrier else carrier
    try:
        base = carrier.view(dtypes.numpy_dtype(dtypes.PACKED.get(dtype, dtype)))
        x = convert(base, adapter.name, copy=True)
        got = adapter.describe(x).dtype
        if got != dtype:
            raise TypeError(f"numpy's {base.dtype} arrives as {got}")
        return x
    except Exception as err:  # noqa: BLE001 - then its bit carrier, viewed
        converted = _first_line(err)
    try:
        return adapter.bitview(adapter.from_dlpack(carrier), dtype)
    except Exception as err:  # noqa: BLE001
        raise TypeError(f"from numpy: {converted}; as a bit-view of {row.carrier}: {_first_line(err)}") from err


def _declared(adapter, way: str, dtype: str) -> bool:
    return dtype in getattr(adapter, f"dlpack_{way}")


def _dtype_support(adapter, dtype: str, storage_why: str | None) -> DtypeSupport:
    """``adapter``'s framework with ``dtype``, found by trying (see DtypeSupport)."""
    held = storage_why or adapter.cannot_hold(dtype)
    if held:
        no = f"not tried: {adapter.name} does not hold {dtype}"
        return DtypeSupport(dtype, False, held, None, no, None, no)
    try:
        with warnings.catch_warnings():  # making the sample is no finding: the same answer under any filter
            warnings.simplefilter("ignore")
            sample = _sample(adapter, dtype)
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        why = f"not tried: no {dtype} tensor could be made ({_first_line(err)})"
        return DtypeSupport(dtype, True, "holds it", None, why, None, why)
    try:
        _capsule(adapter.export(sample, False))
        export, export_why = True, "exports it (tried)"
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        export, export_why = False, _first_line(err)
    imported: bool | None = None
    import_why = "not tried: its own export fails"
    if export:
        try:
            got = adapter.describe(adapter.from_dlpack(adapter.export(sample, False))).dtype
            imported, import_why = True, "imports its own export (tried)"
        except Exception as err:  # noqa: BLE001 - what failed is the finding
            got, imported, import_why = dtype, False, _first_line(err)
        if got != dtype:  # torch's sub-byte ints leave as 8-bit ints
            export, export_why = False, f"exports it as {got}: the type is lost (tried)"
            imported, import_why = None, f"not tried: its own export arrives as {got}"
    checked = []
    for way, ok in (("export", export), ("import", imported)):
        said = _declared(adapter, way, dtype)
        checked.append("" if ok is None or said == ok else
                       f" (the adapter declares {'yes' if said else 'no'}: the planner follows the declaration)")
        if ok is None:
            checked[-1] = f"; the adapter declares {'yes' if said else 'no'}"
    return DtypeSupport(dtype, True, "holds it", export, export_why + checked[0], imported, import_why + checked[1])


def _capsule(obj):
    """Ask ``obj`` for its DLPack capsule (a capsule already is one: tensorflow's export)."""
    return obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj


def _narrow_compute(hooks: ProbeHooks, supports: Mapping) -> tuple:
    hook = hooks.narrow_compute
    out: list[NarrowCompute] = []
    for dtype, sup in supports.items():
        if sup.holds and _fp8(dtype):
            try:
                found = hook(dtype)
            except Exception as err:  # noqa: BLE001
                found = (("?", "unknown", f"the probe itself failed: {_first_line(err)}"),)
            out.extend(NarrowCompute(dtype, *row) for row in found)
    return tuple(out)


# -- frameworks ------------------------------------------------------------------


def _framework(name: str, reader: Reader, asked: bool, trials: bool = True,
               read_devices: bool = True) -> FrameworkCaps:
    spec = registry.spec(name)
    module = spec.requires or name
    version = reader.version(module)
    tested = versions.status(module, version)
    if not (asked or reader.imported(module)):
        why = "not imported; probe(frameworks=[%r]) imports and tries it" % name if version else "not installed"
        return FrameworkCaps(name, version, False, why, tested=tested)
    try:
        adapter = registry.get(name)
    except ImportError as err:
        return FrameworkCaps(name, version, False, str(err), tested=tested)
    if not trials:  # what decide() reads: the devices, when asked; no DLPack trial, no narrow-dtype compute
        return FrameworkCaps(name, version, True, "not tried: probe(trials=False) reads only what decide() needs"
                             + ("" if read_devices else "; devices not read"),
                             devices=tuple(Device(*d) for d in registry.hooks(name, ProbeHooks).devices()) if read_devices else (),
                             tested=tested)
    from bf16bridge.adapters import dlpack as _dlpack

    try:
        sample = adapter.from_dlpack(np.zeros(2, dtype=np.uint16))
    except Exception as err:  # noqa: BLE001
        return FrameworkCaps(name, version, True, f"DLPack import failed: {type(err).__name__}: {err}", False,
                             tested=tested)
    facts = {"Tensor.__dlpack__": _tried(lambda: sample.__dlpack__(), f"{type(sample).__name__}.__dlpack__() works")}
    try:
        dl_version = _dlpack.protocol_version(adapter.export(sample, False))
    except Exception as err:  # noqa: BLE001
        dl_version = f"none ({type(err).__name__}: {err})"
    try:
        bf = adapter.bitview(sample, "bfloat16")
        adapter.from_dlpack(adapter.export(bf, False))  # its own bf16 out and back in over DLPack
        ok, why = True, "exports and imports bf16 over DLPack"
    except Exception as err:  # noqa: BLE001
        ok, why = False, f"{type(err).__name__}: {err}"
    hooks = registry.hooks(name, ProbeHooks)
    devices = tuple(Device(*d) for d in hooks.devices())
    facts.update(hooks.facts())  # the adapter's own account (of a missing entry point too) comes last
    supports = {d: _dtype_support(adapter, d, None) for d in probed_dtypes()}
    return FrameworkCaps(name, version, True, why, ok, dl_version, devices, facts, tested, supports,
                         _narrow_compute(hooks, supports))


def _tried(call, works: str) -> tuple[bool, str]:
    try:
        call()
        return True, works
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        return False, f"{type(err).__name__}: {err}"


def _hub_dtypes(storage_why: str | None) -> dict:
    """numpy's row of the dtype table; every ml_dtypes type is missing when the reader says ml_dtypes is."""
    hub = registry.get(registry.HUB)
    return {d: _dtype_support(hub, d, storage_why) for d in probed_dtypes()}


# -- the entry point ----------------------------------------------------------------

_CACHE: dict = {}
_LOCK = threading.Lock()


@plain_python
def probe(frameworks=None, *, reader: Reader | None = None, refresh: bool = False,
          trials: bool = True, devices: bool = True) -> Capabilities:
    """What this machine can do with bf16. Cached (``refresh=True`` probes again).

    ``frameworks``: a name or names to import and try ("all" for every registered one);
    others are tried only if already imported, and otherwise reported by version.

    ``trials=False``: only what ``decide()`` reads (the CPU, numpy's bf16 storage, the
    frameworks' devices), none of the trials (DLPack per dtype, the narrow-dtype matmuls under a
    framework's profiler, numpy's DLPack). ``fallback='auto'`` asks this one: a conversion must not
    run compute behind the user's back (it stopped a running torch profiler).

    ``devices=False`` (with ``trials=False``): do not read the frameworks' devices either.
    Reading them starts a framework's device runtime (a CUDA context; jax's GPU client, which
    takes most of the GPU's memory by default), so ``fallback='auto'`` asks for them only when it
    decides for compute on a device other than the CPU. A cached answer that read as much or more
    answers too.
    """
    devices = devices or trials
    names = [n for n in registry.names() if n != registry.HUB]
    if frameworks == "all":
        asked = frozenset(names)
    else:
        if isinstance(frameworks, str):  # one name ("torch"), not its letters
            frameworks = (frameworks,)
        try:
            asked = frozenset(registry.resolve(f) for f in (frameworks or ()))
        except TypeError as err:
            raise InvalidArgumentError(f"frameworks must be a name, a list of names, 'all' or None; got "
                                       f"{frameworks!r}") from err
    key = (asked, frozenset(n for n in names if sys.modules.get(registry.spec(n).requires or n)))
    if reader is None:
        with _LOCK:
            # a full probe, then a trimmed one that read devices, answer the trimmed questions too
            for k in (((*key, True, True),) if trials else
                      ((*key, True, True), (*key, False, True)) if devices else
                      ((*key, True, True), (*key, False, True), (*key, False, False))):
                if not refresh and k in _CACHE:
                    return _CACHE[k]
    r = reader or Reader()
    storage, storage_why = r.ml_dtypes()
    if not trials:
        dl, dl_why = False, "not tried: probe(trials=False) reads only what decide() needs"
    else:
        dl, dl_why = r.numpy_bf16_dlpack() if storage else (False, "numpy holds no bf16 here")
    caps = Capabilities(
        cpu=read_cpu(r),
        numpy=NumpyCaps(r.version("numpy"), r.version("ml_dtypes"), storage, storage_why, dl, dl_why,
                        r.numpy_dlpack_version(),
                        "; ".join(f"{m} {versions.status(m, r.version(m))}" for m in ("numpy", "ml_dtypes")),
                        _hub_dtypes(None if storage else storage_why) if trials else {}),
        frameworks={n: _framework(n, r, n in asked, trials, devices) for n in names},
        python=platform.python_version(),
    )
    if reader is None:
        with _LOCK:
            _CACHE[(*key, trials, devices)] = caps
    return caps


def _on_cpu(device: str) -> bool:
    """Whether ``device`` names the CPU ("cpu", "cpu:0", "CPU"; tensorflow's "/CPU:0" and
    "/job:localhost/replica:0/task:0/device:CPU:0"; the adapters say "cpu")."""
    name, _, index = device.lower().rpartition("device:")[2].lstrip("/").partition(":")
    return name == "cpu" and (not index or index.isdecimal())
