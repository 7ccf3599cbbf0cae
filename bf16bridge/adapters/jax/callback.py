"""The callbacks a bridged call runs in when jax runs a traced computation: ``buffer_callback`` on
jax's own buffers where this jax and the devices allow (``probe.buffers_here``), ``pure_callback``
on host copies elsewhere. Their branches are built once and kept: jax caches traced branches and
compiled callbacks by their identity, and new ones on every call would compile every call."""

from __future__ import annotations

import functools

import jax
import numpy as np

from bf16bridge.adapters.hooks import BridgeHooks
from bf16bridge.adapters.jax import internals, probe
from bf16bridge.core import dtypes, registry
from bf16bridge.core.memory import aligned_empty
from bf16bridge.errors import UnsupportedDtypeError, UnsupportedTypeError


class HostCall:
    """One callback of a bridged call (its forward, or its backward): ``fn(to, borrowed, *inputs)``
    takes tensors of ``to`` and gives results of ``avals``' shapes and dtypes as tensors of ``to``
    (None: zeros), and runs when jax runs the computation.

    On the CPU (buffer_callback) the callee gets copies of jax's input buffers of its own (jax's are
    valid only during the callback, and a callee may keep its input), read-only for a numpy callee as
    eagerly, and each result is written into jax's result buffer once checked to be exactly the
    declared shape and dtype (a copy into it would broadcast or cast, silently). On one CUDA GPU, for
    a callee that can queue its work on jax's stream (``BridgeHooks.device_streams``: torch), likewise
    on the device, in order with the computation. Elsewhere (an older jax, several devices, another
    callee, a type jax stores packed) it runs in ``pure_callback``, which hands it host copies."""

    def __init__(self, call, vmap_method, fn, avals, in_avals):
        self.call, self.vmap_method, self.fn, self.avals = call, vmap_method, fn, avals
        self.kw = self._vmap_keywords()
        self.callee = registry.get(call.callee)
        self.callee_hooks = registry.hooks(call.callee, BridgeHooks)
        self.readonly = self.callee.marks_readonly
        #: the callee's DLPack import copies or refuses a buffer not 64-byte aligned (tensorflow): its
        #: inputs' copies are made so aligned
        self.aligned = self.callee.dlpack_unaligned != "ok"
        #: inputs and results of a type jax stores packed (int4, fp4), which a numpy or DLPack view
        #: reads as one value a byte (wrong values, writes past the end): pure_callback unpacks them
        names = (dtypes.name_of_numpy(np.dtype(a.dtype)) for a in (*in_avals, *avals))
        packed = probe.narrow_rows().put_copies
        # the layout trial computes on jax: tried now, while tracing, never first inside the callback (where
        # planning a conversion into jax asks it, and a computation can wait on the device the callback holds)
        probe.takes_permuted()
        self.packed: list[str] = sorted({n for n in names if n is not None and n in packed})
        self._pure = functools.partial(self._pure_callback)
        self._on_host = functools.partial(self._buffer_callback, self._fill)
        self._on_gpu = functools.partial(self._buffer_callback, self._fill_device)

    def _vmap_keywords(self):
        vmap_method = self.vmap_method
        if internals.PURE_CALLBACK_VMAP_METHOD:
            return {} if vmap_method is None else {"vmap_method": vmap_method}
        if vmap_method in (None, "sequential"):
            return {}  # this jax's one batching rule: once per batch element
        return None  # refused when called (under the trace, as before)

    def __call__(self, *args):
        self._refuse()
        branches = {}
        if not self.packed:
            if probe.buffers_here("cpu"):
                branches["cpu"] = self._on_host
            if "cuda" in self.callee_hooks.device_streams() and probe.buffers_here("cuda"):
                branches["cuda"] = self._on_gpu
        try:
            if branches:
                return jax.lax.platform_dependent(*args, **branches, default=self._pure)
            return self._pure(*args)
        except NotImplementedError as err:
            if "vmap" not in str(err):
                raise
            raise UnsupportedTypeError(
                "a bridged function called from jax under vmap needs a batching rule: "
                "bb.bridge(..., vmap_method='sequential') runs it once per batch element "
                "(see jax.pure_callback's vmap_method)"
            ) from err

    def _refuse(self) -> None:
        """Our error where this jax's callbacks cannot carry this call: a vmap method, a packed type."""
        if self.kw is None:
            raise UnsupportedTypeError(
                f"vmap_method={self.vmap_method!r}: jax {jax.__version__}'s pure_callback has no vmap_method; its "
                "one batching rule runs the function once per batch element: pass vmap_method='sequential', or "
                "upgrade jax (pip install -U jax) for the others")
        if self.packed and not probe.callback_takes_packed():
            raise UnsupportedDtypeError(
                f"the bridged {self.call.callee} function {getattr(self.call.fn, '__qualname__', self.call.fn)!r} "
                f"takes or gives {', '.join(self.packed)} under a jax transformation, and jax {jax.__version__}'s "
                "callbacks cannot carry them (its XLA takes sub-byte types only in convert instructions): call the "
                "function eagerly, or upgrade jax (pip install -U jax)")

    def _pure_callback(self, *args):
        return jax.pure_callback(self._host_results, self.avals, *args, **self.kw)

    def _host_results(self, *xs):
        return self.fn("numpy", "jax", *xs)

    def _buffer_callback(self, fill, *args):
        return internals.buffer_callback(fill, self.avals, **self.kw)(*args)

    def _fill(self, ctx, out, *buffers):
        """buffer_callback's callback on the CPU: ``fn`` on copies of jax's input buffers, its results
        into jax's result buffers."""
        # jax's buffers are valid only during the callback (XLA reuses them after): the callee gets copies
        # of its own, aligned where its import needs it, read-only where its tensors can say so
        inputs = []
        for b in buffers:
            a = np.asarray(b)
            if self.call.copy_inputs:  # the call copies each input itself: not twice
                mine = a
            elif self.aligned:
                mine = aligned_empty(a.shape, a.dtype)
                np.copyto(mine, a)
            else:
                mine = a.copy()  # (numpy's own allocation: cheaper for a small array)
            if self.readonly:
                mine.flags.writeable = False
            inputs.append(mine)
        results = self.fn("numpy", None, *inputs)
        self._write(results, [np.asarray(o) for o in out], registry.get("numpy"), _copy_into)

    def _fill_device(self, ctx, out, *buffers):
        """buffer_callback's callback on a GPU: the callee on device copies of jax's input buffers (as
        ``_fill``), its work queued on the computation's stream, its results copied into jax's result
        buffers on that stream."""
        callee = self.callee
        take = callee.importer()
        index = (buffers[0] if buffers else out[0]).__dlpack_device__()[1]
        hooks = self.callee_hooks
        with hooks.on_device_stream("cuda", index, internals.stream_of(ctx)):
            copy = (lambda t: t) if self.call.copy_inputs else callee.copy  # (as _fill)
            results = self.fn(callee.name, None, *[copy(take(b)) for b in buffers])
            self._write(results, [take(o) for o in out], callee, hooks.write_into)

    def _write(self, results, dsts, adapter, write) -> None:
        """Each result into its buffer ``dsts[i]`` (a tensor of ``adapter``'s) by ``write``, once checked
        to be exactly the buffer's shape and dtype; a result None (a gradient the callee has not): zeros."""
        if len(results) != len(dsts):  # (the results' tree is checked before: a guard, never left unwritten)
            i = min(len(results), len(dsts))
            raise self.call.not_declared(
                i, adapter.shape_dtype(results[i]) if i < len(results) and results[i] is not None else None,
                adapter.shape_dtype(dsts[i]) if i < len(dsts) else None, "here")
        for i, (dst, r) in enumerate(zip(dsts, results)):
            if r is None:  # (a gradient the callee has not, on a device)
                write(dst, None)
                continue
            want = adapter.shape_dtype(dst)
            got = adapter.shape_dtype(r)
            if got != want:  # (batched by vmap: not checked before)
                if tuple(want[0]) != tuple(self.avals[i].shape):  # a batch's result
                    raise self.call.not_batched(i, got, want)
                raise self.call.not_declared(i, got, want, "here")
            write(dst, r)


def _copy_into(dst: np.ndarray, src) -> None:
    if src is None:
        dst[...] = 0
    else:
        np.copyto(dst, src, casting="no")
