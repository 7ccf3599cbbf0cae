"""The tensorflow adapter never asks a tensor with no DLPack export (string, resource, variant) for a
pointer: converting it is our clear refusal (convert_tree with on_unsupported="keep" keeps it), never
tensorflow's abort, also after a cached plan of a tensor that has one. Run in a subprocess: an abort
would kill pytest."""

import subprocess
import sys
import textwrap

import pytest


_NO_EXPORT = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes, tensorflow as tf, jax
    import bf16bridge as bb
    from bf16bridge.core import registry
    kinds = {"string": lambda: tf.constant(["a", "b"]), "resource": lambda: tf.Variable(1.0).handle,
             "variant": lambda: tf.data.experimental.to_variant(tf.data.Dataset.range(2))}
    batch = tf.constant(np.zeros(64, ml_dtypes.bfloat16))
    for to in ("jax", "tensorflow", "numpy", "torch"):
        bb.convert(batch, to)
        bb.convert(batch, to)  # the second call takes the cached plan, keyed on the buffer's alignment
        for kind, make in kinds.items():
            x = make()
            out = bb.convert_tree({"x": batch, "text": x}, to, on_unsupported="keep")
            kept = out["text"] is x
            try:
                bb.convert(x, to)
                said = "converted"
            except bb.UnsupportedDtypeError as err:
                said = "refused" if kind in str(err) else "unnamed"
            try:
                registry.get("tensorflow").data_ptr(x)
                ptr = "pointer"
            except bb.UnsupportedDtypeError:
                ptr = "refused"
            print(to, kind, kept, said, ptr, flush=True)
""")


@pytest.fixture(scope="module")
def no_export_run():
    # in a subprocess: before the fix, tensorflow aborted the process (an abort kills pytest)
    return subprocess.run([sys.executable, "-c", _NO_EXPORT], capture_output=True, text=True, timeout=300)


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("to", ["jax", "tensorflow", "numpy", "torch"])
@pytest.mark.parametrize("kind", ["string", "resource", "variant"])
def test_tf_tensor_without_dlpack_is_refused_not_aborted_after_a_cached_plan(no_export_run, to, kind):
    assert no_export_run.returncode == 0, no_export_run.stderr[-2000:]
    assert f"{to} {kind} True refused refused" in no_export_run.stdout.splitlines()
