"""Adversarial fuzzing of convert / plan / convert_tree over every dtype row of the table,
every framework pair and the input layouts that broke something once or might.

test_properties.py holds the properties for bf16 and numpy's own dtypes; this file aims at
what was built later and in one go: the narrow rows (fp8 x8, fp6 x2, fp4 and torch's packed
float4_e2m1fn_x2, the sub-byte ints), the capsule hand-over between frameworks, the hot
path's cache of zero-copy plans (``fastpath.CACHE``: keyed per input type, then on
``Adapter.fast_key``) and convert_tree's per-leaf-type use of it, and where the warnings point.

One oracle judges every call (``check``): the result holds the input's values bit for bit in
the dtype ``plan()`` named (or the exact widening, the raw carrier, the packed or unpacked
twin plan() announced), has the shape plan() said, shares memory exactly when plan() said so,
is writable exactly when plan() said so, and says (Bf16BridgeWarning) when it is a writable
alias of memory its owner treats as read-only; or the call raises a Bf16BridgeError, the
same one plan() raises. ``copy=True`` never shares, ``copy=False`` always does.

The cache is fuzzed by sequences: inputs of one type in different layouts, alignments,
flags and dtype rows converted one after another with the same keywords, each judged by
the same oracle, and each compared with the same call made again on an emptied cache.

Each step plan() calls zero-copy is run on its own and must keep the data pointer.

Examples are derandomized and bounded (the "ci" profile: about 15 seconds here, after the
frameworks' imports). The longer local run draws fresh and more:
``HYPOTHESIS_PROFILE=fuzz FUZZ_ROUTES_EXAMPLES=3000 FUZZ_ROUTES_SEQUENCES=600 pytest tests/core/test_fuzz_routes.py``.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import bf16bridge as bb
from bf16bridge.core import dtypes as bbd
from bf16bridge.core import fastpath, registry
from bf16bridge.core import warn as bb_warn
from conftest import PRESENT, fw, ptr, type_framework
from strategies import (ALIGN, Outcome, aligned_raw, attempt, bridge_warnings, lacks, numpy_holds, readonly_memory,
                        writable)

#: every row of the table numpy holds here; the narrow ones drawn most (inputs are made, and results
#: read, through numpy's dtype of the row: an ml_dtypes without a row, 0.3.1's fp6/fp4/int2/e8m0...,
#: leaves it out, and test_dtypes.py asserts our error naming the ml_dtypes that has it)
ROWS = tuple(d for d in bbd.NAMES if numpy_holds(d))
LOW_PRECISION = bbd.LOW_PRECISION


#: every framework's adapter, loaded before any example is drawn (what each holds decides the
#: draws, and importing a framework inside a draw touches the global random state); this run's
#: frameworks (all four in the full run; numpy and jax in .venv-numpy25)
ADAPTERS = {f: registry.get(f) for f in PRESENT}


def held(framework: str, dtype: str) -> bool:
    return ADAPTERS[framework].holds(dtype)


# -- building inputs, with each framework's own calls ------------------------------------


def _np_dtype(name: str) -> np.dtype:
    """The numpy dtype of row ``name`` (a packed row: its carrier, uint8)."""
    row = bbd.ROWS[name]
    if row.packing > 1:
        return np.dtype(row.carrier)
    return np.dtype(getattr(ml_dtypes, name)) if row.family != "standard" else np.dtype(name)


def _framework(x) -> str:
    if isinstance(x, (np.ndarray, np.generic)):
        return "numpy"
    return type_framework(x)


def _valid_bytes(name: str, raw: np.ndarray, seed: int) -> None:
    """Random bit patterns of row ``name`` into the uint8 buffer ``raw`` (padded rows: their
    low bits only, as ml_dtypes reads them; bool: 0/1)."""
    rng = np.random.default_rng(seed)
    row = bbd.ROWS[name]
    raw[...] = rng.integers(0, 256, raw.shape, dtype=np.uint8)
    if name == "bool":
        raw &= 1
    elif row.family == "narrow" and row.packing == 1 and row.bits < 8:
        raw &= (1 << row.bits) - 1


@dataclass(frozen=True)
class Spec:
    """One input. ``framework`` makes it; ``shape`` after slicing each axis by ``steps``
    and transposing by ``perm``; ``offset``: bytes past a 64-byte boundary (numpy) or
    elements into the storage (torch); ``kind`` one of the special makings below."""

    framework: str
    dtype: str
    shape: tuple
    steps: tuple = ()
    perm: tuple = ()
    offset: int = 0
    readonly: bool = False
    big_endian: bool = False
    kind: str = "plain"  # numpy: plain, memmap, subclass, scalar, broadcast; torch: plain, expand,
    #                     grad, neg; jax: plain, jit; tensorflow: plain, variable
    seed: int = 0

    def _numpy(self) -> np.ndarray:
        dt = _np_dtype(self.dtype)
        steps = self.steps or (1,) * len(self.shape)
        base = tuple(n * abs(k) for n, k in zip(self.shape, steps))
        count = math.prod(base)
        raw = aligned_raw(count * dt.itemsize, self.offset)
        _valid_bytes(self.dtype, raw, self.seed)
        if self.kind == "memmap":
            fd, path = tempfile.mkstemp(suffix=".bin")
            os.close(fd)
            raw.tofile(path)
            m = np.memmap(path, dtype=np.uint8, mode="r" if self.readonly else "r+", shape=raw.shape) \
                if raw.size else raw
            os.unlink(path)  # the mapping keeps the file alive
            raw = m
        a = raw.view(dt)
        if self.big_endian and dt.itemsize > 1:
            a = a.byteswap().view(dt.newbyteorder(">"))  # the same values, stored big-endian
        a = a.reshape(base)[(*(slice(None, None, k) for k in steps), ...)]
        if self.perm:
            a = a.transpose(self.perm)
        if self.kind == "subclass":
            a = a.view(_Sub)
        if self.kind == "broadcast":  # a leading axis of stride 0 (as_strided of a void view: its
            # __array_interface__ cannot name ml_dtypes' types)
            v = a.view(f"V{a.dtype.itemsize}")
            v = np.lib.stride_tricks.as_strided(v, (3, *v.shape), (0, *v.strides), writeable=not self.readonly)
            a = v.view(a.dtype)
        if self.readonly and a.flags.writeable:
            a.flags.writeable = False
        if self.kind == "scalar":
            return a.reshape(-1)[0] if a.size else a
        return a

    def build(self):
        if self.framework == "numpy":
            return self._numpy()
        a = Spec("numpy", self.dtype, self.shape, seed=self.seed)._numpy()
        if self.framework == "torch":
            torch = fw("torch")
            carrier = bbd.ROWS[self.dtype].carrier
            dt = getattr(torch, self.dtype)
            count = a.size + self.offset
            raw = aligned_raw(count * a.dtype.itemsize, 0).view(a.dtype)
            raw[self.offset:] = a.reshape(-1)
            t = (torch.from_numpy(raw.view(carrier)).view(dt) if carrier else torch.from_numpy(raw))
            t = t[self.offset:].reshape(self.shape)
            steps = self.steps or (1,) * len(self.shape)
            if any(k != 1 for k in steps):  # a strided view over a bigger base
                base = torch.empty(tuple(n * k for n, k in zip(self.shape, steps)), dtype=t.dtype)
                if carrier:
                    base.view(getattr(torch, carrier))[tuple(slice(None, None, k) for k in steps)] = \
                        t.view(getattr(torch, carrier))
                else:
                    base[tuple(slice(None, None, k) for k in steps)] = t
                t = base[tuple(slice(None, None, k) for k in steps)]
            if self.perm:
                t = t.permute(self.perm)
            if self.kind == "expand":  # a leading axis of stride 0
                t = t.as_strided((3, *t.shape), (0, *t.stride()), t.storage_offset())
            elif self.kind == "grad":
                t = t.detach().requires_grad_(True)
            elif self.kind == "neg":
                t = torch._neg_view(t)
            return t
        if self.framework == "jax":
            jax = fw("jax")
            from conftest import aligned_copy

            x = jax.device_put(aligned_copy(a))
            if self.kind == "jit":
                x = jax.jit(lambda v: v.reshape(-1).reshape(v.shape))(x)  # a buffer XLA made
            return x
        tf = fw("tensorflow")
        from conftest import aligned_copy

        x = tf.constant(aligned_copy(a))
        if self.kind == "variable":
            try:
                x = tf.Variable(x)
            except Exception:  # noqa: BLE001 - tensorflow has no variable kernels for some narrow rows
                assume(False)
        return x


@dataclass(frozen=True)
class Chained:
    """The input ``start`` after the bridge took it to ``via`` (copy=None): a tensor the bridge
    made (a torch tensor over jax memory, a jax array over torch's), converted again."""

    start: Spec
    via: tuple

    @property
    def dtype(self) -> str:
        return self.start.dtype

    def build(self):
        x = self.start.build()
        for to in self.via:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # making the input; the oracle judges the call
                try:
                    x = bb.convert(x, to, fallback="bits")
                except bb.Bf16BridgeError:
                    pass
        return x


class _Sub(np.ndarray):
    """A numpy subclass, as a library might return one."""


# -- reading values back -------------------------------------------------------------------


def values(x) -> np.ndarray:
    """The elements of any framework's tensor as a contiguous numpy array of the row's own
    numpy dtype (torch's packed fp4 and shell ints: their bytes as uint8, then viewed), read
    with the framework's own calls."""
    kind = _framework(x)
    if kind == "numpy":
        a = np.asarray(x)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("="))
        return np.ascontiguousarray(a)
    if kind == "torch":
        torch = fw("torch")
        t = x.detach().resolve_conj().resolve_neg().cpu()
        name = str(t.dtype).replace("torch.", "")
        row = bbd.ROWS[name]
        if row.carrier is not None:
            u = t.view(getattr(torch, row.carrier)).contiguous().numpy()
            return u if row.packing > 1 else u.view(_np_dtype(name))
        return t.contiguous().numpy()
    if kind in ("jax",):
        return np.array(x)
    tf = fw("tensorflow")
    if x.dtype == tf.bfloat16:
        return tf.bitcast(x, tf.uint16).numpy().view(_np_dtype("bfloat16"))
    return x.numpy()


