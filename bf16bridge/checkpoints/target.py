"""load_for_target: a checkpoint loaded in the dtype its target should compute in, with the reasons."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy as np

from bf16bridge.core.autograph import plain_python
from bf16bridge.core import dtypes
from bf16bridge import kernels
from bf16bridge.core import registry
from bf16bridge.core.memory import aligned_empty
from bf16bridge.core.convert import Device, Fallback, convert, plan
from bf16bridge.errors import Bf16BridgeError, InvalidArgumentError, MissingKeyError
from bf16bridge.core.plan import size
from bf16bridge.checkpoints import format as fmt
from bf16bridge.checkpoints.keys import nest
from bf16bridge.checkpoints import read
from bf16bridge.checkpoints.read import Checkpoint

#: the dtypes ``dtype=`` may name (floating ones; integer and bool tensors are never cast)
DTYPES = ("auto", "bfloat16", "float16", "float32", "float64")
#: the 8-bit floats (the fp8 family): "auto" widens them for compute
FP8 = frozenset(name for name, bits in fmt.CODES.values() if name.startswith("float8"))
#: the packed quantised floats the format holds two a byte (F4) and bf16bridge reads one a byte
PACKED = frozenset(fmt.CODES[code][0] for code in fmt.NIBBLES if fmt.CODES[code][0].startswith("float"))


@dataclass(frozen=True)
class KeyReport:
    """What ``load_for_target`` did with one tensor, and why."""

    key: str
    dtype_in: str
    dtype_out: str
    reason: str
    exact: bool  # every value of dtype_in arrives unchanged (a widening, or no change)
    copied: bool  # the result is a new buffer, not a view of the file
    nbytes_in: int
    nbytes_out: int
    shape_in: tuple[int, ...]  # the file's
    #: the result's: the file's, but where the target holds the dtype packed (torch's
    #: float4_e2m1fn_x2 holds two values a byte: the last dimension halved)
    shape_out: tuple[int, ...]

    def __str__(self) -> str:
        change = self.dtype_in if self.dtype_in == self.dtype_out else f"{self.dtype_in} -> {self.dtype_out}"
        if self.shape_in != self.shape_out:
            change += f" {list(self.shape_in)} -> {list(self.shape_out)}"
        how = "copied" if self.copied else "view of the file"
        return f"{self.key}: {change} ({how}; {self.reason})"


@dataclass(frozen=True)
class LoadReport:
    """``load_for_target``'s account: one KeyReport a tensor, in file order."""

    path: str
    target: str
    dtype: str  # what was asked: "auto" or a dtype name
    for_compute: bool
    keys: tuple[KeyReport, ...]

    def __getitem__(self, key: str) -> KeyReport:
        for k in self.keys:
            if k.key == key:
                return k
        raise MissingKeyError(f"{key!r} is not in this report ({len(self.keys)} keys; .keys lists them)")

    @property
    def changed(self) -> tuple[KeyReport, ...]:
        """The tensors whose dtype changed."""
        return tuple(k for k in self.keys if k.dtype_in != k.dtype_out)

    @property
    def nbytes_in(self) -> int:
        return sum(k.nbytes_in for k in self.keys)

    @property
    def nbytes_out(self) -> int:
        return sum(k.nbytes_out for k in self.keys)

    def __str__(self) -> str:
        lines = [f"{self.path} -> {self.target} (dtype={self.dtype!r}, for_compute={self.for_compute}): "
                 f"{len(self.keys)} tensors, {len(self.changed)} changed dtype, "
                 f"{size(self.nbytes_in)} in the file -> {size(self.nbytes_out)} loaded"]
        reasons: dict[str, list[str]] = {}
        for k in self.keys:
            reasons.setdefault(f"{k.dtype_in} -> {k.dtype_out}: {k.reason}", []).append(k.key)
        for why, keys in reasons.items():
            lines.append(f"  {len(keys)} x {why}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"path": self.path, "target": self.target, "dtype": self.dtype, "for_compute": self.for_compute,
                "keys": [{"key": k.key, "dtype_in": k.dtype_in, "dtype_out": k.dtype_out, "reason": k.reason,
                          "exact": k.exact, "copied": k.copied, "nbytes_in": k.nbytes_in,
                          "nbytes_out": k.nbytes_out, "shape_in": list(k.shape_in),
                          "shape_out": list(k.shape_out)} for k in self.keys]}


def _floating(name: str) -> bool:
    return name in ("bfloat16", "float16", "float32", "float64") or name in FP8 or name in PACKED


