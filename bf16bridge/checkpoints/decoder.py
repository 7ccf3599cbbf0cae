"""A header's JSON decoded and typed in one pass in C by msgspec, where it is installed (`pip
install 'bf16bridge[checkpoints]'`). Each entry becomes an ``Entry`` whose fields msgspec has typed (a string, whole
numbers, two whole numbers; a field left out or null is None). msgspec takes strict JSON only, a
subset of what the standard library's json takes, and decodes it to the same values; whatever it
refuses goes to ``format``'s parse with json, which names the fault. Imported with the
checkpoints (on the first ``bb.open``, ``bb.load`` or ``bb.save``), never by ``import bf16bridge``.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    import msgspec
except ImportError:  # without it, json parses every header (format.parse_header)
    msgspec = None  # type: ignore[assignment]


def _decoders() -> tuple[Any, Any, type] | None:
    """(the header's decoder, the metadata's, the Entry type), or None without msgspec."""
    if msgspec is None:
        return None

    class Entry(msgspec.Struct, frozen=True, gc=False):  # (gc=False: nothing for the collector to walk)
        """One tensor's entry, typed: what ``dict.get`` would give format's checks of the JSON's dict."""

        dtype: Optional[str] = None
        shape: Optional[tuple[int, ...]] = None
        data_offsets: Optional[tuple[int, int]] = None

    class Metadata(msgspec.Struct):
        """The header's metadata alone (every other member skipped, their JSON still checked)."""

        metadata: Optional[dict[str, str]] = msgspec.field(default=None, name="__metadata__")

    return msgspec.json.Decoder(dict[str, Entry]), msgspec.json.Decoder(Metadata), Entry


#: (header decoder, metadata decoder, Entry), or None where msgspec is not installed; tests set it to
#: None to take json's path
DECODERS = _decoders()


def decode(raw: bytes) -> dict[str, Any] | None:
    """The header as {key: Entry} in the JSON's order (the metadata's member typed as an Entry too:
    ``metadata`` reads it), or None: no msgspec, or JSON that msgspec refuses or cannot type so (not
    strict JSON, not an object of objects, a field of another type: json's parse names the fault)."""
    if DECODERS is None:
        return None
    try:
        return DECODERS[0].decode(raw)
    except (msgspec.DecodeError, RecursionError):  # (ValidationError is a DecodeError)
        return None


def metadata(raw: bytes) -> dict[str, str] | None:
    """The header's ``__metadata__`` object of strings, or None (not that, or no msgspec)."""
    if DECODERS is None:
        return None
    try:
        return DECODERS[1].decode(raw).metadata
    except (msgspec.DecodeError, RecursionError):
        return None