def name_of(x) -> str:
    kind = _framework(x)
    if kind == "torch":
        return str(x.dtype).replace("torch.", "")
    if kind == "tensorflow":
        return "bfloat16" if x.dtype.name == "bfloat16" else bbd.name_of_numpy(x.dtype.as_numpy_dtype)
    return bbd.name_of_numpy(np.dtype(x.dtype))


def _low_bits(a: np.ndarray, name: str) -> np.ndarray:
    """The elements' bits, flat, as unsigned ints of the element's width (complex128: two
    uint64 each; padded rows: their low bits only)."""
    a = np.ascontiguousarray(a).reshape(-1)
    size = a.dtype.itemsize
    u = a.view(np.uint8) if a.dtype == bool else a.view(f"u{size if size <= 8 else 8}")
    row = bbd.ROWS[name]
    if row.family == "narrow" and row.packing == 1 and row.bits < 8:
        u = u & np.uint8((1 << row.bits) - 1)
    return u


def _unpack(u8: np.ndarray) -> np.ndarray:
    out = np.empty((*u8.shape[:-1], u8.shape[-1] * 2), np.uint8)
    out[..., 0::2] = u8 & 0x0F
    out[..., 1::2] = u8 >> 4
    return out


def expected(x_vals: np.ndarray, din: str, dout: str) -> np.ndarray:
    """What a result of row ``dout`` must hold for an input of row ``din`` with these values,
    as unsigned ints of its width (padded rows: their low bits)."""
    if dout == din:
        return _low_bits(x_vals, din)
    row = bbd.ROWS[din]
    if dout == row.carrier:  # fallback="bits": the raw patterns
        return np.ascontiguousarray(x_vals).view(dout)
    if bbd.PACKED.get(din) == dout:  # packed -> one a byte
        return _unpack(np.ascontiguousarray(x_vals).view(np.uint8))
    if bbd.UNPACKED.get(din) == dout:  # one a byte -> packed
        u = _low_bits(x_vals, din)
        return (u[..., 0::2] | (u[..., 1::2] << 4)).astype(np.uint8)
    if bbd.INT32_OF.get(din) == dout:
        return x_vals.astype(dout).view(f"u{np.dtype(dout).itemsize}")
    src = x_vals
    if row.packing > 1:
        src = _unpack(np.ascontiguousarray(x_vals).view(np.uint8)).view(_np_dtype(row.unpacked))
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = src.astype(_np_dtype(dout))
    return _low_bits(w, dout)


