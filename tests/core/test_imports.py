"""import bf16bridge imports no framework; first use from many threads is safe."""

import subprocess
import sys
import textwrap

import pytest

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


def test_import_loads_neither_the_planner_nor_a_feature():
    # what the first conversion needs loads with it: import bf16bridge stays as cheap as numpy + ml_dtypes
    out = _run("""
        import sys
        import bf16bridge
        later = ("bf16bridge.core.planner", "bf16bridge.core.plan", "bf16bridge.capabilities", "bf16bridge.functions",
                 "bf16bridge.kernels", "bf16bridge.casting", "bf16bridge.checkpoints", "bf16bridge.parity")
        print(sorted(m for m in later if m in sys.modules))
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


@pytest.mark.frameworks("jax", "tensorflow")
def test_tensorflow_imported_quietly_keeping_the_filters_others_add_meanwhile():
    """tensorflow 2.16's import reads ``jax.xla_computation``, which jax 0.4.30 says is deprecated: under
    warnings as errors that raised at the first conversion to tensorflow. Quieting it must not undo a filter
    another thread adds during the seconds the import takes (``catch_warnings`` would put back its old list)."""
    out = _run("""
        import sys, warnings
        import jax  # tensorflow's import reads jax.xla_computation where jax is imported
        warnings.simplefilter("error")
        class Meanwhile:  # what another thread does while tensorflow imports
            def find_spec(self, name, path=None, target=None):
                if name == "tensorflow":
                    warnings.filterwarnings("ignore", "added meanwhile")
                return None
        sys.meta_path.insert(0, Meanwhile())
        import bf16bridge as bb, numpy as np, ml_dtypes
        x = bb.convert(np.arange(4, dtype=np.uint16).view(ml_dtypes.bfloat16), "tensorflow")
        assert bb.to_numpy(x).view(np.uint16).tolist() == [0, 1, 2, 3]
        patterns = [f[1].pattern for f in warnings.filters if f[1] is not None]
        assert "added meanwhile" in patterns, warnings.filters  # theirs kept
        assert not [p for p in patterns if "xla_computation" in p], warnings.filters  # ours gone
        print("ok")
        import os; sys.stdout.flush(); os._exit(0)
    """)
    assert out.strip().endswith("ok")
