"""import bf16bridge imports no framework; first use from many threads is safe."""

import subprocess
import sys
import textwrap

from conftest import PRESENT


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_loads_no_framework():
    out = _run("""
        import sys
        import bf16bridge as bb
        import numpy as np, ml_dtypes
        a = np.zeros(3, dtype=ml_dtypes.bfloat16)
        assert bb.framework_of(a) == "numpy"
        assert bb.convert(a, "numpy") is a
        print(sorted(m for m in ("torch", "jax", "jaxlib", "tensorflow", "keras") if m in sys.modules))
    """)
    assert out.strip() == "[]"


def test_first_use_from_many_threads():
    # eight threads, each a first conversion to one of this run's frameworks (all three in the full run)
    targets = ([t for t in ["torch", "jax", "tensorflow", "torch"] * 2 if t in PRESENT] * 8)[:8]
    out = _run(f"""
        import threading, numpy as np, ml_dtypes
        import bf16bridge as bb
        a = np.arange(1024, dtype=np.uint16).view(ml_dtypes.bfloat16)
        results, errors = [], []
        barrier = threading.Barrier(8)
        def work(to):
            try:
                barrier.wait()
                y = bb.convert(a, to)
                results.append((to, bb.to_numpy(y, copy=True).view(np.uint16).tolist() == list(range(1024))))
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=work, args=(t,)) for t in {targets!r}]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        assert len(results) == 8 and all(ok for _, ok in results), results
        print("ok")
        import os, sys; sys.stdout.flush(); os._exit(0)
    """)
    assert out.strip().endswith("ok")
