"""The torch adapter refuses a tensor with no single strided buffer: a nested tensor (strided or
jagged), by our UnsupportedTypeError naming unbind()."""

import warnings

import pytest

import bf16bridge as bb


@pytest.mark.frameworks("torch")
def test_torch_nested_tensor_is_refused_clearly():
    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The PyTorch API of nested tensors", UserWarning)
        strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    jagged = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    for nt in (strided, jagged):
        with pytest.raises(bb.UnsupportedTypeError, match="unbind"):
            bb.to_numpy(nt)
