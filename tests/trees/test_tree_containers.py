"""convert_tree's containers: every container type comes back as itself (defaultdict, OrderedDict,
namedtuple, jax-registered dataclasses), the input unmodified; a cycle and a tuple subclass it cannot
rebuild are refused; string leaves stay strings; looking at a tree imports no framework."""

import collections
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bf16_ramp


Pair = collections.namedtuple("Pair", "w b")


@pytest.mark.frameworks("torch")
def test_tree_keeps_every_container_type():
    import torch

    tree = {
        "dd": collections.defaultdict(list, w=bf16_ramp()),
        "od": collections.OrderedDict([("z", bf16_ramp()), ("a", bf16_ramp())]),
        "nt": Pair(bf16_ramp(), 3),
        "t": (bf16_ramp(), "label"),
        "l": [bf16_ramp(), None],
    }
    out = bb.convert_tree(tree, "torch")
    assert type(out["dd"]) is collections.defaultdict and out["dd"].default_factory is list
    assert type(out["od"]) is collections.OrderedDict and list(out["od"]) == ["z", "a"]
    assert type(out["nt"]) is Pair and out["nt"].b == 3
    assert type(out["t"]) is tuple and out["t"][1] == "label"
    assert type(out["l"]) is list and out["l"][1] is None
    assert isinstance(out["dd"]["w"], torch.Tensor)
    assert type(tree["dd"]["w"]) is np.ndarray  # the input is not modified


@pytest.mark.frameworks("torch")
def test_tree_of_jax_registered_nodes():
    import dataclasses

    import jax
    import torch

    @dataclasses.dataclass
    class Layer:
        w: object
        b: object

    # the fields named: jax 0.4.30's register_dataclass takes them only so
    jax.tree_util.register_dataclass(Layer, data_fields=["w", "b"], meta_fields=[])

    out = bb.convert_tree({"layer": Layer(bf16_ramp(), [bf16_ramp(4)])}, "torch")
    assert type(out["layer"]) is Layer
    assert isinstance(out["layer"].w, torch.Tensor) and isinstance(out["layer"].b[0], torch.Tensor)
    with pytest.raises(bb.UnsupportedDtypeError, match=r"\['layer'\]\['w'\]"):
        bb.convert_tree({"layer": Layer(np.array(["s"]), 1)}, "torch")


def test_tree_does_not_import_jax_to_look_at_a_tree():
    code = textwrap.dedent("""
        import sys, numpy as np, ml_dtypes, bf16bridge as bb
        class Box:
            pass
        out = bb.convert_tree({"a": [np.ones(2, ml_dtypes.bfloat16), Box()]}, "numpy")
        assert isinstance(out["a"][1], Box)
        print(sorted(m for m in ("jax", "torch", "tensorflow") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.frameworks("torch")
def test_tree_refuses_a_cycle_and_unbuildable_tuples_and_keeps_string_leaves():
    loop = [bf16_ramp()]
    loop.append(loop)
    with pytest.raises(bb.UnsupportedTypeError, match="contains itself"):
        bb.convert_tree(loop, "torch")

    class Span(tuple):
        def __new__(cls, start, stop):
            return super().__new__(cls, (start, stop))

    with pytest.raises(bb.UnsupportedTypeError, match="Span"):
        bb.convert_tree({"s": Span(bf16_ramp(), bf16_ramp())}, "torch")
    out = bb.convert_tree([np.str_("name"), b"raw", "text"], "torch")
    assert out == [np.str_("name"), b"raw", "text"]
    shared = bf16_ramp()
    assert len(bb.convert_tree([shared, shared], "numpy")) == 2  # a shared leaf is no cycle


@pytest.mark.frameworks("tensorflow", "torch")
def test_string_leaves_stay_strings_after_numpy_has_seen_their_type():
    with pytest.raises(bb.UnsupportedDtypeError):
        bb.to_torch(np.str_("x"))  # the registry now knows np.str_ as a numpy type
    assert bb.convert_tree({"name": np.str_("x"), "w": bf16_ramp()}, "numpy")["name"] == "x"
