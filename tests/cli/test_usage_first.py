"""A usage error is said before any framework is imported: `bf16bridge parity --ops foo` imported torch,
jax and tensorflow (seconds) before it looked at its arguments. And `parity --help` says the default
policy and the op names."""

import subprocess
import sys

import pytest

from bf16bridge.cli import main as cli

FRAMEWORKS = ("torch", "jax", "tensorflow")
# main() as the console script calls it (native_log_level set: it imports the frameworks the command uses
# before running it, to quiet their start-up lines), then which frameworks that imported
CODE = ("import sys\nfrom bf16bridge.cli.main import main\n"
        "status = main(sys.argv[1:], native_log_level=1)\n"
        f"print(status, sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))")


@pytest.mark.parametrize("argv, says", [
    (["parity", "--ops", "foo"], "unknown op foo; built-in ops: matmul,"),
    (["parity", "--frameworks", "torch"], "--frameworks torch names only torch"),
    (["parity", "--frameworks", "torch,jaxx"], "unknown framework 'jaxx'"),
    (["parity", "--set", "k=x"], "--set takes NAME=INTEGER"),
    (["parity", "--policy", "ulp(1.9)"], "a ULP count is a whole number"),
    (["parity", "--output", "/no/such/dir/r.txt"], "no such directory"),
    (["parity", "--recheck", "r.json", "--ops", "exp"], "--ops would change nothing"),
    (["probe", "--frameworks", "torch,jaxx"], "unknown framework 'jaxx'"),
    (["matrix", "--dtype", "float9"], "unknown dtype float9"),
    (["demo", "--extra"], "unrecognized arguments: --extra"),
])
def test_a_usage_error_imports_no_framework(argv, says):
    out = subprocess.run([sys.executable, "-c", CODE, *argv], capture_output=True, text=True, timeout=300)
    assert out.stdout.splitlines() == ["2 []"], out.stdout + out.stderr[-3000:]
    assert says in out.stderr, out.stderr


def test_parity_help_says_the_default_policy_and_every_op(capsys):
    from bf16bridge.parity.ops import OPS
    from bf16bridge.parity.policies import DEFAULT_POLICY

    assert cli.main(["parity", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert f"(default: {DEFAULT_POLICY})" in text
    assert f"(default: all): {', '.join(OPS)}" in text


def test_the_policy_default_is_the_parity_constant(monkeypatch):
    """Read from bf16bridge.parity.policies.DEFAULT_POLICY when the parser is made, never a copy of it."""
    from bf16bridge.parity import policies

    monkeypatch.setattr(policies, "DEFAULT_POLICY", "ulp(7)")
    _, subs = cli._parser()
    assert subs["parity"].parse_args([]).policy == "ulp(7)"
    assert "(default: ulp(7))" in " ".join(subs["parity"].format_help().split())
