"""The safetensors format: its dtype codes, reading and checking a header, laying one out.

A file is 8 bytes (the header's length ``n``, little-endian), ``n`` bytes of UTF-8 JSON, then
the data. The JSON is an object: each tensor's key maps to ``{"dtype": code, "shape": [...],
"data_offsets": [begin, end]}``, and the optional ``"__metadata__"`` to an object of strings.
Offsets count from the data's start, and the tensors cover the data exactly: sorted by offset,
the first begins at 0, each begins where the last ended, the last ends at the end of the file.
safetensors' own reader (its Rust crate, ``Metadata::validate``) refuses holes and overlaps, so
a writer cannot pad between tensors; it can pad the header with spaces (JSON whitespace, which
every reader skips), and it chooses the tensors' order.
"""

from __future__ import annotations

import functools
import json
import math
import os
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np

from bf16bridge.checkpoints import decoder
from bf16bridge.core import dtypes
from bf16bridge.errors import CheckpointError, InvalidArgumentError

def fspath(path, what: str) -> str:
    """``path`` as a str, or InvalidArgumentError naming what was given (3, None, "", a NUL
    character: no file's path)."""
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        raise InvalidArgumentError(f"{what}: the path must be a str or an os.PathLike (pathlib.Path); got "
                                   f"{type(path).__name__} {path!r}") from None
    if not p or "\0" in p:
        raise InvalidArgumentError(f"{what}: {p!r} is no file's path ("
                                   + ("empty" if not p else "it holds a NUL character") + "); pass the file's path")
    return p


#: the largest header read, as safetensors' own cap (MAX_HEADER_SIZE): a length past it is refused
MAX_HEADER = 100_000_000
#: bytes of the length prefix
PREFIX = 8
#: the alignment jax and tensorflow need to take a buffer without copying it
ALIGN = 64
METADATA_KEY = "__metadata__"

#: safetensors' dtype codes (its Rust crate's ``Dtype``, 0.8) -> (our dtype name, bits a value)
CODES: Mapping[str, tuple[str, int]] = types.MappingProxyType({
    "BOOL": ("bool", 8), "U8": ("uint8", 8), "I8": ("int8", 8),
    "I16": ("int16", 16), "U16": ("uint16", 16), "I32": ("int32", 32), "U32": ("uint32", 32),
    "I64": ("int64", 64), "U64": ("uint64", 64),
    "F16": ("float16", 16), "BF16": ("bfloat16", 16), "F32": ("float32", 32), "F64": ("float64", 64),
    "C64": ("complex64", 64),
    "F8_E4M3": ("float8_e4m3fn", 8), "F8_E5M2": ("float8_e5m2", 8), "F8_E8M0": ("float8_e8m0fnu", 8),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8), "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8),
    # packed: two (F4) or four-in-three-bytes (F6) values a byte run; ml_dtypes holds one a byte
    "F4": ("float4_e2m1fn", 4), "F6_E2M3": ("float6_e2m3fn", 6), "F6_E3M2": ("float6_e3m2fn", 6),
})
#: packed two values a byte, element 2i in the low nibble (the order torch's float4_e2m1fn_x2 has,
#: which safetensors' torch loader hands the file's bytes to): unpacked on reading, packed on writing
NIBBLES = frozenset({"F4"})
#: packed four values in three bytes, in an order no reader here defines: listed, checked, raw() only
UNPACKED = frozenset({"F6_E2M3", "F6_E3M2"})
#: our dtype name -> safetensors' code
NAMES: Mapping[str, str] = types.MappingProxyType({name: code for code, (name, _) in CODES.items()})


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype that holds a file dtype (ml_dtypes for bf16 and the fp8 family); the table's
    error, naming the ml_dtypes that has it, where this one does not."""
    return dtypes.numpy_dtype(name)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry, checked: what ``Checkpoint.info(key)`` returns (reads no data)."""

    key: str
    dtype: str  # our name: "bfloat16", "float8_e4m3fn", ...
    code: str  # the file's code: "BF16", "F8_E4M3", ...
    shape: tuple[int, ...]
    offset: int  # where its bytes begin in the file (absolute)
    nbytes: int

    @classmethod
    def _make(cls, key: str, dtype: str, code: str, shape: tuple[int, ...], offset: int, nbytes: int) -> TensorInfo:
        """The same as ``TensorInfo(...)``, for the checks of every entry of a load: a frozen dataclass's
        ``__init__`` sets each field through ``object.__setattr__``, three times as long as this."""
        t = object.__new__(cls)
        t.__dict__.update(key=key, dtype=dtype, code=code, shape=shape, offset=offset, nbytes=nbytes)
        return t

    @property
    def aligned(self) -> bool:
        """Whether its bytes begin on a 64-byte boundary of the file (and so of a memory map)."""
        return self.offset % ALIGN == 0

    @property
    def packed(self) -> bool:
        """More than one value a byte (F4, F6): not one numpy element a value in the file."""
        return CODES[self.code][1] < 8