def _same(got: np.ndarray, want: np.ndarray, dout: str) -> bool:
    if got.shape != want.shape:
        return False
    if np.array_equal(got, want):
        return True
    dt = _np_dtype(dout)
    if bbd.ROWS[dout].kind == "float" and got.dtype.itemsize == dt.itemsize:
        # a widening may quiet a NaN's payload: NaN for NaN, every other element bit for bit
        g, w = np.isnan(got.view(dt).astype(np.float64)), np.isnan(want.view(dt).astype(np.float64))
        return bool(np.array_equal(g, w) and np.array_equal(got[~g], want[~w]))
    return False


# -- the oracle -----------------------------------------------------------------------------


def _ptr_or_none(x):
    try:
        if _framework(x) == "tensorflow" and hasattr(x, "read_value"):
            return None  # a Variable: its snapshot's memory is not its own
        if _framework(x) == "torch" and x.requires_grad:
            return x.data_ptr()
        if isinstance(x, np.generic):
            return None
        return ptr(x)
    except Exception:  # noqa: BLE001 - no pointer to compare
        return None


def _nbytes(x) -> int:
    return math.prod(tuple(np.shape(x))) if not hasattr(x, "shape") else math.prod(tuple(x.shape))


def _readonly_memory(x) -> bool:
    # strategies' own, for numpy subclasses and scalars too
    return readonly_memory(np.asarray(x) if _framework(x) == "numpy" else x)