@functools.lru_cache(maxsize=None)
def exact(dtype_in: str, dtype_out: str) -> bool:
    """Whether every value of ``dtype_in`` (NaN as NaN) survives a cast to ``dtype_out`` and back:
    tried on every bit pattern for 8- and 16-bit types, by width for wider ones."""
    if dtype_in == dtype_out:
        return True
    a, b = fmt.numpy_dtype(dtype_in), fmt.numpy_dtype(dtype_out)
    if a.itemsize > 2:
        return b.itemsize > a.itemsize  # float32 -> float64 only
    width = fmt.CODES[fmt.NAMES[dtype_in]][1]  # float4_e2m1fn: 16 patterns, one a byte
    bits = np.arange(1 << width, dtype=np.uint8 if a.itemsize == 1 else np.uint16)
    values = bits.view(a)
    with np.errstate(all="ignore"):
        back = values.astype(b).astype(a)
    same = back.view(bits.dtype) == bits
    nan = np.isnan(values.astype(np.float32))
    return bool(np.all(same | (nan & np.isnan(back.astype(np.float32)))))


def _choose(info: fmt.TensorInfo, target: str, dtype: str, for_compute: bool, device: str) -> tuple[str, str]:
    """(dtype to load as, why) for one tensor."""
    name = info.dtype
    if not _floating(name):
        return name, "not a floating type: loaded as it is"
    if dtype != "auto":
        if dtype == name:
            return name, f"{dtype} asked for, and the file holds it"
        how = "exact" if exact(name, dtype) else "rounded to nearest even"
        return dtype, f"{dtype} asked for ({how})"
    if name == "bfloat16":
        from bf16bridge.capabilities.probing import probe

        d = probe().decide(target, for_compute=for_compute, device=device)
        return d.dtype, d.reason
    if name in FP8:
        held = None if target == registry.HUB else registry.get(target).cannot_hold(name)  # ml_dtypes holds it
        if held is not None:
            return "float32", f"{target} cannot hold {name} here ({held}); float32 holds every value exactly"
        if for_compute:
            return "float32", (f"for compute: no {target} arithmetic in {name} is probed on {device}; "
                               "float32 holds every value exactly")
        return name, f"{target} holds {name} (for storage: for_compute=False)"
    if name in PACKED:
        return name, (f"dtype='auto' changes only bf16 and fp8 tensors; {name} is a packed quantised float "
                      "(two a byte in the file): loaded as it is, one value a byte where the target holds it so")
    return name, f"dtype='auto' changes only bf16 and fp8 tensors; {name} is loaded as it is"


def _cast(a: np.ndarray, dtype_out: str) -> np.ndarray:
    """``a`` cast to ``dtype_out`` into a new 64-byte aligned array (jax and tensorflow take it as it is)."""
    out = aligned_empty(a.shape, fmt.numpy_dtype(dtype_out))
    if a.dtype.name == "bfloat16" and dtype_out == "float32":
        return kernels.to_float32(a, out=out, progress=False)  # exact, chunked, bit-identical to ml_dtypes
    if a.dtype.name == "float32" and dtype_out == "bfloat16":
        return kernels.to_bf16(a, out=out, progress=False)
    with np.errstate(over="ignore", invalid="ignore"):  # out of range: inf, as a cast gives; NaN stays NaN
        np.copyto(out, a, casting="unsafe")
    return out


def _lost(a: np.ndarray, out: np.ndarray, dtype_out: str) -> str:
    """What a narrowing cast lost beyond rounding, counted: finite values that became inf (past
    ``dtype_out``'s range) and nonzero ones that became 0 (below its smallest subnormal)."""
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(a)
        inf = int(np.count_nonzero(finite & ~np.isfinite(out)))
        zero = int(np.count_nonzero(finite & (a != 0) & (out == 0)))
    said = []
    if inf:
        said.append(f"{inf} value{'s' * (inf != 1)} past {dtype_out}'s range became inf")
    if zero:
        said.append(f"{zero} nonzero value{'s' * (zero != 1)} below {dtype_out}'s smallest became 0")
    return "".join(f"; {s}" for s in said)


def _nbytes(value, shape: tuple[int, ...], held: str) -> int:
    """The result's bytes: its own count (F4 is one value a byte in numpy, two in torch's x2)."""
    try:
        return plan(value, registry.HUB).nbytes
    except Bf16BridgeError:  # pragma: no cover - a result every route took: counted from its shape
        return math.prod(shape) * dtypes.itemsize(held)


