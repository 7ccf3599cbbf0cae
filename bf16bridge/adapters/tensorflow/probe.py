"""What this tensorflow can do, found by trying on first need (nothing runs at import), and the
capability probe's hooks (``TensorflowProbe``: devices, facts, fp8 matmuls).

The trials: how a tensor leaves over DLPack (``export``), what tensorflow does with each
low-precision row (``low_precision_rows``: held, exported, bit-cast), whether its copy kernel
and casts take a dtype (``copy_kernel``, ``casts``, ``rounds_as_ml_dtypes``). Each runs once and is cached; what
tensorflow writes natively while one runs (a refusal it logs) is held off stderr (``adapters.quiet``).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable, TypeVar

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core import versions
from bf16bridge.errors import FrameworkNotInstalledError
from bf16bridge.adapters import dlpack
from bf16bridge.adapters.hooks import ProbeHooks
from bf16bridge.adapters.quiet import held_native_output
from bf16bridge.adapters.trials import (MATMUL_SIDE, allocation_offsets, cast_matches, rounds_as_ml_dtypes as _rounds_as,
                                        timed_bf16_matmul)
from bf16bridge.adapters.tensorflow import internals
from bf16bridge.adapters.tensorflow.framework import tf, tf_dtype

T = TypeVar("T")


def _once(trial: Callable[[], T]) -> Callable[[], T]:
    """``trial()`` run on first call under a lock of its own, its answer kept (a failure too, raised again)."""
    found: list = []
    lock = threading.Lock()

    @functools.wraps(trial)
    def get():
        if not found:
            with lock:
                if not found:
                    try:
                        found.append((trial(), None))
                    except Exception as err:  # noqa: BLE001 - kept, and raised on every ask
                        found.append((None, err))
        value, failure = found[0]
        if failure is not None:
            raise failure
        return value

    return get


# -- DLPack export ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Export:
    """How this tensorflow hands a tensor out over DLPack: ``capsule(x)`` makes its capsule;
    ``native``: tensors have ``__dlpack__`` themselves; ``why``: the probe's account."""

    capsule: Callable[[Any], Any]
    native: bool
    why: str


@_once
def export() -> Export:
    """Tensors have ``__dlpack__`` only in newer releases; older ones (2.16) export through
    ``tf.experimental.dlpack.to_dlpack``. Neither: our error."""
    with tf.init_scope():  # eagerly, even when first asked inside a tf.function's trace
        sample = tf.zeros([1], tf.uint8)
    try:
        sample.__dlpack__()
        return Export(lambda x: x.__dlpack__(), True, "Tensor.__dlpack__() works")
    except AttributeError as err:
        try:
            tf.experimental.dlpack.to_dlpack(sample)  # the older entry point
        except Exception as older:  # noqa: BLE001 - neither works: no route out of tensorflow
            raise FrameworkNotInstalledError(
                f"tensorflow {tf.__version__} exports nothing over DLPack ({err}; {older}); bf16bridge is "
                f"tested with tensorflow {versions.tested_range('tensorflow')}") from older
        return Export(tf.experimental.dlpack.to_dlpack, False, (
            f"{err}; tensors leave through tf.experimental.dlpack.to_dlpack, wrapped in an object with "
            "__dlpack__ for consumers that want one"))


# -- the low-precision rows -------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class LowPrecisionRows:
    """What this tensorflow does with the low-precision rows (``dtypes.LOW_PRECISION``): those it
    holds, why not each other, those it exports over DLPack, those it bit-casts to their carrier."""

    held: frozenset
    why: dict
    dlpack: frozenset
    views: frozenset


def _held_sample(name: str, why: dict):
    """A tensor of row ``name``, or None with the reason in ``why``."""
    missing = dtypes.numpy_missing(name)
    if missing is not None:
        why[name] = f"tensorflow takes it from numpy, and {missing}"
        return None
    try:
        dt = tf.as_dtype(dtypes.numpy_dtype(name))
        x = tf.constant(np.zeros(2, dtypes.numpy_dtype(name)))
        if x.dtype != dt or x.numpy().dtype != dtypes.numpy_dtype(name):
            raise TypeError(f"it came back as {x.dtype.name}")
    except Exception as err:  # noqa: BLE001 - whatever it raised, tf cannot hold it
        why[name] = (f"tensorflow {tf.__version__} cannot hold {name}: "
                     f"{type(err).__name__}: {str(err).splitlines()[0][:160]}")
        return None
    return x


def _exports(x, name: str) -> bool:
    try:
        return dlpack.dtype(export().capsule(x)) == dtypes.ROWS[name].dlpack
    except Exception:  # noqa: BLE001 - no DLPack for it
        return False


def _bitcasts(x, name: str) -> bool:
    try:
        tf.bitcast(tf.bitcast(x, tf_dtype(dtypes.ROWS[name].carrier)), x.dtype)  # type: ignore[arg-type]
        return True
    except Exception:  # noqa: BLE001 - no bitcast kernel for it
        return False


