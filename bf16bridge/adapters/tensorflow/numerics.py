"""What the parity runner asks of tensorflow: that it computes, and its settings that change
bf16 results (``TensorflowNumerics``). tensorflow records gradients only under a tape the caller
opens, so its no-grad context is the default (nothing to do)."""

from __future__ import annotations

import os

from bf16bridge.adapters.hooks import NumericsHooks
from bf16bridge.adapters.tensorflow.framework import tf


class TensorflowNumerics(NumericsHooks):
    name = "tensorflow"
    computes = True

    def numerics(self):
        return {"tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
                "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on for x86)")}


HOOKS = TensorflowNumerics()
