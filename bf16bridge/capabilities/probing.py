"""The capability probe: what this machine and these library versions can do with bf16.

``probe()`` runs when asked, is cached, and returns a frozen dataclass (records.py). Each
capability is found by trying it where that is cheap and safe, and each missing one records
why. It never imports a framework unless asked (``probe(frameworks=[...])``) or already
imported. The machine is read through a ``Reader``, which tests replace to stand in for
other hardware.
"""

from __future__ import annotations

import platform
import sys
import threading
import warnings
from collections.abc import Mapping

import numpy as np

from bf16bridge.adapters import quiet
from bf16bridge.adapters.hooks import ProbeHooks
from bf16bridge.core.autograph import plain_python
from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.core import versions
from bf16bridge.errors import InvalidArgumentError
from bf16bridge.capabilities.machine import CPU, Reader, read_cpu
from bf16bridge.capabilities.records import (Alignment, Capabilities, ComputeTrial, Decision, Device, DtypeSupport,
                                             FrameworkCaps, NarrowCompute, NumpyCaps)

__all__ = ["CPU", "Alignment", "Capabilities", "ComputeTrial", "Decision", "Device", "DtypeSupport", "FrameworkCaps",
           "NarrowCompute", "NumpyCaps", "Reader", "probe", "probed_dtypes"]


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
    from bf16bridge.core.memory import aligned_empty
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
            checked[-1] = f"; the adapter declares that it {'can' if said else 'cannot'} {way} it"
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


def _framework(name: str, reader: Reader, asked: bool, cpu: CPU, trials: bool = True,
               read_devices: bool = True) -> FrameworkCaps:
    spec = registry.spec(name)
    module = spec.requires or name
    version = reader.version(module)
    tested = versions.status(module, version)
    if not (asked or reader.imported(module)):
        why = "not imported; probe(frameworks=[%r]) imports and tries it" % name if version else "not installed"
        return FrameworkCaps(name, version, False, why, tested=tested)
    # its import and its trials write natively to fd 2 (aarch64 builds above all): held, and reported
    return quiet.held_native_output(lambda: _imported(name, version, tested, trials, read_devices, cpu),
                                    f"probing {name}" + ("" if trials else " (trials=False)"))


def _imported(name: str, version, tested: str, trials: bool, read_devices: bool, cpu: CPU) -> FrameworkCaps:
    """``name``'s answer once it may be imported: its trials (or, with ``trials=False``, its devices)."""
    try:
        adapter = registry.get(name)
    except ImportError as err:
        return FrameworkCaps(name, version, False, str(err), tested=tested)
    if not trials:  # what decide() reads: the devices, when asked; no DLPack trial, no compute
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
                         _narrow_compute(hooks, supports), _bf16_compute(hooks, cpu), _alignment(hooks, name))


def _bf16_compute(hooks: ProbeHooks, cpu: CPU) -> tuple:
    """The adapter's bf16 compute trials (its ``bf16_compute`` hook, where it has one): ComputeTrial each.
    On a CPU without bf16 arithmetic none runs ("not tried"): float32 is the answer there whatever a
    trial found, and a framework that picks its kernels wrongly for such a CPU would die running one."""
    hook = getattr(hooks, "bf16_compute", None)
    if hook is None:
        return ()
    if not cpu.bf16_compute:
        return (ComputeTrial("cpu", "float32", "not tried", f"this CPU has no bf16 arithmetic ({cpu.why})"),)
    try:
        return tuple(ComputeTrial(*row) for row in hook())
    except Exception as err:  # noqa: BLE001 - the trial's failure is the finding
        return (ComputeTrial("cpu", "unknown", "failed", f"the trial itself failed: {_first_line(err)}"),)


def _alignment(hooks, name: str, offsets=None) -> Alignment | None:
    """Where ``name``'s fresh allocations start (its ``fresh_offsets`` hook, or ``offsets`` read already)."""
    if offsets is None:
        hook = getattr(hooks, "fresh_offsets", None)
        if hook is None:
            return None
        try:
            offsets = tuple(hook())
        except Exception as err:  # noqa: BLE001
            return Alignment((), False, f"not read: {_first_line(err)}")
    if not offsets:  # the hook read none
        return None
    aligned = not any(offsets)
    said = ", ".join(map(str, offsets))
    return Alignment(tuple(offsets), aligned, (
        f"address mod 64 of {len(offsets)} fresh {name} allocations: {said}" + (
            "" if aligned else "; routes from such a tensor into jax and tensorflow copy it (they take only "
                               f"64-byte aligned buffers as they are; bb.aligned_empty(..., like={name!r}) makes "
                               "aligned ones)")))


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

    ``trials=False``: only what ``decide()`` reads (the CPU, numpy's bf16 storage and matmul loop,
    the frameworks' devices), none of the trials (DLPack per dtype, the narrow-dtype matmuls under a
    framework's profiler, the bf16 compute trials, the allocations' alignment, numpy's DLPack).
    ``fallback='auto'`` asks this one: a conversion must not run compute behind the user's back.

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
    cpu = read_cpu(r)
    frameworks = {n: _framework(n, r, n in asked, cpu, trials, devices) for n in names}
    caps = Capabilities(cpu=cpu, numpy=_numpy(r, trials), frameworks=frameworks,
                        python=platform.python_version(), native_output=quiet.written())
    if reader is None:
        with _LOCK:
            _CACHE[(*key, trials, devices)] = caps
    return caps


def _numpy(r: Reader, trials: bool) -> NumpyCaps:
    """numpy's answer: its bf16 storage and what np.matmul computes bf16 in (read, no arithmetic); with
    ``trials``, its DLPack and dtype trials and where its allocations start."""
    storage, storage_why = r.ml_dtypes()
    if not trials:
        dl, dl_why = False, "not tried: probe(trials=False) reads only what decide() needs"
    else:
        dl, dl_why = (quiet.held_native_output(r.numpy_bf16_dlpack, "numpy's bf16 DLPack trial") if storage
                      else (False, "numpy holds no bf16 here"))
    return NumpyCaps(r.version("numpy"), r.version("ml_dtypes"), storage, storage_why, dl, dl_why,
                     r.numpy_dlpack_version(),
                     "; ".join(f"{m} {versions.status(m, r.version(m))}" for m in ("numpy", "ml_dtypes")),
                     _hub_dtypes(None if storage else storage_why) if trials else {},
                     (ComputeTrial("cpu", *r.numpy_compute()),) if storage else (),
                     _alignment(None, registry.HUB, r.numpy_offsets()) if trials else None)


def auto_policy(target: str, for_compute: bool, device: str) -> tuple[str, str]:
    """``fallback="auto"``'s decision for bf16 into ``target`` (``core.policy``): (dtype, reason). No
    trials: a conversion runs no compute behind the user's back, and starts no device runtime unless
    the decision is for compute on that device."""
    d = probe(trials=False, devices=for_compute and device != "cpu").decide(
        target, for_compute=for_compute, device=device)
    return d.dtype, d.reason