def _writable(y) -> bool:
    return writable(np.asarray(y) if _framework(y) == "numpy" else y)


def _plan(x, to, kw):
    return attempt(bb.plan, x, to, **{k: v for k, v in kw.items() if k in ("copy", "fallback", "for_compute")})


def check(x, to, **kw):
    """Convert ``x`` and judge the result (see the module's docstring). Returns a short record
    of what happened, for comparing two runs of the same call."""
    x_vals = values(x)
    p = _plan(x, to, kw)
    out = attempt(bb.convert, x, to, **kw)
    if p.ok and out.ok:
        steps_keep_their_word(x, p.value)
    return judge(x, x_vals, p, out, to, kw)


def steps_keep_their_word(x, plan) -> None:
    """Run ``plan``'s steps one by one: each that plan() calls zero-copy keeps the data pointer,
    each that it calls a copy moves it (a step's claim, not only the route's: a hidden copy inside
    a route that copies anyway is a cost plan() does not show)."""
    if not plan.nbytes:
        return
    value = registry.get(plan.source).describe(x).value
    here = plan.source
    for step in plan.steps:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = step.run(value)
        try:
            before, after = registry.get(here).data_ptr(value), registry.get(step.framework).data_ptr(out)
        except bb.Bf16BridgeError:  # a tensorflow storage-only dtype has no pointer to read
            before = after = None
        if not step.copies:
            assert before == after, f"{plan.source} -> {plan.target}: step {step} copied\n{plan}"
        elif before is not None:
            assert before != after, f"{plan.source} -> {plan.target}: step {step} said it copies, and aliases\n{plan}"
        value, here = out, step.framework


