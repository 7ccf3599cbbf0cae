"""What the checkpoint tests share: values of every safetensors dtype code, safetensors' own writer
and readers (numpy buffers; its torch module, loaded only where called), a file made byte by
byte from a header (``_file``, ``_t``) for the files no writer makes, and headers parsed with or
without msgspec (``decoding``)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import numpy as np
import safetensors

from bf16bridge.checkpoints import decoder
from bf16bridge.checkpoints import format as fmt


def _np_dtype(code: str) -> np.dtype:
    return fmt.numpy_dtype(fmt.CODES[code][0])


def _values(code: str, n: int = 300, seed: int = 0) -> np.ndarray:
    """Random bits of ``code``'s width, every pattern of 8-bit types included (NaNs, -0)."""
    dt = _np_dtype(code)
    rng = np.random.default_rng(seed)
    if dt == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    if dt.itemsize == 1:
        raw = np.concatenate([np.arange(256, dtype=np.uint8), rng.integers(0, 256, n, dtype=np.uint8)])
    else:
        raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt)


def _st_write(path, tensors: dict, metadata=None):
    """Write with safetensors' own serializer (every dtype it has, from numpy buffers)."""
    specs = {k: safetensors.TensorSpec(dtype=a.dtype.name, shape=list(a.shape), data_ptr=a.ctypes.data,
                                       data_len=a.nbytes) for k, a in tensors.items()}
    safetensors.serialize_file(specs, str(path), metadata=metadata)


def _st_read(path) -> dict:
    """safetensors' own reader: {key: (code, shape, bytes)}."""
    with open(path, "rb") as f:
        return {k: (v["dtype"], list(v["shape"]), bytes(v["data"])) for k, v in safetensors.deserialize(f.read())}


def _st_torch():
    """safetensors' torch loader and saver (it imports torch: only the tests that need torch call it)."""
    import safetensors.torch

    return safetensors.torch


def _file(header, data: bytes = b"", pad: int = 8, length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    text += b" " * ((-len(text)) % pad)
    return (len(text) if length is None else length).to_bytes(8, "little") + text + data


def _t(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


#: how headers are parsed: msgspec's typed entries first (as installed: the test extra has it), and
#: json's path alone (as where msgspec is not installed)
DECODINGS = ("msgspec", "json")


@contextmanager
def decoding(name: str):
    """Headers parsed with msgspec (as installed) or without it (json's path alone)."""
    kept = decoder.DECODERS
    if name == "json":
        decoder.DECODERS = None
    try:
        yield
    finally:
        decoder.DECODERS = kept