class Entries(Mapping[str, TensorInfo]):
    """The entries of a header, read-only: key -> TensorInfo, in the JSON's order. The JSON's dicts
    (or msgspec's typed entries) stay inside; a key's entry is checked (``_entry``: its dtype, shape
    and size) and its TensorInfo (frozen) built the first time it is asked for, since a file lists
    hundreds of tensors and a caller often wants one. What ties the entries together (their offsets)
    was checked at open."""

    __slots__ = ("_raw", "_built", "_data_start", "_path")

    def __init__(self, raw: dict, data_start: int, path: str):
        # key -> {"dtype": code, "shape": [...], "data_offsets": [begin, end]} or a decoder.Entry, offsets checked
        self._raw = raw
        self._built: dict[str, TensorInfo] = {}
        self._data_start = data_start
        self._path = path

    def __getitem__(self, key: str) -> TensorInfo:
        t = self._built.get(key)
        if t is None:
            raw = self._raw[key]  # KeyError if none
            check = _entry if type(raw) is dict else _typed_entry
            t = self._built[key] = check(self._path, key, raw, self._data_start)
        return t

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"<{len(self)} checkpoint entries>"

    @property
    def nbytes(self) -> int:
        """The data's bytes: every tensor's, summed."""
        return sum(end - begin for begin, end in map(_offsets, self._raw.values()))


def _offsets(entry) -> tuple[int, int]:
    """An entry's (begin, end), checked at open: from json's dict or msgspec's Entry."""
    begin, end = entry["data_offsets"] if type(entry) is dict else entry.data_offsets
    return begin, end


@dataclass(frozen=True)
class Header:
    """A checked header: the tensors in file order, the metadata, where the data begins. Holds
    nothing a caller could change (the entries and the metadata are read-only mappings)."""

    path: str
    length: int  # n, the JSON's bytes
    keys: tuple[str, ...]  # in file order: by (begin, end), the JSON's order among equals
    metadata: Mapping[str, str]  # read-only
    #: key -> its TensorInfo (each entry checked and built on first use; the offsets of all at open)
    entries: Entries = field(repr=False)

    @property
    def data_start(self) -> int:
        return PREFIX + self.length

    @property
    def tensors(self) -> tuple[TensorInfo, ...]:
        return tuple(self.info(k) for k in self.keys)

    @property
    def file_size(self) -> int:
        return self.data_start + self.entries.nbytes

    def info(self, key: str) -> TensorInfo:
        """The entry of ``key`` (KeyError if none; CheckpointError if its dtype, shape or size is
        wrong), checked and built once."""
        return self.entries[key]


def _bad(path: str, what: str, key: str | None = None) -> CheckpointError:
    where = f" (key {key!r})" if key is not None else ""
    return CheckpointError(f"{path}: {what}{where}; the file is damaged or not a safetensors file: "
                           "save it again, or check that it was copied whole")