def _load_one(f: Checkpoint, key: str, target: str, dtype_out: str, fallback: Fallback, device: str):
    """(the tensor in ``target`` on ``device``, cast to ``dtype_out`` where the file holds another dtype;
    whether it is a copy, not a view of the file; what a narrowing cast lost beyond rounding)."""
    info = f.info(key)
    if dtype_out == info.dtype:
        value = f.get(key, target, fallback=fallback, device=device)
        return value, info.nbytes > 0 and not read.handed_out(f, key), ""
    a = read.copied_view(f, key)
    cast = _cast(a, dtype_out)
    lost = "" if exact(info.dtype, dtype_out) else _lost(a, cast, dtype_out)
    del a
    read.release(f, key)
    try:
        return convert(cast, target, on_alias="allow", fallback=fallback, device=device), True, lost
    except Bf16BridgeError as err:
        raise type(err)(f"{f.path}: key {key!r}: {err}") from err


def _held(info: fmt.TensorInfo, target: str, value, dtype_out: str, reason: str, fallback: Fallback):
    """(the dtype ``value`` is held in, its shape, the reason with what changed on the way): what
    the caller gets, said as it is."""
    shape_out, held = registry.get(target).shape_dtype(value)
    shape_out = tuple(shape_out)
    if held != dtype_out:
        if dtypes.PACKED.get(held, held) == dtype_out:  # torch's float4_e2m1fn_x2: the same values, two a byte
            reason = (f"{reason}; {target} holds {dtype_out} packed, two values a byte, as {held}: "
                      f"shape {list(info.shape)} -> {list(shape_out)}")
        elif fallback != "error":
            reason = f"{reason}; then fallback={fallback!r}: {target} cannot hold {dtype_out}, so {held}"
        else:  # pragma: no cover - a route that changed the dtype unasked: said, not hidden
            reason = f"{reason}; {target} holds it as {held}"
    return held, shape_out, reason


@plain_python
def load_for_target(path: str | os.PathLike, to: str = "numpy", *, dtype: str = "auto", for_compute: bool = True,
                    device: Device = "cpu", nested: bool = False,
                    fallback: Fallback = "error") -> tuple[dict, LoadReport]:
    """Every tensor of a safetensors file in framework ``to``, in the dtype it should be used in there.

    ``dtype="auto"``: bf16 tensors stay bf16 where ``to`` holds bf16 and (``for_compute=True``)
    the hardware computes in it, and become float32 (exact) otherwise, as the capability probe
    decides (``bb.probe().decide(to, for_compute=..., device=...)``); fp8 tensors become float32
    for compute (no fp8 arithmetic is probed) and stay fp8 for storage where ``to`` holds them.
    An explicit dtype ("bfloat16", "float16", "float32", "float64") casts every floating tensor to
    it (rounding to nearest even where it narrows; float64 -> bfloat16 rounds through float32, as
    ml_dtypes does). Integer and bool tensors are never cast. Returns ``(tensors, report)``: the
    report says, per key, the dtype in and out, why, whether it was exact, and whether copied.
    ``fallback``: ``convert``'s, for a tensor the target cannot hold as it is (jax's int64 without
    x64: "auto" narrows it to int32 when every value fits, checked); the report gives the dtype
    the result has, and says so in the reason.
    ``device``: where the tensors are computed on, for the decision, and where they land ("cpu",
    "cuda:0", or a device object of ``to``, as ``convert``'s ``device=``); a device ``to`` does not
    have in this process is our DeviceError, listing those it has.
    """
    if dtype not in DTYPES:
        raise InvalidArgumentError(f"dtype must be one of {', '.join(map(repr, DTYPES))}; got {dtype!r}")
    if for_compute not in (True, False):
        raise InvalidArgumentError(f"for_compute must be True or False; got {for_compute!r}")
    target = registry.resolve(to)
    # a framework that is not installed, or a device it does not have, is refused before the file is read
    where = registry.get(target).find_device(device)
    out: dict = {}
    reports: list[KeyReport] = []
    with Checkpoint(path) as f:
        f.check()  # a bad entry refuses the file before any tensor is read or cast
        for key in f.keys():
            info = f.info(key)
            try:
                dtype_out, reason = _choose(info, target, dtype, for_compute, where)
            except Bf16BridgeError as err:  # (a dtype this ml_dtypes lacks: numpy cannot hold F4)
                raise type(err)(f"{f.path}: key {key!r}: {err}") from err
            value, copied, lost = _load_one(f, key, target, dtype_out, fallback, where)
            held, shape_out, reason = _held(info, target, value, dtype_out, reason + lost, fallback)
            out[key] = value
            values = dtypes.PACKED.get(held, held)  # the dtype of the values (one a byte for a packed one)
            reports.append(KeyReport(key, info.dtype, held, reason, exact(info.dtype, values)
                                     if _floating(info.dtype) else True, copied, info.nbytes,
                                     _nbytes(value, shape_out, held), info.shape, shape_out))
    report = LoadReport(f.path, target, dtype, for_compute, tuple(reports))
    return (nest(out, f.path) if nested else out), report
