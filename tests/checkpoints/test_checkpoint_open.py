"""Opening a checkpoint fast without checking less: format.parse_header decodes a header with
msgspec into typed entries where it can (_typed), else with json and checks it as a whole in a few
passes over lists (_all_at_once), and sends anything irregular to the key-by-key checks
(_one_by_one), which name the fault; either way each entry's dtype, shape and size are checked on
its first use (_entry, _typed_entry). Here, for headers built to slip past one check of the fast
paths each, and for drawn headers with one field changed: each fast path either declines or gives
exactly the key-by-key answer (keys in file order, every TensorInfo, metadata), and parse_header,
then each entry's first use, raises exactly where the key-by-key checks raise, with their message,
with msgspec and with it taken away (json's path, as where it is not installed)."""

from __future__ import annotations

import json
from types import MappingProxyType

import msgspec  # noqa: F401 - the test extra installs it: its path is tested here, never skipped
import pytest
from hypothesis import given
from hypothesis import strategies as st

import strategies  # noqa: F401 - loads the ci/fuzz profiles
from bf16bridge.checkpoints import decoder
from bf16bridge.checkpoints import format as fmt
from bf16bridge.errors import CheckpointError
from checkpoint_cases import DECODINGS, decoding

PATH = "/x/m.safetensors"


def _t(code="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": code, "shape": list(shape), "data_offsets": list(offsets)}


def _text(header) -> str:
    return header if isinstance(header, str) else json.dumps(header, separators=(",", ":"), ensure_ascii=False)


def _size(text: str, data: int) -> int:
    return fmt.PREFIX + len(text.encode()) + data


def _checked(h: fmt.Header):
    """``h``, or the message of the first entry (in file order) that its check on first use refuses."""
    try:
        for k in h.keys:
            h.info(k)
    except CheckpointError as err:
        return str(err)
    return h


def _slow(text: str, size: int):
    """What the key-by-key checks answer: a Header, or the CheckpointError's message (at open, or at
    the first use of an entry)."""
    try:
        obj = json.loads(text, object_pairs_hook=fmt._pairs)
    except fmt._Duplicate as dup:
        return f"twice {dup}"
    try:
        return _checked(fmt._one_by_one(obj, PATH, len(text.encode()), size))
    except CheckpointError as err:
        return str(err)


def _fast(text: str, size: int):
    return fmt._all_at_once(json.loads(text), text, fmt.PREFIX + len(text.encode()), size)


def _typed_fast(text: str, size: int):
    raw = text.encode()
    obj = decoder.decode(raw)
    return None if obj is None else fmt._typed(obj, raw, fmt.PREFIX + len(raw), size)


def _parsed(text: str, size: int):
    try:
        return _checked(fmt.parse_header(text.encode(), PATH, size))
    except CheckpointError as err:
        return str(err)


def _same(a: fmt.Header, b: fmt.Header) -> bool:
    return (a.keys == b.keys and dict(a.metadata) == dict(b.metadata) and a.length == b.length
            and a.file_size == b.file_size and [a.info(k) for k in a.keys] == [b.info(k) for k in b.keys])


