"""The device check's tests: run by tools/device_check.sh, never by the normal run.

``BF16BRIDGE_DEVICE`` names the device the tests put their tensors on: "cuda" on
a GPU machine, "cpu" for the dry run (``tools/device_check.sh --dry-run``), which
runs the same tests on CPU tensors so that they are exercised in CI. Without it
(the ordinary ``pytest`` run, whose testpaths include tests/), nothing here is
collected.

Each test records what it found with ``record_property``; this file gathers those
records and the outcomes into ``$BF16BRIDGE_DEVICE_OUT/device-check.json`` after
every test (so a run cut short still leaves its results), which
tools/device_summary.py turns into the Markdown summary. The script runs each test
file in a process of its own (a crash loses one file, not the run): a session
appends to the results an earlier one left.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

import pytest

DEVICE = os.environ.get("BF16BRIDGE_DEVICE")
if DEVICE is None:
    collect_ignore_glob = ["test_*.py"]
elif DEVICE not in ("cuda", "cpu"):
    raise pytest.UsageError(f"BF16BRIDGE_DEVICE must be 'cuda' or 'cpu'; got {DEVICE!r}")

#: the distributions whose versions the summary shows (read from metadata: nothing imported)
DISTRIBUTIONS = ("numpy", "ml_dtypes", "torch", "jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin",
                 "tensorflow", "tensorflow-cpu", "cupy-cuda13x", "pytest")

_RESULTS: dict = {"tests": [], "warnings": []}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _path() -> Path | None:
    out = os.environ.get("BF16BRIDGE_DEVICE_OUT")
    return Path(out) / "device-check.json" if DEVICE is not None and out else None


def pytest_configure(config):
    if DEVICE is None:
        return
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    path = _path()
    if path is not None and path.exists():  # an earlier file's session of the same run
        _RESULTS.update(json.loads(path.read_text()))
    _RESULTS.setdefault("sessions", []).append({"args": [str(a) for a in config.args], "started": now})
    _RESULTS.update(
        mode="gpu" if DEVICE == "cuda" else "dry-run",
        device=DEVICE,
        started=_RESULTS.get("started", now),
        python=platform.python_version(),
        machine=platform.machine(),
        versions={d: _version(d) for d in DISTRIBUTIONS if _version(d) is not None},
        missing=[d for d in ("torch", "jax", "tensorflow") if _version(d) is None
                 and not (d == "tensorflow" and _version("tensorflow-cpu"))],
    )


def _save() -> None:
    path = _path()
    if path is None:
        return
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_RESULTS, indent=1, default=str))
    tmp.replace(path)


def pytest_runtest_logreport(report):
    if DEVICE is None:
        return
    # one entry per test: its call, or the phase that failed or skipped it
    if report.when != "call" and report.passed:
        return
    entry = {
        "nodeid": report.nodeid,
        "name": report.nodeid.split("::")[-1],
        "when": report.when,
        "outcome": report.outcome,
        "seconds": round(report.duration, 4),
        "records": {k: v for k, v in report.user_properties},
    }
    if report.skipped and isinstance(report.longrepr, tuple):
        entry["why"] = str(report.longrepr[2])
    elif report.failed:
        crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
        entry["why"] = f"{crash}\n{(report.longreprtext or '')[-1500:]}" if crash else (report.longreprtext or "")[-1500:]
    tests = _RESULTS["tests"]
    if tests and tests[-1]["nodeid"] == report.nodeid and report.when == "teardown":
        tests[-1]["outcome"] = "failed"  # a teardown error fails a test that passed
        tests[-1]["why"] = entry.get("why", "")
    else:
        tests.append(entry)
    _save()


def pytest_warning_recorded(warning_message, when, nodeid, location):
    if DEVICE is not None:
        _RESULTS["warnings"].append(f"{nodeid}: {warning_message.category.__name__}: {warning_message.message}")


def pytest_sessionfinish(session, exitstatus):
    if DEVICE is None:
        return
    _RESULTS["sessions"][-1].update(
        finished=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        status=int(exitstatus))
    _save()


# -- fixtures -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def torch_device():
    """The torch device the tests use: the last GPU (so that a machine with several tries
    a device index other than 0), or the CPU in the dry run."""
    import torch

    if DEVICE == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.fail("BF16BRIDGE_DEVICE=cuda, but torch sees no GPU (torch.cuda.is_available() is False)")
    return torch.device("cuda", torch.cuda.device_count() - 1)


@pytest.fixture(scope="session")
def jax_device(torch_device):
    """The jax device holding the same memory as ``torch_device``."""
    import jax

    if DEVICE == "cpu":
        return jax.devices("cpu")[0]
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as err:
        pytest.fail(f"BF16BRIDGE_DEVICE=cuda, but jax sees no GPU: {err}")
    (dev,) = [d for d in gpus if d.id == torch_device.index]
    return dev


@pytest.fixture(scope="session")
def all_u16():
    """Every bf16 bit pattern, as uint16 on the host."""
    import numpy as np

    return np.arange(1 << 16, dtype=np.uint16)


if DEVICE is not None:
    sys.path.insert(0, str(Path(__file__).parent))  # devicehelp, whatever pytest's import mode
