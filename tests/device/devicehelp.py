"""Make device tensors from host bits and read them back, by each framework's own calls
(never bf16bridge's), so the device tests check the bridge against the frameworks."""

from __future__ import annotations

import os
import time

import ml_dtypes
import numpy as np

#: "cuda" on the GPU, "cpu" in the dry run (tools/device_check.sh sets it)
DEVICE = os.environ.get("BF16BRIDGE_DEVICE")
PAIRS = [("torch", "jax"), ("jax", "torch")]
BF16 = np.dtype(ml_dtypes.bfloat16)


def pair_id(pair) -> str:
    return f"{pair[0]}->{pair[1]}"


def make(framework: str, u16: np.ndarray, torch_device, jax_device):
    """A bf16 tensor of ``framework`` on the test device holding exactly the bits ``u16``."""
    if framework == "torch":
        import torch

        # a fresh tensor from torch's allocator (64-byte aligned on the CPU too, as real tensors are)
        t = torch.empty(u16.shape, dtype=torch.int16, device=torch_device)
        return t.copy_(torch.from_numpy(u16.view(np.int16))).view(torch.bfloat16)
    if framework == "jax":
        import jax

        return jax.device_put(u16.view(BF16), jax_device)
    raise ValueError(framework)


def host_bits(x) -> np.ndarray:
    """The bits of a bf16 tensor of any framework, copied to the host as uint16."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x).view(np.uint16).copy()
    if type(x).__module__.split(".")[0] == "torch":
        import torch

        return x.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16).copy()
    return np.asarray(x).view(np.uint16).copy()  # jax: a host copy


def ptr(x) -> int:
    if type(x).__module__.split(".")[0] == "torch":
        return x.data_ptr()
    x.block_until_ready()  # asking a pending result for its pointer has hung a process
    return x.unsafe_buffer_pointer()


def where(x) -> str:
    """The device a tensor lives on, in one spelling for both frameworks: "cpu" or "gpu:N"."""
    if type(x).__module__.split(".")[0] == "torch":
        return "cpu" if x.device.type == "cpu" else f"gpu:{x.device.index}"
    (d,) = x.devices()
    return "cpu" if d.platform == "cpu" else f"gpu:{d.id}"


def sync(x) -> None:
    """Wait until ``x`` (a result of either framework, or a list of them) is computed."""
    for y in x if isinstance(x, (list, tuple)) else [x]:
        if type(y).__module__.split(".")[0] == "torch":
            import torch

            if y.device.type == "cuda":
                torch.cuda.synchronize(y.device)
        elif hasattr(y, "block_until_ready"):
            y.block_until_ready()


def best_time(fn, reps: int) -> float:
    """The best of ``reps`` wall-clock times of ``fn()`` (which must wait for its own result), in seconds."""
    fn()  # warm-up: compilation, allocator growth
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
