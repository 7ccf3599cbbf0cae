"""What this torch holds and speaks, found by trying on first need (never at import), and the
capability probe's hooks: devices, facts, fp8 matmuls.

The trials' answers depend only on the torch in this process, so each is cached once (``casts``
per dtype pair); the fp8 matmul trial is not cached, as a user's profiler may start or stop.
"""

from __future__ import annotations

import functools

import torch

from bf16bridge.adapters import dlpack
from bf16bridge.adapters.hooks import ProbeHooks
from bf16bridge.adapters.quiet import held_native_output
from bf16bridge.adapters.torch import internals
from bf16bridge.adapters.trials import MATMUL_SIDE, allocation_offsets, cast_matches, timed_bf16_matmul
from bf16bridge.core import dtypes
from bf16bridge.errors import UnsupportedTypeError


def _not_held_why(name: str) -> str:
    packed = dtypes.UNPACKED.get(name)
    return f"torch {torch.__version__} has no torch.{name}" + (
        " (torch.uint16 needs torch >= 2.3)" if name == "uint16" else
        f" (it holds these values packed two a byte, torch.{packed}: the route packs them)"
        if isinstance(getattr(torch, packed or "-", None), torch.dtype) else "")


@functools.cache
def _held() -> tuple[dict, dict]:
    """The table's rows this torch holds, found by trying: its dtype of that name stores elements
    of the row's width and views them as the row's carrier. (held: name -> torch dtype, not held:
    name -> why)."""
    held, why = {}, {}
    for name in dtypes.NAMES:
        dt = getattr(torch, name, None)
        if not isinstance(dt, torch.dtype):
            why[name] = _not_held_why(name)
            continue
        row = dtypes.ROWS[name]
        try:
            size = torch.empty(2, dtype=dt).element_size()
            if row.carrier is not None:
                torch.zeros(2, dtype=getattr(torch, row.carrier)).view(dt)
        except (RuntimeError, TypeError, AttributeError) as err:
            why[name] = f"torch.{name} is unusable here: {type(err).__name__}: {err}"
            continue
        if size != row.itemsize:
            why[name] = f"torch.{name} stores {size} bytes an element, the table {row.itemsize}"
            continue
        held[name] = dt
    return held, why


def to_torch() -> dict:
    """The table's rows this torch holds: name -> torch dtype."""
    return _held()[0]


def not_held() -> dict:
    """Why this torch holds none of each other row: name -> why."""
    return _held()[1]


@functools.cache
def from_torch() -> dict:
    """torch dtype -> the table's name, for the rows this torch holds."""
    return {dt: name for name, dt in to_torch().items()}


@functools.cache
def dlpack_rows() -> tuple[frozenset, frozenset]:
    """The narrow rows torch exports over DLPack with the table's (code, bits, lanes), and takes
    back, found by trying its own round trip. Older torch raises for fp8; torch exports its
    sub-byte ints as 8-bit ints (the type is lost): those are not exported."""
    out, into = set(), set()
    for name, dt in to_torch().items():
        row = dtypes.ROWS[name]
        if row.family != "narrow" or row.dlpack is None:
            continue
        try:
            t = torch.zeros(2, dtype=getattr(torch, row.carrier)).view(dt)  # type: ignore[arg-type]
            if dlpack.dtype(torch.utils.dlpack.to_dlpack(t)) != row.dlpack:
                continue
            out.add(name)
            if torch.from_dlpack(t).dtype == dt:
                into.add(name)
        except (BufferError, RuntimeError, TypeError, ValueError):
            continue
    return frozenset(out), frozenset(into)


def _copies(dt) -> bool:
    try:
        torch.zeros(2, dtype=torch.uint8).view(dt).clone()
        return True
    except (RuntimeError, TypeError):
        return False


@functools.cache
def no_kernels() -> frozenset:
    """The held narrow rows torch has no copy kernel for (its shell sub-byte ints): copied as their carrier."""
    return frozenset(name for name, dt in to_torch().items()
                     if dtypes.ROWS[name].family == "narrow" and not _copies(dt))


@functools.cache
def numpy_rows() -> tuple[frozenset, frozenset]:
    """The dtypes Tensor.numpy() and torch.from_numpy take in this torch, found by trying."""
    import numpy as np

    out, into = set(), set()
    for name, dt in to_torch().items():
        if name in dtypes.BITS_OF:
            continue  # numpy's bf16 is ml_dtypes', which torch does not know
        try:
            torch.zeros(1, dtype=dt).numpy()
            out.add(name)
        except (TypeError, RuntimeError):
            pass
        try:
            torch.from_numpy(np.zeros(1, dtype=name))
            into.add(name)
        except (TypeError, RuntimeError):
            pass
    return frozenset(out), frozenset(into)


