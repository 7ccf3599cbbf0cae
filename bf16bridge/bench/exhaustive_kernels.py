"""Check kernels.to_bf16 against ml_dtypes on all 2**32 float32 inputs, for every backend.

    python -m bf16bridge.bench.exhaustive_kernels [--backends numpy,torch] [--chunk-bits 24]

By default every backend but ml_dtypes (the reference): numpy and each registered
adapter offering kernels (torch's), importing its framework.

Prints one line per backend with the number of mismatches (0 expected) and exits
non-zero on any. Takes about a minute per backend on two cores.
"""

from __future__ import annotations

import argparse
import sys
import time

import ml_dtypes
import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backends", default="", help="comma-separated (default: all but ml_dtypes)")
    ap.add_argument("--chunk-bits", type=int, default=24)
    args = ap.parse_args(argv)
    from bf16bridge import kernels

    backends = [b for b in args.backends.split(",") if b] or [
        b for b in kernels.backends(importing=True) if b not in ("auto", "ml_dtypes")]
    backends = [kernels.pick_backend(b) for b in backends]  # refuses unknown names; imports a framework asked for

    step = 1 << args.chunk_bits
    bad = {b: 0 for b in backends}
    first: dict[str, tuple[str, str, str]] = {}
    out = np.empty(step, dtype=ml_dtypes.bfloat16)
    t0 = time.perf_counter()
    for lo in range(0, 1 << 32, step):
        u = np.arange(lo, lo + step, dtype=np.uint64).astype(np.uint32)
        x = u.view(np.float32)
        with np.errstate(invalid="ignore"):
            ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        for b in backends:
            y = kernels.to_bf16(x, out=out, backend=b).view(np.uint16)
            diff = np.flatnonzero(y != ref)
            if diff.size:
                bad[b] += int(diff.size)
                first.setdefault(b, (hex(int(u[diff[0]])), hex(int(ref[diff[0]])), hex(int(y[diff[0]]))))
    took = time.perf_counter() - t0
    for b in backends:
        print(f"{b}: {bad[b]} mismatches in 2**32 inputs" + (f", first {first[b]}" if b in first else ""))
    print(f"checked in {took:.0f} s")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
