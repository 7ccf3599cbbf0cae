"""Memory is checked before it is allocated: aligned_empty (core.memory) refuses what numpy refuses,
as our InvalidArgumentError; a copy larger than this machine's memory is the planner's
CopyTooLargeError (a MemoryError), raised before allocating."""

import numpy as np
import pytest

import bf16bridge as bb
from conftest import BF16


@pytest.mark.parametrize("args", [(-1,), ((2, -3),), ((2.5,),), (3, "nope"), ((True, 2),),
                                  # numpy's TypeError / ValueError before (audit)
                                  ((2, 3), np.dtype(object)), ((2,), np.dtype([("a", object)])),
                                  ((1 << 62,),), ((1 << 40, 1 << 40), np.float32), ((3,), np.dtype("V0")),
                                  ((3,), np.dtype(("f4", (2,))))])
def test_aligned_empty_refuses_what_numpy_refuses(args):
    with pytest.raises(bb.InvalidArgumentError):
        bb.aligned_empty(*args)


@pytest.mark.frameworks("torch")
def test_huge_copy_is_refused_before_allocating():
    import torch

    big = np.broadcast_to(np.ones(1, BF16), (10**6, 10**6))  # read-only: torch needs a copy
    with pytest.raises(bb.CopyTooLargeError, match="TiB"):
        bb.to_torch(big)
    e = torch.ones(1, dtype=torch.bfloat16).expand(10**6, 10**6)
    for dst in ("jax", "tensorflow"):
        with pytest.raises(bb.CopyTooLargeError):
            bb.convert(e, dst)
    assert isinstance(bb.CopyTooLargeError("x"), MemoryError)
