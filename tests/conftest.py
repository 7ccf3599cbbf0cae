"""Shared helpers: make a tensor of any framework from numpy bits, and read a
tensor's bits and data pointer back, using each framework's own calls (never
bf16bridge's), so the tests check the bridge against the frameworks."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

FRAMEWORKS = ("numpy", "torch", "jax", "tensorflow")
#: The frameworks this test run must have. A named one that cannot be imported
#: is a failure (test_environment.py), never a skip.
REQUIRED = tuple(
    f.strip() for f in os.environ.get("BF16BRIDGE_TEST_FRAMEWORKS", ",".join(FRAMEWORKS)).split(",") if f.strip()
)
#: The frameworks this run leaves out (an environment without them: .venv-numpy25 has numpy and
#: jax only). A test that needs one is deselected, and the run's header says which: a test is taken
#: to need every framework named by its parameters, and those its ``frameworks`` mark names.
EXCLUDED = tuple(f for f in FRAMEWORKS if f not in REQUIRED)
#: The frameworks of this run, in FRAMEWORKS' order: what a test that draws or loops over frameworks
#: (hypothesis strategies, a child process's pairs) takes, so that a run without torch still runs it
#: over numpy and jax. The full run's draws are unchanged (the same tuple as FRAMEWORKS).
PRESENT = tuple(f for f in FRAMEWORKS if f not in EXCLUDED)
#: The libraries some tests need beyond the frameworks: the tree libraries (the ``trees`` extra).
LIBRARIES = ("flax", "equinox", "optree", "keras")
#: The libraries this run must have (BF16BRIDGE_TEST_LIBRARIES, all by default; .venv-numpy25 has
#: none): a named one missing is a failure (test_environment.py); a test whose ``libraries`` mark
#: names one left out is deselected, and the run's summary says which.
REQUIRED_LIBRARIES = tuple(
    n.strip() for n in os.environ.get("BF16BRIDGE_TEST_LIBRARIES", ",".join(LIBRARIES)).split(",") if n.strip()
)
EXCLUDED_LIBRARIES = tuple(n for n in LIBRARIES if n not in REQUIRED_LIBRARIES)
#: frameworks whose tensors are never written in place
IMMUTABLE = ("jax", "tensorflow")
PAIRS = [(s, d) for s in FRAMEWORKS for d in FRAMEWORKS if s != d]
BF16 = np.dtype(ml_dtypes.bfloat16)

# `make fuzz`'s hypothesis profile: random inputs (the seed is pytest's --hypothesis-seed, which
# replays them), FUZZ_EXAMPLES examples a test that sets no count of its own. tests/strategies.py
# registers the others ("ci", fixed and fast, the default; "fuzz", for hunting by hand) and loads
# the one HYPOTHESIS_PROFILE names.
settings.register_profile(
    "campaign", derandomize=False, max_examples=int(os.environ.get("FUZZ_EXAMPLES", 1000)), deadline=None,
    database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
if os.environ.get("HYPOTHESIS_PROFILE") == "campaign":
    settings.load_profile("campaign")


def fw(name):
    """Import a framework module the test needs (fails, never skips, when missing)."""
    mod = {"numpy": "numpy", "torch": "torch", "jax": "jax", "tensorflow": "tensorflow"}[name]
    return importlib.import_module(mod)


def aligned_copy(a: np.ndarray, offset_bytes: int = 0) -> np.ndarray:
    """A C-contiguous copy of ``a`` whose data starts ``offset_bytes`` past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset_bytes
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def bf16_ramp(n: int = 8) -> np.ndarray:
    """``n`` bf16 values stepping by one from -3.5 (each exact in bf16): a small sample input."""
    return (np.arange(n, dtype=np.float32) - 3.5).astype(BF16)


def _ml_dtype(a: np.ndarray) -> bool:
    """An ml_dtypes array (bf16, fp8, fp6, fp4, int4, ...), which torch.from_numpy refuses."""
    return a.dtype.type.__module__.split(".")[0] == "ml_dtypes"


def make(framework: str, a: np.ndarray):
    """A tensor of ``framework`` holding exactly the bits of numpy array ``a`` (any dtype, bf16
    and the other ml_dtypes types too; torch's by the dtype of the same name)."""
    a = aligned_copy(a)
    if framework == "numpy":
        return a
    if framework == "torch":
        torch = fw("torch")
        if _ml_dtype(a):
            return torch.from_numpy(a.view(f"u{a.dtype.itemsize}")).view(getattr(torch, a.dtype.name))
        return torch.from_numpy(a)
    if framework == "jax":
        jax = fw("jax")
        return jax.device_put(a)
    if framework == "tensorflow":
        tf = fw("tensorflow")
        return tf.constant(a)
    raise ValueError(framework)


def bits(x) -> np.ndarray:
    """The raw bytes of any framework's tensor as a numpy array of same-width unsigned ints."""
    mod = type(x).__module__.split(".")[0]
    if isinstance(x, np.ndarray):
        a = np.ascontiguousarray(x)
    elif mod == "torch":
        import torch

        t = x.detach().resolve_conj().resolve_neg().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.uint16).numpy().copy()
        if t.element_size() == 1:  # fp8, fp4_x2 and the sub-byte ints have no .numpy(): their bytes
            return t.view(torch.uint8).numpy().copy()
        a = t.numpy()
    elif mod in ("jax", "jaxlib"):
        a = np.array(x)
    else:  # tensorflow
        import tensorflow as tf

        if x.dtype == tf.bfloat16:
            return tf.bitcast(x, tf.uint16).numpy()
        a = x.numpy()
    if a.dtype == np.bool_:
        return a.view(np.uint8).copy()
    return a.view(f"u{a.dtype.itemsize}" if a.dtype.kind != "c" else f"u{a.dtype.itemsize // 2}").copy()


