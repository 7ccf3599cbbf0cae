"""NumPy and CPython internals the numpy adapter reads, each guarded: an ndarray's data pointer
read from the object itself (``__array_interface__`` builds a dict to say it, too slow for the
hot path).

The read relies on CPython (``id(x)`` is the object's address, ``object.__basicsize__`` its
header) and on NumPy's ``PyArrayObject_fields`` keeping the data pointer right after the header.
Both are checked once, at import, against ``__array_interface__``; where either does not hold
(PyPy, another layout), ``DATA_OFFSET`` is None and ``data_pointer`` asks ``__array_interface__``:
slower, nothing else changes.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

#: reads a pointer at an address (memory the caller vouches for)
read_pointer = ctypes.c_void_p.from_address


def data_offset() -> int | None:
    """Where an ndarray object keeps its data pointer: right after the object header (NumPy's
    ``PyArrayObject_fields``), checked here against ``__array_interface__``; None if not.
    Only on CPython, where ``id(x)`` is the object's address: elsewhere (PyPy) it is not, and
    reading memory there could crash the process."""
    if sys.implementation.name != "cpython":
        return None
    a = np.arange(16, dtype=np.uint8)
    off = object.__basicsize__
    for x in (a, a[3:], np.empty((2, 3), np.uint16)[:, 1:]):
        if (read_pointer(id(x) + off).value or 0) != x.__array_interface__["data"][0]:
            return None
    return off


#: the offset of an ndarray's data pointer in its object, or None: read it through __array_interface__
DATA_OFFSET = data_offset()


def data_pointer(x: np.ndarray) -> int:
    """The address of an ndarray's first element (``x`` must be an ndarray itself, not a subclass)."""
    if DATA_OFFSET is None:
        return x.__array_interface__["data"][0]
    return read_pointer(id(x) + DATA_OFFSET).value or 0
