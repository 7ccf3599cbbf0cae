"""Hypothesis strategies for the property tests: one strategy per concept of an
awkward input (dtype, shape, slicing steps, transposes, byte offsets, byte
order, structured-array fields, zero strides, read-only flags, scalars, copy
modes, fallbacks, targets, chains).

An input is drawn as a small *spec* (a frozen dataclass with a readable repr)
and built from it, so a failing example prints as something one can paste
into a reproducer, not as an array dump. Inputs are built with each
framework's own calls, never with bf16bridge's.

Two things the tests never do themselves, because they take the process down:
hand ``torch.from_dlpack`` a negatively strided numpy array, and hand
tensorflow a buffer that is not 64-byte aligned. Only the bridge is given such
inputs; handling them is its job.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import bf16bridge as bb
from bf16bridge.core import dtypes as bb_dtypes
from conftest import BF16, FRAMEWORKS, PRESENT, dtype_name, fw, make, ptr, type_framework

# -- profiles -----------------------------------------------------------------
# CI: derandomized (the same examples every run) and bounded, so the property
# files take about a minute on a 2-core machine. "fuzz": random and longer, for
# hunting locally: HYPOTHESIS_PROFILE=fuzz pytest tests/core/test_properties.py
_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("ci", derandomize=True, max_examples=60, **_COMMON)
settings.register_profile("fuzz", derandomize=False, max_examples=500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: every dtype the bridge carries (bf16 and the standard ones)
DTYPES = bb_dtypes.ALL

#: the table's rows NumPy cannot hold here, with the library's reason: an ml_dtypes older than the
#: row (0.3.1 has no fp6/fp4/int2, nor float8_e8m0fnu/e4m3/e3m4; torch's packed fp4 then has no
#: values row either). Asked of the table, never of version strings; test_dtypes.py checks it
#: against ml_dtypes' own attributes.
NUMPY_LACKS: dict[str, str] = {
    d: why for d in bb_dtypes.NAMES if (why := bb_dtypes.numpy_missing(d)) is not None
    and bb_dtypes.values_missing(d) is not None}


def numpy_holds(dtype: str) -> bool:
    """Whether numpy (this ml_dtypes) holds ``dtype``'s values: a packed row's, one a byte."""
    return dtype not in NUMPY_LACKS


def needs_newer_ml_dtypes(dtype: str) -> str:
    """The regex our UnsupportedDtypeError matches for a row this ml_dtypes lacks: the row, the
    ml_dtypes version that has it, and the way out."""
    row = bb_dtypes.ROWS[bb_dtypes.PACKED.get(dtype, dtype)]
    return rf"ml_dtypes [^ ]+ has no {row.name} \(ml_dtypes >= {re.escape(str(row.ml_dtypes))} does\): upgrade ml_dtypes"


def lacks(dtype: str) -> bool:
    """True where this ml_dtypes has no ``dtype`` (a packed row: no row of its values); then our
    error, naming the ml_dtypes that has it, is asserted for making a numpy dtype of it, and a test
    that needs a numpy array of it has nothing else to run."""
    if numpy_holds(dtype):
        return False
    with pytest.raises(bb.UnsupportedDtypeError, match=needs_newer_ml_dtypes(dtype)):
        bb_dtypes.numpy_dtype(bb_dtypes.PACKED.get(dtype, dtype))
    return True


def dtype_names(choices=DTYPES):
    """A dtype name; bf16, the reason this library exists, about half the time
    (repeated in the list: ``one_of(just(...), ...)`` draws it far less often)."""
    return st.sampled_from(("bfloat16",) * len(choices) + tuple(choices))

#: jax narrows these unless jax_enable_x64 is on, so they cannot be made as jax inputs
WIDE = frozenset({"int64", "uint64", "float64", "complex128"})
ALIGN = 64

# -- dtypes, values, bits -------------------------------------------------------


def np_dtype(name: str, order: str = "=") -> np.dtype:
    dt = BF16 if name == "bfloat16" else np.dtype(name)
    return dt.newbyteorder(order) if dt.itemsize > 1 else dt


def carrier(dt: np.dtype) -> np.dtype:
    """The unsigned-integer dtype that views ``dt``'s bytes, in ``dt``'s byte order
    (complex: two unsigned ints, real and imaginary part)."""
    order = ">" if dt.byteorder == ">" or (dt.byteorder == "=" and not np.little_endian) else "<"
    if dt.kind == "c":
        return np.dtype((np.dtype(f"{order}u{dt.itemsize // 2}"), 2))
    return np.dtype(f"{order}u{dt.itemsize}") if dt.itemsize > 1 else np.dtype(np.uint8)


def value_bits(a) -> np.ndarray:
    """The bits of every element of numpy array ``a``, as native unsigned ints in
    row-major order, whatever ``a``'s strides, offset and byte order. Reads
    ``a`` through a same-size view only, so it never copies through ``a``'s dtype."""
    a = np.asarray(a)
    c = carrier(a.dtype)
    return a.view(c).astype(c.base.newbyteorder("=")).reshape(-1)