def judge(x, x_vals, p, out, to, kw, warned=None):
    """Judge ``out`` (an Outcome of converting ``x``, whose values were ``x_vals`` before) against
    ``p`` (the Outcome of plan()). ``warned``: whether the call warned of ours (default: the
    outcome's own warnings)."""
    din = name_of(x)
    where = f"{_framework(x)} {din} {tuple(np.shape(x))} -> {to} {kw}"
    if p.ok and p.value.drops_grad and kw.get("on_grad") == "error":
        assert isinstance(out.error, bb.UnsupportedTypeError), f"{where}: on_grad='error' did not refuse: {out}"
        return ("error", "on_grad")
    if p.ok and p.value.alias is not None and kw.get("on_alias") == "error":
        assert isinstance(out.error, bb.CopyRequiredError), f"{where}: on_alias='error' did not refuse: {out}"
        return ("error", "on_alias")
    if p.ok and p.value.alias is not None and kw.get("on_alias") == "copy":
        p = _plan(x, to, {**kw, "copy": True})  # what convert does instead
    if out.error is not None:
        if p.ok:
            # plan() cannot know what a framework decides at run time: copy=False over a
            # step it verifies by pointer may still refuse; a checked narrowing (int64 -> int32,
            # fallback="auto") refuses values that do not fit
            kinds = {s.kind for s in p.value.steps}
            verified = any(s.verify for s in p.value.steps)
            assert ((isinstance(out.error, bb.CopyRequiredError) and kw.get("copy") is False and verified)
                    or (isinstance(out.error, bb.UnsupportedDtypeError) and "narrow" in kinds)), (
                f"{where}: plan() gave a route, convert() raised {out.error!r}\n{p.value}")
        else:
            assert type(out.error) is type(p.error), f"{where}: plan raised {p.error!r}, convert {out.error!r}"
        return ("error", type(out.error).__name__)
    assert p.ok, f"{where}: convert() worked where plan() raised {p.error!r}"
    plan = p.value
    y = out.value
    assert _framework(y) == registry.resolve(to) and not isinstance(y, np.generic), f"{where}: got a {type(y)}"
    dout = name_of(y)
    assert dout == plan.dtype_out, f"{where}: plan said {plan.dtype_out}, got {dout}"
    # never a silent widening: another dtype only where the fallback asked allows it, and said why
    row = bbd.ROWS[din]
    allowed = {din, bbd.PACKED.get(din), bbd.UNPACKED.get(din)}
    fallback = kw.get("fallback", "error")
    if fallback == "bits":
        allowed.add(row.carrier)
    elif fallback == "float32":
        allowed |= {"float32"} & set(row.widenings or bbd.ROWS[row.unpacked or din].widenings)
    elif fallback == "auto":
        allowed |= {row.carrier, bbd.INT32_OF.get(din), *row.widenings, *(bbd.ROWS[row.unpacked].widenings if row.unpacked else ())}
    assert dout in allowed, f"{where}: {din} arrived as {dout}, which fallback={fallback!r} does not allow"
    assert dout == din or plan.decision, f"{where}: {din} arrived as {dout} and plan() says no why"
    assert tuple(y.shape) == tuple(plan.result_shape), f"{where}: plan said shape {plan.result_shape}, got {tuple(y.shape)}"
    if _framework(y) == "tensorflow" and _nbytes(y) and dout in bbd.ALL:
        # before any tensorflow call reads it: its first kernel on an unaligned buffer aborts the process
        assert ptr(y) % ALIGN == 0, f"{where}: an unaligned tensorflow result\n{plan}"
    got = _low_bits(values(y), dout)
    want = np.ascontiguousarray(expected(x_vals, din, dout)).reshape(-1)
    assert _same(got, want, dout), f"{where}: wrong bits ({din} -> {dout})\ngot  {got.reshape(-1)[:8]}\nwant {want.reshape(-1)[:8]}\n{plan}"
    # the input is never changed
    assert np.array_equal(_low_bits(values(x), din), _low_bits(x_vals, din)), f"{where}: the input changed"
    px, py = _ptr_or_none(x), _ptr_or_none(y)
    nonempty = _nbytes(y) > 0
    if px is not None and py is not None and nonempty:
        assert (px == py) == plan.shares_memory, (
            f"{where}: plan says shares_memory={plan.shares_memory}, pointers {px:#x} {py:#x}\n{plan}")
    if kw.get("copy") is True and px is not None and py is not None and nonempty:
        assert px != py, f"{where}: copy=True shares memory"
    if kw.get("copy") is False and nonempty and px is not None and py is not None:
        assert px == py, f"{where}: copy=False copied\n{plan}"
    assert _writable(y) == plan.writable, f"{where}: plan says writable={plan.writable}\n{plan}"
    ours = len(bridge_warnings(out)) if warned is None else int(warned)
    alias = nonempty and plan.shares_memory and _writable(y) and _readonly_memory(x)
    if alias:
        on_alias = kw.get("on_alias", "warn")
        assert on_alias in ("warn", "allow"), f"{where}: on_alias={on_alias!r} gave a writable alias\n{plan}"
        if on_alias == "warn":
            assert ours, f"{where}: a writable alias of read-only memory, and no warning\n{plan}"
    if plan.drops_grad and kw.get("on_grad", "warn") == "warn":
        assert ours, f"{where}: the input's gradient does not cross, and no warning"
    return ("ok", dout, tuple(y.shape), plan.shares_memory, plan.writable, ours)


# -- strategies ------------------------------------------------------------------------------


@st.composite
def specs(draw, frameworks=PRESENT, rows=None, kinds=True):
    framework = draw(st.sampled_from(frameworks))
    pool = [d for d in (rows or ROWS) if (held(framework, d) or framework == "numpy") and d in ROWS]
    pool = [d for d in pool if held(framework, d)]
    if framework == "jax":
        pool = [d for d in pool if d not in ("int64", "uint64", "float64", "complex128")]
    narrow = [d for d in pool if d in LOW_PRECISION]
    if not pool:
        pool = ["bfloat16"]
    dtype = draw(st.sampled_from(narrow * 3 + pool if narrow else pool))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim)))
    row = bbd.ROWS[dtype]
    if row.packing > 1 and shape and draw(st.booleans()):
        shape = (*shape[:-1], max(shape[-1], 1))  # packed rows: non-empty last axis more often
    steps: tuple = ()
    perm: tuple = ()
    offset = 0
    readonly = big_endian = False
    kind = "plain"
    if framework == "numpy":
        steps = tuple(draw(st.sampled_from([1, 1, 2, -1, -2])) for _ in shape)
        perm = tuple(draw(st.permutations(range(len(shape)))))
        offset = draw(st.sampled_from([0, 0, 1, 2, 8, 16, 32]))
        readonly = draw(st.booleans())
        big_endian = row.itemsize > 1 and draw(st.sampled_from([False, False, True]))
        if kinds:
            kind = draw(st.sampled_from(["plain", "plain", "memmap", "subclass", "scalar", "broadcast"]))
    elif framework == "torch":
        steps = tuple(draw(st.sampled_from([1, 1, 2])) for _ in shape)
        perm = tuple(draw(st.permutations(range(len(shape)))))
        offset = draw(st.integers(0, 3))
        floating = ADAPTERS["torch"].holds(dtype) and bbd.ROWS[dtype].kind == "float"
        if kinds:
            # torch's fp8 and packed fp4 may require grad too; its lazy neg bit is for the wider floats
            kind = draw(st.sampled_from(["plain", "expand"] + ["grad"] * floating
                                        + ["neg"] * (dtype in ("bfloat16", "float16", "float32", "float64"))))
    elif framework == "jax" and kinds:
        kind = draw(st.sampled_from(["plain", "jit"]))
    elif framework == "tensorflow" and kinds:
        kind = draw(st.sampled_from(["plain", "variable"]))
    return Spec(framework, dtype, shape, steps, perm, offset, readonly, big_endian, kind,
                draw(st.integers(0, 2**16)))


