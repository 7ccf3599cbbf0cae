"""Thread safety (issue 8 item 14): in a fresh process, 8 threads make their first
conversions at the same moment, across all 12 pairs of numpy, torch, jax and
tensorflow (the pairs of this run's frameworks: numpy and jax in .venv-numpy25), while
the bridge loads its adapters, fills its route caches and runs its probe for the first
time. Every result must be bit-exact, no call may fail.

A fresh process is the point: in this test session the adapters are long loaded
and the caches full, so only a new interpreter shows the first-use races.
"""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import PRESENT

# The child: the frameworks are imported and the inputs made by the frameworks' own
# calls in the main thread (the bridge is not touched), then 8 threads released by
# one barrier convert every pair; the results are checked after all threads joined.
CHILD = r'''
import json, sys, threading, traceback
import numpy as np, ml_dtypes
import importlib
import bf16bridge as bb
FRAMEWORKS = tuple(json.loads(sys.argv[1]))  # this run's (tests/conftest.py PRESENT): all four in the full run
mods = {f: importlib.import_module(f) for f in FRAMEWORKS if f != "numpy"}
torch, jax, tf = (mods.get(f) for f in ("torch", "jax", "tensorflow"))

BF16 = np.dtype(ml_dtypes.bfloat16)
THREADS = 8
# numpy's adapter loads with the package (numpy is the hub); the others load on first use
loaded_before = sorted(m for m in sys.modules if m.split(".")[-1] in ("torch", "jax", "tensorflow")
                       and m.startswith("bf16bridge."))

def aligned(a):
    raw = np.empty(a.nbytes + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out

# every bf16 bit pattern (NaN payloads, -0, subnormals), shuffled
bits = np.random.default_rng(0).permutation(np.arange(1 << 16, dtype=np.uint16)).reshape(256, 256)
makers = {
    "numpy": lambda: aligned(bits).view(BF16),
    "torch": lambda: torch.from_numpy(aligned(bits)).view(torch.bfloat16),
    "jax": lambda: jax.device_put(aligned(bits).view(BF16)),
    "tensorflow": lambda: tf.bitcast(tf.constant(bits), tf.bfloat16),
}
inputs = {f: makers[f]() for f in FRAMEWORKS}

def read(y):
    if isinstance(y, np.ndarray):
        return np.ascontiguousarray(y).view(np.uint16)
    if torch is not None and isinstance(y, torch.Tensor):
        return y.contiguous().view(torch.uint16).numpy()
    if jax is not None and isinstance(y, jax.Array):
        return np.asarray(y).view(np.uint16)
    return tf.bitcast(y, tf.uint16).numpy()

pairs = [(s, d) for s in FRAMEWORKS for d in FRAMEWORKS if s != d]
barrier = threading.Barrier(THREADS)
results, errors = {}, []

def work(i):
    barrier.wait()
    order = pairs[i % len(pairs):] + pairs[:i % len(pairs)]  # each thread starts elsewhere
    for src, dst in order:
        for copy in (None, True):
            try:
                results[(i, src, dst, copy)] = bb.convert(inputs[src], dst, copy=copy)
            except BaseException as err:
                errors.append(f"thread {i} {src} -> {dst} copy={copy}: {err!r}\n{traceback.format_exc()}")

threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()

wrong = [f"{s} -> {d} copy={c} (thread {i})" for (i, s, d, c), y in results.items()
         if not np.array_equal(read(y), bits)]
print(json.dumps({"loaded_before": loaded_before, "results": len(results), "errors": errors,
                  "wrong": wrong}), flush=True)
'''


def test_first_conversions_from_8_threads_at_once_are_bit_exact():
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(PRESENT)], capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"the child printed no result (exit code {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1])
    assert report["loaded_before"] == [], "an adapter was loaded before the threads started"
    assert report["errors"] == []
    assert report["wrong"] == []
    assert report["results"] == 8 * len(PRESENT) * (len(PRESENT) - 1) * 2  # 12 pairs in the full run
    # The results were right; the process must also end cleanly. A process that
    # imported torch, tensorflow and jax has once printed "terminate called without
    # an active exception" at exit: that is a failure too, not something to hide.
    assert proc.returncode == 0, f"exit code {proc.returncode} after correct results:\n{proc.stderr[-3000:]}"
