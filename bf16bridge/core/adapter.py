"""What every adapter is: its abilities as data, and a few primitives.

The planner (``bf16bridge.core.planner``) reads only the data here; ``convert`` runs
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

from bf16bridge.core import dtypes
from bf16bridge.errors import CopyRequiredError, DeviceError

#: Alignment (bytes) a buffer needs to be taken without a copy by the pickiest
#: importer we know (XLA on CPU), and that our own copies are allocated with.
ALIGN = 64

# Memory layouts, from the most to the least regular. An importer states the
# least regular one it takes; anything beyond needs a copy first.
CONTIGUOUS = 0  # row-major, no gaps
PERMUTED = 1  # no gaps, dimensions in another order: transposes, permutes (a size-1 dimension's stride aside)
STRIDED = 2  # positive (or zero) strides: slices with steps or gaps, broadcasts
NEGATIVE = 3  # at least one negative stride (numpy's a[::-1])
LAYOUT_NAMES = ("contiguous", "strided (dense, its dimensions permuted)", "strided", "negatively strided")


class UnalignedImport(CopyRequiredError):
    """``Adapter.importer_aligned``'s refusal of a buffer not ALIGN-aligned. ``convert`` catches it
    and takes the full path, which copies such a buffer first; it reaches a caller only where a
    source adapter described a buffer as aligned that was not."""


class StalePlan(UnalignedImport):
    """A kept plan's pointer-checked step copied an input its key took to share memory (the key
    cannot tell such inputs apart: a jax array over foreign strides). Caught where
    ``UnalignedImport`` is: the full path describes the input and plans it afresh."""


#: device kinds a device string may name, in any framework's spelling: CUDA (and ROCm) GPUs are
#: "gpu" (torch's "cuda:0", jax's and tensorflow's "gpu:0" name one device)
_KINDS = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu"}


def parse_device(name: str) -> tuple[str, int | None] | None:
    """A device string in any framework's spelling ("cpu", "cpu:0", "cuda:1", "gpu:0", tensorflow's
    "/GPU:0" and "/job:localhost/replica:0/task:0/device:CPU:0") as (kind, index), kind "cpu" or
    "gpu" and index None where none is named; None where it names no device."""
    kind, _, index = name.strip().lower().rpartition("device:")[2].lstrip("/").partition(":")
    found = _KINDS.get(kind)
    if found is None or (index and not index.isdigit()):
        return None
    return found, int(index) if index else None


def same_device(a: str, b: str) -> bool:
    """Whether two frameworks' names of a device (``Source.device``, ``Adapter.find_device``) are
    the same device (an unnamed index is 0)."""
    if a == b:
        return True
    pa, pb = parse_device(a), parse_device(b)
    return pa is not None and pb is not None and pa[0] == pb[0] and (pa[1] or 0) == (pb[1] or 0)


def on_host(device: str) -> bool:
    """Whether ``Source.device`` names host memory ("cpu", or another CPU device of jax: "cpu:1")."""
    return device == "cpu" or device.startswith("cpu:")


def layout_of(shape, strides_in_elements) -> int:
    """Classify strides (in elements, not bytes) into CONTIGUOUS/PERMUTED/STRIDED/NEGATIVE."""
    if any(s < 0 for s in strides_in_elements):
        return NEGATIVE
    shape = tuple(shape)
    if 0 in shape:  # a zero-size array is contiguous whatever its strides say
        return CONTIGUOUS
    # the dimensions that move (size > 1), innermost first: row-major order, then any order
    dims = [(stride, size) for size, stride in zip(shape, strides_in_elements) if size != 1]
    for order, layout in ((dims[::-1], CONTIGUOUS), (sorted(dims), PERMUTED)):
        expected = 1
        for stride, size in order:
            if stride != expected:
                break
            expected *= size
        else:
            return layout
    return STRIDED


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
    #: the least regular layout it takes (see CONTIGUOUS/PERMUTED/STRIDED/NEGATIVE)
    layouts: int = NEGATIVE
    #: a copy it makes is ALIGN-aligned (False: numpy.array's own allocation, which is not)
    copies_aligned: bool = True
    #: for a ``verify`` hand-off: a cheap test that its result still shares the input's memory, which
    #: the fast path runs under copy=None instead of reading two pointers; None: no such test
    shares: Callable[[Any], bool] | None = None
    #: its copy is decided by the dtype alone (a packing hand-off) and makes a fresh result each run
    #: (``Step.by_dtype``)
    copies_by_dtype: bool = False


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
    #: the least regular layout its DLPack import takes of host memory without copying (see
    #: CONTIGUOUS/PERMUTED/STRIDED/NEGATIVE); anything beyond is copied first, in the source framework
    dlpack_accepts: ClassVar[int] = STRIDED
    #: the same for device (GPU) memory; None: as ``dlpack_accepts``
    dlpack_accepts_device: ClassVar[int | None] = None
    #: what a result that kept a non-row-major input layout (its DLPack import took it as it is) is
    #: in this framework, for plan()'s notes; "" where it needs no word (a strided tensor like any other)
    kept_layout_note: ClassVar[str] = ""
    #: what its DLPack import does with a buffer not ALIGN-aligned: "ok" (takes it),
    #: "copies" (copies it, silently: jax), "refuse" (takes it, but its kernels then
    #: abort the process: tensorflow; the planner copies first)
    dlpack_unaligned: ClassVar[str] = "ok"
    #: a bit-view (a dtype <-> the unsigned int carrying its bits) is free; False: it copies;
    #: None: impossible (``views_bits`` says for which dtypes)
    bitview_free: ClassVar[bool | None] = True
    #: its own copies are ALIGN-aligned
    copies_aligned: ClassVar[bool] = True
    #: ``fast_key`` reads an input's alignment cheaply; False (tensorflow: a DLPack capsule each): a plan
    #: that copies for an unaligned input is not kept, as its key would read every later input's alignment
    alignment_cheap: ClassVar[bool] = True
    #: its kernels (copy, astype) can read a buffer that is not ALIGN-aligned. False
    #: (tensorflow: they abort the process): the planner copies or widens such a tensor
    #: in another framework, through steps plan() shows
    kernels_unaligned: ClassVar[bool] = True
    #: the most bytes an array of this framework may span (its element count times its itemsize), a
    #: view too; None: no limit below the memory a copy needs (numpy: the largest intp)
    max_nbytes: ClassVar[int | None] = None
    #: what a copy made by its import costs, against one made by an adapter's copy()
    #: (measured by the benchmark harness: docs/benchmarks.md, "What an import's own copy costs";
    #: tests/project/test_benchmarks_smoke.py checks the declared value is on the measured side of 1;
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

    #: the low-precision rows (dtypes.LOW_PRECISION) this framework holds, and why not each of the
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
        zero-copy plans, ``Source.requires_grad`` included (a tf tensor a tape watches; a torch
        tensor that requires grad, whose kept plan first runs ``kept_value``); None where
        ``describe`` would change the value otherwise (a tf.Variable) or the input is unusual:
        those take the full path.
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

    #: ``fit_int`` is offered (a checked int64 -> int32 conversion for fallback="auto": dtypes.INT32_OF)
    fits_int: ClassVar[bool] = False

    def fit_int(self, x, dtype: str):
        """``x`` as the 32-bit integer ``dtype``, after checking every value fits; else our
        ``UnsupportedDtypeError`` naming the range and the way out."""
        raise NotImplementedError(f"{self.name} does not fit 64-bit integers into 32 bits")

    def mark_readonly(self, x):
        """``x`` marked read-only, for frameworks that mark memory (default: as it is)."""
        return x

    # -- devices: what ``device=`` may name, and moving a result there ----------------------------
    #: plan()'s label of a move to another device ("{device}": the device's name)
    label_place: ClassVar[str] = "move to {device}"
    #: the device objects of this framework ``device=`` takes besides names ("torch.device"), or ""
    device_objects: ClassVar[str] = ""

    def devices(self) -> tuple[str, ...]:
        """The devices this framework has in this process, as ``Source.device`` names them ("cpu",
        "cuda:0", ...): what ``device=`` may name. Default: the host only."""
        return ("cpu",)

    def find_device(self, device) -> str:
        """The device ``device=`` names (a string in any framework's spelling, or a device object of
        this framework) as one of ``devices()``; our DeviceError listing them otherwise. Default: the
        host, for a string naming the CPU."""
        if isinstance(device, str) and parse_device(device) in (("cpu", None), ("cpu", 0)):
            return "cpu"
        raise self.no_device(device)

    def fixed_device(self, device) -> bool:
        """Whether ``find_device(device)`` gives the same answer on every call (False: torch's "cuda",
        its current device): only then is a plan kept for it. Default: True."""
        return True

    def device_of(self, x) -> str:
        """The device tensor ``x`` is on, as ``devices()`` names it. Default: the host."""
        return "cpu"

    def place(self, x, device: str):
        """``x`` on ``device`` (one of ``devices()``): ``x`` itself where it is there already, else a
        copy there. Default: ``x`` (the host only)."""
        return x

    def no_device(self, device, why: str = "") -> DeviceError:
        """Our error for a ``device=`` this framework does not have here, listing those it has."""
        t = type(device)
        what = repr(device) if isinstance(device, str) else f"{device!r} (a {t.__module__}.{t.__qualname__})"
        objects = f", a {self.device_objects}" if self.device_objects else ""
        return DeviceError(f"device={what} is not a device {self.name} has here{why}; {self.name} has: "
                           f"{', '.join(map(repr, self.devices()))}; pass one of those{objects}, or device=None to "
                           "leave the result where the route puts it")

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
        objects no adapter claims as a tensor. Default: None."""
        return None

    def model_message(self, model) -> str:
        """What ``not_a_tensor`` says of a model object with weights."""
        t = type(model)
        return (f"{t.__module__}.{t.__qualname__} is a model object of {self.name}, not a tensor or a tree of "
                f"tensors: {self.model_way_out or 'pass its weights'}")

    def to_host(self, x):
        """A copy in host memory (only asked for with copy=True)."""
        raise NotImplementedError(f"{self.name} cannot move data to the host")

    def shape_dtype(self, x) -> tuple[tuple, str]:
        """A tensor's (shape, bridge dtype name), traced values too: reads no data."""
        return tuple(x.shape), dtypes.name_of_numpy(x.dtype) or str(x.dtype)

    def no_data(self, x) -> str | None:
        """Why tensor ``x`` has no memory behind it to read (a freed or fake torch tensor), naming the
        way out; None where it has (the default). ``describe`` refuses such a tensor itself: this is for
        callers that read a tensor without describing it (cast_tree)."""
        return None

    def same_data(self, x) -> object:
        """A hashable key equal for two tensors that are the same data (the same memory, shape,
        strides and dtype), so a cast of a tree keeps tied weights tied. Default: ``id(x)``
        (override where distinct objects view the same memory: a torch state dict's tied weights)."""
        return id(x)

    def kept_value(self, x, source: Source) -> Callable[[Any], Any] | None:
        """Where ``describe`` gave ``x`` another value (``source.value``) and ``fast_key`` says so in its
        key: the function that gives that value from any input of the key (torch: detached where it
        requires grad, a row-major view where a size-1 dimension's stride is odd), which a plan kept for
        them runs first. None (the default): plans for such inputs are not kept."""
        return None
