"""The package's surface: bf16bridge's submodules (parity, kernels, capabilities, dtypes) are listed by
dir() and load on first attribute access, checked in a fresh process."""

import subprocess
import sys
import textwrap


def test_submodules_load_on_attribute_access():
    code = textwrap.dedent("""
        import bf16bridge as bb
        assert {"parity", "kernels", "capabilities", "dtypes"} <= set(dir(bb))
        assert callable(bb.parity.compare) and callable(bb.kernels.to_bf16)
        assert bb.__version__
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
