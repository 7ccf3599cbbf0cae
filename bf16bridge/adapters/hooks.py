"""The feature hooks: what each feature asks of a framework, one protocol a feature.

The core ``Adapter`` (``bf16bridge.core.adapter``) holds what the planner and ``convert`` need. A
feature that needs a framework's help finds that framework's hooks through the registry
(``registry.hooks(name, BridgeHooks)``); a framework without hooks for a feature gets the defaults
below (no autodiff, no model objects, no sharded type, nothing probed, no kernels).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, ClassVar

from bf16bridge.adapters import cpython
from bf16bridge.errors import UnsupportedTypeError


@dataclasses.dataclass(frozen=True)
class Submodule:
    """One module of a model, for ``bf16bridge.casting.cast.cast_module``: its dotted name ("" for
    the model itself), the names of its class and bases, those classes, and its own tensors
    (parameters and buffers, not its children's) as (name, tensor) pairs; ``parameters``: how
    many of the leaves, first, are parameters (the rest are buffers)."""

    name: str
    type_names: tuple[str, ...]
    classes: tuple[type, ...]
    leaves: tuple[tuple[str, Any], ...]
    parameters: int = 0

class BridgeHooks:
    """What ``bb.bridge`` asks of a framework, as caller and as callee: autodiff, tracing, writes, kept results."""

    #: the registry's name for this feature (a hooks module of a framework package is named so)
    feature: ClassVar[str] = "bridge"
    #: the framework these hooks serve (set by the registry)
    name: str = ""

    # -- functions across frameworks, for bf16bridge.functions.call (bb.bridge) ------------------------
    #: has autodiff: gradients of bridged functions flow through it
    differentiates: ClassVar[bool] = False

    def differentiable(self, x) -> bool:
        """Caller side: whether this input leaf's gradient is wanted (default: never)."""
        return False

    def differentiable_leaves(self, leaves: list, traced: bool) -> list:
        """``differentiable`` of each leaf (an adapter may answer for all at once, cheaper); ``traced``:
        what ``traced(leaves)`` said, asked once per bridged call."""
        return [self.differentiable(x) for x in leaves]

    def traced(self, leaves: list) -> bool:
        """Whether this call is being traced (jax under a transformation, a tf graph): its
        results must be declared before it runs. Default: never."""
        return False

    def call_foreign(self, call, leaves: list) -> list:
        """Caller side: run a ``functions.ForeignCall`` on this framework's input leaves so that
        this framework's autodiff reaches its backward; the output leaves, as this
        framework's tensors (``call.traced``: what ``traced(leaves)`` said). Default (no autodiff):
        the forward alone."""
        return call.forward(leaves, False, self.name)[0]

    def device_streams(self) -> tuple:
        """Callee side: the device platforms ("cuda") on whose streams this framework can queue its
        work when another runtime hands it device buffers and a stream (a jax computation's callback:
        ``on_device_stream``); () where it cannot (the default): such a callee gets host copies."""
        return ()

    def on_device_stream(self, platform: str, index: int, stream: int) -> contextlib.AbstractContextManager:
        """A context in which this framework's work on device ``index`` of ``platform`` is queued on
        ``stream`` (the foreign runtime's raw stream handle, a cudaStream_t), in order with that runtime's
        own work: no synchronisation, and nothing read before the runtime's earlier work is done."""
        raise NotImplementedError(f"{self.name} queues no work on another runtime's stream")  # pragma: no cover

    def write_into(self, dst, src) -> None:
        """Write tensor ``src`` into tensor ``dst`` (same shape and dtype, checked by the caller; None:
        zeros), on the current stream: a result into the buffer another runtime gave for it."""
        raise NotImplementedError(f"{self.name} writes into no foreign buffer")  # pragma: no cover

    def watch_writes(self, leaves: list):
        """Callee side: what shows, after the callee ran, that it wrote in place into these input
        leaves (this framework's tensors, as the callee got them); None where writes cannot be seen
        or cannot happen (the default: immutable tensors, or no cheap way to tell). Asked on every
        bridged call whose inputs are not copies: keep it cheap (torch: each tensor's version
        counter)."""
        return None

    def written(self, watched) -> list[int]:
        """The positions of the leaves ``watch_writes`` watched that were written in place since."""
        return []

    def kept(self, outs: list, pullback=None) -> list[int]:
        """Callee side: the positions of the output tensors ``outs`` (this framework's; that list
        their only holder in the bridge) that something else keeps too: the same tensor object
        referenced elsewhere (a captured constant, a parameter, an input, a result returned twice)
        or, where the framework can tell, memory another tensor shares (torch: a view or a detach
        of a parameter). Asked when the caller's framework and the callee's differ in whether their
        tensors are written in place: such a result is copied, so neither side's later writes reach
        the other's. Default: by Python's reference count (the same object; a new tensor object over
        kept memory is not seen).

        ``pullback``: this call's own pullback (``vjp``'s; None without one). The references its
        ``residuals`` hold (an attribute a ``vjp`` may set: what its autodiff keeps for the backward,
        ``exp(x)``'s result) are not counted: a result only the pullback keeps is the caller's to guard,
        and its autodiff does (torch saves a bridged call's results for its backward, so a write into
        one before the backward is torch's own error, as natively)."""
        counts = cpython.refcounts(outs)
        found = [i for i, n in enumerate(counts) if n > cpython.FRESH]
        if found and pullback is not None:
            held = cpython.held_in(getattr(pullback, "residuals", None), {id(outs[i]) for i in found})
            found = [i for i in found if counts[i] - held.get(id(outs[i]), 0) > cpython.FRESH]
        return found

    def aliased(self, outs: list, ins: list) -> list[int]:
        """Caller side: the positions of the output tensors ``outs`` that share memory with any of
        the input tensors ``ins`` (both this framework's). Asked of a mutable caller of an immutable
        callee, whose results are values: one handed back as a view of an input is copied; and of a
        mutable callee, whose view of its own input is not copied as ``kept``. Default: none seen."""
        return []

    def outside_compiler(self, call):
        """``call`` wrapped to run outside this framework's graph compiler when one is tracing
        now (torch.compile), else None. Asked of every imported framework on each bridged call."""
        return None

    def vjp(self, fn, leaves: list, diff: list):
        """Callee side: ``fn(*leaves)`` (a list of output tensors) with this framework's own
        autodiff; returns (outputs, pullback) where ``pullback(cotangents)`` (one per output,
        None for none) gives one gradient per input leaf, None where ``diff`` is False."""
        raise NotImplementedError(f"{self.name} has no autodiff")

    #: compiles a function of its own tensors (jax: ``jax.jit``): ``bb.bridge`` compiles such a callee by default
    compiles: ClassVar[bool] = False

    def compile(self, fn, diff: list):
        """Callee side, where ``compiles``: ``fn`` compiled, once per input shapes and dtypes. ``fn(*leaves)``
        gives ``(output tensors, aux)``, ``aux`` being Python data fixed by the input shapes and dtypes (what
        a run found beside the tensors). The object returned has ``forward(leaves) -> (outputs, aux)`` and
        ``vjp(leaves) -> (outputs, aux, pullback)``, the pullback as ``vjp``'s (``diff``: which leaves want a
        gradient, fixed for this object), both compiled. A pullback may carry ``at_one``: its gradients for
        the cotangent 1 of a single scalar output (a loss), computed with the forward, on the host."""
        raise NotImplementedError(f"{self.name} compiles nothing")

    def traced_value_error(self, err: BaseException, compiled: bool) -> str | None:
        """Callee side: where ``err`` is this framework's error for a traced value used as a Python one (a
        callee's ``float(x)`` under its autodiff's tracer, or in a function ``compile`` compiled), what the
        callee did and the way out, as the end of a sentence about it; None for any other error (the default).
        ``compiled``: only the compilation traced it (no gradient was wanted), so running uncompiled is a way out."""
        return None


class CastHooks:
    """What ``bb.cast_module`` asks of a framework with model objects."""

    #: the registry's name for this feature (a hooks module of a framework package is named so)
    feature: ClassVar[str] = "cast"
    #: the framework these hooks serve (set by the registry)
    name: str = ""

    # -- casting models, for bf16bridge.casting.cast (bb.cast_module) ----------------------------------
    def submodules(self, model) -> list[Submodule] | None:
        """Every module of a model object of this framework (torch: an ``nn.Module``), each once,
        parents before children, in the model's own order; None for anything else."""
        return None

    def cast_module(self, model, plan: dict, hooks: list) -> None:
        """Cast, in place, the tensors of ``model`` whose ``id()`` is in ``plan`` to the dtype
        named there (their gradients too); leave the others. ``hooks``: (module name, input
        dtype, output dtype): forward hooks that cast that module's floating inputs and outputs
        (replacing hooks an earlier call installed)."""
        raise NotImplementedError(f"{self.name} has no model objects to cast")


class ShardHooks:
    """What ``bb.convert_shards`` / ``bb.from_shards`` ask of a framework with a sharded tensor type."""

    #: the registry's name for this feature (a hooks module of a framework package is named so)
    feature: ClassVar[str] = "shard"
    #: the framework these hooks serve (set by the registry)
    name: str = ""

    # -- sharded tensors, for bf16bridge.shards ---------------------------------------------------
    #: builds its own sharded tensor from shards (``assemble``): jax arrays, torch DTensors
    assembles: ClassVar[bool] = False

    def local_shards(self, x):
        """For a sharded tensor of this framework: ``(global shape, layout, pieces)``, with the
        ``core.sharding.Layout`` (None where the sharding is no mesh) and, for each shard this process
        holds, ``(index, device, tensor, replica)``: its global index as slices with explicit
        bounds (``core.sharding.bounds``), its device as a string, the single-device tensor holding it
        (no copy), its replica number (0: the first holder of that index). Shape and indices count
        values: a tensor held packed (torch's fp4 x2, two values a byte) says its last dimension in
        values, as its shards cross (unpacked) and as ``assemble`` takes them. None for a tensor
        that is not sharded (the default)."""
        return None

    def assemble(self, shape: tuple, pieces: list, sharding, layout, copy: bool | None, on_alias: str, convert):
        """A sharded tensor of this framework of global ``shape`` from ``pieces`` (``(index,
        device, tensor)``, tensors of any framework; shape and indices in values, as ``local_shards``
        says them), laid out as ``sharding`` (this framework's own
        object) or, when it is None, as ``layout``; each piece taken without a copy where the
        route allows, refused under ``copy=False`` otherwise, each moved by ``convert`` (the core's,
        passed in: adapters import no feature). Offered where ``assembles``."""
        raise NotImplementedError(f"{self.name} has no sharded tensor type")


class ProbeHooks:
    """What the capability probe asks of a framework: its devices, its facts, fp8 compute (found by trying)."""

    #: the registry's name for this feature (a hooks module of a framework package is named so)
    feature: ClassVar[str] = "probe"
    #: the framework these hooks serve (set by the registry)
    name: str = ""

    # -- facts for the capability probe ---------------------------------------
    def devices(self) -> list[tuple[str, bool | None, str]]:
        """Accelerators this framework sees: (name, bf16 compute?, why). Default: none."""
        return []

    def facts(self) -> dict:
        """Extra capabilities worth reporting (found by trying), as {name: (value, why)}."""
        return {}

    # -- fp8 compute, for the capability probe (bf16bridge.capabilities.probing) -------------
    def narrow_compute(self, dtype: str) -> tuple:
        """A tiny matmul on ``dtype`` inputs (an fp8 row) with float32 results, tried on each
        device this framework computes on: ``((device, how, why), ...)``, how being "native"
        (the matmul takes the narrow operands as they are), "emulated" (the framework widens
        them first, as its own trace or compiled program shows), "no" (refused: why is the
        error) or "unknown". Default: () (not tried)."""
        return ()


class NumericsHooks:
    """What ``bb.parity`` asks of a framework: whether it computes, its numeric settings, no-grad runs."""

    #: the registry's name for this feature (a hooks module of a framework package is named so)
    feature: ClassVar[str] = "numerics"
    #: the framework these hooks serve (set by the registry)
    name: str = ""

    # -- numerics, for bf16bridge.parity -----------------------------------------
    #: the framework computes: the parity runner runs its built-in ops in it by default
    computes: ClassVar[bool] = False

    def numerics(self) -> dict:
        """The framework's settings that change bf16 results (threads, precision flags),
        recorded with each parity report; asked only once the framework is imported."""
        return {}

    def no_grad(self) -> contextlib.AbstractContextManager:
        """A context in which this framework records no gradients (bb.parity.check_cast runs
        both models in it). Default: nothing to do (no autodiff, or none recorded unasked)."""
        return contextlib.nullcontext()


class KernelHooks:
    """Integer kernels a framework offers ``bb.kernels`` (bf16 <-> float32 bits) as a backend."""

    #: the registry's name for this feature (a hooks module of a framework package is named so)
    feature: ClassVar[str] = "kernel"
    #: the framework these hooks serve (set by the registry)
    name: str = ""

    # -- float32 <-> bf16 kernels for bf16bridge.kernels (optional) ---------------------
    #: widen_bits / round_bits are offered: bf16bridge.kernels may run them as a backend
    #: named after this adapter (chosen by "auto" only when the framework is already imported)
    offers_kernels: ClassVar[bool] = False

    #: one kernel call already spreads over the framework's own threads: run chunks one at a time
    kernels_threaded: ClassVar[bool] = False

    def widen_bits(self, src_u16, dst_u32) -> None:
        """Write ``src_u16 << 16`` into ``dst_u32`` (1-d numpy uint16 / uint32, same size):
        bf16 bits widened to float32 bits, exactly. Not offered by default."""
        raise NotImplementedError(f"the {self.name} adapter offers no kernels (offers_kernels is False)")

    def round_bits(self, src_u32, dst_u16) -> None:
        """Write float32 bits ``src_u32`` rounded to bf16 bits into ``dst_u16`` (1-d numpy, same
        size), bit-identical to ml_dtypes: nearest, ties to even, no flush to zero, overflow to
        inf, every NaN to the quiet NaN keeping its sign (0x7FC0 / 0xFFC0). Not offered by default."""
        raise NotImplementedError(f"the {self.name} adapter offers no kernels (offers_kernels is False)")


def second_order_refused(caller: str, fn) -> UnsupportedTypeError:
    """Our error for a gradient of a gradient through a bridged call, raised by the caller
    adapter's autodiff when it differentiates the backward (the backward runs foreign code its
    autodiff cannot see: without the refusal the callee's part of the second derivative would be
    missing, silently)."""
    return UnsupportedTypeError(
        f"a gradient of a gradient through the bridged function {getattr(fn, '__qualname__', fn)!r} "
        f"({caller} differentiating its own backward): bf16bridge does not support higher-order gradients "
        "across frameworks (the callee's backward runs outside the caller's autodiff); compute the "
        "second-order part in one framework")


class TraceHooks:
    """What ``bb.parity.trace`` asks of a framework: run a model reporting each layer's output as it is
    made, a float64 copy of a model, its parameters' gradients, and marked taps. The defaults serve a
    plain function of this framework's tensors (taps only, no model object, no gradients)."""

    #: the registry's name for this feature (a hooks module of a framework package is named so)
    feature: ClassVar[str] = "trace"
    #: the framework these hooks serve (set by the registry)
    name: str = ""

    def owns(self, model) -> bool:
        """Whether ``model`` is a model object of this framework (torch: an ``nn.Module``). Default: no."""
        return False

    def run(self, model, args: tuple, record, inputs_of=frozenset()):
        """``model(*args)``, its output as the model gives it. Each layer's output is handed to
        ``record(layer, "output", value)`` as it is made (``layer``: its dotted path, "" for the model;
        ``value``: as the layer returned it, a tensor or a tree of them), and the positional arguments
        of each layer named in ``inputs_of`` (a set of names, or True for every layer) to
        ``record(layer, "input", args)`` before it runs. Default: the call alone (taps record)."""
        return model(*args)

    def float64_copy(self, model):
        """A copy of ``model`` that computes in float64 (its floating parameters and buffers widened,
        exactly), or None where this framework cannot run it so (the default)."""
        return None

    def gradients(self, model, args: tuple, cotangent, loss=None) -> list:
        """Each trainable parameter's gradient by this framework's autodiff, as (name, parameter,
        gradient or None where it is not reached), in the model's order: of ``loss(output)`` where given,
        else of the sum of the first floating output leaf times ``cotangent`` (numpy, of its shape)."""
        raise UnsupportedTypeError(f"gradients of {type(model).__qualname__} in {self.name}: bf16bridge takes "
                                   "gradients of torch, flax and Keras models; pass grads=False")

    def layer_variants(self, model, layer: str, args: tuple) -> dict:
        """``layer`` of ``model`` run again on ``args`` with each square 2-d parameter of its own
        transposed, as {what changed: output}; {} where this framework cannot (the default)."""
        return {}

    def tap(self, name: str, x, record):
        """``x`` unchanged, having handed it to ``record(name, "output", x)`` (a framework that traces
        may hand it over later, when it runs); asked by ``bb.parity.tap`` while a trace runs."""
        record(name, "output", x)
        return x


def first_floating(out, floating):
    """The first leaf of a model's output (a tensor, or a tuple, list or dict of them, nested) for which
    ``floating(leaf)`` is true, or None: what a trace takes gradients of when no loss is given."""
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for o in out:
            found = first_floating(o, floating)
            if found is not None:
                return found
        return None
    return out if floating(out) else None