def as_numpy(y) -> np.ndarray:
    """Any framework's tensor as a numpy array of the same dtype, by that framework's calls."""
    kind = type_framework(y)
    if kind == "numpy" or isinstance(y, np.generic):  # an ml_dtypes scalar's module is ml_dtypes
        return np.asarray(y)
    if kind == "torch":
        torch = fw("torch")
        t = y.detach().resolve_conj().resolve_neg().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.uint16).numpy().view(BF16)
        return t.numpy()
    if kind == "jax":
        return np.asarray(y)
    tf = fw("tensorflow")
    if y.dtype == tf.bfloat16:
        return tf.bitcast(y, tf.uint16).numpy().view(BF16)
    return y.numpy()


def result_bits(y) -> np.ndarray:
    """``value_bits`` of a result in any framework. A tensorflow result must be
    64-byte aligned before any tf call reads it (an unaligned one aborts the
    process in the first kernel): that is checked first."""
    if type_framework(y) == "tensorflow" and math.prod(y.shape):
        assert ptr(y) % ALIGN == 0, "the bridge returned a tensorflow tensor that is not 64-byte aligned"
    return value_bits(as_numpy(y))


def fill(raw: np.ndarray, seed: int, boolean: bool) -> None:
    """Random bytes (every bit pattern: NaN payloads, -0, subnormals); 0/1 for bool."""
    rng = np.random.default_rng(seed)
    raw[...] = rng.integers(0, 2 if boolean else 256, raw.shape, dtype=np.uint8)