def header_length(prefix: bytes, path: str, file_size: int) -> int:
    """The header's length from the file's first 8 bytes, checked against the cap and the file's size."""
    if len(prefix) < PREFIX or file_size < PREFIX:
        raise _bad(path, f"the file has {file_size} bytes, fewer than the 8 of a header's length")
    n = int.from_bytes(prefix[:PREFIX], "little")
    if n > MAX_HEADER:
        raise _bad(path, f"the header's length is {n} bytes, past the cap of {MAX_HEADER}")
    if PREFIX + n > file_size:
        raise _bad(path, f"the header's length ({n} bytes) runs past the end of the file ({file_size} bytes)")
    return n


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):  # a key named twice: find which, to name it
        seen: set = set()
        for k, _ in pairs:
            if k in seen:
                raise _Duplicate(k)
            seen.add(k)
    return out


class _Duplicate(Exception):
    pass


def _loads(text: str, path: str, hook=None):
    try:  # json.loads given any keyword builds a decoder of its own: none unless a hook is asked for
        return json.loads(text) if hook is None else json.loads(text, object_pairs_hook=hook)
    except _Duplicate as dup:
        raise _bad(path, "the header's JSON names a key twice", str(dup)) from None
    except RecursionError:
        raise _bad(path, "the header's JSON nests too deep") from None
    except ValueError as err:
        raise _bad(path, f"the header is not JSON ({err})") from None


def parse_header(raw: bytes, path: str, file_size: int) -> Header:
    """Check a header's JSON (``raw``: the n bytes after the prefix) against a file of ``file_size``
    bytes: the JSON, its keys, the metadata and every entry's data_offsets (which must cover the
    data); each entry's dtype, shape and size are checked when it is first asked for
    (``Header.info``). Anything a reader could trip on raises CheckpointError naming the file and
    the key. Decoded by msgspec where it is installed and takes the JSON (``decoder``), else by json:
    the same answer either way."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise _bad(path, f"the header is not UTF-8 ({err.reason} at byte {err.start})") from None
    length = len(raw)
    # msgspec's typed entries, where installed and the JSON is strict and regular (an escape: json's path)
    typed = None if b"\\" in raw else decoder.decode(raw)
    checked = None if typed is None else _typed(typed, raw, PREFIX + length, file_size)
    if checked is None:
        obj = _loads(text, path)  # json's own dicts: a key named twice keeps its last value, checked below
        if type(obj) is dict:
            checked = _all_at_once(obj, text, PREFIX + length, file_size)
    if checked is not None:
        keys, entries, metadata = checked
        return Header(path, length, keys, types.MappingProxyType(metadata), Entries(entries, PREFIX + length, path))
    # something irregular (or a file written otherwise than safetensors and bb.save write): parsed
    # again, naming a key given twice, and checked key by key, which names the fault
    return _one_by_one(_loads(text, path, _pairs), path, length, file_size)


def _typed(obj: dict, raw: bytes, data_start: int, file_size: int):
    """_all_at_once for msgspec's typed entries (decoder.Entry: dtype a str, shape whole numbers,
    data_offsets two whole numbers, each None where left out or null), with the same answer: None for
    anything irregular (json's path then checks it), else (the keys in file order, the entries,
    metadata). The metadata's member was typed as an Entry too: decoded again alone."""
    named = METADATA_KEY in obj
    metadata: dict = {}
    if named:
        del obj[METADATA_KEY]
        decoded = decoder.metadata(raw)  # (a JSON null there is no Entry: msgspec refused the header)
        if decoded is None:
            return None
        metadata = decoded
    n = len(obj)
    # no key named twice, no field more: the count of quotes, as _all_at_once, given that every entry
    # has a string dtype and a shape (a field left out is None here: its missing quotes could make up
    # for a dropped member's)
    if b"\\" in raw or raw.count(b'"') != 2 * (named + 5 * n + 2 * len(metadata)):
        return None
    entries = obj.values()
    if None in map(_DTYPE, entries) or None in map(_SHAPE, entries):
        return None
    offsets = list(map(_DATA_OFFSETS, entries))
    if not n:
        return ((), obj, metadata) if data_start == file_size else None
    try:  # data_offsets left out or null (None)
        begins = list(map(itemgetter(0), offsets))
    except TypeError:
        return None
    keys = _in_file_order(list(obj), offsets, begins, list(map(itemgetter(1), offsets)), data_start, file_size)
    return None if keys is None else (keys, obj, metadata)


