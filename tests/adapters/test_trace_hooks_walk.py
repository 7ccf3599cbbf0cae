"""The walk a trace's gradients start from: the first floating leaf of a model's output."""

from __future__ import annotations

import numpy as np
import pytest

from bf16bridge.adapters.hooks import first_floating


def _floating(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def test_the_first_floating_leaf_in_order_through_nested_tuples_lists_and_dicts():
    ints, f1, f2 = np.arange(3), np.ones(2, np.float32), np.zeros(2, np.float32)
    assert first_floating(f1, _floating) is f1
    assert first_floating((ints, [{"a": ints, "b": f1}], f2), _floating) is f1
    assert first_floating({"ids": ints, "logits": f2}, _floating) is f2


@pytest.mark.parametrize("out", [np.arange(3), (np.arange(3), "text", None), {}, [], {"a": [np.arange(2)]}])
def test_none_where_no_leaf_is_floating(out):
    assert first_floating(out, _floating) is None


@pytest.mark.frameworks("torch")
def test_torch_gradients_take_the_first_floating_output_leaf():
    import torch

    from bf16bridge.adapters.torch.trace import HOOKS

    class TwoOut(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return {"ids": torch.zeros(2, dtype=torch.int64), "y": self.lin(x), "z": 3 * self.lin(x)}

    m = TwoOut()
    grads = HOOKS.gradients(m, (torch.ones(1, 2),), np.ones((1, 2), np.float32))
    assert dict((n, g.sum().item()) for n, _, g in grads)["lin.bias"] == 2.0  # of y, not 3 * y
