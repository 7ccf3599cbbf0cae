"""`bf16bridge probe` says first, one line a framework, what a bf16 tensor should arrive as there and
why; the findings behind it under --verbose, no phrase cut off; --json carries the same decisions."""

import json
import subprocess
import sys

import pytest

import bf16bridge as bb
from bf16bridge.cli import main as cli

DTYPES = ("bfloat16", "float32", "bits")


def _probe(capsys, *args) -> str:
    assert cli.main(["probe", *args]) == 0
    return capsys.readouterr().out


def _fresh(*args) -> str:
    """A probe in a fresh process, where no framework is imported unless asked."""
    out = subprocess.run([sys.executable, "-m", "bf16bridge", "probe", *args], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _names() -> list[str]:
    return ["numpy", *bb.probe().frameworks]


def test_the_first_lines_are_one_per_framework_decision_first():
    lines = _fresh().splitlines()
    names = _names()
    assert [line.split()[0] for line in lines[:len(names)]] == names
    head = dict(line.split(None, 1) for line in lines[:len(names)])
    assert head["numpy"].startswith(tuple(f"{d} to store" for d in DTYPES) + tuple(f"{d}: " for d in DTYPES))
    for name in names[1:]:  # not imported by a bare probe: said so, with the way to try it
        assert head[name].startswith(("not tried (", "not installed")), head[name]
    assert len(lines) == len(names) + 1 and "--verbose" in lines[-1]  # then what the lines are, and no more


@pytest.mark.frameworks("torch")
def test_a_probed_framework_line_is_its_decisions_and_their_reason(capsys):
    lines = _probe(capsys, "--frameworks", "torch").splitlines()
    torch = next(line for line in lines if line.startswith("torch "))
    caps = bb.probe(frameworks=["torch"])
    store, compute = caps.decide("torch"), caps.decide("torch", for_compute=True)
    said = torch.split(None, 1)[1]
    # (a reason may carry a time measured when asked: the words before the first number are compared)
    if store.dtype != "bfloat16":
        assert said.startswith(f"{store.dtype}: {store.reason.split('(')[0]}"), said
    elif compute.dtype == store.dtype:
        assert said.startswith(f"bfloat16 to store and to compute: {compute.reason.split('(')[0]}"), said
    else:
        assert said.startswith(f"bfloat16 to store, {compute.dtype} to compute: {compute.reason.split('(')[0]}")


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_verbose_has_the_findings_and_no_phrase_is_cut_off(capsys):
    short = _probe(capsys, "--frameworks", "all").splitlines()
    full = _probe(capsys, "--frameworks", "all", "--verbose")
    n = len(_names())
    assert [line.split(":")[0] for line in full.splitlines()[:n + 1]] == [line.split(":")[0] for line in short]
    assert "cpu bf16 compute" in full and "why not:" in full
    assert "cpu bf16 compute" not in "\n".join(short) and len(short) == n + 1


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_no_reason_in_the_findings_ends_cut_off(capsys):
    """`DLPack import: not tried: its own export fails; the adapter declares no` (declares no what?)."""
    full = _probe(capsys, "--frameworks", "all", "--verbose")
    cut = [line for line in full.splitlines() if line.rstrip().endswith(("declares no", "declares yes"))]
    assert not cut, cut


def test_json_has_each_frameworks_decisions_with_their_reasons():
    out = json.loads(_fresh("--json"))
    caps = bb.probe()
    decided = out["decisions"]
    assert list(decided) == _names()
    for key, kw in (("storage", {}), ("for_compute", {"for_compute": True})):
        want = caps.decide("numpy", **kw)
        assert decided["numpy"][key] == {"dtype": want.dtype, "reason": want.reason}
    for name in _names()[1:]:  # not probed here: no decision, and why
        assert decided[name]["storage"] is None and decided[name]["why"] == out["frameworks"][name]["why"]


@pytest.mark.frameworks("torch")
def test_json_decisions_of_a_probed_framework(capsys):
    decided = json.loads(_probe(capsys, "--frameworks", "torch", "--json"))["decisions"]["torch"]
    caps = bb.probe(frameworks=["torch"])
    assert decided["storage"]["dtype"] == caps.decide("torch").dtype and decided["storage"]["reason"]
    assert decided["for_compute"]["dtype"] == caps.decide("torch", for_compute=True).dtype
    assert decided["for_compute"]["reason"]
    assert decided["devices"] == {}  # the CPU's decision is for_compute's; another device differs, or is left out