def aligned_raw(nbytes: int, offset: int) -> np.ndarray:
    """A writable uint8 buffer of ``nbytes`` starting ``offset`` bytes past a 64-byte boundary."""
    raw = np.empty(nbytes + 2 * ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN + offset
    return raw[start:start + nbytes]


# -- numpy inputs ---------------------------------------------------------------


@dataclass(frozen=True)
class NumpySpec:
    """A numpy array: ``dtype`` in byte order ``order``, ``shape`` after slicing each
    axis with ``steps`` and transposing by ``perm``; its buffer starts ``offset``
    bytes past a 64-byte boundary; ``pad`` > 0 makes it the field of a structured
    array (after ``pad`` bytes of another field, so the stride is itemsize + pad);
    ``broadcast`` >= 0 prepends an axis of that length with stride 0."""

    dtype: str
    shape: tuple
    steps: tuple
    perm: tuple
    offset: int = 0
    order: str = "="
    pad: int = 0
    broadcast: int = -1
    readonly: bool = False
    seed: int = 0

    def build(self) -> np.ndarray:
        dt = np_dtype(self.dtype, self.order)
        base_shape = tuple(n * abs(k) for n, k in zip(self.shape, self.steps))
        count = math.prod(base_shape)
        rec = np.dtype([("pad", f"V{self.pad}"), ("v", dt)]) if self.pad else dt
        raw = aligned_raw(count * rec.itemsize, self.offset)
        fill(raw, self.seed, boolean=self.dtype == "bool")
        a = raw.view(rec)["v"] if self.pad else raw.view(dt)
        # the trailing Ellipsis keeps a 0-d array an array (a[()] would give a scalar)
        a = a.reshape(base_shape)[(*(slice(None, None, k) for k in self.steps), ...)].transpose(self.perm)
        if self.broadcast >= 0:
            a = np.lib.stride_tricks.as_strided(a, (self.broadcast, *a.shape), (0, *a.strides),
                                                writeable=not self.readonly)
        if self.readonly:
            a.flags.writeable = False
        return a


@st.composite
def shapes_and_steps(draw, max_dims=5, negative=True):
    """A shape of 0 to ``max_dims`` axes (lengths 0-4: empty arrays included), a
    slicing step per axis (negative ones only where ``negative``) and a transpose."""
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=max_dims)))
    choices = [1, 2, 3, -1, -2] if negative else [1, 2, 3]
    steps = tuple(draw(st.sampled_from(choices)) for _ in shape)
    perm = tuple(draw(st.permutations(range(len(shape)))))
    return shape, steps, perm


@st.composite
def numpy_specs(draw, dtypes=DTYPES, order=None, pad=None, broadcast=None, offset=None):
    """A NumpySpec; each keyword, when given, is the strategy for that feature (to
    aim a share of the examples at one concept), else the feature is drawn rarely."""
    dtype = draw(dtype_names(dtypes))
    shape, steps, perm = draw(shapes_and_steps())
    return NumpySpec(
        dtype=dtype, shape=shape, steps=steps, perm=perm,
        # 0, 2, ..., 62 bytes past a 64-byte boundary: aligned for jax/tf or not,
        # element-aligned or not (an odd element offset for 4- and 8-byte dtypes)
        offset=draw(offset if offset is not None else st.sampled_from([0, 0, 0, *range(2, 64, 2)])),
        order=draw(order if order is not None else st.sampled_from(["=", "=", ">"])),  # big-endian: must arrive as native values
        pad=draw(pad if pad is not None else st.sampled_from([0, 0, 0, 1, 2, 4, 8])),  # complex64 at stride 12: pad=4
        broadcast=draw(broadcast if broadcast is not None else st.sampled_from([-1, -1, -1, 0, 1, 3])),
        readonly=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


#: the concepts, each given a share of the examples
big_endian_specs = numpy_specs(order=st.just(">"))
#: a field of a structured array: a stride that is not a multiple of the item size.
#: Complex fields after 4, 8 or 12 bytes stay element-aligned (numpy aligns complex
#: to its parts), so no copy is forced: the case DLPack refuses (complex64 at stride 12)
field_specs = numpy_specs(dtypes=("complex64", "complex128"), pad=st.sampled_from([4, 8, 12, 1, 2]))
zero_stride_specs = numpy_specs(broadcast=st.sampled_from([0, 1, 3]))
offset_specs = numpy_specs(offset=st.integers(1, 31).map(lambda k: 2 * k), order=st.just("="))


# -- torch inputs ---------------------------------------------------------------


@dataclass(frozen=True)
class TorchSpec:
    """A torch tensor over an aligned numpy buffer ``offset`` elements in, sliced with
    positive ``steps`` and permuted; ``expand`` >= 0 prepends an axis of that length
    with stride 0; ``conj``/``neg`` set torch's lazy bits
    (complex / signed floats only); ``grad`` asks for requires_grad (floats only)."""

    dtype: str
    shape: tuple
    steps: tuple
    perm: tuple
    offset: int = 0
    expand: int = -1
    conj: bool = False
    neg: bool = False
    grad: bool = False
    seed: int = 0

    def build(self):
        torch = fw("torch")
        dt = np_dtype(self.dtype)
        base_shape = tuple(n * k for n, k in zip(self.shape, self.steps))
        count = math.prod(base_shape)
        raw = aligned_raw((count + self.offset) * dt.itemsize, 0)
        fill(raw, self.seed, boolean=self.dtype == "bool")
        a = raw.view(dt)
        t = (torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16) if self.dtype == "bfloat16"
             else torch.from_numpy(a))
        t = t[self.offset:].reshape(base_shape)[tuple(slice(None, None, k) for k in self.steps)]
        t = t.permute(self.perm)
        if self.expand >= 0:
            # as_strided, not expand: expand keeps a length-1 axis's old stride, and a
            # stride of 0 on a length-1 axis is what went wrong once (issue 16 item 3)
            t = t.as_strided((self.expand, *t.shape), (0, *t.stride()), t.storage_offset())
        if self.conj:
            t = t.conj()
        if self.neg:
            t = torch._neg_view(t)
        if self.grad:
            t = t.detach().requires_grad_(True)
        return t


