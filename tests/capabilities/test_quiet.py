"""Native output held off stderr by what it is: whatever file descriptor 2 receives while a trial runs
is the trial's own (bf16bridge.adapters.quiet), kept with its name and reported by the probe; Python's
own sys.stderr still reaches the real stderr meanwhile. No list of known messages is involved: the
lines here are ones no framework writes."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap

import pytest

from bf16bridge.adapters import quiet


def _libc_write(text: bytes) -> None:
    """A write to fd 2 from C, as a framework's C++ logger does it (no Python stream involved)."""
    libc = ctypes.CDLL(None)
    libc.write(2, text, len(text))


def test_a_trials_native_writes_are_held_and_kept_with_its_name(capfd):
    def trial():
        os.write(2, b"native line from os.write\n")
        _libc_write(b"native line from libc write\n")
        return 42

    assert quiet.held_native_output(trial, "a trial that writes natively") == 42
    out, err = capfd.readouterr()
    assert err == "" and out == ""
    what, text = quiet.written()[-1]
    assert what == "a trial that writes natively"
    assert text == "native line from os.write\nnative line from libc write"


def test_a_trial_that_writes_nothing_leaves_no_record_and_errors_pass_through(capfd):
    before = quiet.written()
    assert quiet.held_native_output(lambda: "quiet", "silent trial") == "quiet"
    assert quiet.written() == before

    def failing():
        os.write(2, b"said before failing\n")
        raise ValueError("the finding")

    with pytest.raises(ValueError, match="the finding"):
        quiet.held_native_output(failing, "failing trial")
    assert capfd.readouterr().err == ""
    assert quiet.written()[-1] == ("failing trial", "said before failing")
    os.write(2, b"after the hold\n")  # fd 2 is the real one again
    assert capfd.readouterr().err == "after the hold\n"


def test_nested_holds_keep_each_trials_own_output(capfd):
    def inner():
        os.write(2, b"inner\n")

    def outer():
        os.write(2, b"outer before\n")
        quiet.held_native_output(inner, "inner trial")
        os.write(2, b"outer after\n")

    quiet.held_native_output(outer, "outer trial")
    assert capfd.readouterr().err == ""
    assert quiet.written()[-2:] == (("inner trial", "inner"), ("outer trial", "outer before\nouter after"))


def test_python_stderr_still_reaches_the_real_stderr_and_the_probe_reports_what_was_held():
    """A fresh process with its real fd 2: a trial's native write is held, its Python print to
    sys.stderr (a warning, a log line: Python's own, which Python's settings govern) is not; a probe
    reports the held output and prints nothing."""
    code = textwrap.dedent("""
        import ctypes, json, os, sys
        import bf16bridge as bb
        from bf16bridge.adapters import quiet

        def trial():
            os.write(2, b"held: native\\n")
            print("passes: python", file=sys.stderr)
        quiet.held_native_output(trial, "mixed trial")
        print("after", file=sys.stderr)
        caps = bb.probe(refresh=True)
        print(json.dumps({"native_output": [list(p) for p in caps.native_output], "text": str(caps)}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "passes: python\nafter\n"
    got = json.loads(out.stdout)
    assert ["mixed trial", "held: native"] in got["native_output"]
    assert "held off stderr" in got["text"] and "mixed trial: held: native" in got["text"]


@pytest.mark.frameworks("torch")
def test_the_probe_holds_what_a_frameworks_hooks_write_natively(monkeypatch, capfd):
    """A probe hook that writes to fd 2 from C, as torch's profiler library does on a machine without a
    CUDA driver ("gpuGetDeviceCount failed", aarch64): nothing reaches stderr, the probe says it."""
    from bf16bridge.adapters.hooks import ProbeHooks
    import bf16bridge as bb
    from bf16bridge.core import registry

    hooks = type(registry.hooks("torch", ProbeHooks))
    real = hooks.devices

    def devices(self):
        _libc_write(b"E0101 native.cpp:50] device count failed with code 35\n")
        return real(self)

    monkeypatch.setattr(hooks, "devices", devices)
    caps = bb.probe(frameworks="torch", refresh=True)
    assert capfd.readouterr().err == ""
    held = dict(caps.native_output)
    assert "device count failed with code 35" in held["probing torch"]
    assert caps.frameworks["torch"].probed and caps.frameworks["torch"].compute  # the trials still ran
