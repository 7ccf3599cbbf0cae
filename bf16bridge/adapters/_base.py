"""What every adapter is: its abilities as data, and a few primitives.

The planner (``bf16bridge.routes``) reads only the data here; ``convert`` runs
the primitives the chosen route names. An adapter module may import its
framework at the top: it is imported only when first used.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ClassVar, NamedTuple

from .. import dtypes

#: Alignment (bytes) a buffer needs to be taken without a copy by the pickiest
#: importer we know (XLA on CPU), and that our own copies are allocated with.
ALIGN = 64

# Memory layouts, from the most to the least regular. An importer states the
# least regular one it takes; anything beyond needs a copy first.
CONTIGUOUS = 0  # row-major, no gaps
STRIDED = 1  # positive (or zero) strides: transposes, slices with steps, broadcasts
NEGATIVE = 2  # at least one negative stride (numpy's a[::-1])
LAYOUT_NAMES = ("contiguous", "strided", "negatively strided")


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


class Adapter:
    """Base class: the abilities every adapter declares, and its primitives."""

    name: ClassVar[str]
    #: tensors of this framework are never written in place (jax, tf)
    immutable: ClassVar[bool] = False
    #: the framework can mark memory read-only (numpy's writeable flag)
    marks_readonly: ClassVar[bool] = False
    #: holds host (CPU) memory only
    host_only: ClassVar[bool] = False
    #: dtypes it exports / imports over DLPack
    dlpack_export: ClassVar[frozenset] = frozenset(dtypes.ALL)
    dlpack_import: ClassVar[frozenset] = frozenset(dtypes.ALL)
    #: the least regular layout its DLPack import takes (see CONTIGUOUS/STRIDED/NEGATIVE)
    dlpack_accepts: ClassVar[int] = STRIDED
    #: what its DLPack import does with a buffer not ALIGN-aligned: "ok" (takes it),
    #: "copies" (copies it, silently: jax), "refuse" (takes it, but its kernels then
    #: abort the process: tensorflow; the planner copies first)
    dlpack_unaligned: ClassVar[str] = "ok"
    #: a bit-view (bf16 <-> uint16) is free; False: it copies; None: impossible
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

    # Labels shown by plan(); the adapter names its own calls.
    label_bitview: ClassVar[str] = "view as {dtype}"
    label_import: ClassVar[str] = "from_dlpack"
    label_copy: ClassVar[str] = "copy"

    # -- data the planner reads ------------------------------------------
    def holds(self, dtype: str) -> bool:
        """Whether tensors of this framework can hold ``dtype`` at all."""
        return self.cannot_hold(dtype) is None

    def cannot_hold(self, dtype: str) -> str | None:
        """Why this framework cannot hold ``dtype`` here (and the way out), or None."""
        return None if dtype in dtypes.ALL else f"{self.name} holds no {dtype}"

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
        zero-copy plans; None where ``describe`` would change the value (a tensor that
        requires grad, a tf.Variable) or the input is unusual: those take the full path.
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
        """Convert values (used only for the float32 fallback: bf16 -> float32 is exact)."""
        raise NotImplementedError

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

    def differentiable_leaves(self, leaves: list) -> list:
        """``differentiable`` of each leaf (an adapter may answer for all at once, cheaper)."""
        return [self.differentiable(x) for x in leaves]

    def traced(self, leaves: list) -> bool:
        """Whether this call is being traced (jax under a transformation, a tf graph): its
        results must be declared before it runs. Default: never."""
        return False

    def call_foreign(self, call, leaves: list) -> list:
        """Caller side: run a ``functions.ForeignCall`` on this framework's input leaves so that
        this framework's autodiff reaches its backward; the output leaves, as this
        framework's tensors. Default (no autodiff): the forward alone."""
        return call.forward(leaves, False, self.name)[0]

    def outside_compiler(self, call):
        """``call`` wrapped to run outside this framework's graph compiler when one is tracing
        now (torch.compile), else None. Asked of every imported framework on each bridged call."""
        return None

    def vjp(self, fn, leaves: list, diff: list):
        """Callee side: ``fn(*leaves)`` (a list of output tensors) with this framework's own
        autodiff; returns (outputs, pullback) where ``pullback(cotangents)`` (one per output,
        None for none) gives one gradient per input leaf, None where ``diff`` is False."""
        raise NotImplementedError(f"{self.name} has no autodiff")
