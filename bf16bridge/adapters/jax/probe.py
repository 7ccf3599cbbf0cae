"""What this jax holds, speaks, casts and allocates, found by trying on first need (never at import),
and the capability probe's hooks (devices, facts, fp8 compute). Each trial runs once, outside any
jax trace (a first use may come under jit), and is kept, keyed on jax's x64 flag where it matters.
A trial asked inside a jax callback is waited for boundedly (``trials.Bounded``): its computation can
wait for the device the callback holds."""

from __future__ import annotations

import contextlib
import functools
import sys
from types import FrameType
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bf16bridge.adapters import dlpack, trials
from bf16bridge.adapters.hooks import ProbeHooks
from bf16bridge.adapters.jax import internals
from bf16bridge.adapters.trials import (Bounded, allocation_offsets, cast_matches, float_row, kept,
                                       rounds_as_ml_dtypes)
from bf16bridge.core import dtypes, registry
from bf16bridge.core.adapter import ALIGN
from bf16bridge.core.memory import aligned_empty

#: dtypes jax narrows unless its x64 flag is on
WIDE = frozenset({"int64", "uint64", "float64", "complex128"})
#: how long a trial asked inside a jax callback is waited for: far above a trial's own time on a loaded
#: machine (compiles included); past it the trial is taken to wait for the device the callback holds
CALLBACK_WAIT_S = 5.0


def x64() -> bool:
    return bool(jax.config.jax_enable_x64)


