"""tensorflow's hooks for ``bb.parity.trace``: a Keras model (the tensorflow backend's) with each of its
layers' ``call`` wrapped for the run (an attribute of the layer object, removed after), named by its
path inside the model; its trainable variables' gradients by ``tf.GradientTape``. A plain function of
tensorflow tensors is traced through its taps."""

from __future__ import annotations

import sys

import numpy as np

from bf16bridge.adapters.hooks import TraceHooks, first_floating
from bf16bridge.adapters.tensorflow.framework import tf
from bf16bridge.errors import UnsupportedTypeError


def _keras_model(model) -> bool:
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(model, keras.Layer) and keras.config.backend() == "tensorflow"


def _layers(model) -> list:
    """Every layer inside a Keras model (nested models' too), parents before children."""
    out = []
    for layer in getattr(model, "layers", None) or ():
        out.append(layer)
        out.extend(_layers(layer))
    return out


def _name(model, layer) -> str:
    """A layer's path inside the model ("fc1", "encoder/fc1"), as the trace names it."""
    root, path = getattr(model, "path", None) or model.name, getattr(layer, "path", None) or layer.name
    return path[len(root) + 1:] if path.startswith(root + "/") else path


class TensorflowTrace(TraceHooks):
    """``bb.parity.trace`` on Keras models (tensorflow backend) and plain tensorflow functions."""

    name = "tensorflow"

    def owns(self, model):
        return _keras_model(model)

    def run(self, model, args, record, inputs_of=frozenset()):
        if not _keras_model(model):
            return model(*args)
        layers = _layers(model)
        try:
            for layer in layers:
                object.__setattr__(layer, "call", _Call(_name(model, layer), layer.call, record, inputs_of))
            out = model(*args)
        finally:
            for layer in layers:
                if "call" in vars(layer):
                    object.__delattr__(layer, "call")
        record("", "output", out)
        return out

    def gradients(self, model, args, cotangent, loss=None):
        if not _keras_model(model):
            raise UnsupportedTypeError(f"gradients of {type(model).__qualname__}, a plain function: parameters are "
                                       "a Keras model's; pass the model, or grads=False")
        variables = list(model.trainable_variables)
        with tf.GradientTape() as tape:
            out = model(*args)
            target = loss(out) if loss is not None else first_floating(out, _floating)
        if target is None:
            raise UnsupportedTypeError("the model's output holds no floating tensor to take gradients of: pass loss= "
                                       "(a scalar of the output)")
        wanted = None if loss is not None else tf.constant(np.ascontiguousarray(cotangent), dtype=target.dtype)
        grads = tape.gradient(target, variables, output_gradients=wanted)
        return [(_var_name(model, v), v.value, g) for v, g in zip(variables, grads)]


class _Call:
    """A layer's ``call``, handing its output (and, where asked, its arguments) to the trace."""

    def __init__(self, name: str, call, record, inputs_of):
        self.name, self.call, self.record, self.inputs_of = name, call, record, inputs_of

    def __call__(self, *args, **kwargs):
        if self.inputs_of is True or self.name in self.inputs_of:
            self.record(self.name, "input", args)
        out = self.call(*args, **kwargs)
        self.record(self.name, "output", out)
        return out


def _var_name(model, v) -> str:
    root = getattr(model, "path", None) or model.name
    return v.path[len(root) + 1:] if v.path.startswith(root + "/") else v.path


def _floating(x) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype.is_floating


HOOKS = TensorflowTrace()
