"""tools/device_check.sh, the prepared GPU check, run here with --dry-run on CPU tensors so it
cannot rot; and its summary, which must fail when a check did not run, failed, was skipped
without saying why, or recorded nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "device_check.sh"
SUMMARY = ROOT / "tools" / "device_summary.py"

#: every check the device tests hold, and a record each must leave (what it found)
CHECKS = {
    "test_all_patterns_bit_exact[torch->jax]": "mismatches",
    "test_all_patterns_bit_exact[jax->torch]": "mismatches",
    "test_zero_copy_by_pointer[torch->jax]": "result_ptr",
    "test_zero_copy_by_pointer[jax->torch]": "result_ptr",
    "test_device_index_kept[torch->jax]": "result_device",
    "test_device_index_kept[jax->torch]": "result_device",
    "test_producer_stream_busy[torch->jax]": "producer_busy_at_handoff",
    "test_producer_stream_busy[jax->torch]": "producer_busy_at_handoff",
    "test_copy_true_stays_on_device[torch->jax]": "result_device",
    "test_copy_true_stays_on_device[jax->torch]": "result_device",
    "test_numpy_target[torch]": "copy=True",
    "test_numpy_target[jax]": "copy=True",
    "test_torch_caller_jax_callee_grad": "grad_mismatches",
    "test_jax_caller_torch_callee": "callee_ran_on",
    "test_jax_caller_torch_callee_grad": "grad_mismatches",
    "test_jax_jit_caller_torch_callee_on_jaxs_buffers_in_order": "path",
    "test_jax_jit_torch_callee_keeping_its_input_and_giving_no_gradient": "kept_mismatches",
    "test_jax_jit_packed_types_through_a_callee": "int4",
    "test_framework_present[torch]": "installed",
    "test_framework_present[jax]": "installed",
    "test_framework_present[tensorflow]": "installed",
    "test_probe_reports_the_device": "torch_devices",
    "test_registry_present": "register_dlpack_dtype",
    "test_from_dlpack_host_copy[torch]": "np.from_dlpack",
    "test_from_dlpack_host_copy[jax]": "np.from_dlpack",
    "test_bridge_registration": "registration",
    "test_fp8_every_pattern_zero_copy[float8_e4m3fn-torch->jax]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e4m3fn-jax->torch]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e5m2-torch->jax]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e5m2-jax->torch]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e4m3fnuz-torch->jax]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e4m3fnuz-jax->torch]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e5m2fnuz-torch->jax]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e5m2fnuz-jax->torch]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e8m0fnu-torch->jax]": "route",
    "test_fp8_every_pattern_zero_copy[float8_e8m0fnu-jax->torch]": "route",
    "test_bridge_against_workaround[torch->jax]": "ratio",
    "test_bridge_against_workaround[jax->torch]": "ratio",
    "test_bridge_against_workaround[torch->numpy]": "ratio",
    "test_bridge_against_workaround[jax->numpy]": "ratio",
    "test_overhead_against_raw_dlpack[torch->jax]": "bridge_over_raw",
    "test_overhead_against_raw_dlpack[jax->torch]": "bridge_over_raw",
    "test_bridged_call_under_jit_against_pure_callback[1024]": "pure_callback_over_bridge",
    "test_bridged_call_under_jit_against_pure_callback[1048576]": "pure_callback_over_bridge",
    "test_shards_to_torch_zero_copy": "pointers_equal",
    "test_shards_back_to_jax_no_copy": "pointers_equal",
    "test_shards_to_host_target": "copy=True",
    "test_dtensor_to_jax_and_back": "round_trip_pointer_equal",
    "test_host_to_device_in_one_copy[numpy-torch]": "result_device",
    "test_host_to_device_in_one_copy[numpy-jax]": "result_device",
    "test_host_to_device_in_one_copy[torch-torch]": "result_device",
    "test_host_to_device_in_one_copy[torch-jax]": "result_device",
    "test_host_to_device_in_one_copy[jax-torch]": "result_device",
    "test_host_to_device_in_one_copy[jax-jax]": "result_device",
    "test_already_on_the_device_zero_copy[torch-torch]": "pointers_equal",
    "test_already_on_the_device_zero_copy[torch-jax]": "pointers_equal",
    "test_already_on_the_device_zero_copy[jax-torch]": "pointers_equal",
    "test_already_on_the_device_zero_copy[jax-jax]": "pointers_equal",
    "test_device_to_host_in_one_copy[torch-numpy]": "route",
    "test_device_to_host_in_one_copy[torch-torch]": "route",
    "test_device_to_host_in_one_copy[torch-jax]": "route",
    "test_device_to_host_in_one_copy[jax-numpy]": "route",
    "test_device_to_host_in_one_copy[jax-torch]": "route",
    "test_device_to_host_in_one_copy[jax-jax]": "route",
    "test_a_gpu_this_machine_lacks_is_refused[torch]": "error",
    "test_a_gpu_this_machine_lacks_is_refused[jax]": "error",
}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device-check")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BF16BRIDGE_DEVICE")}
    env["PYTHON"] = sys.executable
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
    return r, out


@pytest.mark.frameworks("torch", "jax")  # the device check moves tensors between torch and jax
def test_dry_run_passes(dry_run):
    r, out = dry_run
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "device-check.json", "device-check.log", "device-check.md", "device-junit.xml"]


@pytest.mark.frameworks("torch", "jax")  # the device check moves tensors between torch and jax
def test_dry_run_ran_every_check(dry_run):
    _, out = dry_run
    data = json.loads((out / "device-check.json").read_text())
    assert data["mode"] == "dry-run" and data["device"] == "cpu" and data["passed"] is True
    tests = {t["name"]: t for t in data["tests"]}
    assert sorted(tests) == sorted(CHECKS)
    for name, record in CHECKS.items():
        assert tests[name]["outcome"] == "passed", (name, tests[name])
        assert record in tests[name]["records"], (name, tests[name]["records"])
    # what they found, here on CPU tensors
    assert tests["test_all_patterns_bit_exact[torch->jax]"]["records"]["patterns"] == 65536
    assert tests["test_all_patterns_bit_exact[jax->torch]"]["records"]["mismatches"] == 0
    zc = tests["test_zero_copy_by_pointer[torch->jax]"]["records"]
    assert zc["source_ptr"] == zc["result_ptr"]
    for name in CHECKS:
        if name.startswith("test_bridge_against_workaround"):
            assert tests[name]["records"]["bridge_ms"] > 0 and tests[name]["records"]["workaround_ms"] > 0


@pytest.mark.frameworks("torch", "jax")  # the device check moves tensors between torch and jax
def test_dry_run_summary_says_what_ran(dry_run):
    _, out = dry_run
    md = (out / "device-check.md").read_text()
    assert md.startswith("# Device check (dry-run, ")
    assert "**PASSED**" in md
    for name in CHECKS:
        if not name.startswith(("test_bridge_against_workaround", "test_overhead_against_raw_dlpack")):
            assert f"| {name} | passed |" in md, name
    assert "## Timings" in md and "## Per call" in md
    for route in ("torch->jax", "jax->torch", "torch->numpy", "jax->numpy"):
        assert f"| {route} |" in md
    junit = (out / "device-junit.xml").read_text()
    assert f'tests="{len(CHECKS)}"' in junit and 'failures="0"' in junit and 'errors="0"' in junit


def _results(**change):
    tests = [{"nodeid": f"tests/device/x.py::{n}", "name": n, "when": "call", "outcome": "passed",
              "seconds": 0.1, "records": {r: 1}} for n, r in CHECKS.items()]
    data = {"mode": "gpu", "device": "cuda", "started": "now", "tests": tests, "warnings": [], "versions": {},
            "missing": ["tensorflow"], "sessions": [{"args": ["tests/device/x.py"], "started": "now", "finished": "then"}]}
    for name, entry in change.items():
        (t,) = [t for t in tests if t["name"] == name]
        if entry is None:
            tests.remove(t)
        else:
            t.update(entry)
    return data


def _cut_short():
    data = _results()
    del data["sessions"][0]["finished"]
    return data


# (what went wrong, the results, each test file's pytest status, what the summary must say)
BROKEN = [
    ("a check did not run", _results(**{"test_registry_present": None}), "x=0", "test_registry_present did not run"),
    ("a check recorded nothing", _results(**{"test_numpy_target[jax]": {"records": {}}}), "x=0",
     "test_numpy_target[jax] recorded nothing"),
    ("a check failed", _results(**{"test_zero_copy_by_pointer[jax->torch]": {"outcome": "failed"}}), "x=1",
     "test_zero_copy_by_pointer[jax->torch] failed"),
    ("a check was skipped", _results(**{"test_device_index_kept[torch->jax]": {"outcome": "skipped", "why": "x"}}),
     "x=0", "test_device_index_kept[torch->jax] was skipped"),
    ("a missing framework skipped without saying why",
     _results(**{"test_framework_present[tensorflow]": {"outcome": "skipped"}}), "x=0", "skipped without a reason"),
    ("a file ran out of time", _results(), "test_timings=124", "test_timings: pytest exited with status 124 (it ran past"),
    ("a file crashed", _results(), "test_routes=139", "test_routes: pytest exited with status 139 (a segmentation fault)"),
    ("a session was cut short", _cut_short(), "x=0", "did not finish"),
    ("no results at all", None, "test_functions=2", "the tests did not start"),
]


@pytest.mark.parametrize("what,data,status,says", BROKEN, ids=[b[0] for b in BROKEN])
def test_summary_fails_when_a_check_did_nothing(tmp_path, what, data, status, says):
    if data is not None:
        (tmp_path / "device-check.json").write_text(json.dumps(data))
    r = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path), "--status", status],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout
    md = (tmp_path / "device-check.md").read_text()
    assert "**FAILED**" in md and says in md, md


def test_summary_passes_a_skipped_missing_framework_that_says_so(tmp_path):
    data = _results(**{"test_framework_present[tensorflow]": {
        "outcome": "skipped", "why": "tensorflow is not installed on this machine"}})
    (tmp_path / "device-check.json").write_text(json.dumps(data))
    r = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path), "--status", "test_probe=0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    md = (tmp_path / "device-check.md").read_text()
    assert "**PASSED**" in md and "Not installed here, so not checked: tensorflow." in md
    assert "| test_framework_present[tensorflow] | skipped | installed: 1 -- tensorflow is not installed" in md


def test_normal_run_collects_no_device_test():
    env = {k: v for k, v in os.environ.items() if not k.startswith("BF16BRIDGE_DEVICE")}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "tests/device"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 5 and "no tests collected" in r.stdout, r.stdout + r.stderr


def test_summary_says_what_this_machine_could_not_check(tmp_path):
    """The "not checked" line comes from what the checks recorded: numpy without the DLPack
    registry, an fp8 row jax cannot hold; and "nothing" when everything was tried."""
    data = _results(**{"test_registry_present": {"records": {"numpy": "2.4.6", "register_dlpack_dtype": False}},
                       "test_fp8_every_pattern_zero_copy[float8_e8m0fnu-torch->jax]": {
                           "records": {"route": "none: jax cannot hold it here: upgrade ml_dtypes"}}})
    (tmp_path / "device-check.json").write_text(json.dumps(data))
    subprocess.run([sys.executable, str(SUMMARY), str(tmp_path)], capture_output=True, text=True, timeout=60)
    md = (tmp_path / "device-check.md").read_text()
    assert ("Not checked on this machine: the bridge's registration with NumPy's DLPack registry (numpy 2.4.6 has "
            "none; NumPy >= 2.5); float8_e8m0fnu-torch->jax (jax cannot hold it here: upgrade ml_dtypes).") in md, md
    (tmp_path / "device-check.json").write_text(json.dumps(_results()))
    subprocess.run([sys.executable, str(SUMMARY), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert "Not checked on this machine: nothing." in (tmp_path / "device-check.md").read_text()


def _summary_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_summary", SUMMARY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_routes_doc_holds_the_saved_gpu_run():
    """docs/routes.md's "On a GPU" block is the saved GPU run's summary, written by the tool (never by
    hand), that run passed, and the prose beside it says where the callee ran as the run recorded it."""
    mod = _summary_module()
    saved = ROOT / "benchmarks" / "results" / "device-gpu.json"
    data = json.loads(saved.read_text())
    assert data["mode"] == "gpu" and data["passed"] is True and data["problems"] == []
    doc = (ROOT / "docs" / "routes.md").read_text()
    start, end = doc.index(mod.DOCS_OPEN), doc.index(mod.DOCS_CLOSE) + len(mod.DOCS_CLOSE)
    assert doc[start:end] == mod.docs_block(data, "benchmarks/results/device-gpu.json")
    tests = {t["name"]: t["records"] for t in data["tests"]}
    jit = tests["test_jax_jit_caller_torch_callee_on_jaxs_buffers_in_order"]
    assert jit["path"] == "buffer_callback" and jit["callee_ran_on"] == jit["grad_callee_ran_on"] == "gpu:0"
    assert jit["callee_stream_is_torchs_default"] is False and jit["mismatches"] == 0 and jit["input_is_a_copy"]
    kept = tests["test_jax_jit_torch_callee_keeping_its_input_and_giving_no_gradient"]
    assert kept["kept_on"] == kept["zero_grad_on"] == "gpu:0" and kept["kept_mismatches"] == 0
    assert "a callee that keeps its input keeps its values, and a gradient it has not is zeros" in doc
    assert tests["test_jax_jit_packed_types_through_a_callee"]["int4"] == "values kept"
    assert "int4, which jax stores\npacked, crosses a jitted callee through `jax.pure_callback` with its values" in doc
    assert tests["test_jax_caller_torch_callee_grad"]["callee_ran_on"] == "gpu:0"
    assert tests["test_jax_caller_torch_callee"]["callee_ran_on"] == tests["test_torch_caller_jax_callee_grad"][
        "callee_ran_on"] == "gpu:0"
    assert "runs on the GPU, on jax's device buffers with its work queued on the\ncomputation's stream" in doc
    assert "A torch caller's jax callee runs on the GPU either way" in doc


def test_docs_mode_writes_only_a_finished_gpu_run(tmp_path):
    doc = tmp_path / "routes.md"
    doc.write_text("before\n<!-- gpu: generated by old -->\nold\n<!-- /gpu -->\nafter\n")
    dry = tmp_path / "dry.json"
    dry.write_text(json.dumps({**_results(), "mode": "dry-run"}))
    r = subprocess.run([sys.executable, str(SUMMARY), "--docs", str(dry), str(doc)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "not the results of a finished GPU run" in r.stderr
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({**_results(), "passed": True, "problems": []}))
    r = subprocess.run([sys.executable, str(SUMMARY), "--docs", str(gpu), str(doc)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    text = doc.read_text()
    assert text.startswith("before\n<!-- gpu: generated by `python tools/device_summary.py --docs ")
    assert text.endswith("<!-- /gpu -->\nafter\n") and "old" not in text and "**PASSED**" in text
