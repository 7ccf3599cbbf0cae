"""What every adapter is: its abilities as data, and a few primitives.

The planner (``bf16bridge.routes``) reads only the data here; ``convert`` runs
the primitives the chosen route names. An adapter module may import its
framework at the top: it is imported only when first used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import sys
import warnings
from typing import Any, Callable, ClassVar, NamedTuple

from .. import dtypes
from ..errors import CopyRequiredError

#: Alignment (bytes) a buffer needs to be taken without a copy by the pickiest
#: importer we know (XLA on CPU), and that our own copies are allocated with.
ALIGN = 64

# Memory layouts, from the most to the least regular. An importer states the
# least regular one it takes; anything beyond needs a copy first.
CONTIGUOUS = 0  # row-major, no gaps
STRIDED = 1  # positive (or zero) strides: transposes, slices with steps, broadcasts
NEGATIVE = 2  # at least one negative stride (numpy's a[::-1])
LAYOUT_NAMES = ("contiguous", "strided", "negatively strided")


class UnalignedImport(CopyRequiredError):
    """``Adapter.importer_aligned``'s refusal of a buffer not ALIGN-aligned. ``convert`` catches it
    and takes the full path, which copies such a buffer first; it reaches a caller only where a
    source adapter described a buffer as aligned that was not."""


def layout_of(shape, strides_in_elements) -> int:
    """Classify strides (in elements, not bytes) into CONTIGUOUS/STRIDED/NEGATIVE."""
    if any(s < 0 for s in strides_in_elements):
        return NEGATIVE
    expected = 1
    for size, stride in zip(reversed(tuple(shape)), reversed(tuple(strides_in_elements))):
        if size != 1 and stride != expected:
            # a zero-size array is contiguous whatever its strides say
            return CONTIGUOUS if 0 in tuple(shape) else STRIDED
        expected *= size
    return CONTIGUOUS


class Source(NamedTuple):
    """What an adapter reports of an input: enough for the planner to choose a route."""

    value: Any  # the tensor to move (torch: detached; tf.Variable: its current value)
    dtype: str  # bridge dtype name
    shape: tuple
    nbytes: int
    layout: int  # CONTIGUOUS / STRIDED / NEGATIVE
    aligned: bool  # data pointer is a multiple of ALIGN
    readonly: bool  # memory marked read-only (numpy's writeable flag)
    device: str  # "cpu", "cuda:0", ...
    must_copy: str | None = None  # why the value cannot leave as it is (torch conj/neg bits)
    notes: tuple = ()  # what the user should know (gradients dropped, a Variable's snapshot)
    requires_grad: bool = False  # the input takes part in autodiff: its gradient does not cross
    #: what the input's memory belongs to beyond an immutable tensor, where a writable alias of
    #: it changes that owner ("the live tf.Variable it was read from"): the alias message names
    #: it; None: an immutable tensor of its own
    owner: str | None = None


class Handoff(NamedTuple):
    """An extra edge an adapter offers besides DLPack and bit-views.

    ``copies(layout, aligned)`` returns None when the hand-off is zero-copy for
    such an input, or the reason it copies. ``verify`` asks ``convert`` to check
    the data pointer afterwards, for hand-offs whose copying we predict but the
    framework decides.
    """

    src: str
    dst: str
    label: str
    run: Callable[[Any], Any]
    copies: Callable[[int, bool], str | None]
    dtypes: frozenset = frozenset(dtypes.ALL)
    verify: bool = False
    #: the least regular layout it takes (see CONTIGUOUS/STRIDED/NEGATIVE)
    layouts: int = NEGATIVE
    #: a copy it makes is ALIGN-aligned (False: numpy.array's own allocation, which is not)
    copies_aligned: bool = True


@dataclasses.dataclass(frozen=True)
class Submodule:
    """One module of a model, for ``bf16bridge.casting.cast_module``: its dotted name ("" for
    the model itself), the names of its class and bases, those classes, and its own tensors
    (parameters and buffers, not its children's) as (name, tensor) pairs; ``parameters``: how
    many of the leaves, first, are parameters (the rest are buffers)."""

    name: str
    type_names: tuple[str, ...]
    classes: tuple[type, ...]
    leaves: tuple[tuple[str, Any], ...]
    parameters: int = 0


def _refcounts(objs: list) -> list[int]:
    """Python's reference count of each object of ``objs``, as read here (the list, the loop and the
    call each hold one): an object nothing else holds reads ``_FRESH``."""
    return [sys.getrefcount(o) for o in objs]


#: what ``_refcounts`` reads for an object that list alone holds (measured, not assumed: the count
#: a loop and a call add differ between Python versions)
_FRESH = _refcounts([object()])[0]


def _held_in(root, ids: set[int]) -> dict[int, int]:
    """How many references to each object of ``ids`` (by id) ``root`` holds, itself and through the
    lists, tuples, dicts and ``functools.partial`` objects it holds (each walked once; older jax keeps
    residuals in a partial's arguments): ``gc.get_referents`` lists one entry per reference an object
    holds. References further in (a function's closure, another object's attributes) are not counted:
    an object held there stays counted as kept. What is walked is taken to be ``root``'s alone (a vjp's
    residual lists and partials, which its framework builds for that vjp)."""
    held: dict[int, int] = {}
    todo, seen = ([] if root is None else [root]), set()
    while todo:
        for r in gc.get_referents(todo.pop()):
            if id(r) in ids:
                held[id(r)] = held.get(id(r), 0) + 1
            elif (type(r) in (list, tuple, dict) or isinstance(r, functools.partial)) and id(r) not in seen:
                seen.add(id(r))
                todo.append(r)
    return held


class Adapter:
    """Base class: the abilities every adapter declares, and its primitives."""

    name: ClassVar[str]
    #: tensors of this framework are never written in place (jax, tf)
    immutable: ClassVar[bool] = False
    #: for an immutable framework: what else may share a tensor's memory, that a write through a
    #: writable alias of it changes too (said in the alias warning); "" where nothing in particular
    shared_with: ClassVar[str] = ""
    #: the framework can mark memory read-only (numpy's writeable flag)
    marks_readonly: ClassVar[bool] = False
    #: holds host (CPU) memory only
    host_only: ClassVar[bool] = False
    #: dtypes it exports / imports over DLPack (bit for bit, with the table's DLPack code;
    #: adapters add the narrow rows they were found to speak, by trying)
    dlpack_export: ClassVar[frozenset] = frozenset(dtypes.ALL)
    dlpack_import: ClassVar[frozenset] = frozenset(dtypes.ALL)
    #: the least regular layout its DLPack import takes (see CONTIGUOUS/STRIDED/NEGATIVE)
    dlpack_accepts: ClassVar[int] = STRIDED
    #: what its DLPack import does with a buffer not ALIGN-aligned: "ok" (takes it),
    #: "copies" (copies it, silently: jax), "refuse" (takes it, but its kernels then
    #: abort the process: tensorflow; the planner copies first)
    dlpack_unaligned: ClassVar[str] = "ok"
    #: a bit-view (a dtype <-> the unsigned int carrying its bits) is free; False: it copies;
    #: None: impossible (``views_bits`` says for which dtypes)
    bitview_free: ClassVar[bool | None] = True
    #: its own copies are ALIGN-aligned
    copies_aligned: ClassVar[bool] = True
    #: its kernels (copy, astype) can read a buffer that is not ALIGN-aligned. False
    #: (tensorflow: they abort the process): the planner copies or widens such a tensor
    #: in another framework, through steps plan() shows
    kernels_unaligned: ClassVar[bool] = True
    #: what a copy made by its import costs, against one made by an adapter's copy()
    #: (measured by the benchmark harness: docs/benchmarks.md, "What an import's own copy costs";
    #: tests/test_benchmarks_smoke.py checks the declared value is on the measured side of 1;
    #: the planner prefers the cheaper)
    import_copy_cost: ClassVar[float] = 1.0
    #: how ``convert``'s warning says an input's gradient is dropped (``Source.requires_grad``):
    #: "this {framework} tensor {grad_words}; its data crosses ..."
    grad_words: ClassVar[str] = "requires grad"
    #: ``describe``'s value still carries the input's gradient (tensorflow: the tensor itself, or a
    #: Variable's read, recorded by the tape), so a route with no steps (already a tensor of the
    #: target) keeps it; False: describe detached it (torch), and even that route drops it
    grad_stays_on_value: ClassVar[bool] = False
    #: the note describe adds for an input whose gradient would not cross, where grad_stays_on_value:
    #: a route with no steps leaves it out (the gradient flows there)
    grad_note: ClassVar[str | None] = None

    # Labels shown by plan(); the adapter names its own calls.
    label_bitview: ClassVar[str] = "view as {dtype}"
    label_import: ClassVar[str] = "from_dlpack"
    label_copy: ClassVar[str] = "copy"

    #: the narrow rows (dtypes.NARROW_DTYPES) this framework holds, and why not each of the
    #: others, found by trying when the adapter is built; the base cannot_hold reads them
    narrow_held: ClassVar[frozenset] = frozenset()
    narrow_why: ClassVar[dict[str, str]] = {}

    # -- data the planner reads ------------------------------------------
    def holds(self, dtype: str) -> bool:
        """Whether tensors of this framework can hold ``dtype`` at all."""
        return self.cannot_hold(dtype) is None

    def cannot_hold(self, dtype: str) -> str | None:
        """Why this framework cannot hold ``dtype`` here (and the way out), or None."""
        if dtype in dtypes.ALL or dtype in self.narrow_held:
            return None
        return self.narrow_why.get(dtype, f"{self.name} holds no {dtype}")

    def views_bits(self, dtype: str) -> bool:
        """Whether a bit-view turns ``dtype`` into its carrier (``dtypes.BITS_OF``) and back
        within this framework (``bitview_free`` says whether that copies). Default: wherever
        the framework has a bit-view and holds ``dtype``."""
        return self.bitview_free is not None and dtype in dtypes.BITS_OF and self.holds(dtype)

    def can_copy(self, dtype: str) -> bool:
        """Whether ``copy`` works on a tensor of ``dtype`` (tensorflow has no copy kernel for its
        storage-only dtypes). Default: wherever it holds ``dtype``."""
        return self.holds(dtype)

    def casts(self, src: str, dst: str) -> bool:
        """Whether ``astype`` turns every ``src`` value into the same ``dst`` value, as ml_dtypes
        does (the widenings the planner takes). Default: wherever it holds both."""
        return self.holds(src) and self.holds(dst)

    def handoffs(self) -> list[Handoff]:
        """Extra edges into or out of this framework (default: none)."""
        return []

    def state(self) -> object:
        """Run-time settings that change what this adapter declares (a hashable value;
        jax: its x64 flag). Routes are cached per state: return everything that matters,
        cheaply (it is read on every conversion)."""
        return None

    # -- primitives convert() runs ------------------------------------------
    def describe(self, x, *, alignment: bool = True) -> Source:  # pragma: no cover - every adapter overrides
        """What the planner needs to know of ``x``. ``alignment=False``: no step of the
        route can depend on the buffer's alignment, so an adapter may skip an
        expensive check and report ``aligned=True``."""
        raise NotImplementedError

    def fast_key(self, x, alignment: bool) -> tuple | None:
        """A cheap, hashable description of everything ``describe`` would report of ``x``
        that a route depends on (dtype, layout, read-only, device, empty or not, and, when
        ``alignment``, whether the buffer is ALIGN-aligned), for ``convert``'s cache of
        zero-copy plans, ``Source.requires_grad`` included where the value stays the same
        (a tf tensor a tape watches); None where ``describe`` would change the value (a
        tensor that requires grad, a tf.Variable) or the input is unusual: those take the
        full path.
        Default: None (no fast path)."""
        return None

    def data_ptr(self, x) -> int:  # pragma: no cover
        raise NotImplementedError

    def bitview(self, x, dtype: str):  # pragma: no cover
        raise NotImplementedError

    def bitview_to(self, dtype: str) -> Callable[[Any], Any]:
        """``bitview(x, dtype)`` as a one-argument function, for routes (override with a
        faster one: it runs on every conversion)."""
        return functools.partial(self.bitview, dtype=dtype)

    def export(self, x, readonly: bool):
        """An object with ``__dlpack__`` for the next framework to import."""
        return x

    def from_dlpack(self, obj):  # pragma: no cover
        raise NotImplementedError

    # Routes run on every conversion: the two below let a DLPack step call the framework
    # itself, with no frame of ours in between, where export adds nothing.
    def exporter(self, readonly: bool) -> Callable[[Any], Any] | None:
        """``export`` as a one-argument function, or None where it hands ``x`` over as it is."""
        if type(self).export is Adapter.export:
            return None
        return functools.partial(self.export, readonly=readonly)

    def importer(self) -> Callable[[Any], Any]:
        """``from_dlpack`` as the framework's own function where it is one."""
        return self.from_dlpack

    def importer_aligned(self) -> Callable[[Any], Any] | None:
        """For an adapter whose import copies a buffer not ALIGN-aligned (``dlpack_unaligned``
        "copies"): an importer that takes an aligned buffer as ``importer()`` does and refuses any
        other, raising ``UnalignedImport``, instead of copying it silently (jax:
        ``from_dlpack(copy=False)``), or None. A zero-copy route into it then needs no alignment
        read: ``convert``'s hot path keys such routes without the input's alignment (a pointer
        read each call; tensorflow's costs a DLPack capsule), and the import tells: an unaligned
        input takes the full path, which routes it by an aligned copy."""
        return None

    # Between two frameworks that both offer these, a DLPack step of host memory hands a legacy
    # capsule straight over: the consumer's ``from_dlpack(obj)`` would first ask the producer
    # for its device and the protocol versions it speaks (microseconds a call in some
    # frameworks), which host memory does not need (no stream to synchronise).
    def capsule_exporter(self) -> Callable[[Any], Any] | None:
        """A function giving a host tensor's legacy (unversioned) DLPack capsule, or None."""
        return None

    def capsule_importer(self) -> Callable[[Any], Any] | None:
        """A function taking a legacy DLPack capsule of host memory, or None."""
        return None

    def copy(self, x):  # pragma: no cover
        """A fresh, contiguous, writable (where the framework allows) copy."""
        raise NotImplementedError

    def astype(self, x, dtype: str):  # pragma: no cover
        """Convert values (used only for the widening fallbacks, exact where ``casts`` says so)."""
        raise NotImplementedError

    def cast(self, x, dtype: str):
        """cast_tree's cast of one leaf: ``astype``, keeping what the framework's own cast keeps of
        the leaf's type (numpy: a scalar stays a scalar, a subclass its class)."""
        return self.astype(x, dtype)

    #: ``pack`` and ``unpack`` are offered: between a row of one value a byte and its packed row
    #: (``dtypes.PACKED``: float4_e2m1fn <-> float4_e2m1fn_x2), as the packed row's carrier
    packs: ClassVar[bool] = False
    label_pack: ClassVar[str] = "pack into {dtype}"
    label_unpack: ClassVar[str] = "unpack into {dtype}"

    def pack(self, x, dtype: str):
        """``x`` (a row of one value a byte) packed as row ``dtype``'s bytes, in its carrier:
        element 2i in the low nibble; the last dimension halves (and must be even)."""
        raise NotImplementedError(f"{self.name} does not pack")

    def unpack(self, x, dtype: str):
        """``x`` (the carrier of packed row ``dtype``) as its values one a byte: the last dimension doubles."""
        raise NotImplementedError(f"{self.name} does not unpack")

    #: ``narrow`` is offered (a checked int64 -> int32 conversion for fallback="auto")
    narrows: ClassVar[bool] = False

    def narrow(self, x, dtype: str):
        """``x`` as the narrower integer ``dtype``, after checking every value fits; else our
        ``UnsupportedDtypeError`` naming the range and the way out."""
        raise NotImplementedError(f"{self.name} does not narrow")

    def mark_readonly(self, x):
        """``x`` marked read-only, for frameworks that mark memory (default: as it is)."""
        return x

    def tree_children(self, node):
        """For a container this framework knows (jax: registered pytree nodes):
        ``(keys, children, rebuild)`` with ``rebuild(new_children)`` making the same
        container; None for anything else. Asked only once the framework is imported."""
        return None

    #: how to get at the tensors of one of this framework's model objects, for errors that
    #: refuse one (``not_a_tensor``); "" where it has none (``submodules`` says what a model is)
    model_way_out: ClassVar[str] = ""

    def not_a_tensor(self, x) -> str | None:
        """For an object of this framework that holds tensors but is no tensor bf16bridge moves
        or walks (a model, a composite tensor): what it is and the way out, as an error names
        them; None for anything else. Asked only once the framework is imported, and only of
        objects no adapter claims as a tensor. Default: a model object (``submodules``) with any
        parameter or buffer."""
        subs = self.submodules(x)
        if subs is None or not any(sub.leaves for sub in subs):
            return None
        return self.model_message(x)

    def model_message(self, model) -> str:
        """What ``not_a_tensor`` says of a model object with weights."""
        t = type(model)
        return (f"{t.__module__}.{t.__qualname__} is a model object of {self.name}, not a tensor or a tree of "
                f"tensors: {self.model_way_out or 'pass its weights'}")

    def to_host(self, x):
        """A copy in host memory (only asked for with copy=True)."""
        raise NotImplementedError(f"{self.name} cannot move data to the host")

    # -- facts for the capability probe ---------------------------------------
    def devices(self) -> list[tuple[str, bool | None, str]]:
        """Accelerators this framework sees: (name, bf16 compute?, why). Default: none."""
        return []

    def facts(self) -> dict:
        """Extra capabilities worth reporting (found by trying), as {name: (value, why)}."""
        return {}

    # -- fp8 compute, for the capability probe (bf16bridge.capabilities) -------------
    def narrow_compute(self, dtype: str) -> tuple:
        """A tiny matmul on ``dtype`` inputs (an fp8 row) with float32 results, tried on each
        device this framework computes on: ``((device, how, why), ...)``, how being "native"
        (the matmul takes the narrow operands as they are), "emulated" (the framework widens
        them first, as its own trace or compiled program shows), "no" (refused: why is the
        error) or "unknown". Default: () (not tried)."""
        return ()

    # -- float32 <-> bf16 kernels for bf16bridge.kernels (optional) -------------
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

    # -- numerics, for bf16bridge.parity -----------------------------------------
    #: the framework computes: the parity runner runs its built-in ops in it by default
    computes: ClassVar[bool] = False

    def numerics(self) -> dict:
        """The framework's settings that change bf16 results (threads, precision flags),
        recorded with each parity report; asked only once the framework is imported."""
        return {}

    # -- functions across frameworks, for bf16bridge.functions (bb.bridge) ------------------------
    #: has autodiff: gradients of bridged functions flow through it
    differentiates: ClassVar[bool] = False

    def shape_dtype(self, x) -> tuple[tuple, str]:
        """A tensor's (shape, bridge dtype name), traced values too: reads no data."""
        return tuple(x.shape), dtypes.name_of_numpy(x.dtype) or str(x.dtype)

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

    def no_data(self, x) -> str | None:
        """Why tensor ``x`` has no memory behind it to read (a freed or fake torch tensor), naming the
        way out; None where it has (the default). ``describe`` refuses such a tensor itself: this is for
        callers that read a tensor without describing it (cast_tree)."""
        return None

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
        counts = _refcounts(outs)
        found = [i for i, n in enumerate(counts) if n > _FRESH]
        if found and pullback is not None:
            held = _held_in(getattr(pullback, "residuals", None), {id(outs[i]) for i in found})
            found = [i for i in found if counts[i] - held.get(id(outs[i]), 0) > _FRESH]
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

    def no_grad(self) -> contextlib.AbstractContextManager:
        """A context in which this framework records no gradients (bb.parity.check_cast runs
        both models in it). Default: nothing to do (no autodiff, or none recorded unasked)."""
        return contextlib.nullcontext()

    def vjp(self, fn, leaves: list, diff: list):
        """Callee side: ``fn(*leaves)`` (a list of output tensors) with this framework's own
        autodiff; returns (outputs, pullback) where ``pullback(cotangents)`` (one per output,
        None for none) gives one gradient per input leaf, None where ``diff`` is False."""
        raise NotImplementedError(f"{self.name} has no autodiff")

    # -- casting models, for bf16bridge.casting (bb.cast_module) ----------------------------------
    def submodules(self, model) -> list[Submodule] | None:
        """Every module of a model object of this framework (torch: an ``nn.Module``), each once,
        parents before children, in the model's own order; None for anything else."""
        return None

    def same_data(self, x) -> object:
        """A hashable key equal for two tensors that are the same data (the same memory, shape,
        strides and dtype), so a cast of a tree keeps tied weights tied. Default: ``id(x)``
        (override where distinct objects view the same memory: a torch state dict's tied weights)."""
        return id(x)

    def cast_module(self, model, plan: dict, hooks: list) -> None:
        """Cast, in place, the tensors of ``model`` whose ``id()`` is in ``plan`` to the dtype
        named there (their gradients too); leave the others. ``hooks``: (module name, input
        dtype, output dtype): forward hooks that cast that module's floating inputs and outputs
        (replacing hooks an earlier call installed)."""
        raise NotImplementedError(f"{self.name} has no model objects to cast")

    # -- sharded tensors, for bf16bridge.shards ---------------------------------------------------
    #: builds its own sharded tensor from shards (``assemble``): jax arrays, torch DTensors
    assembles: ClassVar[bool] = False

    def local_shards(self, x):
        """For a sharded tensor of this framework: ``(global shape, layout, pieces)``, with the
        ``shards.Layout`` (None where the sharding is no mesh) and, for each shard this process
        holds, ``(index, device, tensor, replica)``: its global index as slices with explicit
        bounds (``shards.bounds``), its device as a string, the single-device tensor holding it
        (no copy), its replica number (0: the first holder of that index). Shape and indices count
        values: a tensor held packed (torch's fp4 x2, two values a byte) says its last dimension in
        values, as its shards cross (unpacked) and as ``assemble`` takes them. None for a tensor
        that is not sharded (the default)."""
        return None

    def assemble(self, shape: tuple, pieces: list, sharding, layout, copy: bool | None, on_alias: str):
        """A sharded tensor of this framework of global ``shape`` from ``pieces`` (``(index,
        device, tensor)``, tensors of any framework; shape and indices in values, as ``local_shards``
        says them), laid out as ``sharding`` (this framework's own
        object) or, when it is None, as ``layout``; each piece taken without a copy where the
        route allows, refused under ``copy=False`` otherwise. Offered where ``assembles``."""
        raise NotImplementedError(f"{self.name} has no sharded tensor type")