@st.composite
def torch_specs(draw, dtypes=DTYPES, expand=None):
    dtype = draw(dtype_names(dtypes))
    shape, steps, perm = draw(shapes_and_steps(negative=False))  # torch has no negative strides
    floating = dtype in ("bfloat16", "float16", "float32", "float64", "complex64", "complex128")
    return TorchSpec(
        dtype=dtype, shape=shape, steps=steps, perm=perm,
        offset=draw(st.integers(0, 64 // np_dtype(dtype).itemsize - 1)),
        expand=draw(expand if expand is not None else st.sampled_from([-1, -1, -1, 0, 1, 3])),
        conj=draw(st.booleans()) if dtype.startswith("complex") else False,
        neg=draw(st.booleans()) if floating and not dtype.startswith("complex") else False,
        grad=draw(st.booleans()) if floating else False,
        seed=draw(st.integers(0, 2**16)),
    )


torch_expand_specs = torch_specs(expand=st.sampled_from([0, 1, 3]))


# -- jax and tensorflow inputs: dense, made by the framework --------------------------


@dataclass(frozen=True)
class MadeSpec:
    """A jax or tensorflow tensor made by the framework from an aligned copy of random bits."""

    framework: str
    dtype: str
    shape: tuple
    seed: int = 0

    def build(self):
        dt = np_dtype(self.dtype)
        raw = aligned_raw(math.prod(self.shape) * dt.itemsize, 0)
        fill(raw, self.seed, boolean=self.dtype == "bool")
        return make(self.framework, raw.view(dt).reshape(self.shape))


@st.composite
def made_specs(draw, frameworks=("jax", "tensorflow")):
    framework = draw(st.sampled_from(frameworks))
    choices = [d for d in DTYPES if not (framework == "jax" and d in WIDE)]
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=5)))
    return MadeSpec(framework, draw(dtype_names(choices)), shape, draw(st.integers(0, 2**16)))


# -- numpy scalars ------------------------------------------------------------------


@dataclass(frozen=True)
class ScalarSpec:
    """A numpy scalar (np.generic) of ``dtype`` holding the bits ``seed`` picks."""

    dtype: str
    seed: int = 0

    def build(self):
        dt = np_dtype(self.dtype)
        raw = np.empty(dt.itemsize, np.uint8)
        fill(raw, self.seed, boolean=self.dtype == "bool")
        return raw.view(dt)[0]


scalar_specs = st.builds(ScalarSpec, dtype_names(), st.integers(0, 2**16))

@dataclass(frozen=True)
class ChainedSpec:
    """The input ``start`` after the bridge took it through ``via`` (copy=None): a
    tensor the bridge made (a jax array over torch memory, a tf tensor imported
    zero-copy, ...), which the next call must handle as well as a fresh one."""

    start: object
    via: tuple

    def build(self):
        x = self.start.build()
        for to in self.via:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # building the input; the tests judge warnings
                try:
                    x = bb.convert(x, to)
                except bb.Bf16BridgeError:
                    pass
        return x


