"""x86 CPUID and XCR0, read by running the instructions: the CPU's own answer where the OS lists no
flags (Windows; an Intel Mac). Linux lists them in /proc/cpuinfo, which ``machine.read_cpu`` reads first.

The code runs from a page mapped executable (mmap on POSIX, VirtualAlloc on Windows) and takes no
arguments: the leaf, the subleaf and where to write the registers are written into its bytes, so the
same bytes run under the System V and the Windows x64 calling conventions. x86-64 only.
``decode`` turns the registers into the probe's flags, and is what the tests run on recorded words.
"""

from __future__ import annotations

import ctypes
import platform
import sys
import threading
from typing import Callable

#: CPUID's four registers, in the order (eax, ebx, ecx, edx)
Words = tuple[int, int, int, int]

_LOCK = threading.Lock()
_X86_64 = ("x86_64", "amd64")


def _run(code: bytes) -> None:
    """Run ``code`` (position-independent, no arguments, ends in ret) from an executable page."""
    size = 4096
    if sys.platform == "win32":
        k32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
        k32.VirtualAlloc.restype = ctypes.c_void_p
        k32.VirtualAlloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_ulong, ctypes.c_ulong]
        k32.VirtualFree.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_ulong]
        addr = k32.VirtualAlloc(None, size, 0x3000, 0x40)  # MEM_COMMIT | MEM_RESERVE, PAGE_EXECUTE_READWRITE
        if not addr:
            raise OSError("VirtualAlloc refused an executable page")
        try:
            ctypes.memmove(addr, code, len(code))
            ctypes.CFUNCTYPE(None)(addr)()
        finally:
            k32.VirtualFree(addr, 0, 0x8000)  # MEM_RELEASE
        return
    import mmap

    page = mmap.mmap(-1, size, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    try:
        page.write(code)
        holder = ctypes.c_char.from_buffer(page)
        try:
            ctypes.CFUNCTYPE(None)(ctypes.addressof(holder))()
        finally:
            del holder  # the page cannot close while a ctypes object points into it
    finally:
        page.close()


def _store(out) -> bytes:
    """movabs r8, &out; mov [r8], eax; mov [r8+4], ebx; mov [r8+8], ecx; mov [r8+12], edx."""
    return (b"\x49\xb8" + ctypes.addressof(out).to_bytes(8, "little")
            + b"\x41\x89\x00\x41\x89\x58\x04\x41\x89\x48\x08\x41\x89\x50\x0c")


def _supported() -> bool:
    return platform.machine().lower() in _X86_64 and ctypes.sizeof(ctypes.c_void_p) == 8


def cpuid(leaf: int, subleaf: int = 0) -> Words | None:
    """CPUID's (eax, ebx, ecx, edx) for ``leaf`` and ``subleaf``; None off x86-64 or where no page may
    be made executable (a hardened runtime)."""
    if not _supported():
        return None
    out = (ctypes.c_uint32 * 4)()
    code = (b"\x53"  # push rbx (callee-saved in both conventions; cpuid writes it)
            + b"\xb8" + leaf.to_bytes(4, "little") + b"\xb9" + subleaf.to_bytes(4, "little")
            + b"\x0f\xa2" + _store(out) + b"\x5b\xc3")  # cpuid ... pop rbx; ret
    try:
        with _LOCK:
            _run(code)
    except (OSError, ValueError, AttributeError):
        return None
    return out[0], out[1], out[2], out[3]


def xcr0() -> int | None:
    """XCR0 (the register states the OS saves: AVX, AVX-512, AMX), by XGETBV; None where it cannot run
    (CPUID says the OS has not enabled XSAVE, when XGETBV would fault, or no executable page)."""
    leaf1 = cpuid(1)
    if leaf1 is None or not leaf1[2] >> 27 & 1:  # CPUID.1:ECX.OSXSAVE
        return None
    out = (ctypes.c_uint32 * 4)()
    code = b"\x53\x31\xc9\x0f\x01\xd0" + _store(out) + b"\x5b\xc3"  # xor ecx, ecx; xgetbv: edx:eax
    try:
        with _LOCK:
            _run(code)
    except (OSError, ValueError, AttributeError):
        return None
    return out[0] | out[3] << 32


# -- what the words say ----------------------------------------------------------------------------

#: XCR0 bits an OS sets once it saves a state: AVX (SSE, YMM), AVX-512 (and opmask, ZMM), AMX tiles
_XCR0_AVX, _XCR0_AVX512, _XCR0_AMX = 0x6, 0xE6, 0x60000


def decode(read: Callable[[int, int], Words | None], xcr0_value: int | None) -> tuple[set[str], str]:
    """The probe's x86 flags (avx512_bf16, amx_bf16, avx512f, avx2) from CPUID words (``read(leaf,
    subleaf)``) and XCR0, each counted only where the OS saves its registers, and where they were read:
    CPUID.(7,1):EAX[5] AVX512_BF16, CPUID.(7,0):EDX[22] AMX_BF16, EBX[16] AVX512F, EBX[5] AVX2."""
    leaf0 = read(0, 0)
    if leaf0 is None:
        return set(), "could not run CPUID (no executable page here)"
    if leaf0[0] < 7:
        return set(), f"CPUID has no leaf 7 (its highest is {leaf0[0]})"
    leaf7 = read(7, 0) or (0, 0, 0, 0)
    leaf71 = (read(7, 1) if leaf7[0] >= 1 else None) or (0, 0, 0, 0)  # eax of (7,0): the last subleaf
    cpu = {"avx2": leaf7[1] >> 5 & 1, "avx512f": leaf7[1] >> 16 & 1, "amx_bf16": leaf7[3] >> 22 & 1,
           "avx512_bf16": leaf71[0] >> 5 & 1}
    state = xcr0_value or 0
    saved = {"avx2": state & _XCR0_AVX == _XCR0_AVX, "avx512f": state & _XCR0_AVX512 == _XCR0_AVX512,
             "avx512_bf16": state & _XCR0_AVX512 == _XCR0_AVX512, "amx_bf16": state & _XCR0_AMX == _XCR0_AMX}
    found = {f for f, on in cpu.items() if on and saved[f]}
    unsaved = sorted(f.upper() for f, on in cpu.items() if on and not saved[f] and f in ("avx512_bf16", "amx_bf16"))
    where = "CPUID leaf 7" + (f"; in CPUID but not enabled by the OS (XCR0 {state:#x}): {', '.join(unsaved)}"
                              if unsaved else "")
    return found, where