@_once
def low_precision_rows() -> LowPrecisionRows:
    """Found by trying each row once (tensorflow 2.21 stores its fp8/fp4/int4 types but has no
    bitcast, DLPack or copy kernel for them)."""
    def trial():
        held, out, views = set(), set(), set()
        why: dict[str, str] = {}
        with tf.init_scope():  # eagerly, even when first asked inside a tf.function's trace
            for name in dtypes.LOW_PRECISION:
                x = _held_sample(name, why)
                if x is None:
                    continue
                held.add(name)
                if _exports(x, name):
                    out.add(name)
                if _bitcasts(x, name):
                    views.add(name)
        return LowPrecisionRows(frozenset(held), why, frozenset(out), frozenset(views))

    return held_native_output(trial, "tensorflow's low-precision rows")


def holds(name: str) -> bool:
    """Whether tensorflow holds row ``name`` here."""
    return name in dtypes.ALL or name in low_precision_rows().held


@functools.lru_cache(maxsize=None)
def copy_kernel(name: str) -> bool:
    """Whether tensorflow's copy kernel takes ``name``, tried when first asked (its kernel registry
    cannot answer: DeepCopy's CPU kernel is registered for every type; its own switch refuses)."""
    def trial():
        with tf.init_scope():
            tf.raw_ops.DeepCopy(x=tf.constant(np.zeros(2, dtypes.numpy_dtype(name))))

    try:
        held_native_output(trial, f"tensorflow's copy kernel for {name}")
        return True
    except Exception:  # noqa: BLE001 - no copy kernel for it
        return False


@functools.lru_cache(maxsize=None)
def casts(src: str, dst: str) -> bool:
    """Whether tf.cast keeps every src value in dst, tried once. A cast with no kernel raises (the
    finding) and logs natively, as does a first float16 cast on a CPU without AVX-512: those lines
    are kept off stderr."""
    return held_native_output(
        lambda: cast_matches(src, dst, lambda a: tf.cast(tf.constant(a), tf_dtype(dst)).numpy()),
        f"tf.cast from {src} to {dst}")


@functools.lru_cache(maxsize=None)
def rounds_as_ml_dtypes(src: str, dst: str) -> bool:
    """Whether tf.cast from float row ``src`` to ``dst`` gives ml_dtypes' bits, tried once on the CPU
    (tensorflow's CPU casts flush subnormals between float64 and the narrower floats)."""
    to = tf_dtype(dst)
    with tf.init_scope(), tf.device("/CPU:0"):  # eagerly, where the first cast comes inside a tf.function
        return _rounds_as(src, dst, lambda a: tf.cast(tf.constant(a), to).numpy())


# -- the capability probe's hooks ---------------------------------------------------------------

class TensorflowProbe(ProbeHooks):
    name = "tensorflow"

    def devices(self):
        out: list[tuple[str, bool | None, str]] = []
        for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            cap = tf.config.experimental.get_device_details(gpu).get("compute_capability")
            if cap is None:
                out.append((f"gpu:{i}", None, "tensorflow does not say"))
            else:
                out.append((f"gpu:{i}", tuple(cap) >= (8, 0),
                            f"compute capability {cap[0]}.{cap[1]} (bf16 arithmetic from 8.0)"))
        return out

    def facts(self):
        found = export()
        tapes = ((True, "pywrap_tfe.TFE_Py_TapeSetPossibleGradientTypes says whether a tape watches an input")
                 if internals.TAPE_UNKNOWN is None else
                 (False, f"{internals.TAPE_UNKNOWN}: whether a gradient tape watches a tf input is not known, "
                         "and not said"))
        facts = {"Tensor.__dlpack__": (found.native, found.why), "gradient tapes": tapes}
        if internals.MISSING:  # (none in the tensorflow versions tested)
            facts["private APIs"] = (False, "; ".join(f"{api} is gone: {stops} stops working"
                                                      for api, stops in internals.MISSING.items()))
        return facts

    def narrow_compute(self, dtype):
        if not holds(dtype):
            return ()
        try:
            x = tf.constant(np.ones((4, 4), dtype=dtypes.numpy_dtype(dtype)))
            tf.linalg.matmul(x, x)
        except Exception as err:  # noqa: BLE001 - what failed is the finding
            return (("cpu", "no", f"tf.linalg.matmul: {type(err).__name__}: "
                                  f"{(str(err).splitlines() or [''])[0][:200]}"),)
        return (("cpu", "unknown", "tf.linalg.matmul runs; how is not read"),)

    def bf16_compute(self):
        """tf.linalg.matmul in bf16 against float32 on the CPU, timed (eager CPU ops finish before they return)."""
        def run(dtype):
            with tf.init_scope(), tf.device("/CPU:0"):
                a = tf.ones((MATMUL_SIDE, MATMUL_SIDE), dtype=tf_dtype(dtype))

            def matmul():
                with tf.init_scope(), tf.device("/CPU:0"):
                    return tf.linalg.matmul(a, a)

            return matmul

        return (("cpu", *timed_bf16_matmul(run, "tf.linalg.matmul")),)

    def fresh_offsets(self):
        """Address mod 64 of fresh tf.zeros CPU tensors (read from their DLPack capsules)."""
        def make(n):
            with tf.init_scope(), tf.device("/CPU:0"):
                return tf.zeros([n], tf.uint8)

        return allocation_offsets(make, lambda t: dlpack.data_ptr(export().capsule(t)))


HOOKS = TensorflowProbe()