def cast_matches(src: str, dst: str, run: Callable[[Any], Any]) -> bool:
    """Whether ``run`` (a framework's own conversion, given and returning numpy arrays) keeps
    every ``src`` value exactly in ``dst``, as ml_dtypes reads both: NaN for NaN, zeros keeping
    their sign. For the adapters' ``casts``, found by trying (at most 256 values; 65,536 for bf16).

    ``run`` gets every ``src`` value as a numpy array of ``src``, or, where numpy cannot hold
    ``src`` (no ml_dtypes), as its carrier's bits: the expected values then come from the
    kernels, which read the format's bits without ml_dtypes."""
    import numpy as np

    try:
        # NaN patterns warn "invalid value encountered in cast" in some ml_dtypes casts
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            bits = dtypes.all_patterns(src)
            if dtypes.numpy_missing(src) is None:
                a = bits.view(dtypes.numpy_dtype(src))
                want = a.astype(np.float64)
            else:
                from .. import kernels

                a = bits
                want = kernels.to_float32(bits, dtype=src).astype(np.float64)
            got = np.asarray(run(a)).astype(np.float64)
    except Exception:  # noqa: BLE001 - any failure means it does not convert
        return False
    nan = np.isnan(want)
    return bool(want.shape == got.shape and np.array_equal(nan, np.isnan(got))
                and np.array_equal(want[~nan], got[~nan])
                and np.array_equal(np.signbit(want[~nan]), np.signbit(got[~nan])))


