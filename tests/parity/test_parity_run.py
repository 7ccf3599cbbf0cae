"""parity.run and its ops (parity.ops, parity.runner): every built-in op in every framework, the ties
inputs, the argument checks, frameworks that did not run (failing unless allowed, kept by a recheck),
the frameworks and settings taken from the registry, and the bf16bridge parity CLI (json, recheck,
html, markdown)."""

import json
import subprocess
import sys

import numpy as np
import pytest

import bf16bridge as bb
from bf16bridge import parity
from bf16bridge.parity import metrics, runner
from conftest import BF16
from parity_cases import _rand


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # parity.run runs every registered framework
@pytest.mark.parametrize("op", sorted(parity.OPS))
def test_every_builtin_op_runs_in_every_framework(op):
    rep = parity.run(op)
    assert "not run" not in rep.settings, rep.settings.get("not run")
    assert len(rep.pairs) == 3 and len(rep.references) == 3
    assert rep.settings["cpu_bf16"] and "torch_threads" in rep.settings
    for r in rep.references:  # each framework is a sane bf16 implementation of the op
        if r.p99_normalised is not None:  # ops that cancel: errors against the condition scale
            assert r.p99_normalised < 4, (op, r)
        else:  # flushing subnormal results to zero is allowed here (XLA and tensorflow do): judged elsewhere
            assert _p99_ulps_where_normal(rep, r.name) < 8, (op, r)


def _p99_ulps_where_normal(rep, name):
    ref = runner._unpack(rep.data["reference"]).reshape(-1)
    x = metrics.to_float64(runner._unpack(rep.data["results"][name])).reshape(-1)
    normal = np.isfinite(ref) & np.isfinite(x) & (np.abs(ref) >= 2.0 ** -126)
    return float(np.percentile(np.abs(x[normal] - ref[normal]) / metrics.ulp_of(ref[normal], "bfloat16"), 99))


