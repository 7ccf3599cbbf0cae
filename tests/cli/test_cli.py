"""bf16bridge on the command line: main() in-process where it can, a subprocess where the
environment or a fresh process matters."""

import functools
import json
import os
import subprocess
import sys

import pytest

from bf16bridge.cli import main as cli
from bf16bridge.parity.policies import DEFAULT_POLICY
from conftest import PRESENT

BANNERS = ("absl::InitializeLog", "oneDNN custom operations")  # tensorflow 2.21's, at import (2.16: the second)


def _run(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bf16bridge", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def _cli(*args):
    out = _run(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _env(**set_):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "JAX_LOGGING_LEVEL")}
    env.update(set_)
    return env


@pytest.mark.frameworks("jax")
def test_matrix_and_demo_leave_out_a_framework_that_is_not_installed_and_say_so():
    """Without torch (an import that fails, as where it is not installed) the matrix and the demo
    run over the frameworks that are usable and name the one left out with its extra; both failed
    outright ("torch is not usable here") for a numpy and jax user."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "from bf16bridge.cli import main as cli\n"
            "sys.exit(cli.main(sys.argv[1:]))")
    left = [f for f in PRESENT if f != "torch"]
    pairs = {(s, d) for s in left for d in left if s != d}

    def run(*args):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return out

    note = "torch: torch is not usable here"
    out = run("matrix", "--format", "json")
    rows = json.loads(out.stdout)
    assert {(r["source"], r["target"]) for r in rows} == pairs and all(r["bit_exact"] for r in rows)
    assert note in out.stderr and "pip install 'bf16bridge[torch]'" in out.stderr
    assert note in run("matrix").stdout
    demo = run("demo", "--mib", "0.01", "--repeat", "1").stdout
    assert note in demo and f"all {len(pairs)} pairs bit-exact" in demo and "torch ->" not in demo


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # the matrix and the demo run every registered framework
def test_matrix_json_has_twelve_zero_copy_bit_exact_routes():
    rows = json.loads(_cli("matrix", "--format", "json"))
    assert len(rows) == 12
    assert len({(r["source"], r["target"]) for r in rows}) == 12
    for r in rows:  # (jax 0.4.30 aligns its own buffers to 64 bytes by chance only: the matrix aligns them)
        assert r["bit_exact"] and not r["copies"] and r["shares_memory"], r
        assert r["writable"] == (r["target"] in ("numpy", "torch") and r["source"] not in ("jax", "tensorflow")
                                 or r["target"] == "torch")


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_matrix_markdown_is_the_table_alone_and_says_its_assumptions_on_stderr():
    out = _run("matrix", "--format", "markdown", env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("| from | to | route |") and out.stdout.count("\n") == 14
    assert "assumes" not in out.stdout  # docs/routes.md embeds stdout
    assert "contiguous, 64-byte aligned" in out.stderr and "transposed 2-D torch tensor" in out.stderr
    assert not [b for b in BANNERS if b in out.stderr], out.stderr


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_matrix_text_states_its_assumptions_and_the_inputs_that_copy():
    text = _cli("matrix")
    assert "assumes: each route is for a contiguous, 64-byte aligned, writable bf16 tensor" in text
    lines = text.splitlines()
    copies = [line for line in lines if line.startswith(("default numpy allocation", "read-only numpy",
                                                         "transposed 2-D torch")) and " copy " in line]
    # unaligned -> jax, tf; read-only -> torch; transposed -> tf, and -> jax unless jax keeps a permuted layout
    from bf16bridge.adapters.jax import probe

    assert len(copies) == (4 if probe.takes_permuted() else 5), "\n".join(lines)


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_demo_runs_and_says_all_pairs_are_bit_exact():
    text = _cli("demo", "--mib", "0.25", "--repeat", "1")
    assert "all 12 pairs bit-exact" in text
    assert text.count("zero-copy") >= 12


def _in_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_main_returns_so_finally_blocks_and_atexit_handlers_run():
    out = _in_process(
        "import atexit\n"
        "from bf16bridge.cli.main import main\n"
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
                      "from bf16bridge.cli.main import console_main; console_main()")
    assert out.returncode == 2 and "a ULP count is a whole number" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_reader_that_leaves_early_ends_the_script_quietly():
    """`bf16bridge matrix --dtype all --format json | head` ended in a BrokenPipeError traceback."""
    with subprocess.Popen([sys.executable, "-m", "bf16bridge", "matrix", "--dtype", "all", "--format", "json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout.read(100)  # then leave: the rest (far more than a pipe holds) has nowhere to go
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=600) == cli.BROKEN_PIPE, err[-3000:]
    assert "Traceback" not in err and "BrokenPipeError" not in err, err[-3000:]


@pytest.mark.parametrize("command", [[], ["demo"], ["matrix"], ["probe"], ["parity"]])
def test_help_is_plain_text_and_main_returns_0(capsys, command):
    assert cli.main([*command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bf16bridge")
    for markup in ("``", ":func:", ":class:", ":meth:", ".. "):
        assert markup not in out, (markup, out)


@pytest.mark.parametrize("argv, says", [
    (["parity", "--frameworks", "torch,jaxx"],
     ["usage: bf16bridge parity", "unknown framework 'jaxx'; choose one of numpy (np), torch (pt, pytorch), jax"]),
    (["parity", "--ops", "nosuchop"], ["usage: bf16bridge parity", "unknown op nosuchop; built-in ops: matmul,"]),
    (["parity", "--ops", "matmul,fft,ffft"], ["unknown ops fft, ffft; built-in ops: matmul,"]),
    # given, an empty list names no op: it once read as "all ops" (left out, --ops means all)
    (["parity", "--ops", ","], ["usage: bf16bridge parity", "--ops ',' names nothing; name one or more"]),
    (["parity", "--ops", ""], ["--ops '' names nothing"]),
    (["parity", "--frameworks", ", "], ["--frameworks ', ' names nothing"]),
    (["parity", "--recheck", "r.json", "--ops", ""], ["--ops would change nothing"]),
    (["parity", "--frameworks", "torch"],
     ["two or more frameworks; --frameworks torch names only torch; choose two or more of numpy, torch, jax"]),
    (["parity", "--frameworks", "torch,pt", "--allow-missing"], ["--frameworks torch,pt names only torch"]),
    (["probe", "--frameworks", "torch,jaxx"], ["usage: bf16bridge probe", "unknown framework 'jaxx'"]),
    (["matrix", "--format", "html"], ["usage: bf16bridge matrix", "invalid choice: 'html'"]),
    (["matrix", "--dtype", "float9"], ["usage: bf16bridge matrix", "unknown dtype float9; choose 'all' or one or more",
                                       "float8_e4m3fn"]),
    (["matrix", "--dtype", "int4,bf16"], ["unknown dtype bf16; choose"]),
    (["parity", "--output", "/no/such/dir/r.txt"], ["--output /no/such/dir/r.txt: no such directory"]),
    (["parity", "--output", "."], ["--output . is a directory; name a file in it"]),
    (["demo", "--repeat", "0"], ["usage: bf16bridge demo", "argument --repeat: a whole number >= 1"]),
    (["demo", "--mib", "nan"], ["argument --mib: a size in MiB that holds one bf16 value or more", "not 'nan'"]),
    (["demo", "--mib", "inf"], ["not 'inf'"]),
    (["demo", "--mib", "0"], ["not '0'"]),
    (["demo", "--mib", "1e-9"], ["not '1e-9'"]),  # no whole bf16 value: an empty run
    (["parity", "--seed", "-1"], ["argument --seed: a whole number >= 0, not '-1'"]),
    (["parity", "--set", "k=16", "--set", "k=32"], ["--set k given twice"]),
    # "²" is a digit to str.isdigit and no number to int(): a raw ValueError
    (["parity", "--set", "k=\u00b2"], ["--set takes NAME=INTEGER; got 'k=\u00b2'"]),
    (["demo", "--repeat", "\u00b2"], ["argument --repeat: a whole number >= 1"]),
    # an --output that cannot be written: said before the run (it ended in a raw error, the results lost)
    (["parity", "--output", "/proc/r.json"], ["--output /proc/r.json: cannot write there"]),
    (["parity", "--recheck", "r.json", "--ops", "exp", "--seed", "0"],
     ["--recheck judges saved results again and runs nothing; --ops, --seed would change nothing"]),
    (["parity", "--recheck", "r.json", "--frameworks", "torch,jax", "--set", "k=1"], ["--frameworks, --set would"]),
])
def test_unknown_names_and_one_framework_are_usage_errors_before_anything_runs(monkeypatch, capsys, argv, says):
    from bf16bridge.cli import demo
    from bf16bridge.parity import runner

    def must_not_run(*a, **k):
        raise AssertionError("ran")
    monkeypatch.setattr(runner, "suite", must_not_run)
    monkeypatch.setattr(demo, "demo", must_not_run)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    for s in says:
        assert s in err, err


def _saved(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("argv, says", [
    (["--set", "kk=16", "--ops", "matmul"], "no op of this run has the size kk; the sizes each op takes: matmul m, k, n"),
    (["--set", "cols=64"], "no op of this run has the size cols"),  # the run is matmul only
    (["--set", "k=0"], "a size is a whole number >= 1; got k=0"),
    (["--recheck", "{tmp}/none.json"], "recheck {tmp}/none.json: cannot read it (No such file or directory)"),
    (["--recheck", "not json"], "not JSON"),
    (["--recheck", '{"op": "sum"}'], "not a list of parity reports"),
    (["--recheck", '[{"op": "sum"}]'], "a report without its results (sum)"),
    (["--recheck", '[{"op": "sum", "data": {"results": {"torch": {"dtype": "bfloat16"}}}}]'],
     "the results of sum are damaged (KeyError"),
])
def test_parity_sizes_and_saved_results_that_do_not_fit_are_our_errors_before_anything_runs(
        monkeypatch, capsys, tmp_path, argv, says):
    from bf16bridge.parity import runner

    def must_not_run(*a, **k):
        raise AssertionError("ran")
    monkeypatch.setattr(runner, "run", must_not_run)
    if argv[0] == "--recheck" and "{tmp}" not in argv[1]:
        argv = ["--recheck", _saved(tmp_path, "r.json", argv[1])]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--ops" not in argv and "--recheck" not in argv:
        argv += ["--ops", "matmul"]
    assert cli.main(["parity", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bf16bridge parity: error: ") and says.replace("{tmp}", str(tmp_path)) in err, err
    assert "Traceback" not in err


def test_parity_settings_skip_a_framework_whose_import_was_blocked():
    """A module set to None in sys.modules (how tests and sandboxes block an import) is not imported:
    asking its adapter for its numerics raised FrameworkNotInstalledError and ended the whole run."""
    code = ("import sys; sys.modules['jax'] = None\n"
            "from bf16bridge.parity import runner\n"
            "s = runner.settings(['jax', 'numpy'])\n"
            "assert 'jax_version' in s and not any(k.startswith('jax_') and k != 'jax_version' for k in s), s\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.frameworks("torch", "jax")
def test_parity_with_a_framework_that_cannot_run_fails_unless_allow_missing(capsys):
    args = ["parity", "--ops", "sum", "--set", "cols=64", "--frameworks", "torch,jax,numpy", "--policy", "ulp(1000)"]
    assert cli.main(args) == 1  # numpy has no definition of sum: not run
    out = capsys.readouterr().out
    assert "not compared: not run: numpy (no definition of this op)" in out and "FAILED" in out
    assert cli.main(args + ["--allow-missing"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and out.rstrip().endswith("3 of 3 cases pass ulp(1000)")


@pytest.mark.frameworks("torch")  # only torch runs: without torch, nothing would run for another reason
def test_parity_that_compared_nothing_fails_even_with_allow_missing(capsys):
    args = ["parity", "--ops", "sum", "--set", "cols=64", "--frameworks", "torch,numpy", "--allow-missing"]
    assert cli.main(args) == 1  # only torch ran: every case passes as allowed, and nothing was compared
    out = capsys.readouterr().out.rstrip()
    assert out.endswith(f"3 of 3 cases pass {DEFAULT_POLICY}; FAILED: nothing was compared "
                        "(no case had results from two frameworks)")


@pytest.mark.frameworks("torch", "jax")
def test_parity_output_says_where_it_wrote_and_the_summary(tmp_path, capsys):
    saved = tmp_path / "r.json"
    assert cli.main(["parity", "--ops", "sum", "--set", "cols=64", "--frameworks", "torch,jax", "--format", "json",
                     "--output", str(saved)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote 3 cases (json) to {saved}",
                                                    f"3 of 3 cases pass {DEFAULT_POLICY}"]
    assert len(json.loads(saved.read_text())) == 3
    page = tmp_path / "r.md"
    assert cli.main(["parity", "--recheck", str(saved), "--policy", "ulp(2)", "--format", "markdown",
                     "--output", str(page)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"wrote 3 cases (markdown) to {page}", "3 of 3 cases pass ulp(2)"]
    assert page.read_text().count("sum") >= 3


@pytest.mark.frameworks("torch")
def test_parity_output_that_fails_says_why(tmp_path, capsys):
    page = tmp_path / "r.html"
    assert cli.main(["parity", "--ops", "sum", "--set", "cols=64", "--frameworks", "torch,numpy", "--format", "html",
                     "--output", str(page)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"wrote 3 cases (html) to {page}",
        f"0 of 3 cases pass {DEFAULT_POLICY}; failing: sum cols=64 [normal], sum cols=64 [cancel], "
        "sum cols=64 [ties]; "
        "FAILED: nothing was compared (no case had results from two frameworks)"]


@pytest.mark.parametrize("argv", [["demo", "--mib", "1e9", "--repeat", "1"],
                                  ["parity", "--ops", "matmul", "--frameworks", "numpy,jax", "--set", f"k={10**15}"]])
def test_a_size_this_machine_cannot_hold_is_our_usage_error(capsys, argv):
    """A raw numpy MemoryError (its traceback, and status 1: 'a case failed') before. (Sizes beyond any
    address space: no overcommit setting lets them be allocated.)"""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bf16bridge {argv[0]}: error: out of memory") and "smaller size" in err, err
    assert "Traceback" not in err


def test_the_output_check_changes_nothing_there(tmp_path, capsys):
    """--output is checked before the run without touching what is there: a file keeps its content, a
    dangling link stays a link (the check once removed it and left an empty file at its target), and
    nothing is left where nothing was."""
    kept, link, fresh = tmp_path / "kept.json", tmp_path / "link.json", tmp_path / "fresh.json"
    kept.write_text("mine")
    link.symlink_to(tmp_path / "target.json")
    for path in (kept, link, fresh):
        assert cli.main(["parity", "--output", str(path), "--set", "k=x"]) == 2  # a usage error after the check
        assert "--set takes NAME=INTEGER" in capsys.readouterr().err
    assert kept.read_text() == "mine" and link.is_symlink() and not (tmp_path / "target.json").exists()
    assert not fresh.exists()


def test_probe_suggests_the_command_line_not_a_python_call():
    out = _run("probe", env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "probe(frameworks=" not in out.stdout
    names = [n for n in PRESENT if n != "numpy"]  # this run's (torch, jax, tensorflow in the full run)
    for name in names:  # none imported by a bare probe
        assert f": not imported; 'bf16bridge probe --frameworks all' (or '--frameworks {name}') imports" in out.stdout
    caps = json.loads(_cli("probe", "--json"))
    assert all("--frameworks all" in caps["frameworks"][name]["why"] for name in names)


@pytest.mark.frameworks("tensorflow")
@pytest.mark.parametrize("env, banners", [
    ({}, False),  # the script quiets them
    ({"TF_CPP_MIN_LOG_LEVEL": "1"}, False),  # the user's level, held although tensorflow 2.21 ignores it here
    ({"TF_CPP_MIN_LOG_LEVEL": "0"}, True),  # the user asked for everything: not overridden
    ({"JAX_LOGGING_LEVEL": "INFO"}, True),
])
def test_framework_log_banners_are_quieted_unless_the_user_set_a_level(env, banners):
    out = _run("probe", "--frameworks", "tensorflow", "--json", env=_env(**env))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["frameworks"]["tensorflow"]["probed"]
    # the banners tensorflow itself prints at import here (2.16, the oldest declared: the oneDNN line only);
    # asked for, they reach the user: on stderr, or, written while the probe imported tensorflow, held
    # off stderr as that import's own output and kept in the probe's record (the JSON on stdout)
    shown = {b for b in BANNERS if b in out.stderr or (banners and b in out.stdout)}
    assert shown == (_tensorflow_banners() if banners else set()), out.stderr


@functools.cache
def _tensorflow_banners() -> set:
    """The BANNERS a bare ``import tensorflow`` prints here, every level shown (none of ours running)."""
    out = subprocess.run([sys.executable, "-c", "import tensorflow; tensorflow.constant(1.0) + 1"],
                         capture_output=True, text=True, timeout=600, env=_env(TF_CPP_MIN_LOG_LEVEL="0"))
    assert out.returncode == 0, out.stderr[-3000:]
    got = {b for b in BANNERS if b in out.stderr}
    assert got, out.stderr  # it prints at least one: else this test could not tell quiet from loud
    return got


@pytest.mark.parametrize("env, level", [
    ({}, None),
    ({"TF_CPP_MIN_LOG_LEVEL": "2"}, 2),
    ({"TF_CPP_MIN_LOG_LEVEL": "7"}, 3),
    ({"TF_CPP_MIN_LOG_LEVEL": "x"}, 0),
    ({"TF_CPP_MIN_LOG_LEVEL": "\u00b2"}, 0),  # (a raw ValueError, for every command)
    ({"JAX_LOGGING_LEVEL": "error"}, 2),
    ({"JAX_LOGGING_LEVEL": "DEBUG", "TF_CPP_MIN_LOG_LEVEL": "3"}, 0),  # the more verbose wins
])
def test_user_log_level(env, level):
    assert cli.user_log_level(env) == level


def test_native_log_lines_below_the_level_are_dropped_and_the_rest_kept(capfd):
    written = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
               "I0000 00:00:1796000158.013337    5300 port.cc:153] oneDNN custom operations are on.\n"
               "W0000 00:00:1796000158.013337    5300 x.cc:1] a warning\n"
               "E0000 00:00:1796000158.013337    5300 x.cc:2] an error\n"
               "a line of our own\n")
    for level, kept in [(1, [2, 3, 4]), (2, [3, 4]), (3, [4])]:
        with cli._native_logs_below(level):
            os.write(2, written.encode())
        assert capfd.readouterr().err.splitlines() == [written.splitlines()[i] for i in kept]


# -- matrix --dtype ----------------------------------------------------------------------


def _dtype_rows(capsys, dtype: str) -> list[dict]:
    assert cli.main(["matrix", "--dtype", dtype, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.frameworks("torch", "jax", "tensorflow")
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e8m0fnu", "float8_e4m3", "float4_e2m1fn", "float4_e2m1fn_x2",
                                   "int4", "uint2"])
def test_matrix_dtype_routes_every_pair_as_the_probe_says_each_framework_holds_it(capsys, dtype):
    import bf16bridge as bb
    from conftest import PAIRS

    rows = _dtype_rows(capsys, dtype)
    caps = bb.probe(frameworks="all")
    sup = {"numpy": caps.numpy.dtypes[dtype], **{n: f.dtypes[dtype] for n, f in caps.frameworks.items() if f.probed}}
    assert [(r["source"], r["target"]) for r in rows] == PAIRS and {r["dtype"] for r in rows} == {dtype}
    for r in rows:
        s, d = sup[r["source"]], sup[r["target"]]
        assert r["result"].split(" ")[0] in ("zero-copy", "copies", "refused"), r
        if r["refused"]:
            assert r["reason"] and r["result"] == f"refused ({r['reason']})" and r["bit_exact"] is None, r
        else:  # every bit pattern went there and came back through numpy unchanged
            assert r["bit_exact"] is True, r
            assert r["result"] == ("copies" if r["copies"] else "zero-copy") + (f" ({r['reason']})" if r["copies"]
                                                                               else ""), r
            assert r["same_pointer"] is (True if not r["copies"] else None), r  # zero-copy: the same memory
        if not s.holds:
            assert r["refused"] and r["source"] in r["reason"], r
        if s.holds and d.holds and s.dlpack_export and d.dlpack_import:  # a DLPack code both speak
            assert r["result"] == "zero-copy", r


@pytest.mark.frameworks("torch", "jax", "tensorflow")
def test_matrix_dtype_bfloat16_takes_the_routes_of_the_bf16_matrix(capsys):
    from bf16bridge.cli import demo

    assert cli.main(["matrix", "--dtype", "bfloat16"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("bfloat16:\n") and "assumes: each route is for a contiguous, 64-byte aligned" in text
    rows = _dtype_rows(capsys, "bfloat16")
    assert [(r["source"], r["target"], r["route"], r["result"]) for r in rows] == [
        (r["source"], r["target"], r["route"], "zero-copy") for r in demo.matrix_rows()]


def test_matrix_dtype_all_markdown_is_the_tables_alone_and_says_its_assumption_on_stderr(capsys):
    from bf16bridge.cli import tables

    assert cli.main(["matrix", "--dtype", "all", "--format", "markdown"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("| dtype | numpy -> torch | numpy -> jax |")
    assert [line[4:] for line in out.splitlines() if line.startswith("### ")] == list(tables.matrix_dtypes())
    assert "bfloat16" in tables.matrix_dtypes() and "float32" not in tables.matrix_dtypes()
    assert "assumes" not in out and "assumes: each route is for a contiguous" in err


@pytest.mark.frameworks("torch", "jax", "tensorflow")  # the ghost alone missing
def test_matrix_dtype_with_a_registered_framework_not_installed_refuses_its_pairs_and_routes_the_rest(capsys):
    from bf16bridge.core import registry

    registry.register_adapter("ghostfw", "bf16bridge_no_such_module", types=("ghostfw:Tensor",), extra="ghostfw")
    try:
        rows = _dtype_rows(capsys, "float8_e4m3fn")
    finally:
        spec = registry._SPECS.pop("ghostfw")
        registry._LOADED.pop(spec.name, None)
        registry.TENSOR_TYPES.clear()
    ghost = [r for r in rows if "ghostfw" in (r["source"], r["target"])]
    assert len(ghost) == 8 and all(r["refused"] and "pip install 'bf16bridge[ghostfw]'" in r["reason"] for r in ghost)
    assert any(r["result"] == "zero-copy" for r in rows if r not in ghost)
