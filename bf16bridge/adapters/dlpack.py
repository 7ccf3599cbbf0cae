"""Read a DLPack producer's (or capsule's) data pointer and device without importing any consumer.

Used by adapters whose framework has no public data-pointer call (tensorflow):
asking for a capsule and reading its DLTensor costs about 2 microseconds; the
unconsumed capsule frees itself.
"""

from __future__ import annotations

import ctypes
import datetime


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


#: the PyCapsule type, which Python names nowhere public; the stdlib's datetime exports one
_CAPSULE = type(datetime.datetime_CAPI)


def _is_capsule(obj) -> bool:
    return type(obj) is _CAPSULE


def _tensor(capsule) -> _DLTensor:
    """The DLTensor of a legacy (unversioned) capsule: a DLManagedTensor starts with it.
    The caller keeps the capsule alive while reading."""
    return _DLTensor.from_address(_get_pointer(capsule, b"dltensor"))


def data_ptr(obj) -> int:
    """Address of the first element of a legacy DLPack capsule or producer."""
    capsule = obj if _is_capsule(obj) else obj.__dlpack__()
    tensor = _tensor(capsule)
    return (tensor.data or 0) + tensor.byte_offset


#: DLTensor as 64-bit words, for capsule_ptr: ``data`` is the first, ``byte_offset`` the sixth
#: (None where the layout is not that: a 32-bit build reads the structure)
_WORDS = (ctypes.c_uint64 * 6 if ctypes.sizeof(ctypes.c_void_p) == 8 and _DLTensor.data.offset == 0
          and _DLTensor.byte_offset.offset == 40 and ctypes.sizeof(_DLTensor) == 48 else None)


def capsule_ptr(capsule) -> int:
    """``data_ptr`` of a legacy capsule, read as two words of its DLTensor (an adapter's hot path:
    one ctypes object, not the structure and its nested fields)."""
    if _WORDS is None:  # pragma: no cover - 64-bit builds only here
        return data_ptr(capsule)
    words = _WORDS.from_address(_get_pointer(capsule, b"dltensor"))
    return words[0] + words[5]


def device(obj) -> tuple[int, int]:
    """``(device_type, device_id)`` of a legacy DLPack capsule or producer, as ``__dlpack_device__`` gives it."""
    capsule = obj if _is_capsule(obj) else obj.__dlpack__()
    d = _tensor(capsule).device
    return (d.device_type, d.device_id)


def dtype(obj) -> tuple[int, int, int]:
    """``(code, bits, lanes)``, the DLPack data type of a legacy capsule or producer."""
    capsule = obj if _is_capsule(obj) else obj.__dlpack__()
    d = _tensor(capsule).dtype
    return (d.code, d.bits, d.lanes)


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype = ctypes.c_char_p
_get_name.argtypes = [ctypes.py_object]


def protocol_version(obj) -> str:
    """The newest DLPack protocol version ``obj`` exports, found by asking for 1.x."""
    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:
        return "0.x (legacy capsule only)"
    name = _get_name(capsule)
    if name == b"dltensor_versioned":
        v = _DLPackVersion.from_address(_get_pointer(capsule, name))
        return f"{v.major}.{v.minor}"
    return "0.x (legacy capsule only)"