#: name -> (header, data bytes, whether the fast path takes it); each irregular one slips past one
#: check of the fast path (the check named) were it missing
CASES = {
    "written in order": ({"a": _t(), "b": _t("BF16", (3,), (8, 14))}, 14, True),
    "metadata": ({"__metadata__": {"k": "v", "x:y": "1"}, "a": _t()}, 8, True),
    "metadata null": ({"__metadata__": None, "a": _t()}, 8, True),
    "no tensors": ({}, 0, True),
    "no tensors, data": ({}, 4, False),
    "scalar and empty": ({"s": _t("I64", (), (0, 8)), "e": _t("F32", (0, 3), (8, 8))}, 8, True),
    "packed F4": ({"p": _t("F4", (2, 3), (0, 3))}, 3, True),
    # order: the keys come in (begin, end) order, the JSON's among equals (sorted, stable)
    "not in offset order": ({"b": _t(offsets=(8, 16)), "a": _t()}, 16, True),
    "ties at one offset": ({"z": _t("F32", (0,), (8, 8)), "a": _t(), "y": _t("F32", (0,), (8, 8)),
                            "b": _t(offsets=(8, 16))}, 16, True),
    # a key named twice: the count of quotes
    "key twice": ('{"a":' + _text(_t()) + ',"a":' + _text(_t()) + "}", 8, False),
    "field twice": ('{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8, False),
    "offsets twice": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4],"data_offsets":[0,8]}}', 8, False),
    "metadata key twice": ('{"__metadata__":{"k":"v","k":"w"},"a":' + _text(_t()) + "}", 8, False),
    # the dropped member has no string past its key, the entry kept none for its shape: as many quotes
    "key twice, no shape": ('{"b":1,"b":{"dtype":"F32","data_offsets":[0,8]}}', 8, False),
    "metadata twice": ('{"__metadata__":{"k":"v"},"__metadata__":{},"a":' + _text(_t()) + "}", 8, False),
    # msgspec types a member left out as None: its quotes missing make up for those of a dropped member
    "key twice, the first empty, no shape": ('{"a":{},"a":{"dtype":"F32","data_offsets":[0,8]}}', 8, False),
    "key twice, the first empty, dtype null": ('{"a":{},"a":{"dtype":null,"shape":[2],"data_offsets":[0,8]}}', 8,
                                               False),
    "a field more for the dtype": ({"a": {"x": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8, False),
    "offsets null": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": None}}, 8, False),
    # the metadata, which msgspec types as an entry too (the fields it has) before reading it alone
    "metadata named as fields": ({"__metadata__": {"dtype": "x", "k": "v"}, "a": _t()}, 8, True),
    "metadata named as a shape": ({"__metadata__": {"shape": "x"}, "a": _t()}, 8, True),
    "metadata empty": ({"__metadata__": {}, "a": _t()}, 8, True),
    # the metadata: an object of strings (a list of one string has the quotes of one)
    "metadata value a list": ({"__metadata__": {"k": ["v"]}, "a": _t()}, 8, False),
    "metadata a list": ({"__metadata__": ["k", "v"], "a": _t()}, 8, False),
    "escaped key": ('{"a\\u0041":' + _text(_t()) + "}", 8, False),  # a backslash: parsed again, read alike
    "escaped key twice": ('{"aA":' + _text(_t()) + ',"a\\u0041":' + _text(_t()) + "}", 8, False),
    "a field more": ({"a": {**_t(), "x": 1}}, 8, False),  # safetensors ignores it, and so do we
    # the checks of types and sizes; those of one entry alone (its dtype, its shape, its size against
    # its offsets) are made on the entry's first use (_entry) whichever path opened the header: the
    # fast path takes these (True) and the first use refuses them as the key-by-key checks do
    "unknown code": ({"a": _t("F7")}, 8, True),
    "code a list": ({"a": _t(["F32"])}, 8, False),
    "no dtype": ({"a": {"shape": [2], "data_offsets": [0, 8]}}, 8, False),
    "entry a list": ({"a": [1, 2, 3]}, 0, False),
    "negative dims": ({"a": _t(shape=(-2, -1))}, 8, True),  # their product is 2
    "float dim": ({"a": _t(shape=(2.0,))}, 8, True),
    "bool dim": ({"a": _t(shape=(True,), offsets=(0, 4))}, 4, True),
    "shape an object": ({"a": {"dtype": "F32", "shape": {}, "data_offsets": [0, 4]}}, 4, True),
    "shape a string": ({"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, 8, False),
    "bool offset": ({"a": _t(offsets=(False, 8))}, 8, False),
    "float offset": ({"a": _t(offsets=(0, 8.0))}, 8, False),
    "offsets an object": ({"a": {"dtype": "F32", "shape": [0], "data_offsets": {}}}, 0, False),
    "three offsets": ({"a": _t(offsets=(0, 8, 8))}, 8, False),
    "three offsets, after a pair": ({"a": _t(), "b": _t(offsets=(8, 16, 16))}, 16, False),  # items 0 and 1 fit
    "reversed offsets": ({"a": _t("F32", (0,), (8, 0)), "b": _t()}, 8, False),
    "negative offsets": ({"a": _t(offsets=(-8, 0)), "b": _t(offsets=(0, 8))}, 8, False),
    # an end before its begin, last, where the file ends: begins and ends alike, the walk alone passes it
    "end before begin, last": ({"a": _t(), "b": _t("F32", (0,), (8, 4))}, 4, False),
    # a first end below 0, the next beginning there: each begins where the one before ended, ends go up
    "end below 0, first": ({"a": _t("F32", (0,), (0, -8)), "b": _t("F32", (4,), (-8, 8))}, 8, False),
    "huge dim": ({"a": _t(shape=(2**64,))}, 8, True),
    "odd nibbles": ({"a": _t("F4", (3,), (0, 1))}, 1, True),
    # empty shapes no array can take: 0 bytes, so the size check passes them; numpy refused at get()
    "empty, huge dim": ({"a": _t(shape=(0, 2**64), offsets=(0, 0))}, 0, True),
    "empty, past intp in bytes": ({"a": _t(shape=(0, 2**63 - 1), offsets=(0, 0))}, 0, True),
    "empty, largest": ({"a": _t("U8", (0, 2**63 - 1), (0, 0))}, 0, True),
    "too many dims": ({"a": _t(shape=(0,) + (1,) * 70, offsets=(0, 0))}, 0, True),
    "most dims": ({"a": _t(shape=(1,) * 32, offsets=(0, 4))}, 4, True),
    "wrong size": ({"a": _t(shape=(3,))}, 8, True),
    # the walk over the data
    "not from 0": ({"a": _t(offsets=(4, 12))}, 12, False),
    "hole": ({"a": _t(), "b": _t(offsets=(12, 20))}, 20, False),
    "overlap": ({"a": _t(), "b": _t(offsets=(4, 12))}, 12, False),
    "empty inside another": ({"a": _t(), "z": _t("F32", (0,), (4, 4))}, 8, False),
    "bytes left over": ({"a": _t()}, 9, False),
    "past the end": ({"a": _t()}, 7, False),
}


#: the cases the json path's fast checks take that msgspec's typing refuses (so json's path takes them)
UNTYPED = frozenset({"metadata null", "float dim", "bool dim", "shape an object", "metadata named as a shape"})


@pytest.mark.parametrize("decoding_name", DECODINGS)
@pytest.mark.parametrize("name", list(CASES))
def test_the_fast_path_takes_what_it_should_and_answers_as_the_key_by_key_checks(name, decoding_name):
    header, data, fast = CASES[name]
    text = _text(header)
    size = _size(text, data)
    slow = _slow(text, size)
    n = len(text.encode())
    for path, taken, takes in (("json", _fast(text, size), fast), ("msgspec", _typed_fast(text, size),
                                                                   fast and name not in UNTYPED)):
        assert (taken is not None) == takes, path
        if taken is not None:
            keys, entries, metadata = taken
            got = _checked(fmt.Header(PATH, n, keys, MappingProxyType(metadata),
                                      fmt.Entries(entries, fmt.PREFIX + n, PATH)))
            assert got == slow if isinstance(slow, str) else isinstance(got, fmt.Header) and _same(got, slow)
    with decoding(decoding_name):
        ours = _parsed(text, size)
    if isinstance(slow, str):
        assert isinstance(ours, str) and PATH in ours
        assert ours == slow or (slow.startswith("twice ") and "names a key twice" in ours
                                and f"(key {slow[6:]!r})" in ours)
    else:
        assert isinstance(ours, fmt.Header) and _same(ours, slow)


def test_headers_written_by_safetensors_and_bb_save_take_the_fast_path(tmp_path):
    import ml_dtypes
    import numpy as np
    import safetensors.numpy

    import bf16bridge as bb

    tensors = {f"h.{i}.w": np.ones((i % 3, 5), np.float32) for i in range(12)}
    tensors["e"] = np.arange(6, dtype=np.uint16).view(ml_dtypes.bfloat16)
    safetensors.numpy.save_file({k: v for k, v in tensors.items() if k != "e"}, str(tmp_path / "st.safetensors"),
                                metadata={"format": "np"})
    bb.save(tensors, tmp_path / "bb.safetensors", metadata={"step": "3"})
    for name in ("st", "bb"):
        blob = (tmp_path / f"{name}.safetensors").read_bytes()
        n = int.from_bytes(blob[:8], "little")
        text = blob[8:8 + n].decode()
        assert _fast(text, len(blob)) is not None, name
        assert _typed_fast(text, len(blob)) is not None, name  # msgspec's path too, metadata and all
        with bb.open(tmp_path / f"{name}.safetensors") as f:
            assert f.keys() == sorted(f.keys(), key=lambda k: f.info(k).offset)


_CODES = sorted(fmt.CODES)


@st.composite
def headers(draw):
    """A valid layout (codes, shapes, offsets in file order; the JSON in a drawn order), then maybe
    one field of one entry changed as the fuzz test changes them: (JSON text, file size)."""
    entries = []
    at = 0
    for i in range(draw(st.integers(0, 6))):
        code = draw(st.sampled_from(_CODES))
        bits = fmt.CODES[code][1]
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        n = 1
        for d in shape:
            n *= d
        if n * bits % 8:
            shape = [*shape, 8]
            n *= 8
        entries.append((f"k{i}", {"dtype": code, "shape": shape, "data_offsets": [at, at + n * bits // 8]}))
        at += n * bits // 8
    order = draw(st.permutations(range(len(entries))))
    header = {entries[i][0]: entries[i][1] for i in order}
    if draw(st.booleans()):
        header = {"__metadata__": draw(st.one_of(st.none(), st.dictionaries(st.text("ab:{", max_size=2),
                                                                             st.text("xy\"", max_size=2),
                                                                             max_size=2))), **header}
    if entries and draw(st.booleans()):
        key = draw(st.sampled_from([k for k, _ in entries]))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        odd = st.one_of(st.integers(-3, 40), st.booleans(), st.none(), st.just(2.0), st.just({}))
        value = draw({
            "dtype": st.one_of(st.sampled_from(_CODES), odd, st.just("F7")),
            "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), odd,
                               st.lists(st.one_of(st.integers(0, 4), st.booleans(), st.just(2.0)), max_size=2)),
            "data_offsets": st.one_of(st.lists(st.integers(-8, 60), min_size=2, max_size=2), odd,
                                      st.lists(st.one_of(st.integers(0, 60), st.booleans(), st.just(8.0)), max_size=3)),
        }[field])
        header[key] = {**header[key], field: value}
    return _text(header), fmt.PREFIX + len(_text(header).encode()) + at + draw(st.sampled_from([0, 0, 0, 1, -1]))


@pytest.mark.parametrize("decoding_name", DECODINGS)
@given(drawn=headers())
def test_drawn_headers_read_as_the_key_by_key_checks_read_them(decoding_name, drawn):
    text, size = drawn
    with decoding(decoding_name):
        slow, ours = _slow(text, size), _parsed(text, size)
    if isinstance(slow, str):
        assert ours == slow
    else:
        assert isinstance(ours, fmt.Header) and _same(ours, slow)


def _mutable(value, where: str) -> list[str]:
    """Every dict, list or set reachable from ``value`` through mappings, sequences and dataclasses."""
    import dataclasses
    from collections.abc import Mapping

    if isinstance(value, (dict, list, set, bytearray)):
        return [f"{where}: {type(value).__name__}"]
    found: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            found += _mutable(v, f"{where}[{k!r}]")
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            found += _mutable(v, f"{where}[{i}]")
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            found += _mutable(getattr(value, f.name), f"{where}.{f.name}")
    return found


@pytest.mark.parametrize("decoding_name", DECODINGS)
@pytest.mark.parametrize("fast", [True, False], ids=["all-at-once", "one-by-one"])
def test_a_header_holds_nothing_a_caller_could_change(fast, decoding_name):
    # a frozen Header once held the JSON's entry dicts (their shape and offsets lists too): a caller
    # changing one changed what info(key), and so get(key), read from the file
    header = {"__metadata__": {"format": "pt"}, "w": _t("F32", (2,), (0, 8)), "e": _t("BF16", (1, 2), (8, 12))}
    text = _text(header)
    if not fast:
        text = text.replace('"w"', '"\\u0077"')  # an escape in a key: the key-by-key checks read it
    size = _size(text, 12)
    assert (_fast(text, size) is not None) == fast
    with decoding(decoding_name):
        h = fmt.parse_header(text.encode(), PATH, size)
    assert _mutable(h, "header") == []
    with pytest.raises(TypeError):
        h.entries["w"] = h.entries["e"]  # type: ignore[index]
    assert h.entries["w"] == h.info("w") and h.info("w").shape == (2,) and "w" in h.entries and "x" not in h.entries
    assert list(h.entries) == ["w", "e"] and len(h.entries) == 2 and dict(h.metadata) == {"format": "pt"}


#: the cases whose one entry is refused on its first use, and what the refusal says: one checker
#: (_entry) serves both paths, so its answers are pinned here, not only compared
ON_FIRST_USE = {
    "unknown code": "unknown dtype 'F7' (known: BOOL, U8,",
    "negative dims": "its shape [-2, -1] is not a list of whole numbers >= 0",
    "float dim": "its shape [2.0] is not a list of whole numbers >= 0",
    "bool dim": "its shape [True] is not a list of whole numbers >= 0",
    "shape an object": "its shape {} is not a list of whole numbers >= 0",
    "huge dim": f"its shape [{2**64}] of F32 is larger than any array",
    "odd nibbles": "its shape [3] of F4 ends inside a byte",
    "empty, huge dim": f"its shape [0, {2**64}] of F32 is larger than any array",
    "empty, past intp in bytes": f"its shape [0, {2**63 - 1}] of F32 is larger than any array",
    "too many dims": f"its shape has 71 dimensions; arrays here take at most {fmt.max_dims()}",
    "wrong size": "its shape [3] of F32 needs 12 bytes; data_offsets give 8",
}


@pytest.mark.parametrize("decoding_name", DECODINGS)
@pytest.mark.parametrize("name", [*ON_FIRST_USE, "empty, largest", "most dims", "scalar and empty", "packed F4"])
def test_an_entry_is_checked_on_first_use_and_refused_naming_its_fault(name, decoding_name):
    header, data, _ = CASES[name]
    text = _text(header)
    with decoding(decoding_name):  # the header as a whole is sound: it opens
        h = fmt.parse_header(text.encode(), PATH, _size(text, data))
    if name not in ON_FIRST_USE:
        assert [h.info(k).key for k in h.keys] == list(h.keys)
        return
    for _ in range(2):  # every use, not only the first
        with pytest.raises(CheckpointError) as err:
            h.info("a")
        assert str(err.value).startswith(f"{PATH}: {ON_FIRST_USE[name]}") and "(key 'a')" in str(err.value)


class _Dribble:
    """A binary file that gives at most 5 bytes a read, as an unbuffered read may."""

    def __init__(self, blob: bytes):
        self.blob, self.at = blob, 0

    def read(self, n: int) -> bytes:
        out = self.blob[self.at:self.at + min(n, 5)]
        self.at += len(out)
        return out


def test_a_header_read_in_short_pieces_is_read_whole():
    text = _text({"__metadata__": {"k": "v"}, "a": _t(), "b": _t("BF16", (3,), (8, 14))})
    blob = len(text).to_bytes(8, "little") + text.encode() + bytes(14)
    h = fmt.read(_Dribble(blob), PATH, len(blob))
    assert h.keys == ("a", "b") and dict(h.metadata) == {"k": "v"} and h.info("b").offset == 8 + len(text) + 8
    with pytest.raises(CheckpointError, match="the header ends early"):  # the file ends first: said so
        fmt.read(_Dribble(blob[:20]), PATH, len(blob))