def float_row(name: str | None) -> bool:
    """A floating row numpy holds here, one value a byte or more (ml_dtypes' cast is the reference
    an adapter's own cast between two of them is held to: ``rounds_as_ml_dtypes``)."""
    row = dtypes.ROWS.get(name) if name is not None else None
    return row is not None and row.kind == "float" and row.packing == 1 and dtypes.numpy_missing(row.name) is None


def _rounding_probe(src: str):
    """Values of float row ``src`` where two casts from it differ if they round differently: every
    pattern of a 16-bit or narrower type; for float32 and float64, every exponent (subnormals
    included) under mantissas at, just below and just above a tie at each bit (a tie plus the
    smallest tail shows a double rounding)."""
    import numpy as np

    dt = dtypes.numpy_dtype(src)
    if dt.itemsize <= 2:
        return dtypes.all_patterns(src).view(dt)
    mant = 23 if dt.itemsize == 4 else 52
    u = np.dtype(f"u{dt.itemsize}")
    tails = sorted({m for k in range(mant) for m in (1 << k, (1 << k) - 1, (1 << k) + 1, 3 << k)
                    if m < 1 << mant})
    heads = np.arange(1 << (dt.itemsize * 8 - mant), dtype=u) << u.type(mant)  # sign and exponent
    return (heads[:, None] | np.array(tails, u)[None, :]).ravel().view(dt)