_DTYPE, _SHAPE, _DATA_OFFSETS = attrgetter("dtype"), attrgetter("shape"), attrgetter("data_offsets")


def _all_at_once(obj: dict, text: str, data_start: int, file_size: int):
    """The checks of the header as a whole in a few passes over lists (C loops: map, sorted),
    or None for anything irregular, which _one_by_one then names. Takes exactly what _one_by_one
    takes, and checks the same things: no key named twice; metadata an object of strings; every entry
    an object whose data_offsets are two whole numbers, 0 <= begin <= end, the entries sorted by
    (begin, end) covering the data from 0 to the end of the file with no hole and no overlap. Each
    entry's dtype, shape and size are checked when it is first asked for (``_entry``, by Entries).
    Returns (the keys in file order, the entries, metadata)."""
    named = METADATA_KEY in obj
    metadata = obj.pop(METADATA_KEY, None)
    if metadata is None:
        metadata = {}
    elif type(metadata) is not dict or not set(map(type, metadata.values())) <= {str}:
        return None
    n = len(obj)
    # no key named twice (json kept the last one): without a backslash, each JSON string is two
    # quotes of the text; if each entry holds the three fields and a string code (checked below:
    # anything else is irregular), the text holds exactly the strings parsed unless a member was
    # dropped, or an entry has a string more (a field, in its shape or offsets)
    if "\\" in text or text.count('"') != 2 * (named + 5 * n + 2 * len(metadata)):
        return None
    entries = obj.values()
    keys = list(obj)
    if not n:
        return ((), obj, metadata) if data_start == file_size else None
    try:  # a missing field (KeyError), an entry that is no object (TypeError)
        if not set(map(type, map(itemgetter("dtype"), entries))) <= {str}:
            return None
        offsets = list(map(itemgetter("data_offsets"), entries))
        if not all(map(dict.__contains__, entries, repeat("shape"))) or not set(map(len, offsets)) <= {2}:
            return None
        # two items each (an object's are its keys: KeyError; a string's are strings, refused below)
        begins = list(map(itemgetter(0), offsets))
        ends = list(map(itemgetter(1), offsets))
    except (KeyError, TypeError):
        return None
    if not set(map(type, begins + ends)) <= {int}:
        return None  # type(True) is bool and 2.0 a float: neither is an offset
    in_order = _in_file_order(keys, offsets, begins, ends, data_start, file_size)
    return None if in_order is None else (in_order, obj, metadata)


def _in_file_order(keys: list[str], offsets: list, begins: list[int], ends: list[int], data_start: int,
                   file_size: int) -> tuple[str, ...] | None:
    """The keys sorted by their entries' (begin, end) (whole numbers, in lists or tuples), or None where
    the spans do not cover the data from 0 to the end of the file with no hole and no overlap."""
    # entries that cover the data from 0 in the JSON's order are in (begin, end) order already (each
    # begins where the one before it ended, and none ends before it begins): sorted only if not
    if not _covers(begins, ends):
        in_order = sorted(offsets)  # by (begin, end)
        if in_order == offsets:
            return None  # not from 0, a begin that is not the end before it (a hole or an overlap), or end < begin
        keys = [k for _, k in sorted(zip(offsets, keys), key=itemgetter(0))]  # stable: the JSON's order among equals
        begins = list(map(itemgetter(0), in_order))
        ends = list(map(itemgetter(1), in_order))
        if not _covers(begins, ends):
            return None
    if data_start + ends[-1] != file_size:
        return None
    return tuple(keys)


def _covers(begins: list[int], ends: list[int]) -> bool:
    """Whether spans (begin, end), in this order, cover 0 to the last end: each begins where the one
    before it ended, and none ends before it begins (the ends never go down)."""
    return begins[0] == 0 <= ends[0] and begins[1:] == ends[:-1] and sorted(ends) == ends


