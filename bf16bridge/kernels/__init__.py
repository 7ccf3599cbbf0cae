"""float32 <-> bf16 and every low-precision dtype (fp8, fp6, fp4, int4/int2): rounding and
widening, chunked over threads, bit-exact with ml_dtypes; and two 4-bit values a byte.

All of it is numpy only: no framework is imported (a framework's own kernels join as a backend
through its KernelHooks, when it is imported). docs/kernels.md describes every call.

- ``casts``: to_dtype, to_float32 (the calls users make)
- ``bf16``: to_bf16 and bf16 widening
- ``rounding``: the rounding rule, the numpy backend's tables, each format's kernels
- ``bits``: the bf16 bit kernels, and which backend runs them
- from ``bf16bridge.core``: chunks, threads and the progress bar (``core.chunks``), the formats'
  codecs (``core.formats``) and nibble packing (``core.nibbles``)
"""

from bf16bridge.core.chunks import BLOCK, CHUNK, MIN_PIECE, PROGRESS_AFTER_S
from bf16bridge.core.dtypes import FORMATS
from bf16bridge.core.formats import byte_codes, decoded, format_of, refuse_changed_padding
from bf16bridge.core.nibbles import NIBBLE_DTYPES, pack_nibbles, unpack_nibbles
from bf16bridge.kernels.bits import BUILTIN, backends, pick_backend
from bf16bridge.kernels.bf16 import to_bf16
from bf16bridge.kernels.casts import KERNEL_DTYPES, to_dtype, to_float32
from bf16bridge.kernels.rounding import round_reference

__all__ = [
    "BLOCK", "BUILTIN", "CHUNK", "FORMATS", "KERNEL_DTYPES", "MIN_PIECE", "NIBBLE_DTYPES", "PROGRESS_AFTER_S",
    "backends", "byte_codes", "decoded", "format_of", "pack_nibbles", "pick_backend", "refuse_changed_padding",
    "round_reference", "to_bf16", "to_dtype", "to_float32", "unpack_nibbles",
]