targets = st.sampled_from(PRESENT)
chained = st.builds(Chained, specs(kinds=False), st.lists(targets, min_size=1, max_size=2).map(tuple))
inputs = st.one_of(specs(), chained)
copies = st.sampled_from([None, True, False])
on_alias = st.sampled_from(["warn", "copy", "error", "allow"])
on_grad = st.sampled_from(["warn", "error", "drop"])
fallbacks = st.sampled_from(["error", "float32", "bits", "auto"])


# -- the properties ----------------------------------------------------------------------------


@settings(max_examples=int(os.environ.get("FUZZ_ROUTES_EXAMPLES", 300)))
@given(spec=inputs, to=targets, copy=copies, fallback=fallbacks, compute=st.booleans())
def test_every_row_every_pair_every_layout(spec, to, copy, fallback, compute):
    x = spec.build()
    check(x, to, copy=copy, fallback=fallback, for_compute=compute and fallback == "auto")


def _fresh(fn):
    """``fn()`` with convert's cache of zero-copy plans emptied first and restored after."""
    saved = dict(fastpath.CACHE)
    fastpath.clear()
    try:
        return fn()
    finally:
        fastpath.clear()
        fastpath.CACHE.update(saved)


@settings(max_examples=int(os.environ.get("FUZZ_ROUTES_SEQUENCES", 60)))
@given(framework=st.sampled_from(PRESENT), data=st.data(), to=targets, copy=copies, fallback=fallbacks)
def test_cached_plans_answer_as_a_fresh_plan_does(framework, data, to, copy, fallback):
    # one input type, many layouts and rows, the same keywords, jax's x64 flag switched between
    # calls: every call after the first of a kind is served from the cache, if its key says it is
    # the same kind
    seq = data.draw(st.lists(st.tuples(specs(frameworks=(framework,)), st.booleans()), min_size=2, max_size=6),
                    label="sequence")
    jax = fw("jax")
    was = jax.config.jax_enable_x64
    fastpath.clear()
    try:
        for spec, x64 in seq:
            jax.config.update("jax_enable_x64", x64)
            x = spec.build()
            warm = check(x, to, copy=copy, fallback=fallback)
            cold = _fresh(lambda: check(x, to, copy=copy, fallback=fallback))
            assert warm == cold, f"{spec} -> {to}: served from the cache {warm}, planned afresh {cold}"
    finally:
        jax.config.update("jax_enable_x64", was)