@functools.cache
def casts(src: str, dst: str) -> bool:
    """Whether Tensor.to turns every src value into the same dst value, found by trying once."""
    held = to_torch()
    if src not in held or dst not in held:
        return False
    if src in no_kernels() or dtypes.ROWS[src].packing > 1:
        return False
    import numpy as np

    def run(a):
        carrier = dtypes.BITS_OF.get(src)
        t = (torch.from_numpy(a.view(carrier)).view(held[src]) if carrier
             else torch.from_numpy(np.ascontiguousarray(a)))
        out = t.to(held[dst])
        bits = dtypes.BITS_OF.get(dst)
        return out.view(getattr(torch, bits)).numpy().view(dtypes.numpy_dtype(dst)) if bits else out.numpy()

    return cast_matches(src, dst, run)


_MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm")


def _scaled_mm_traced(dt, device: str):
    """torch._scaled_mm on two 16x16 ``dt`` matrices of ones under torch's profiler: (profile, out)."""
    from torch.profiler import ProfilerActivity, profile

    a = torch.ones(16, 16, device=device).to(dt)
    b = torch.ones(16, 16, device=device).to(dt).t()  # its second operand must be column-major
    one = torch.ones((), device=device)

    def traced():
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            out = internals.scaled_mm(a, b, one)
        return prof, out

    # kineto logs each profiler start and stop natively (and a CUDA build without a driver, that it
    # found none): the trial's own output, held off stderr
    return held_native_output(traced, f"{dt} matmul on {device} under torch's profiler")


def narrow_matmul(dt, device: str) -> tuple[str, str]:
    """torch._scaled_mm on ``dt`` inputs, float32 out: 'emulated' when torch's profiler shows an
    aten matmul on wider copies inside it (its CPU kernel widens to float32), else 'native'."""
    try:
        if internals.profiler_running():
            return "unknown", "not traced: a torch profiler is already running"
    except UnsupportedTypeError as err:  # this torch cannot tell
        return "unknown", f"not traced: {err}"
    try:
        prof, out = _scaled_mm_traced(dt, device)
        if float(out[0, 0]) != 16.0:
            return "no", f"torch._scaled_mm ran but gave {float(out[0, 0])} for 16"
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        return "no", f"torch._scaled_mm: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    try:
        inner = [(n, d) for n, d in internals.traced_ops(prof) if n in _MATMULS]
    except Exception as err:  # noqa: BLE001 - the trace's shape is the profiler's, not ours
        return "unknown", f"torch._scaled_mm runs; its trace could not be read ({type(err).__name__}: {err})"
    wide = [(n, d) for n, d in inner if d and "Float8" not in str(d[0])]
    if wide:
        return "emulated", (f"torch._scaled_mm runs {wide[0][0]} on {wide[0][1][0]} copies of the {dt} inputs "
                            "(torch's profiler)")
    return "native", "torch._scaled_mm runs no widening matmul inside (torch's profiler)"


class TorchProbe(ProbeHooks):
    """The capability probe's questions, answered for torch."""

    name = "torch"

    def devices(self):
        out = []
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                cap = torch.cuda.get_device_capability(i)
                out.append((f"cuda:{i} {torch.cuda.get_device_name(i)}", cap >= (8, 0),
                            f"compute capability {cap[0]}.{cap[1]} (bf16 arithmetic from 8.0)"))
        return out

    def facts(self):
        try:
            torch.zeros(2, dtype=torch.bfloat16).view(torch.uint16)
            return {"uint16": (True, "Tensor.view(torch.uint16) works")}
        except (AttributeError, RuntimeError, TypeError) as err:
            return {"uint16": (False, f"{type(err).__name__}: {err} (torch >= 2.3 has it)")}

    def narrow_compute(self, dtype):
        dt = to_torch().get(dtype)
        if dt is None:
            return ()
        devices = ("cpu", *(f"cuda:{i}" for i in range(torch.cuda.device_count())))
        return tuple((d, *narrow_matmul(dt, d)) for d in devices)

    def bf16_compute(self):
        """torch.mm in bf16 against float32 on the CPU, timed (((device, dtype, how, why),))."""
        def run(dtype):
            a = torch.ones(MATMUL_SIDE, MATMUL_SIDE, dtype=getattr(torch, dtype))
            return lambda: torch.mm(a, a)

        return (("cpu", *timed_bf16_matmul(run, "torch.mm")),)

    def fresh_offsets(self):
        """Address mod 64 of fresh torch.empty CPU tensors."""
        return allocation_offsets(lambda n: torch.empty(n, dtype=torch.uint8), lambda t: t.data_ptr())


HOOKS = TorchProbe()