def inside_callback() -> bool:
    """Whether this call comes from inside a jax callback (pure_callback, io_callback, jax.debug.callback):
    a frame of jax's own callback machinery (its ``_wrapped_callback``, jax 0.4.30 to 0.10) on the stack."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        if "callback" in f.f_code.co_name and f.f_globals.get("__name__", "").startswith("jax."):
            return True
        f = f.f_back
    return False


def revision() -> int:
    """Counts the trials whose answer landed after a conservative one was given in its place (0 where none
    was): what jax declares from its trials, and the routes planned on that, key on it."""
    return trials.revision()


def _trial(conservative: Callable, context: Callable | None = None) -> Callable[[Callable], Bounded]:
    """A trial kept once found; asked inside a jax callback, waited for at most CALLBACK_WAIT_S, and past
    that answered ``conservative(*args)`` (not kept) while it runs on (``trials.Bounded``)."""
    return lambda trial: Bounded(trial, conservative, inside_callback, CALLBACK_WAIT_S, context)


def _x64_as(src: str, dst: str, wide: bool | None):
    """The x64 setting a trial keyed on ``wide`` runs under in a thread of its own (jax's is per thread)."""
    if wide is None:
        return contextlib.nullcontext()
    return jax.enable_x64(wide) if hasattr(jax, "enable_x64") else jax.experimental.enable_x64(wide)


class Rows(NamedTuple):
    """What this jax does with each narrow row (dtypes.LOW_PRECISION)."""

    held: frozenset
    why: dict  # why not held, for each row it does not hold
    dlpack_out: frozenset  # exported over DLPack as the row itself
    dlpack_in: frozenset  # and imported back as it
    views: frozenset  # bit-cast to its carrier and back (lowered, not only shaped)
    put_copies: frozenset  # device_put copies it from numpy (XLA on CPU stores sub-byte types packed)
    asarray_copies: frozenset  # numpy.asarray copies it from jax


def _untried_rows() -> Rows:
    """narrow_rows' answer while its trial cannot finish: no row held, each saying why."""
    why = {name: (f"jax's trial of {name} did not finish inside a jax callback (its computation waits for the "
                  f"device the callback holds): convert a {name} array into jax once outside a callback first")
           for name in dtypes.LOW_PRECISION}
    return Rows(frozenset(), why, frozenset(), frozenset(), frozenset(), frozenset(), frozenset())


@_trial(_untried_rows)
def narrow_rows() -> Rows:
    """The narrow rows, each tried once on a small aligned array on the host."""
    found: dict[str, set] = {k: set() for k in ("held", "out", "into", "views", "put", "asarray")}
    why = {}
    with jax.ensure_compile_time_eval():  # under a trace device_put would give tracers
        for name in dtypes.LOW_PRECISION:
            reason = _try_row(name, found)
            if reason is not None:
                why[name] = reason
        views = _lowers(found["views"])
    return Rows(frozenset(found["held"]), why, frozenset(found["out"]), frozenset(found["into"]),
                frozenset(views), frozenset(found["put"]), frozenset(found["asarray"]))


def _try_row(name: str, found: dict[str, set]) -> str | None:
    """Try row ``name``, adding it to the sets of ``found`` it belongs to; why jax cannot hold it, or None."""
    if dtypes.numpy_missing(name) is not None:
        return f"jax takes it from numpy, and {dtypes.numpy_missing(name)}"
    a = aligned_empty((64,), name)
    a.view(dtypes.BITS_OF[name])[...] = 0
    try:
        # on the host: a GPU default device would make every row look copied
        x = jax.device_put(a, jax.devices("cpu")[0])
        back = np.asarray(x)
    except Exception as err:  # noqa: BLE001 - whatever it raised, jax cannot hold it
        return f"jax {jax.__version__} cannot hold {name}: {type(err).__name__}: {str(err).splitlines()[0]}"
    found["held"].add(name)
    x.block_until_ready()
    if x.unsafe_buffer_pointer() != a.ctypes.data:
        found["put"].add(name)
    if back.ctypes.data != x.unsafe_buffer_pointer():
        found["asarray"].add(name)
    try:
        if dlpack.dtype(x.__dlpack__()) == dtypes.ROWS[name].dlpack:
            found["out"].add(name)
            if jnp.from_dlpack(x).dtype == x.dtype:
                found["into"].add(name)
    except Exception:  # noqa: BLE001 - no DLPack for it
        pass
    if _shapes_bitcast(x, np.dtype(dtypes.ROWS[name].carrier)):
        found["views"].add(name)
    return None


def _shapes_bitcast(x, carrier) -> bool:
    """Whether jax gives the bit-cast of ``x`` to ``carrier`` and back a shape (asked of the abstract
    shapes: running a bit-cast compiles it)."""
    try:
        u = jax.eval_shape(lambda v: jax.lax.bitcast_convert_type(v, carrier), x)
        back = jax.eval_shape(lambda v: jax.lax.bitcast_convert_type(v, x.dtype), u)
    except Exception:  # noqa: BLE001 - no bit-cast for it
        return False
    return u.shape == x.shape and back.shape == x.shape


def _bitcasts(names) -> None:
    """Lower (not compile) the bit-casts of ``names`` to their carriers and back, in one program;
    raises what jax raises when any of them cannot be lowered."""
    specs = [jax.ShapeDtypeStruct((64,), dtypes.numpy_dtype(n)) for n in names]
    carriers = [np.dtype(dtypes.ROWS[n].carrier) for n in names]

    def f(xs):
        out = [jax.lax.bitcast_convert_type(x, c) for x, c in zip(xs, carriers)]
        return out, [jax.lax.bitcast_convert_type(u, x.dtype) for u, x in zip(out, xs)]

    jax.jit(f).lower(specs)


def _lowers(names) -> set:
    """The bit-casts jax gives a shape that it can also lower (jax 0.4.30 shapes an int4 bit-cast to
    uint8, then refuses to lower it): all in one lowering, one a row only when that fails."""
    names = sorted(names)
    try:
        _bitcasts(names)
        return set(names)
    except Exception:  # noqa: BLE001 - which one failed is found one by one
        pass
    ok = set()
    for n in names:
        try:
            _bitcasts([n])
            ok.add(n)
        except Exception:  # noqa: BLE001 - this jax cannot lower it: no bit-view for it
            pass
    return ok


@kept
def shared() -> frozenset:
    """The dtypes whose hand-offs with numpy are zero-copy as for any other (aligned, contiguous)."""
    rows = narrow_rows()
    return frozenset(dtypes.ALL) | (rows.held - rows.put_copies)


def casts(src: str, dst: str) -> bool:
    """Whether jax's astype keeps every src value in dst (XLA on CPU may flush subnormals)."""
    return _casts(src, dst, x64() if src in WIDE or dst in WIDE else None)


@_trial(lambda src, dst, wide: False, _x64_as)
def _casts(src: str, dst: str, wide: bool | None) -> bool:
    with jax.ensure_compile_time_eval():
        return cast_matches(src, dst, lambda a: np.asarray(jax.device_put(a).astype(dtypes.numpy_dtype(dst))))


def rounds_as_ml_dtypes_here(src: str, dst: str) -> bool:
    """Whether jax's astype from float row ``src`` to ``dst`` gives ml_dtypes' bits (a NaN: a NaN) on
    the CPU. jax 0.4.30 flushes float32 subnormals on the way to bf16 and rounds float32 to fp8 twice;
    jax 0.10 agrees from float32, not from float64 (values just above 2**-150 round to 0)."""
    return _rounds(src, dst, x64() if src in WIDE or dst in WIDE else None)


@_trial(lambda src, dst, wide: False, _x64_as)  # (False: cast by ml_dtypes in numpy, its bits)
def _rounds(src: str, dst: str, wide: bool | None) -> bool:
    to = dtypes.numpy_dtype(dst)
    cpu = jax.local_devices(backend="cpu")[0]
    with jax.ensure_compile_time_eval():  # a first cast may come under a trace (cast_tree inside jit)
        return rounds_as_ml_dtypes(src, dst, lambda a: np.asarray(jax.device_put(a, cpu).astype(to)))


def host_cast(src_dtype: np.dtype, dst: str) -> bool:
    """Whether astype from numpy dtype ``src_dtype`` to row ``dst`` goes through ml_dtypes in numpy
    (this jax's own cast gives other bits)."""
    return _host_cast(src_dtype, dst, x64())


@kept
def _host_cast(src_dtype: np.dtype, dst: str, wide: bool) -> bool:
    src = dtypes.name_of_numpy(src_dtype)
    return (src is not None and src != dst and float_row(src) and float_row(dst)
            and not rounds_as_ml_dtypes_here(src, dst))


@_trial(lambda: False)  # (False: the hot path reads each input's alignment)
def refuses_unaligned() -> bool:
    """Whether ``jnp.from_dlpack(x, copy=False)`` refuses a buffer not ALIGN-aligned (a ValueError, as
    jax 0.10 does) and takes an aligned one without copying (jax 0.4.30 takes an unaligned one as it is)."""
    buf = np.zeros(4 * ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    try:
        with jax.ensure_compile_time_eval():
            aligned = jnp.from_dlpack(buf[start:start + ALIGN], copy=False)
            if aligned.unsafe_buffer_pointer() != buf.ctypes.data + start:
                return False
            jnp.from_dlpack(buf[start + 1:start + 1 + ALIGN], copy=False)
    except ValueError:
        return True
    except Exception:  # noqa: BLE001 - no copy keyword, no DLPack from numpy: no aligned importer
        return False
    return False


@_trial(lambda: False)  # (False: such inputs are copied row-major first)
def takes_permuted() -> bool:
    """Whether jax's DLPack import takes a host buffer in another dimension order (a transpose, a
    permute) as it is, into an array it computes on with the right values: jax 0.10 does; jax 0.4.30
    takes it, and then its first operation on the array fails (XLA's layout assertion). Tried on
    transposed and permuted 64-byte aligned numpy arrays: the pointer kept, the values read and
    computed on. (Strides with gaps or repeats jax refuses, in every version tried.)"""
    base = aligned_empty((2, 3, 4), np.uint16)
    base[...] = np.arange(base.size, dtype=np.uint16).reshape(base.shape)
    try:
        with jax.ensure_compile_time_eval():
            for view in (base.reshape(6, 4).T, base.transpose(2, 0, 1)):
                x = jnp.from_dlpack(view)
                x.block_until_ready()
                if x.unsafe_buffer_pointer() != base.ctypes.data:
                    return False
                if not (np.array_equal(np.asarray(x), view) and np.array_equal(np.asarray(x + 1), view + 1)):
                    return False
    except Exception:  # noqa: BLE001 - jax's refusal, whatever this jax calls its error type
        return False
    return True


@_trial(lambda: False)  # (False: a jax array's pointer is read where a route depends on it)
def allocates_aligned() -> bool:
    """Whether every jax array starts on an ALIGN boundary: jax 0.10 copies an unaligned numpy buffer
    into one it allocates aligned; jax 0.4.30 on CPU takes it as it is and allocates its own 16-byte
    aligned (tensorflow's kernels abort on such a buffer). Tried by ``device_put`` of unaligned slices."""
    base = np.zeros(4099 + 2 * ALIGN, np.uint8)
    start = (1 - base.ctypes.data) % ALIGN  # an address 1 past a boundary: never taken as it is
    with jax.ensure_compile_time_eval(), jax.default_device(jax.local_devices(backend="cpu")[0]):
        for n in (1, 3, 24, 100, 4099):
            for _ in range(2):
                y = jax.device_put(base[start:start + n])
                y.block_until_ready()  # a pointer asked of a pending result can hang
                if y.unsafe_buffer_pointer() % ALIGN:
                    return False
    return True


@functools.cache
def callback_takes_packed() -> bool:
    """Whether this jax's pure_callback carries a type it stores packed (int4) under jit (jax 0.4.30's
    XLA refuses it)."""
    aval = jax.ShapeDtypeStruct((2,), jnp.int4)
    try:
        jax.jit(lambda x: jax.pure_callback(lambda a: a, aval, x)).lower(aval).compile()
    except Exception as err:  # noqa: BLE001 - XLA's refusal, whatever this jax calls its error type
        return not internals.refuses_packed(err)  # any other failure says nothing of int4
    return True


@functools.cache
def buffers_here(platform: str) -> bool:
    """Whether bridged callbacks on ``platform`` ("cpu", "cuda") take buffer_callback here: jax has it,
    and one device of that platform (over several, a buffer_callback runs once on every device, each
    with the whole array; pure_callback runs once)."""
    if not internals.BUFFER_CALLBACK:
        return False
    try:
        return len(jax.devices(platform)) == 1
    except RuntimeError:  # no such backend here
        return False


def narrow_dot(np_dtype, device) -> tuple[str, str]:
    """jnp.dot on ``np_dtype`` inputs, float32 out, compiled for ``device``: 'native' when a dot or
    library call in the compiled program takes the narrow operands, 'emulated' when XLA widens them first."""
    name = np.dtype(np_dtype).name
    try:
        x = jax.device_put(np.ones((16, 16), dtype=np_dtype), device)
        compiled = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32)).lower(x, x).compile()
        out = np.asarray(compiled(x, x))
        if out[0, 0] != 16.0:
            return "no", f"jnp.dot ran but gave {out[0, 0]} for 16"
        ops = internals.hlo_matmuls(internals.hlo_text(compiled))
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        return "no", f"jnp.dot: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    narrow = internals.hlo_type_prefix(name)
    if any(t.startswith(narrow) for _, ts in ops for t in ts):
        return "native", f"the compiled program's {ops[0][0]} takes the {name} operands as they are"
    if ops:
        return "emulated", f"XLA converts the {name} operands to {ops[0][1][0]} before its {ops[0][0]} (the compiled program)"
    return "unknown", "jnp.dot runs; no dot found in the compiled program"