def _one_by_one(obj, path: str, length: int, file_size: int) -> Header:
    if not isinstance(obj, dict):
        raise _bad(path, f"the header is a JSON {type(obj).__name__}, not an object")
    metadata = obj.pop(METADATA_KEY, None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad(path, "__metadata__ is not an object of strings", METADATA_KEY)
    # each entry's dtype, shape and size are checked when it is first asked for (Entries, _entry)
    spans = sorted([(*_span(path, key, entry), key) for key, entry in obj.items()], key=itemgetter(0, 1))
    at = 0  # from the data's start
    for begin, end, key in spans:
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else "leaves a hole before it"
            if at == 0:
                what = "does not start at offset 0 (the first tensor must)"
            raise _bad(path, f"its data_offsets {what}", key)
        at = end
    if PREFIX + length + at != file_size:
        last = spans[-1][2] if spans else None
        what = "ends before the end of the file (bytes left over)" if PREFIX + length + at < file_size else \
            f"runs past the end of the file ({file_size} bytes)"
        raise _bad(path, f"the data {what}", last)
    return Header(path, length, tuple(key for _, _, key in spans), types.MappingProxyType(metadata),
                  Entries(obj, PREFIX + length, path))


def _int(v) -> bool:
    return type(v) is int  # not bool, not float: JSON 2.0 is no size


#: the most bytes the non-zero dimensions of a shape may span: numpy refuses an array, even an
#: empty one, whose non-zero dimensions times its item size pass an intp
_MAX_BYTES = 2 ** 63 - 1


#: dimensions every numpy's arrays take (NPY_MAXDIMS before numpy 2): max_dims() is asked only past it
_ANY_NUMPY_DIMS = 32
_INT = frozenset({int})
_ONE = (1,)


@functools.lru_cache(maxsize=1)
def max_dims() -> int:
    """The most dimensions this numpy's arrays take (32 before numpy 2, 64 since), found by making
    one rather than parsing the version; asked only of a shape of more than 32."""
    try:
        np.empty((1,) * 64, np.uint8)
    except ValueError:
        return 32
    return 64


def _span(path: str, key: str, entry) -> tuple[int, int]:
    """An entry's data_offsets, checked: what opening checks of every entry."""
    if not isinstance(entry, dict):
        raise _bad(path, f"its entry is a JSON {type(entry).__name__}, not an object", key)
    offsets = entry.get("data_offsets")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_int(o) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise _bad(path, f"its data_offsets {offsets!r} are not [begin, end] with 0 <= begin <= end", key)
    return offsets[0], offsets[1]


def _entry(path: str, key: str, entry, data_start: int) -> TensorInfo:
    """An entry checked whole (its dtype, shape and size against its offsets): on first use. A load
    asks this of every entry, so a sound one is taken in a few tests; anything else is checked
    again step by step below, which names the fault."""
    if type(entry) is dict:  # (each test as cheap as it comes: a keyword to min() or a set display cost more)
        code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (type(code) is str and code in CODES and type(shape) is list and type(offsets) is list
                and len(offsets) == 2 and set(map(type, shape)) <= _INT and len(shape) <= _ANY_NUMPY_DIMS
                and min(shape or _ONE) > 0):  # no empty tensor: the steps below check how it fits
            begin, end = offsets
            if type(begin) is int and type(end) is int and 0 <= begin <= end:
                name, bits = CODES[code]
                count = math.prod(shape)
                if count * bits == 8 * (end - begin) and count * -(-bits // 8) <= _MAX_BYTES:
                    return TensorInfo._make(key, name, code, tuple(shape), data_start + begin, end - begin)
    begin, end = _span(path, key, entry)
    code, shape = entry.get("dtype"), entry.get("shape")
    if not isinstance(code, str) or code not in CODES:
        raise _bad(path, f"unknown dtype {code!r} (known: {', '.join(CODES)})", key)
    if not isinstance(shape, list) or not all(_int(d) and d >= 0 for d in shape):
        raise _bad(path, f"its shape {shape!r} is not a list of whole numbers >= 0", key)
    if len(shape) > _ANY_NUMPY_DIMS and len(shape) > max_dims():
        raise _bad(path, f"its shape has {len(shape)} dimensions; arrays here take at most {max_dims()}", key)
    name, bits = CODES[code]
    count = math.prod(shape)
    # an empty shape whose other dimensions still give no array numpy can make ([0, 2**63 - 1] of bf16
    # is 0 bytes, which the size check passes, and numpy refuses)
    if (count or math.prod(d for d in shape if d)) * -(-bits // 8) > _MAX_BYTES:
        raise _bad(path, f"its shape {shape} of {code} is larger than any array (its non-zero dimensions span "
                         f"more than {_MAX_BYTES} bytes)", key)
    nbits = count * bits
    if nbits % 8:
        raise _bad(path, f"its shape {shape} of {code} ends inside a byte", key)
    nbytes = end - begin
    if nbytes != nbits // 8:
        raise _bad(path, f"its shape {shape} of {code} needs {nbits // 8} bytes; data_offsets give {nbytes}", key)
    return TensorInfo._make(key, name, code, tuple(shape), data_start + begin, nbytes)


def _typed_entry(path: str, key: str, entry, data_start: int) -> TensorInfo:
    """_entry for msgspec's typed Entry (a string dtype, a shape of whole numbers, its offsets checked at
    open: _typed): a sound one in a few tests, any other checked by _entry as the dict json makes of
    the same JSON, which names the fault alike."""
    code, shape = entry.dtype, entry.shape
    if code in CODES and len(shape) <= _ANY_NUMPY_DIMS and min(shape or _ONE) > 0:
        begin, end = entry.data_offsets
        name, bits = CODES[code]
        count = math.prod(shape)
        if count * bits == 8 * (end - begin) and count * -(-bits // 8) <= _MAX_BYTES:
            return TensorInfo._make(key, name, code, shape, data_start + begin, end - begin)
    return _entry(path, key, {"dtype": code, "shape": list(shape), "data_offsets": list(entry.data_offsets)},
                  data_start)


def _read(f, n: int) -> bytes:
    """``n`` bytes from ``f``, fewer only where the file ends (an unbuffered read may return fewer)."""
    out = f.read(n)
    while 0 < len(out) < n:
        more = f.read(n - len(out))
        if not more:
            break
        out += more
    return out


def read(f, path: str, file_size: int) -> Header:
    """Read and check the header of an open binary file of ``file_size`` bytes (reads n + 8 bytes)."""
    n = header_length(_read(f, PREFIX), path, file_size)
    raw = _read(f, n)
    if len(raw) != n:
        raise _bad(path, f"the header ends early ({len(raw)} of {n} bytes read)")
    return parse_header(raw, path, file_size)


# -- writing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """A tensor to write: its key, file code, shape, bytes (known before its data is read)."""

    key: str
    code: str
    shape: tuple[int, ...]
    nbytes: int


def order(entries: list[Entry]) -> list[Entry]:
    """The order to write tensors in so that as many as can begin on a 64-byte boundary.

    The data begins on one (the header is padded to it). Tensors whose size is a multiple of
    64 go first, in the caller's order: each of them begins aligned. The rest follow by
    descending value size (as safetensors orders), so each still begins on a multiple of its
    own value size; the first of them is aligned too. Packed (sub-byte) types go last.
    """
    whole = [e for e in entries if e.nbytes % ALIGN == 0]
    rest = [e for e in entries if e.nbytes % ALIGN]
    rest.sort(key=lambda e: -CODES[e.code][1])  # stable: the caller's order within a size
    return whole + rest


def header_bytes(entries: list[Entry], metadata: Mapping[str, str] | None) -> bytes:
    """The 8-byte length and the JSON header for ``entries`` written in this order, padded
    with spaces so that the data begins on a 64-byte boundary of the file."""
    obj: dict = {}
    if metadata:
        obj[METADATA_KEY] = dict(metadata)
    at = 0
    for e in entries:
        obj[e.key] = {"dtype": e.code, "shape": list(e.shape), "data_offsets": [at, at + e.nbytes]}
        at += e.nbytes
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    n = len(text) + (-(PREFIX + len(text))) % ALIGN
    return n.to_bytes(PREFIX, "little") + text + b" " * (n - len(text))
