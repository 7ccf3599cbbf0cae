"""convert_tree: nested containers, leaves converted, input untouched."""

from collections import OrderedDict, namedtuple

import numpy as np
import pytest

import bf16bridge as bb
from conftest import bits, type_framework

Pair = namedtuple("Pair", "w b")


@pytest.mark.frameworks("torch")
def test_state_dict_to_jax_and_back():
    import torch

    model = torch.nn.Linear(4, 3).to(torch.bfloat16)
    sd = model.state_dict()
    params = bb.convert_tree(sd, to="jax")
    assert type(params) is type(sd) and list(params) == list(sd)
    for k in sd:
        assert type_framework(params[k]) == "jax"
        np.testing.assert_array_equal(bits(params[k]), bits(sd[k]))
    back = bb.convert_tree(params, to="torch", on_alias="allow")
    assert all(torch.equal(back[k].view(torch.uint16), sd[k].view(torch.uint16)) for k in sd)


@pytest.mark.frameworks("torch")
def test_nested_containers_and_non_tensor_leaves():
    import torch

    tree = {"a": [torch.ones(2, dtype=torch.bfloat16), (np.zeros(3, np.float32), "name")],
            "b": Pair(torch.zeros(1), None), "step": 7, "od": OrderedDict(x=torch.ones(1))}
    out = bb.convert_tree(tree, "tf")
    assert type_framework(out["a"][0]) == "tensorflow" and type_framework(out["a"][1][0]) == "tensorflow"
    assert out["a"][1][1] == "name" and out["step"] == 7 and out["b"].b is None
    assert isinstance(out["b"], Pair) and isinstance(out["a"][1], tuple) and isinstance(out["od"], OrderedDict)
    assert type_framework(tree["a"][0]) == "torch"  # the input tree is not modified


@pytest.mark.frameworks("torch")
def test_errors_name_the_leaf():
    import torch

    tree = {"layer": {"w": torch.ones(2, dtype=torch.float64)}}
    with pytest.raises(bb.UnsupportedDtypeError, match=r"\['layer'\]\['w'\]"):
        bb.convert_tree(tree, "jax")