def bf16_dot(device) -> tuple[str, str, str]:
    """(dtype, how, why): what jnp.dot of two bf16 arrays (a bf16 result, as users write it) computes in
    on ``device``, read from the compiled program: the dot's operands are bf16, or XLA converts them first."""
    try:
        x = jax.device_put(np.ones((16, 16), dtype=dtypes.numpy_dtype("bfloat16")), device)
        compiled = jax.jit(jnp.dot).lower(x, x).compile()
        ops = internals.hlo_matmuls(internals.hlo_text(compiled))
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        return "unknown", "failed", f"jnp.dot: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"
    if not ops or "?" in ops[0][1]:
        return "unknown", "failed", "jnp.dot compiles; its dot's operand types are not in the program's text"
    op, types = ops[0]
    if all(t == "bf16" for t in types):
        return "bfloat16", "read", f"the compiled jnp.dot's {op} takes the bf16 operands as they are"
    return "float32", "read", (f"XLA converts the bf16 operands to {types[0]} before its {op} (the compiled "
                               "program of jnp.dot on two bf16 arrays): it computes in float32")


class JaxProbe(ProbeHooks):
    name = "jax"

    def devices(self):
        out: list[tuple[str, bool | None, str]] = []
        for d in jax.devices():
            if d.platform == "cpu":
                continue
            label = f"{d.platform}:{d.id} {d.device_kind}"
            cap = internals.compute_capability(d)
            if d.platform == "tpu":
                out.append((label, True, "TPUs compute in bf16"))
            elif cap is not None:
                major = int(str(cap).split(".")[0])
                out.append((label, major >= 8, f"compute capability {cap} (bf16 arithmetic from 8.0)"))
            else:
                out.append((label, None, "jax does not say"))
        return out

    def facts(self):
        return {"x64": _x64_fact(), "aligned import": _import_fact(), "pure_callback vmap_method": _vmap_fact(),
                "buffer_callback": _buffer_fact(), "aligned buffers": _aligned_fact(), "permuted import": _permuted_fact()}

    def narrow_compute(self, dtype):
        if not registry.get(self.name).holds(dtype):
            return ()
        one_each = {d.platform: d for d in (*jax.devices("cpu"), *jax.devices())}  # a device per platform
        return tuple(("cpu" if p == "cpu" else f"{p}:{d.id}", *narrow_dot(dtypes.numpy_dtype(dtype), d))
                     for p, d in one_each.items())

    def bf16_compute(self):
        """What jnp.dot of two bf16 arrays computes in, read from its program compiled for a device of each
        platform (((device, dtype, how, why), ...))."""
        one_each = {d.platform: d for d in (*jax.devices("cpu"), *jax.devices())}
        return tuple(("cpu" if p == "cpu" else f"{p}:{d.id}", *bf16_dot(d)) for p, d in one_each.items())

    def fresh_offsets(self):
        """Address mod 64 of fresh jnp.zeros arrays on the CPU."""
        def make(n):
            with jax.ensure_compile_time_eval(), jax.default_device(jax.local_devices(backend="cpu")[0]):
                x = jnp.zeros(n, jnp.uint8)
                x.block_until_ready()
                return x

        return allocation_offsets(make, lambda x: x.unsafe_buffer_pointer())