#: the frameworks an input passes through first: jax and tensorflow most, their
#: imports are where memory changes hands
vias = st.lists(st.sampled_from([*(f for f in ("jax", "tensorflow") if f in PRESENT), *PRESENT]), min_size=1,
                max_size=2).map(tuple)
chained_specs = st.builds(ChainedSpec, st.one_of(numpy_specs(), torch_specs(), torch_expand_specs), vias)

#: every kind of tensor input, by concept; the tests run each concept with its own
#: examples, so none depends on a share of one random stream
CONCEPTS = {
    "numpy": numpy_specs(),
    "big-endian": big_endian_specs,
    "structured-field": field_specs,
    "zero-stride": zero_stride_specs,
    "offset": offset_specs,
    "torch": torch_specs(),
    "torch-expand": torch_expand_specs,
    "jax-tf": made_specs(),
    "chained": chained_specs,
    # what jax and tensorflow make of zero-stride views (a jax array over a stride-0 torch view)
    "chained-zero-stride": st.builds(ChainedSpec, st.one_of(zero_stride_specs, torch_expand_specs),
                                     st.sampled_from([("jax",), ("tensorflow",)])),
    # inputs that broke a promise once, each run through every property (hypothesis
    # enumerates a short list): issue 16 items 1, 3, 5, 11, and the hot path's cache
    "regressions": st.sampled_from([
        NumpySpec("bfloat16", (3,), (1,), (0,), order=">", seed=1),
        NumpySpec("complex64", (3,), (1,), (0,), pad=4, seed=2),
        NumpySpec("complex128", (2, 2), (1, 1), (1, 0), pad=8, seed=3),
        ChainedSpec(TorchSpec("bfloat16", (2,), (1,), (0,), expand=1, seed=4), ("jax",)),
        ChainedSpec(TorchSpec("bfloat16", (0,), (1,), (0,)), ("jax",)),
        ChainedSpec(TorchSpec("bfloat16", (0, 3), (1, 1), (0, 1)), ("tensorflow",)),
        NumpySpec("bfloat16", (1000,), (1,), (0,), offset=2, readonly=True, seed=5),
        TorchSpec("bfloat16", (3,), (1,), (0,), neg=True, seed=6),
        TorchSpec("complex64", (2, 3), (1, 2), (1, 0), conj=True, seed=7),
        # one complex128 8 bytes past a 16-byte boundary (numpy calls it aligned)
        NumpySpec("complex128", (1,), (1,), (0,), offset=8, seed=8),
    ]),
}
specs = st.one_of(*CONCEPTS.values())


# -- trees (convert_tree) ---------------------------------------------------------


Pair = namedtuple("Pair", "w b")


class Couple(tuple):
    """A tuple subclass whose constructor takes its items as separate arguments."""

    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))


def _defaultdict(items):
    d = defaultdict(list)
    d.update(items)
    return d


#: leaves: small bf16 arrays (built from specs) and the values a tree keeps as they are
tree_leaves = st.one_of(
    numpy_specs(dtypes=("bfloat16",)).filter(lambda s: s.broadcast < 0).map(lambda s: s.build()),
    st.integers(-3, 3), st.text(max_size=3), st.text(max_size=3).map(np.str_), st.none(),
)
_keys = st.text("abc", min_size=1, max_size=2)
#: nested containers of every kind convert_tree promises to keep
trees = st.recursive(tree_leaves, lambda kids: st.one_of(
    st.lists(kids, max_size=3),
    st.lists(kids, max_size=3).map(tuple),
    st.dictionaries(_keys, kids, max_size=3),
    st.dictionaries(_keys, kids, max_size=3).map(OrderedDict),
    st.dictionaries(_keys, kids, max_size=3).map(_defaultdict),
    st.builds(Pair, kids, kids),
    st.builds(Couple, kids, kids),
), max_leaves=8)