def test_ties_inputs_put_exact_results_half_way_between_bf16_numbers():
    from bf16bridge.parity.ops import OPS

    o = OPS["matmul"]
    x = o.inputs(np.random.default_rng(0), "ties", o.params)
    a, b = (metrics.to_float64(x[k]) for k in ("a", "b"))
    exact = a @ b  # integers, exact in float64 (and in float32)
    assert np.all(exact == np.round(exact))
    rne = bb.kernels.to_bf16(exact.astype(np.float32))  # nearest, ties to even
    gap = np.abs(exact - metrics.to_float64(rne))
    ties = (gap > 0) & (gap == metrics.ulp_of(exact, "bfloat16") / 2)
    assert ties.sum() > 100, "the inputs must put many results exactly half-way"
    rep = parity.run("matmul", inputs=x, policy="exact")
    for name, packed in rep.data["results"].items():  # every framework rounds every tie to even
        got = runner._unpack(packed)
        np.testing.assert_array_equal(got.view(np.uint16), rne.view(np.uint16), err_msg=name)


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_matmul_agrees_with_the_reference_within_bf16_rounding():
    rep = parity.run("matmul", k=256, policy="reference(2)")
    assert rep.passed
    for r in rep.references:
        assert r.max_normalised <= 1.0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bf16bridge", "parity", *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_cli_json_then_recheck_under_other_policies(tmp_path):
    path = tmp_path / "r.json"
    out = _cli("--ops", "softmax", "--format", "json", "--output", str(path))
    saved = json.loads(path.read_text())
    assert len(saved) == 2 and all(d["data"]["results"] for d in saved)
    assert out.returncode == (0 if all(d["passed"] for d in saved) else 1)
    n = max(d["smallest"]["ulp"] for d in saved)
    assert _cli("--recheck", str(path), "--policy", f"ulp({n})").returncode == 0
    assert n > 0, "jax's softmax differs from the others here (docs/parity.md): a recheck needs a gap to close"
    bad = _cli("--recheck", str(path), "--policy", f"ulp({n - 1})")
    assert bad.returncode == 1 and "FAILED" in bad.stdout


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_cli_html_and_markdown(tmp_path):
    # sums agree bit for bit here (docs/parity.md); exp does not (XLA and tensorflow flush subnormals)
    out = _cli("--ops", "sum", "--set", "cols=64", "--format", "html", "--output", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "ULP histogram" in page
    assert out.returncode == 0 and page.count("PASSED") == 3 and "FAILED" not in page
    md = _cli("--ops", "exp", "--format", "markdown", "--policy", "ulp(1)")  # (the default explains the flushing)
    assert md.returncode == 1 and "FAILED" in md.stdout
    assert "| pair | 0 | 1 | 2 | 3 | 4-7 |" in md.stdout and "Worst regions" in md.stdout


# -- nothing compared never passes silently ------------------------------------------


def _op_failing_in(broken: str):
    from bf16bridge.parity.ops import Op

    def boom(x, **p):
        raise RuntimeError("this framework cannot")

    return Op("twice", "2x", lambda rng, kind, p: {"x": _rand((8, 8))}, lambda x, **p: 2 * x,
              {"numpy": lambda x, **p: x * np.asarray(2, x.dtype), "torch": lambda x, **p: x * 2, broken: boom})


@pytest.mark.parametrize("frameworks,missing", [
    pytest.param(["numpy", "torch", "jax"], "jax (RuntimeError: this framework cannot)",  # raised inside run()
                 marks=pytest.mark.frameworks("torch", "jax")),
    pytest.param(["numpy", "torch", "tensorflow"], "tensorflow (no definition of this op)",
                 marks=pytest.mark.frameworks("torch", "tensorflow")),
])
def test_run_with_a_framework_that_did_not_run_fails_unless_allowed(frameworks, missing):
    op = _op_failing_in("jax")
    rep = parity.run(op, frameworks=frameworks)
    assert rep.pairs and rep.references and all(r.passed for r in rep.references), "the two that ran are right"
    assert not rep.passed and missing in rep.not_compared and missing.split(" (")[0] in rep.settings["not run"]
    assert parity.run(op, frameworks=frameworks, allow_missing=True).passed


@pytest.mark.frameworks("jax", "tensorflow")
def test_a_case_no_framework_ran_is_a_failing_report_not_an_error():
    rep = parity.run(_op_failing_in("jax"), frameworks=["jax", "tensorflow"])
    assert not rep.passed and rep.pairs == () and rep.references == ()
    assert "jax (RuntimeError: this framework cannot)" in rep.not_compared and "only 0 results" in rep.not_compared


@pytest.mark.parametrize("kwargs, says", [
    (dict(op="nosuch"), "unknown op 'nosuch'; built-in ops: matmul"),
    (dict(op="matmul", kind="weird"), "matmul takes the input kinds normal, wide, cancel, ties; got 'weird'"),
    (dict(op="exp", kind="normal"), "exp takes the input kinds all; got 'normal'"),
    (dict(op="matmul", inputs={"x": np.ones((2, 2), BF16)}), "matmul takes the inputs a, b"),
    (dict(op="sum", kk=3), "no op of this run has the size kk; the sizes each op takes: sum rows, cols"),
    (dict(op="sum", cols=0), "a size is a whole number >= 1; got cols=0"),
    (dict(op="sum", cols=2.5), "a size is a whole number >= 1; got cols=2.5"),
    (dict(op="sum", frameworks=[]), "run sum: no frameworks to run it in"),
])
def test_run_arguments_that_do_not_fit_are_our_errors_before_anything_runs(monkeypatch, kwargs, says):
    monkeypatch.setattr(runner, "convert", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(bb.InvalidArgumentError) as err:
        parity.run(**{"frameworks": ["torch", "jax"], **kwargs})
    assert says in str(err.value), str(err.value)


def test_recheck_keeps_what_did_not_run(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(runner.dumps([parity.run(_op_failing_in("jax"), frameworks=["numpy", "torch", "jax"])]))
    again = runner.recheck(path, "ulp(3)")[0]
    assert not again.passed and "jax (RuntimeError" in again.not_compared
    assert runner.recheck(path, "ulp(3)", allow_missing=True)[0].passed


def test_unknown_framework_is_our_error():
    with pytest.raises(bb.UnknownFrameworkError, match="choose one of"):
        parity.run("sum", frameworks=["torch", "mxnet"])


# -- frameworks and their settings come from the registry ----------------------------


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # the registered ones
def test_default_frameworks_are_the_registered_ones_that_compute(monkeypatch):
    from bf16bridge.core import registry
    from bf16bridge.core.adapter import Adapter

    from bf16bridge.adapters.hooks import NumericsHooks

    want = [n for n in registry.names() if registry.hooks(n, NumericsHooks).computes]
    assert runner.default_frameworks() == want and "numpy" not in want and len(want) >= 3

    class Fake(Adapter):
        name = "fake"
        computes = True

    names, hooks = registry.names, registry.hooks
    monkeypatch.setattr(registry, "names", lambda: names() + ["fake"])
    monkeypatch.setattr(registry, "hooks", lambda n, kind: Fake() if n == "fake" else hooks(n, kind))
    assert runner.default_frameworks() == want + ["fake"]


@pytest.mark.frameworks("torch")
def test_settings_ask_each_imported_framework_its_numerics():
    import torch  # imported: its numerics are asked

    from bf16bridge.core import registry

    s = runner.settings(["torch"])
    from bf16bridge.adapters.hooks import NumericsHooks

    for k, v in registry.hooks("torch", NumericsHooks).numerics().items():
        assert s[k] == v
    assert s["torch_threads"] == torch.get_num_threads()