def _x64_fact():
    on = x64()
    return on, ("jax_enable_x64 is on" if on else
                "jax_enable_x64 is off: 64-bit dtypes are refused rather than narrowed")


def _import_fact():
    refuses = refuses_unaligned.found()
    return refuses, (
        "jax.numpy.from_dlpack(copy=False) refuses a buffer not 64-byte aligned: zero-copy routes into jax "
        "run it, and convert's hot path reads no input's alignment for them" if refuses else
        "jax.numpy.from_dlpack(copy=False) took a buffer not 64-byte aligned: convert's hot path reads each "
        "input's alignment for routes into jax")


def _permuted_fact():
    takes = takes_permuted.found()
    return takes, (
        "jax.numpy.from_dlpack takes a host buffer in another dimension order (a transpose) as it is, and "
        "computes on it: such a torch or numpy input crosses into jax zero-copy (strides with gaps are copied "
        "first)" if takes else
        f"jax {jax.__version__}'s DLPack import of a host buffer in another dimension order (a transpose) "
        "gives an array it cannot compute on, or copies: such inputs are copied row-major before crossing into jax")


def _vmap_fact():
    takes = internals.PURE_CALLBACK_VMAP_METHOD
    return takes, (
        "jax.pure_callback takes vmap_method: a bridged function under vmap needs one" if takes else
        f"jax {jax.__version__}'s pure_callback has no vmap_method: under vmap a bridged function runs once "
        "per batch element (as vmap_method='sequential'), the only method it takes")


def _buffer_fact():
    buffers = buffers_here("cpu")
    if buffers:
        return True, (
            "under a jax transformation a bridged callee on the CPU runs in jax.experimental.buffer_callback, "
            "on copies of jax's input buffers and writing into its result buffers (no host round trip); on one "
            "CUDA GPU too, for a callee that queues its work on jax's stream (torch with CUDA); elsewhere in "
            "jax.pure_callback, on host copies")
    why = (f"jax {jax.__version__} has no buffer_callback the bridge uses (from 0.8.1)" if not internals.BUFFER_CALLBACK
           else f"{len(jax.devices('cpu'))} CPU devices (a buffer_callback would run on each)")
    return False, why + (": under a jax transformation a bridged callee runs in jax.pure_callback, on host "
                         "copies of its inputs and results")


def _aligned_fact():
    aligned = allocates_aligned.found()
    return aligned, (
        "jax allocates its buffers 64-byte aligned: a jax array is aligned, read without a pointer" if aligned else
        "jax allocates buffers not 64-byte aligned: a jax array's pointer is read where a route depends on it "
        "(tensorflow takes only aligned ones)")


HOOKS = JaxProbe()
