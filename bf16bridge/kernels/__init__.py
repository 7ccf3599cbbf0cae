"""float32 <-> bf16 and narrow-dtype rounding and widening, chunked, bit-exact with ml_dtypes."""

from bf16bridge.kernels.chunked import (
    BLOCK, BUILTIN, CHUNK, FORMATS, MIN_PIECE, NARROW, NIBBLE_DTYPES, PROGRESS_AFTER_S, Format, backends,
    byte_codes, decoded, format_of, numpy_dtype_of, pack_nibbles, pick_backend, refuse_changed_padding,
    round_reference, to_bf16, to_dtype, to_float32, unpack_nibbles,
)

__all__ = [
    "BLOCK", "BUILTIN", "CHUNK", "FORMATS", "MIN_PIECE", "NARROW", "NIBBLE_DTYPES", "PROGRESS_AFTER_S", "Format",
    "backends", "byte_codes", "decoded", "format_of", "numpy_dtype_of", "pack_nibbles", "pick_backend",
    "refuse_changed_padding", "round_reference", "to_bf16", "to_dtype", "to_float32", "unpack_nibbles",
]
