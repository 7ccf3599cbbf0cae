"""bf16bridge matrix / demo, run as a user runs them."""

import json
import subprocess
import sys

import pytest


def _cli(*args):
    out = subprocess.run([sys.executable, "-m", "bf16bridge", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_matrix_json_has_twelve_zero_copy_bit_exact_routes():
    rows = json.loads(_cli("matrix", "--format", "json"))
    assert len(rows) == 12
    assert len({(r["source"], r["target"]) for r in rows}) == 12
    for r in rows:
        assert r["bit_exact"] and not r["copies"] and r["shares_memory"], r
        assert r["writable"] == (r["target"] in ("numpy", "torch") and r["source"] not in ("jax", "tensorflow")
                                 or r["target"] == "torch")


def test_matrix_markdown():
    text = _cli("matrix", "--format", "markdown")
    assert text.startswith("| from | to | route |") and text.count("\n") >= 13


def test_demo_runs_and_says_all_pairs_are_bit_exact():
    text = _cli("demo", "--mib", "0.25", "--repeat", "1")
    assert "all 12 pairs bit-exact" in text
    assert text.count("zero-copy") >= 12


def _in_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_main_returns_so_finally_blocks_and_atexit_handlers_run():
    out = _in_process(
        "import atexit\n"
        "from bf16bridge.cli import main\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "try:\n"
        "    code = main(['probe', '--json'])\n"
        "    print('main returned', code)\n"
        "finally:\n"
        "    print('finally ran')\n"
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[-3:] == ["main returned 0", "finally ran", "atexit ran"]


def test_console_script_exits_with_mains_status_and_our_error():
    out = _in_process("import sys; sys.argv = ['bf16bridge', 'parity', '--policy', 'ulp(1.9)']\n"
                      "from bf16bridge.cli import console_main; console_main()")
    assert out.returncode == 2 and "a ULP count is a whole number" in out.stderr
    assert "Traceback" not in out.stderr


def test_parity_with_a_framework_that_cannot_run_fails_unless_allow_missing(capsys):
    from bf16bridge.cli import main

    args = ["parity", "--ops", "sum", "--set", "cols=64", "--frameworks", "torch,numpy", "--policy", "ulp(1000)"]
    assert main(args) == 1  # numpy has no definition of sum: not run, and one result compares nothing
    out = capsys.readouterr().out
    assert "not compared: not run: numpy (no definition of this op)" in out and "FAILED" in out
    assert main(args + ["--allow-missing"]) == 0
    assert "PASSED" in capsys.readouterr().out


def test_parity_refuses_unknown_names_before_running(capsys):
    from bf16bridge.cli import main

    assert main(["parity", "--frameworks", "torch,mxnet"]) == 2
    assert "unknown framework 'mxnet'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["parity", "--ops", "matmul,fft"])
    assert exit_.value.code == 2 and "unknown op(s) fft" in capsys.readouterr().err
