"""NumPy (bf16 through ml_dtypes). NumPy <= 2.4 cannot pass bf16 over DLPack,
so bf16 crosses as a uint16 bit-view, which is free."""

from __future__ import annotations

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core.memory import aligned_bytes, aligned_empty
from bf16bridge.errors import InvalidArgumentError, UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.adapters import numpy_registry as _numpy_registry
from bf16bridge.adapters.numpy_internals import data_pointer
from bf16bridge.core.adapter import ALIGN, CONTIGUOUS, NEGATIVE, Adapter, Source, layout_of


class _WritableAlias:
    """Shows read-only memory as writable, only to hand it over DLPack to an
    immutable framework (jax, tensorflow), which never writes to it. NumPy's
    DLPack export refuses read-only arrays (its protocol version cannot flag
    them); keeping a reference to the original keeps the memory alive."""

    def __init__(self, a: np.ndarray):
        self._keep = a
        iface = dict(a.__array_interface__)
        iface["data"] = (iface["data"][0], False)
        self.__array_interface__ = iface


#: NumPy 2.5's DLPack dtype registry: the table's bf16 and fp8 rows registered where ml_dtypes
#: has not (nothing to register on NumPy <= 2.4), and which rows numpy passes over DLPack,
#: found by trying its own round trip (none in NumPy <= 2.4)
REGISTRATION = _numpy_registry.register()


