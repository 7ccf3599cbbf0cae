"""torch's integer kernels for ``bb.kernels`` (bf16 <-> float32 bits) as a backend.

Integer arithmetic only, never torch's ``.to(bfloat16)``: its vectorised path differs on NaNs
and, with AVX512-BF16, flushes subnormals.
"""

from __future__ import annotations

import torch

from bf16bridge.adapters.hooks import KernelHooks


class TorchKernels(KernelHooks):
    """bf16 bits widened to float32 bits and float32 bits rounded to bf16, on numpy buffers torch views."""

    name = "torch"
    offers_kernels = True
    kernels_threaded = True  # torch spreads each call over its own threads

    def widen_bits(self, src_u16, dst_u32):
        s = torch.from_numpy(src_u16.view("i2"))
        d = torch.from_numpy(dst_u32.view("i4"))
        torch.bitwise_left_shift(s.to(torch.int32), 16, out=d)

    def round_bits(self, src_u32, dst_u16):
        u = torch.from_numpy(src_u32.view("i4"))
        # int32 arithmetic wraps like uint32 for the low bits we keep; >> is arithmetic, so mask
        r = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        r &= 0xFFFF
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        if bool(nan.any()):
            r = torch.where(nan, ((u >> 16) & 0x8000) | 0x7FC0, r)
        torch.from_numpy(dst_u16.view("i2")).copy_(r.to(torch.int16))


HOOKS = TorchKernels()