@settings(max_examples=int(os.environ.get("FUZZ_ROUTES_EXAMPLES", 300)) // 2)
@given(spec=inputs, to=targets, copy=copies, fallback=fallbacks, alias=on_alias, grad=on_grad)
def test_on_alias_and_on_grad_on_every_row(spec, to, copy, fallback, alias, grad):
    assume(not (alias == "copy" and copy is False))  # refused as a contradiction before anything runs (test_convert_checks.py)
    x = spec.build()
    check(x, to, copy=copy, fallback=fallback, on_alias=alias, on_grad=grad)


@settings(max_examples=int(os.environ.get("FUZZ_ROUTES_SEQUENCES", 60)))
@given(leaves=st.lists(specs(), min_size=1, max_size=8), to=targets, copy=copies, fallback=fallbacks,
       alias=st.sampled_from(["warn", "allow"]), grad=st.sampled_from(["warn", "drop"]))
def test_convert_tree_twice_judges_every_leaf(leaves, to, copy, fallback, alias, grad):
    # mixed leaf types, each type seen more than once and the tree converted twice: the second
    # pass and every repeated leaf type take convert_tree's per-type cache lookup
    xs = [spec.build() for spec in leaves]
    xs = xs + xs[::-1]
    kw = dict(copy=copy, fallback=fallback, on_alias=alias, on_grad=grad)
    vals = [values(x) for x in xs]
    plans = [_plan(x, to, kw) for x in xs]
    for _ in range(2):
        tree = {"a": xs[: len(xs) // 2], "b": tuple(xs[len(xs) // 2:])}
        got = attempt(bb.convert_tree, tree, to, on_unsupported="keep", **kw)
        if not got.ok:
            # "keep" keeps a leaf no route takes; a refusal the caller chose (copy=False) still raises
            assert copy is False and isinstance(got.error, bb.CopyRequiredError), (
                f"convert_tree raised {got.error!r} under on_unsupported='keep'")
            assert any(isinstance(attempt(bb.convert, x, to, **kw).error, bb.CopyRequiredError) for x in xs), (
                f"convert_tree raised {got.error!r}, and no leaf's convert does")
            return
        ys = [*got.value["a"], *got.value["b"]]
        warned = bool(bridge_warnings(got))
        for x, v, p, y in zip(xs, vals, plans, ys):
            if not p.ok:
                assert y is x, f"a leaf plan() refuses ({p.error!r}) was not kept as it is"
                continue
            if y is x and registry.framework_of(x) != registry.resolve(to):
                # kept: convert_tree met an error plan() cannot foresee (see judge)
                one = attempt(bb.convert, x, to, **kw)
                judge(x, v, p, one, to, kw)
                assert not one.ok, "convert_tree kept a leaf that convert() converts"
                continue
            judge(x, v, p, Outcome(value=y), to, kw, warned=warned)


#: inputs the fuzzing found wrong once (the report of branch fuzz-convert), each run through the
#: oracle: (input, target, keywords)
REGRESSIONS = [
    # numpy's astype allocated the widened array unaligned, the planner took it as aligned, and
    # tensorflow imported it zero-copy: its first kernel on it aborted the process
    (Spec("numpy", "float8_e3m4", (3, 2, 3), (-1, -2, 1), (0, 1, 2), seed=3), "tensorflow", {"fallback": "float32"}),
    (Spec("numpy", "float6_e2m3fn", (5,), seed=4), "tensorflow", {"fallback": "auto"}),
    (Spec("numpy", "float8_e8m0fnu", (7,), offset=2, seed=5), "tensorflow", {"fallback": "float32"}),
    # a 0-d tensorflow tensor of a storage-only row left as a numpy scalar: to numpy a scalar, not
    # an array; to torch a raw TypeError from torch.from_numpy
    (Spec("tensorflow", "float8_e4m3fn", (), seed=6), "numpy", {}),
    (Spec("tensorflow", "int4", (), seed=7), "torch", {"copy": True}),
    (Spec("tensorflow", "float8_e5m2fnuz", (), seed=8), "jax", {}),
    # torch's Tensor.to keeps a strided input's strides: the widened tensor, taken as contiguous,
    # met tensorflow's DLPack import ("Invalid strides array from DLPack", raw)
    (Spec("torch", "float8_e8m0fnu", (2, 3, 1), (1, 2, 1), (2, 1, 0), offset=1, seed=10), "tensorflow",
     {"fallback": "float32"}),
    # a 0-d packed fp4 (two values in one byte) took a widening that unpacks: a raw IndexError
    (Spec("torch", "float4_e2m1fn_x2", (), offset=2, seed=11), "numpy", {"fallback": "float32"}),
    (Spec("torch", "float4_e2m1fn_x2", (), seed=12), "jax", {"fallback": "auto"}),
    # jax 0.4.30 (the oldest declared) widened a 0-d fp8 (tensorflow 2.16 holds no fnuz) into a buffer
    # 32 bytes past a 64-byte boundary, which tensorflow then imported zero-copy: its first kernel on
    # it aborts the process
    (Spec("jax", "float8_e4m3fnuz", (), seed=0), "tensorflow", {"fallback": "float32"}),
    # jax's bit-cast copies, and copy=False took it all the same
    (Spec("jax", "float8_e4m3b11fnuz", (4,), seed=13), "torch", {"copy": False, "fallback": "bits"}),
    (Spec("jax", "float8_e3m4", (2, 2), seed=14), "torch", {"copy": False, "fallback": "bits"}),
]


@pytest.mark.parametrize("spec,to,kw", [pytest.param(*r, marks=pytest.mark.frameworks(r[0].framework))
                                        for r in REGRESSIONS], ids=lambda v: getattr(v, "dtype", None) or str(v))
def test_what_the_fuzzing_found(spec, to, kw):
    if lacks(spec.dtype):
        return
    if not held(spec.framework, spec.dtype):  # (tensorflow 2.16 has no fnuz fp8): said, by name
        assert spec.dtype in ADAPTERS[spec.framework].cannot_hold(spec.dtype)
        return
    check(spec.build(), to, **kw)


@pytest.mark.frameworks("tensorflow")
def test_tensorflow_storage_only_rows_to_jax_plan_their_copies():
    # Tensor.numpy's copy is numpy's own allocation, 64-byte aligned only by chance: plan() showed
    # jax.device_put after it as zero-copy where jax then copied (sizes vary the chance)
    # (tensorflow 2.16, the oldest declared, has no e4m3b11fnuz: e4m3fn is storage-only there too)
    dtype = next(d for d in ("float8_e4m3b11fnuz", "float8_e4m3fn") if held("tensorflow", d))
    for n in range(1, 41):
        check(Spec("tensorflow", dtype, (n,), seed=n).build(), "jax")


# -- our warnings, against warnings.warn itself -----------------------------------------------------

_SITE = """
import bf16bridge as bb

def one(x):
    return bb.convert(x, "torch")

def other(x):
    return bb.convert(x, "torch")

def tree(xs):
    return bb.convert_tree(xs, "torch")
"""


def _sites(n: int) -> list:
    """``n`` modules of call sites, each with its own globals (and warnings registry)."""
    import types

    out = []
    for k in range(n):
        m = types.ModuleType(f"fuzzsite{k}")
        exec(compile(_SITE, f"<fuzzsite{k}>", "exec"), m.__dict__)
        out.append(m)
    return out


def _plain_warn(message: str, above: int = 1) -> None:
    """core.warn.warn as warnings.warn does it from the first frame outside the package, found by
    walking every frame up from the caller (no hint of where to start)."""
    level, f = 2, sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(bb_warn.PACKAGE_DIR):
        level, f = level + 1, f.f_back
    warnings.warn(message, bb.Bf16BridgeWarning, stacklevel=level)


_ACTIONS = ["default", "always", "once", "module", "ignore", "error"]
_steps = st.one_of(
    st.tuples(st.just("filter"), st.sampled_from(_ACTIONS), st.sampled_from([None, 0, 1])),
    st.tuples(st.just("call"), st.sampled_from(["one", "other", "tree"]), st.integers(0, 1), st.integers(0, 1)),
    st.tuples(st.just("clear"), st.integers(0, 1)),
)


def _replay(steps, inputs, warn) -> list:
    """What the user is shown along ``steps`` with ``warn`` as core.warn.warn."""
    shown: list = []
    saved = bb_warn.warn
    bb_warn.warn = warn
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.onceregistry.clear()
            warnings.showwarning = lambda message, category, filename, lineno, *a, **k: shown.append(
                (str(message)[:60], filename, lineno))
            sites = _sites(2)
            for step in steps:
                if step[0] == "filter":
                    _, action, module = step
                    kw = {} if module is None else {"module": f"fuzzsite{module}$"}
                    warnings.filterwarnings(action, category=bb.Bf16BridgeWarning, **kw)
                elif step[0] == "call":
                    _, fn, k, which = step
                    x = inputs[which]
                    try:
                        getattr(sites[k], fn)([x, x] if fn == "tree" else x)
                    except bb.Bf16BridgeWarning as err:  # an "error" filter
                        shown.append(("raised", str(err)[:60]))
                else:
                    sites[step[1]].__dict__.get("__warningregistry__", {}).clear()
    finally:
        bb_warn.warn = saved
    return shown


#: sequences the fuzzing found wrong once (in a memory of what warnings had shown, since removed)
_FOUND = [
    # CPython's "once" is once per module registry: the message, shown once from one module, was
    # remembered as shown everywhere, and a second module's call was silenced
    [("filter", "once", None), ("call", "one", 0, 0), ("call", "one", 1, 0)],
    [("filter", "once", None), ("call", "one", 0, 1), ("call", "other", 0, 1), ("call", "tree", 1, 1),
     ("call", "other", 1, 1)],
]


@pytest.mark.frameworks("torch")  # its calls convert to torch (one, other, tree)
@pytest.mark.parametrize("steps", _FOUND)
def test_warnings_as_found(steps):
    test_warnings_show_what_warnings_itself_shows.hypothesis.inner_test(steps)


@pytest.mark.frameworks("torch")
@settings(max_examples=int(os.environ.get("FUZZ_ROUTES_SEQUENCES", 60)))
@given(steps=st.lists(_steps, min_size=1, max_size=12))
def test_warnings_show_what_warnings_itself_shows(steps):
    # a jax and a tensorflow input, each a writable alias in torch: two messages
    inputs = [Spec("jax", "bfloat16", (4,)).build(), Spec("tensorflow", "bfloat16", (4,)).build()]
    real = _replay(steps, inputs, bb_warn.warn)
    plain = _replay(steps, inputs, _plain_warn)
    assert real == plain