class NumpyAdapter(Adapter):
    name = "numpy"
    marks_readonly = True
    host_only = True
    dlpack_export = frozenset(dtypes.STANDARD) | REGISTRATION.passes  # no bf16 nor fp8 in NumPy <= 2.4
    dlpack_import = dlpack_export
    dlpack_accepts = NEGATIVE
    label_bitview = "ndarray.view({dtype})"
    label_import = "numpy.from_dlpack"
    label_copy = "copy into a 64-byte aligned array"
    max_nbytes = int(np.iinfo(np.intp).max)  # numpy's "array is too big" beyond it, a view too

    def cannot_hold(self, dtype):
        if dtype == "bfloat16" and dtypes.bfloat16 is None:
            return f"ml_dtypes is unusable: {dtypes.ML_DTYPES_ERROR}"
        return dtypes.numpy_missing(dtype)

    def casts(self, src, dst):
        return self.holds(src) and self.holds(dst)  # ml_dtypes' astype: the reference itself

    def describe(self, x, *, alignment: bool = True) -> Source:
        notes: tuple[str, ...] = ()
        _refuse_masked(x)
        scalar = isinstance(x, np.generic)
        if scalar:
            x = np.asarray(x)
            notes = ("a numpy scalar is taken as a 0-d array",)
        name = dtypes.name_of_numpy(x.dtype)
        if name is None:
            raise UnsupportedDtypeError(
                f"numpy array of dtype {x.dtype} is not moved by bf16bridge; supported: {', '.join(dtypes.NAMES)}"
            )
        must_copy = None
        itemsize = x.dtype.itemsize
        if scalar:
            # a fresh 0-d array each call, aligned or not by chance: the result is always a copy
            must_copy = "a numpy scalar has no memory of its own to share"
        elif not x.dtype.isnative:
            must_copy = f"the array is in non-native byte order ({x.dtype.str}), which DLPack cannot carry"
        elif not x.flags.aligned:
            must_copy = "the buffer is not aligned to its element size"
        elif any(st % itemsize for st in x.strides):
            # a field of a structured array: strides in bytes that no element stride expresses
            must_copy = f"its strides {x.strides} are not whole multiples of its {itemsize}-byte elements"
        elif x.size and x.__array_interface__["data"][0] % itemsize:
            # numpy aligns complex128 to half an element; an importer's kernels may load whole ones
            must_copy = f"the buffer is not aligned to its {itemsize}-byte elements"
        ptr = x.__array_interface__["data"][0]
        return Source(
            value=x, dtype=name, shape=x.shape, nbytes=x.nbytes,
            # numpy calls an array with a negative stride on a dimension of size 0 or 1 contiguous;
            # torch.from_numpy refuses it all the same
            layout=(CONTIGUOUS if x.flags.c_contiguous and min(x.strides, default=0) >= 0
                    else layout_of(x.shape, [st // itemsize for st in x.strides])),
            aligned=ptr % ALIGN == 0, readonly=not x.flags.writeable, device="cpu",
            must_copy=must_copy, notes=notes,
        )

    def fast_key(self, x, alignment):
        if type(x) is not np.ndarray:
            return None  # scalars, masked arrays and other subclasses: the full path
        f = x.flags
        if not f.aligned or not x.size:
            return None  # (empty arrays: the full path)
        dt = x.dtype
        if not f.c_contiguous:
            layout = _layout(x.shape, x.strides, dt.itemsize)
            if layout is None:
                return None
        elif 1 in x.shape and _layout(x.shape, x.strides, dt.itemsize) != CONTIGUOUS:
            return None  # a size-1 dimension's stride negative, or no whole number of elements: the full path
        else:
            layout = CONTIGUOUS
        if alignment or dt.alignment < dt.itemsize:  # complex: numpy's alignment is half an element
            ptr = data_pointer(x)  # an ndarray itself (checked above)
            if not dt.itemsize or ptr % dt.itemsize:  # (itemsize 0: jax's float0; describe refuses it)
                return None  # describe copies it: the full path
            return (dt, f.writeable, layout, alignment and ptr % ALIGN == 0)
        return (dt, f.writeable, layout, False)

    def data_ptr(self, x) -> int:
        return x.__array_interface__["data"][0]

    def bitview(self, x, dtype):
        return x.view(dtypes.numpy_dtype(dtype))

    def bitview_to(self, dtype):
        to = dtypes.numpy_dtype(dtype)

        # a method call by name: ndarray.view through operator.methodcaller (or unbound) takes the
        # slower calling convention, which costs more than this frame
        def view(x):
            return x.view(to)

        return view

    def export(self, x, readonly):
        return np.asarray(_WritableAlias(x)) if readonly else x

    def from_dlpack(self, obj):
        return np.from_dlpack(obj)

    def exporter(self, readonly):
        return super().exporter(readonly) if readonly else None

    def importer(self):
        return np.from_dlpack

    def copy(self, x):
        dtype = x.dtype.newbyteorder("=")
        # a contiguous source is copied by memcpy: its destination goes where memcpy runs fastest
        like = x.__array_interface__["data"][0] if x.flags.c_contiguous else None
        out = aligned_bytes(x.nbytes, like).view(dtype).reshape(x.shape)
        if x.dtype.name in dtypes.BITS_OF:  # copy the bits: numpy's loops for ml_dtypes types are slower
            bits = np.dtype(dtypes.BITS_OF[x.dtype.name])
            # read the bits in the input's byte order, so a big-endian input is swapped, not garbled
            out.view(bits)[...] = x.view(bits.newbyteorder(x.dtype.byteorder))
        else:
            out[...] = x
        return out

    packs = True
    label_pack = "kernels.pack_nibbles ({dtype} bytes, element 2i in the low nibble)"
    label_unpack = "kernels.unpack_nibbles ({dtype})"

    def pack(self, x, dtype):
        from bf16bridge.core.nibbles import pack_nibbles  # (loaded on first use, as the dtypes it packs are rare)

        out = aligned_empty((*x.shape[:-1], x.shape[-1] // 2) if x.ndim else (), dtypes.BITS_OF[dtype])
        try:
            return pack_nibbles(x, out=out)
        except InvalidArgumentError as err:  # a byte packing would change: say which step refused it
            raise InvalidArgumentError(f"packing {x.dtype.name} as {dtype} (the target holds it packed), {err}") from err

    def unpack(self, x, dtype):
        from bf16bridge.core.nibbles import unpack_into

        # (the planner unpacks only a uint8 array of at least one dimension; a kept plan's 0-d input is sent
        # back to it by this refusal)
        if not x.ndim:
            raise InvalidArgumentError("a 0-d packed array has no last dimension to unpack along")
        values = dtypes.numpy_dtype(dtypes.PACKED[dtype])  # (aligned_bytes: aligned_empty without its checks)
        return unpack_into(x, aligned_bytes(2 * x.size).view(values).reshape(*x.shape[:-1], 2 * x.shape[-1]))

    fits_int = True

    def fit_int(self, x, dtype):
        info = np.iinfo(dtype)
        if x.size and (x.min() < info.min or x.max() > info.max):
            raise UnsupportedDtypeError(
                f"fallback='auto' narrows {x.dtype} to {dtype} only when every value fits, and this array "
                f"holds values in [{x.min()}, {x.max()}], outside [{info.min}, {info.max}]; turn on 64-bit "
                "mode in jax (jax.config.update('jax_enable_x64', True)), or narrow it yourself"
            )
        out = aligned_empty(x.shape, dtype)
        out[...] = x
        return out

    def mark_readonly(self, x):
        if not x.flags.writeable:
            return x
        view = x.view()  # never change the flags of an array someone else holds
        view.flags.writeable = False
        return view

    def astype(self, x, dtype):
        _refuse_masked(x)  # the cast below is a plain array: cast_tree would drop the mask without a word
        # into an aligned array: the planner takes a widened array as this adapter's own copy
        # (copies_aligned), and hands it to importers that need alignment (tensorflow's kernels
        # abort the process on an unaligned buffer); numpy's own allocation of a small array is not
        out = aligned_empty(x.shape, dtype)
        if dtype == "float32" and x.dtype.name == "bfloat16" and x.flags.c_contiguous and x.dtype.isnative:
            return _widen_bf16(x, out)
        out[...] = x  # numpy's cast, as astype runs it (a same-kind or wider one: exact widenings only)
        return out

    def cast(self, x, dtype):
        if type(x) is np.ndarray:
            return self.astype(x, dtype)
        _refuse_masked(x)
        # ndarray.astype keeps a scalar a scalar and a subclass its class (np.matrix, whose * is a matrix
        # product: a plain array's is elementwise); the same cast, so the same bits
        # (numpy's and ml_dtypes' casts of NaN and overflow warn through errstate: the rounding defines
        # them; no catch_warnings, whose restore races another thread's and can leave "ignore" behind)
        with np.errstate(all="ignore"):
            return x.astype(dtypes.numpy_dtype(dtype))


ADAPTER = NumpyAdapter()


def _layout(shape, strides, itemsize: int) -> int | None:
    """describe's layout class of an array, from its strides in bytes; None where a stride is no whole
    number of elements (a structured array's field: describe copies it)."""
    elements = []
    for st in strides:
        if st % itemsize:
            return None
        elements.append(st // itemsize)
    return layout_of(shape, elements)


def _widen_bf16(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """bf16 to float32 into ``out``, exactly, chunk by chunk on threads (extra memory bounded by a chunk)."""
    from bf16bridge.core.chunks import CHUNK, Progress, spread  # (loaded on first use)

    src, dst = x.reshape(-1).view(np.uint16), out.reshape(-1).view(np.uint32)
    spread(_widen_bits, False, src, dst, CHUNK, None, Progress(src.size, "bf16 -> float32", None))
    return out


def _widen_bits(src: np.ndarray, dst: np.ndarray) -> None:
    if dtypes.bfloat16 is not None:  # ml_dtypes' own cast, the reference
        np.copyto(dst.view(np.float32), src.view(dtypes.bfloat16))
    else:  # the same bits: bf16's 16 bits are the top half of the float32
        np.left_shift(src, 16, out=dst, dtype=np.uint32)


def _refuse_masked(x) -> None:
    if isinstance(x, np.ma.MaskedArray):
        raise UnsupportedTypeError(
            "a numpy masked array would lose its mask; pass a.filled(value) or a.data explicitly"
        )
