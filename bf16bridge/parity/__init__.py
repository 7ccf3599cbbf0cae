"""Parity validation: does the same bf16 computation give the same numbers in two frameworks?

    rep = bb.parity.compare(y_torch, y_jax)                 # policy rounding(8): what bf16 rounding explains
    rep = bb.parity.compare({"torch": y1, "jax": y2, "tensorflow": y3}, reference=y_fp64)
    bb.parity.assert_parity(y_torch, y_jax, ulp=1)
    print(bb.parity.check_cast(model_f32, model_bf16, x, logits=-1))   # after bb.cast_module
    rep = bb.parity.run("matmul", frameworks=["torch", "jax", "tensorflow"])
    rep = bb.parity.trace(torch_model, (flax_module, variables), ids)  # the first layer that goes wrong
"""

from bf16bridge.parity.compare import Against, Element, Pair, Report, assert_parity, compare
from bf16bridge.parity.explain import Explained
from bf16bridge.parity.outputs import (LeafOutput, OutputMismatchError, OutputReport, OutputsDifferError, assert_outputs_close,
                      check_cast, compare_outputs)
from bf16bridge.parity.policies import (DEFAULT_POLICY, FRAMEWORK_DEFAULTS, Policy, PolicyError, allclose, exact, parse,
                                        reference, rounding, rounding_multiple, ulp)

__all__ = ["Against", "DEFAULT_POLICY", "Element", "Explained", "FRAMEWORK_DEFAULTS", "Pair", "Policy", "PolicyError",
           "Report", "allclose", "assert_parity", "compare", "exact", "parse", "recheck", "reference", "rounding",
           "rounding_multiple", "run", "suite", "ulp", "OPS",
           "LeafOutput", "OutputMismatchError", "OutputReport", "OutputsDifferError", "assert_outputs_close",
           "check_cast", "compare_outputs", "trace", "trace_cast", "tap", "TraceReport"]


def __getattr__(name):
    if name in ("trace", "trace_cast", "tap", "TraceReport"):
        from bf16bridge.parity.tracing import api, precision, report, tap

        return {"trace": api.trace, "trace_cast": precision.trace_cast, "tap": tap.tap,
                "TraceReport": report.TraceReport}[name]
    if name in ("run", "recheck", "suite", "OPS"):
        from bf16bridge.parity import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'bf16bridge.parity' has no attribute {name!r}")