def rounds_as_ml_dtypes(src: str, dst: str, run: Callable[[Any], Any]) -> bool:
    """Whether ``run`` (a framework's own cast from float row ``src`` to ``dst``, given and returning
    numpy arrays) gives ml_dtypes' bits (a NaN: a NaN) on every value where two casts can differ
    (subnormals flushed, a double rounding): tried once per pair by the adapters whose casts do
    not (XLA:CPU and tensorflow's CPU kernels flush subnormals), which then cast in numpy."""
    import numpy as np

    a = _rounding_probe(src)
    to = dtypes.numpy_dtype(dst)
    # NaN and overflow casts warn through errstate (no catch_warnings: from two threads at once, its
    # restore can leave "ignore" behind for the whole process)
    with np.errstate(all="ignore"):
        try:
            want = a.astype(to)
        except (TypeError, ValueError):  # no cast of ml_dtypes' between the two (e8m0 -> e4m3fn): none to hold to
            return True
        try:
            got = np.asarray(run(a))
        except Exception:  # noqa: BLE001 - a cast that fails is no cast to take
            return False
        if got.dtype != to or got.shape != want.shape:
            return False
        nan = np.isnan(want.astype(np.float32))
        return bool(np.isnan(got[nan].astype(np.float32)).all()
                    and np.array_equal(want[~nan].view(f"u{to.itemsize}"), got[~nan].view(f"u{to.itemsize}")))