# -- keywords ---------------------------------------------------------------------

targets = st.sampled_from(PRESENT)  # this run's frameworks (all four in the full run)
copy_modes = st.sampled_from([None, True, False])
#: values of copy= that are not None/True/False: each must raise our error, never be
#: read as a bool (0 == False would share lru_cache keys with False)
bad_copy_modes = st.sampled_from([0, 1, np.False_, np.True_, "yes", "", 2, 0.0, [], None.__class__])
fallbacks = st.sampled_from(["error", "float32", "bits", "auto"])
bad_fallbacks = st.sampled_from(["float16", "", "ERROR", None, 0, ["float32"]])

#: a chain of 1 to 6 conversions: (target, copy mode) for each
chains = st.lists(st.tuples(targets, copy_modes), min_size=1, max_size=6)


# -- running a conversion ---------------------------------------------------------------


@dataclass
class Outcome:
    """What one call did: its value, or our error; and the warnings it gave."""

    value: object = None
    error: BaseException | None = None
    warned: tuple = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def attempt(fn, *args, **kwargs) -> Outcome:
    """Call ``fn``; keep a Bf16BridgeError as the outcome, let any other exception
    fail the test (a foreign exception is a bug). Warnings are recorded, not
    raised (pytest turns warnings into errors here)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn(*args, **kwargs)
        except bb.Bf16BridgeError as err:
            return Outcome(error=err, warned=tuple(caught))
    return Outcome(value=value, warned=tuple(caught))


def bridge_warnings(outcome: Outcome) -> list:
    """The warnings of ours among an outcome's (category named Bf16BridgeWarning or a subclass)."""
    return [w for w in outcome.warned
            if any(c.__name__ == "Bf16BridgeWarning" for c in getattr(w.category, "__mro__", ()))]


#: what fallback="auto" narrows where the target cannot hold 64 bits (jax without x64), every value checked
NARROWED = {"int64": "int32", "uint64": "uint32"}


def same_bits(y, expected_bits: np.ndarray, dtype_in: str, auto: bool = False) -> str | None:
    """None if ``y`` holds exactly ``expected_bits`` (values of ``dtype_in``), allowing
    the two fallbacks a bf16 input may take: exact widening to float32, raw uint16
    bits; with ``auto`` (fallback="auto"), also a 64-bit integer narrowed to 32 bits
    holding the same values. Otherwise, a message saying what differs."""
    out = dtype_name(y)
    got = result_bits(y)
    if out == dtype_in or (dtype_in == "bfloat16" and out == "uint16"):
        want = expected_bits
    elif dtype_in == "bfloat16" and out == "float32":
        want = expected_bits.astype(np.uint32) << 16
    elif auto and NARROWED.get(dtype_in) == out:
        values = expected_bits.view(dtype_in)
        if got.shape != values.shape or not np.array_equal(got.view(out).astype(dtype_in), values):
            return f"{dtype_in} narrowed to {out} changed values: got {got.view(out)[:8]} want {values[:8]}"
        return None
    else:
        return f"dtype {dtype_in} arrived as {out}"
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)[:4] if got.shape == want.shape else "shape"
        return f"bits differ ({out}): at {bad}: got {got[:8]} want {want[:8]}"
    return None


def nonempty(x) -> bool:
    return math.prod(np.shape(x) if not hasattr(x, "shape") else tuple(x.shape)) > 0


def readonly_memory(x) -> bool:
    """Memory its owner treats as read-only or immutable: a read-only numpy array,
    any jax or tensorflow tensor."""
    kind = type_framework(x)
    if kind == "numpy":
        return not np.asarray(x).flags.writeable
    return kind in ("jax", "tensorflow")


def writable(y) -> bool:
    kind = type_framework(y)
    if kind == "numpy":
        return bool(y.flags.writeable)
    return kind == "torch"