def ptr(x) -> int:
    """The address of a tensor's first element, by each framework's own means."""
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return x.data_ptr()
    if mod in ("jax", "jaxlib"):
        x.block_until_ready()
        return x.unsafe_buffer_pointer()
    import tensorflow as tf

    u = tf.bitcast(x, tf.uint16) if x.dtype == tf.bfloat16 else x
    if hasattr(u, "__dlpack__"):
        return np.from_dlpack(u).__array_interface__["data"][0]
    # tensorflow 2.16 (the oldest set) has no Tensor.__dlpack__: its own exporter, read by torch
    import torch

    return torch.from_dlpack(tf.experimental.dlpack.to_dlpack(u)).data_ptr()


def dtype_name(x) -> str:
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return str(x.dtype).replace("torch.", "")
    if mod == "tensorflow":
        return x.dtype.name
    return np.dtype(x.dtype).name


def type_framework(x) -> str:
    mod = type(x).__module__.split(".")[0]
    return {"jaxlib": "jax"}.get(mod, mod)


@pytest.fixture(scope="session")
def all_bf16():
    """Every bf16 bit pattern, as uint16."""
    return np.arange(1 << 16, dtype=np.uint16)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "frameworks(*names): the frameworks a test needs beyond its parameters "
        "(deselected where BF16BRIDGE_TEST_FRAMEWORKS leaves one out)")
    config.addinivalue_line(
        "markers", "libraries(*names): the tree libraries a test needs (deselected where "
        "BF16BRIDGE_TEST_LIBRARIES leaves one out)")
    config.addinivalue_line(
        "markers", "subprocess: the test starts a Python process (set by reading its source; `make check` "
        "leaves these out)")


def by_first_word(values):
    """Parameters whose first word may name a framework ("torch expand", "jax random key"), each
    marked as needing it: a run without that framework deselects those cases only."""
    return [pytest.param(v, marks=pytest.mark.frameworks(*[w for w in v.split()[:1] if w in FRAMEWORKS]))
            for v in values]


def needs(item) -> set[str]:
    """The frameworks and libraries a collected test needs: the frameworks named by its parameters
    or by its ``frameworks`` mark, the libraries its ``libraries`` mark names."""
    out = {v for v in getattr(getattr(item, "callspec", None), "params", {}).values()
           if isinstance(v, str) and v in FRAMEWORKS}
    for kind, known in (("frameworks", FRAMEWORKS), ("libraries", LIBRARIES)):
        named = {n for mark in item.iter_markers(kind) for n in mark.args}
        unknown = named - set(known)
        if unknown:
            raise ValueError(f"{item.nodeid}: {kind} mark names {sorted(unknown)}; known: {known}")
        out |= named
    return out


#: what a function's source says when it starts a Python process
_STARTS_A_PROCESS = ("subprocess", "sys.executable")


def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


@functools.cache
def _process_helpers(module) -> tuple[str, ...]:
    """The module's own functions that start a process (``_run(code)``, ``dry_run()``)."""
    return tuple(name for name, obj in vars(module).items()
                 if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("test_")
                 and any(w in _source(obj) for w in _STARTS_A_PROCESS))


def _starts_a_process(fn) -> bool:
    source = _source(fn)
    helpers = _process_helpers(sys.modules[fn.__module__]) if fn.__module__ in sys.modules else ()
    return any(w in source for w in _STARTS_A_PROCESS) or any(f"{h}(" in source for h in helpers)


def pytest_collection_modifyitems(config, items):
    for item in items:
        fn = getattr(item, "function", None)
        if fn is not None and _starts_a_process(fn):
            item.add_marker(pytest.mark.subprocess)
    keep, drop = [], []
    for item in items:  # every run reads every mark: a misspelt framework fails in the full run too
        (drop if needs(item) & {*EXCLUDED, *EXCLUDED_LIBRARIES} else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _excluded_line() -> str | None:
    out = []
    if EXCLUDED:
        out.append(f"frameworks: {', '.join(REQUIRED)} (BF16BRIDGE_TEST_FRAMEWORKS); tests that need "
                   f"{', '.join(EXCLUDED)} are deselected")
    if EXCLUDED_LIBRARIES:
        out.append(f"libraries: {', '.join(REQUIRED_LIBRARIES) or 'none'} (BF16BRIDGE_TEST_LIBRARIES); tests "
                   f"that need {', '.join(EXCLUDED_LIBRARIES)} are deselected")
    return "; ".join(out) or None


def pytest_report_header(config):
    return _excluded_line()


def pytest_terminal_summary(terminalreporter):
    line = _excluded_line()  # the header is not shown under -q (make's runs); this line is
    if line:
        terminalreporter.write_line(line)


# A process that imported torch, tensorflow and jax together has crashed at
# interpreter shutdown here ("terminate called without an active exception").
# Leave with pytest's own exit status once it has printed its summary, so the
# status reflects the tests, not the frameworks' teardown.
_STATUS = {}


def pytest_sessionfinish(session, exitstatus):
    _STATUS["code"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if "code" in _STATUS and any(m in sys.modules for m in ("torch", "tensorflow", "jax")):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_STATUS["code"])


@pytest.fixture
def torch_described(monkeypatch):
    """The inputs the torch adapter describes (the full path), in order: a kept plan describes none
    (the cache emptied first: another test's tensors may have kept a plan under these keys)."""
    from bf16bridge.core import fastpath, registry

    fastpath.clear()
    adapter, seen = registry.get("torch"), []
    describe = adapter.describe

    def counting(x, **kw):
        seen.append(x)
        return describe(x, **kw)

    monkeypatch.setattr(adapter, "describe", counting)
    return seen
