"""Importing a framework adapter runs none of its trials: after importing
bf16bridge.adapters.<framework>.convert, every trial of that framework's probe.py (a functools cache,
or tensorflow's run-once ``_once``) is still empty; the first read of what a trial finds
(``ADAPTER.dlpack_export``) runs one. Each framework in a fresh process: this one's tests have run
the trials long before."""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import by_first_word

_TRIALS = textwrap.dedent("""
    import importlib, inspect, json, sys

    framework = sys.argv[1]
    convert = importlib.import_module(f"bf16bridge.adapters.{framework}.convert")
    probe = importlib.import_module(f"bf16bridge.adapters.{framework}.probe")

    def trials():
        # name -> whether it has run: a functools cache holding an answer, or a run-once trial whose
        # closure holds one (tensorflow's _once keeps it in a list named found)
        out = {}
        for name, obj in vars(probe).items():
            if getattr(obj, "__module__", None) != probe.__name__:
                continue
            if hasattr(obj, "cache_info"):
                out[name] = obj.cache_info().currsize > 0
            elif inspect.isfunction(obj) and "found" in obj.__code__.co_freevars:
                out[name] = bool(inspect.getclosurevars(obj).nonlocals["found"])
        return out

    at_import = trials()
    convert.ADAPTER.dlpack_export
    print(json.dumps({"trials": sorted(at_import), "at import": sorted(n for n, ran in at_import.items() if ran),
                      "on first read": sorted(n for n, ran in trials().items() if ran)}))
""")


@pytest.mark.parametrize("framework", by_first_word(["torch", "jax", "tensorflow"]))
def test_importing_an_adapter_runs_no_trial(framework):
    out = subprocess.run([sys.executable, "-c", _TRIALS, framework], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said["trials"], "no trial found in the probe module: the check would prove nothing"
    assert said["at import"] == [], said
    assert said["on first read"], said
