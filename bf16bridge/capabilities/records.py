"""The capability probe's records: what one framework, numpy and the machine can do with bf16
and the narrow dtypes (frozen dataclasses), and ``Capabilities.decide``, the fallback policy
that follows from them."""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Literal

from bf16bridge.core import registry
from bf16bridge.errors import InvalidArgumentError
from bf16bridge.capabilities.machine import CPU
from bf16bridge.core.text import table

__all__ = ["Alignment", "Capabilities", "ComputeTrial", "Decision", "Device", "DtypeSupport", "FrameworkCaps",
           "NarrowCompute", "NumpyCaps"]


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
class ComputeTrial:
    """Whether one framework computes in bf16 on one device, found by trying: the dtype to hand it for
    compute (``decide(for_compute=True)`` follows it on a device with bf16 arithmetic).

    ``how``: "read" (its own loop or compiled program shows what it computes in), "timed" (a small
    bf16 matmul against the same in float32), "not tried" (a CPU without bf16 arithmetic: float32) or
    "failed" (``dtype`` "unknown": ``why`` says how).
    """

    device: str
    dtype: str  # "bfloat16" | "float32" | "unknown"
    how: str
    why: str


@dataclass(frozen=True)
class Alignment:
    """Where one framework's fresh CPU allocations start: each address mod 64 (a few sizes, tried).
    Not all 0: zero-copy routes into frameworks that take only 64-byte aligned buffers (jax,
    tensorflow) copy such tensors; ``bb.aligned_empty(shape, dtype, like=...)`` makes aligned ones."""

    offsets: tuple
    aligned: bool
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
    #: ComputeTrial on the CPU: what np.matmul computes two bf16 arrays in (read, never timed)
    compute: tuple = ()
    #: where numpy's fresh allocations start (tried with the trials; None: not tried)
    alignment: Alignment | None = None

    def __post_init__(self):
        _frozen(self, "dtypes", dict)
        _frozen(self, "compute", tuple)


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
    #: ComputeTrial for each device the adapter tries bf16 compute on (the CPU at least); () untried
    compute: tuple = ()
    #: where its fresh CPU allocations start (None: not tried)
    alignment: Alignment | None = None

    def __post_init__(self):
        _frozen(self, "devices", tuple)
        _frozen(self, "facts", dict)
        _frozen(self, "dtypes", dict)
        _frozen(self, "narrow_compute", tuple)
        _frozen(self, "compute", tuple)


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
    #: (what was tried, what it wrote to fd 2): the frameworks' native output held off stderr while the
    #: bridge tried them in this process (``adapters.quiet``)
    native_output: tuple = ()

    def __post_init__(self):
        _frozen(self, "frameworks", dict)
        _frozen(self, "native_output", tuple)

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
            if _on_cpu(device):  # "cpu:0", "CPU" and tensorflow's "/CPU:0" too
                return self._for_compute_on_cpu(target, widen_to)
            dev = self._device(device)
            if dev is not None and dev.bf16_compute is False:
                return Decision(widen_to, f"for compute on {dev.name}, which has no bf16 arithmetic ({dev.why})")
            if dev is None:
                return Decision("bfloat16", f"{target} holds bf16; no framework here reports a device {device!r}, "
                                            "so its bf16 arithmetic is not known: the data stays bf16")
            trial = self._compute(target, device)
            if trial is not None and trial.dtype == "float32":
                return Decision(widen_to, f"for compute in {target} on {device}: {trial.why}; float32 holds every "
                                          "bf16 value exactly")
            return Decision("bfloat16", f"{target} holds bf16 on {device} ({dev.why})")
        return Decision("bfloat16", f"{target} holds bf16 here" + (
            f" ({self.numpy.bf16_storage_why})" if target == "numpy" else ""))

    def _for_compute_on_cpu(self, target: str, widen_to: str) -> Decision:
        """bf16 where this CPU has bf16 arithmetic and ``target`` computes in it (its ComputeTrial, where
        tried); ``widen_to`` otherwise."""
        if not self.cpu.bf16_compute:
            return Decision(widen_to, f"for compute on this CPU, which has no bf16 arithmetic "
                                      f"({self.cpu.why}); float32 holds every bf16 value exactly")
        trial = self._compute(target, "cpu")
        if trial is None or trial.dtype == "unknown":
            untried = "not tried: bb.probe() tries it" if trial is None else trial.why
            return Decision("bfloat16", f"{target} holds bf16 and this CPU computes in it ({self.cpu.why}); "
                                        f"whether {target} itself does is not known ({untried})")
        if trial.dtype == "float32":
            return Decision(widen_to, f"for compute in {target}, which computes in float32 on this CPU though the "
                                      f"CPU has bf16 arithmetic ({self.cpu.why}): {trial.why}; float32 holds every "
                                      "bf16 value exactly")
        return Decision("bfloat16", f"{target} computes in bf16 on this CPU ({self.cpu.why}): {trial.why}")

    def _compute(self, target: str, device: str):
        """``target``'s ComputeTrial on ``device`` ("cpu" for any spelling of the CPU), or None: not tried."""
        fw = self.frameworks.get(target)
        trials = self.numpy.compute if target == registry.HUB else (fw.compute if fw is not None else ())
        for t in trials:
            if t.device == device or (t.device == "cpu" and _on_cpu(device)):
                return t
        return None

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
        rows.extend(_trial_rows(self))
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


def _trial_rows(caps: Capabilities) -> list[tuple[str, str]]:
    """The text rows of the bf16 compute trials, the allocation alignments and the native output held."""
    rows = []
    for name, found in ((registry.HUB, caps.numpy), *caps.frameworks.items()):
        for t in found.compute:
            rows.append((f"{name} {t.device} bf16 compute", f"{t.dtype} ({t.how}): {t.why}"))
        if found.alignment is not None:
            a = found.alignment
            rows.append((f"{name} allocations", f"{'64-byte aligned' if a.aligned else 'not 64-byte aligned'}: {a.why}"))
    for what, text in caps.native_output:
        lines = text.splitlines()
        rows.append(("held off stderr", f"{what}: {lines[0][:160]}" + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else "")))
    return rows


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


def _on_cpu(device: str) -> bool:
    """Whether ``device`` names the CPU ("cpu", "cpu:0", "CPU"; tensorflow's "/CPU:0" and
    "/job:localhost/replica:0/task:0/device:CPU:0"; the adapters say "cpu")."""
    name, _, index = device.lower().rpartition("device:")[2].lstrip("/").partition(":")
    return name == "cpu" and (not index or index.isdecimal())
