"""Every private tensorflow API this package uses, each behind a name of ours and guarded.

Each is looked up once, when this module is imported. One that a tensorflow version lacks
leaves a fallback behind (named in ``MISSING`` with what stops working, which the probe reports)
or, where there is none, raises our ``PrivateApiError`` naming it when used; importing
the adapter still succeeds. No other module of the package names these APIs; docs/adapters.md
lists them with the versions they were checked on.
"""

from __future__ import annotations

import contextlib
import importlib
import math

from bf16bridge.core import versions
from bf16bridge.errors import PrivateApiError
from bf16bridge.adapters.tensorflow.framework import tf

#: private API -> what stops working here without it (empty where this tensorflow has them all)
MISSING: dict[str, str] = {}


def _find(module: str, attr: str, stops: str):
    """``module.attr`` (each dotted part looked up), or None, noting it in MISSING."""
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError):
        MISSING[f"{module}.{attr}"] = stops
        return None


def gone(api: str) -> PrivateApiError:
    """Our error for a use of private API ``api`` that this tensorflow lacks."""
    return versions.private_api_missing("tensorflow", tf.__version__, api, MISSING.get(api, "its use stops working"))


# -- gradient tapes: how tensorflow itself decides whether to record an op ----------------------------
# (eager/record.py, execute.py: no active tape or accumulator on this thread, else which inputs one watches)

_TAPE = "tensorflow.python.pywrap_tfe"
_empty = _find(_TAPE, "TFE_Py_TapeSetIsEmpty",
               "telling cheaply that no gradient tape is active (each tf input is asked about instead)")
_types = _find(_TAPE, "TFE_Py_TapeSetPossibleGradientTypes",
               "telling whether a gradient tape watches a tf input: convert does not say its gradient is dropped")

#: no_tape(): no gradient tape nor forward accumulator is active on this thread (one C call); without
#: the API, a tape may be: the next question decides
no_tape = _empty if _empty is not None else (lambda: False)
#: gradient_types(tensors): non-zero where an active tape or accumulator watches any of ``tensors``
gradient_types = _types if _types is not None else (lambda tensors: 0)
#: why whether a tape watches a tf input is not known here, or None where it is
TAPE_UNKNOWN: str | None = None if _types is not None else f"{_TAPE}.TFE_Py_TapeSetPossibleGradientTypes is gone"

_RECORD = "tensorflow.python.eager.record"
_should_record = _find(_RECORD, "should_record_backprop",
                       "telling whether a tape watches a bridged call's inputs (each call builds a custom gradient)")
_stop_recording = _find(_RECORD, "stop_recording",
                        "copying a tf tensor that a gradient tape watches (copy, to_host)")


def records_backprop(tensors) -> bool:
    """Whether a GradientTape watches any of ``tensors``; without the API, assume one does."""
    return True if _should_record is None else bool(_should_record(tensors))


def stop_recording() -> contextlib.AbstractContextManager:
    """A context in which no tape records tensorflow's ops."""
    if _stop_recording is None:
        raise gone(f"{_RECORD}.stop_recording")
    return _stop_recording()


_pack_tangents = _find("tensorflow.python.eager.forwardprop_util", "pack_tangents",
                       "refusing a bridged call's input that a ForwardAccumulator watches (its tangent is lost)")


def has_tangents(tensors) -> bool:
    """Whether a ForwardAccumulator has a tangent for any of ``tensors``; without the API, none is seen."""
    return False if _pack_tangents is None else bool(_pack_tangents(tensors).tangents)


# -- XLA: whether the graph being traced is compiled as a whole ----------------------------------

_in_xla = _find("tensorflow.python.ops.control_flow_util", "GraphOrParentsInXlaContext",
                "our error for a bridged call or a numpy cast inside tf.function(jit_compile=True) "
                "(tensorflow's own error then)")


def compiled_by_xla() -> bool:
    """Whether the graph being traced is compiled by XLA as a whole (tf.function(jit_compile=True)),
    where a py_function or numpy_function has no kernel; without the API, not known: False."""
    return _in_xla is not None and bool(_in_xla(tf.compat.v1.get_default_graph()))


# -- eager tensors ---------------------------------------------------------------------------

#: the type of an eager tensor (no tf.Variable), or None: the bridge then checks every leaf for a Variable
EAGER_TENSOR: type | None = _find("tensorflow.python.framework.ops", "EagerTensor",
                                  "the bridge's cheap check that no input is a tf.Variable (each is checked), "
                                  "and reading a tensor's dtype enum and size in one C call each")

_enum = None if EAGER_TENSOR is None else _find(
    "tensorflow.python.framework.ops", "EagerTensor._datatype_enum",
    "reading a tensor's dtype enum in one C call (its dtype object is read instead)")
_count = None if EAGER_TENSOR is None else _find(
    "tensorflow.python.framework.ops", "EagerTensor._num_elements",
    "counting a tensor's elements in one C call (its shape is read instead)")


def _public_enum(x) -> int:
    return x.dtype.as_datatype_enum


def _public_count(x) -> int:
    return math.prod(tuple(x.shape))


#: datatype_enum(x): an eager tensor's dtype as tensorflow's enum (an int), one C call
datatype_enum = _enum if _enum is not None else _public_enum
#: num_elements(x): how many elements an eager tensor has, one C call
num_elements = _count if _count is not None else _public_count


# -- composite tensors ------------------------------------------------------------------------

#: the base class of tensorflow's tensors made of several (tf.__internal__), or None: such an object
#: not named otherwise is then refused with the general message
COMPOSITE_TENSOR: type | None = _find("tensorflow", "__internal__.CompositeTensor",
                                      "naming the way out for a composite tensor of a kind not listed")
