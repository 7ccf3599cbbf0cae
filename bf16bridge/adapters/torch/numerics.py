"""torch's hooks for ``bb.parity``: it computes, the settings that change its bf16 results, and
its no-grad context."""

from __future__ import annotations

import torch

from bf16bridge.adapters.hooks import NumericsHooks


class TorchNumerics(NumericsHooks):
    """What a parity report records of torch, and how it runs torch without autograd."""

    name = "torch"
    computes = True

    def numerics(self):
        return {"torch_threads": torch.get_num_threads(), "torch_mkldnn": torch.backends.mkldnn.is_available()}

    def no_grad(self):
        return torch.no_grad()


HOOKS = TorchNumerics()
