"""jax's hooks for ``bb.parity.trace``: a flax linen module's method calls seen through
``flax.linen.intercept_methods``, a flax nnx module's through its classes' methods wrapped for the run
(as ``nnx.capture`` does), a plain jax function's ``bb.parity.tap`` marks (under ``jax.jit`` too, through
``jax.debug.callback``), and the parameters' gradients by ``jax.vjp``.

A linen model is ``(module, variables)`` or a bound module (``module.bind(variables)``)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping

import jax
import numpy as np

from bf16bridge.adapters.hooks import TraceHooks
from bf16bridge.errors import UnsupportedTypeError


def _linen():
    return sys.modules.get("flax.linen")


def _nnx():
    return sys.modules.get("flax.nnx")


def _as_linen(model):
    """(module, variables) of a linen model given either way, else None."""
    nn = _linen()
    if nn is None:
        return None
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], nn.Module) \
            and isinstance(model[1], Mapping):
        return model
    if isinstance(model, nn.Module) and model.scope is not None:
        return model.unbind()
    return None


def _is_nnx(model) -> bool:
    nnx = _nnx()
    return nnx is not None and isinstance(model, nnx.Module)


class JaxTrace(TraceHooks):
    """``bb.parity.trace`` on flax models and plain jax functions."""

    name = "jax"

    def owns(self, model):
        return _as_linen(model) is not None or _is_nnx(model)

    def run(self, model, args, record, inputs_of=frozenset()):
        linen = _as_linen(model)
        if linen is not None:
            module, variables = linen
            with _linen().intercept_methods(_Interceptor(record, inputs_of)):
                out = module.apply(variables, *args)
        elif _is_nnx(model):
            with _NnxCalls(model, record, inputs_of):
                out = model(*args)
        else:
            out = model(*args)
        jax.block_until_ready(out)
        jax.effects_barrier()  # the taps' callbacks have run
        return out

    def gradients(self, model, args, cotangent, loss=None):
        linen = _as_linen(model)
        if linen is not None:
            module, variables = linen
            params = variables["params"]
            rest = {k: v for k, v in variables.items() if k != "params"}
            forward = lambda p: module.apply({**rest, "params": p}, *args)  # noqa: E731
        elif _is_nnx(model):
            nnx = _nnx()
            graphdef, params, rest = nnx.split(model, nnx.Param, ...)
            forward = lambda p: nnx.merge(graphdef, p, rest)(*args)  # noqa: E731
        else:
            raise UnsupportedTypeError(f"gradients of {type(model).__qualname__}, a plain function: parameters "
                                       "are a flax model's; pass (module, variables) or an nnx module, or grads=False")
        if loss is not None:
            grads = jax.grad(lambda p: loss(forward(p)))(params)
        else:
            out, pullback = jax.vjp(forward, params)
            grads = pullback(_cotangents(out, cotangent))[0]
        return [(n, p, g) for (n, p), (_, g) in zip(_flat(params), _flat(grads))]

    def tap(self, name, x, record):
        if isinstance(x, jax.core.Tracer):
            jax.debug.callback(functools.partial(record, name, "output"), x, ordered=True)
        else:
            record(name, "output", x)
        return x


class _Interceptor:
    """Hands each linen method call's output (and, where asked, its arguments) to the trace."""

    def __init__(self, record, inputs_of):
        self.record, self.inputs_of = record, inputs_of

    def __call__(self, next_fun, args, kwargs, context):
        method = context.method_name
        if method == "setup" or (method.startswith("_") and method != "__call__"):
            return next_fun(*args, **kwargs)
        name = ".".join(str(p) for p in context.module.path)
        if method != "__call__":
            name = f"{name}:{method}" if name else method
        if self.inputs_of is True or name in self.inputs_of:
            self.record(name, "input", args)
        out = next_fun(*args, **kwargs)
        self.record(name, "output", out)
        return out


def _iter_modules(model):
    """(path, module) of an nnx model and every submodule: flax.nnx.iter_modules where it exists, the
    Module method that flax 0.10 has instead (it has no nnx.iter_modules)."""
    nnx = _nnx()
    if hasattr(nnx, "iter_modules"):
        return nnx.iter_modules(model)
    return model.iter_modules()


class _NnxCalls:
    """For one run, every nnx module class of the model has its ``__call__`` wrapped to hand the output
    to the trace (the class that defines it, once; restored after)."""

    def __init__(self, model, record, inputs_of):
        self.paths = {id(m): ".".join(str(p) for p in path) for path, m in _iter_modules(model)}
        self.owners = {}
        for path, m in _iter_modules(model):
            owner = next((c for c in type(m).__mro__ if "__call__" in c.__dict__), None)
            if owner is not None:
                self.owners[owner] = owner.__dict__["__call__"]
        self.record, self.inputs_of = record, inputs_of

    def __enter__(self):
        for owner, method in self.owners.items():
            setattr(owner, "__call__", self._wrapped(method))
        return self

    def __exit__(self, *exc):
        for owner, method in self.owners.items():
            setattr(owner, "__call__", method)

    def _wrapped(self, method):
        @functools.wraps(method)
        def call(module, *args, **kwargs):
            name = self.paths.get(id(module))
            if name is not None and (self.inputs_of is True or name in self.inputs_of):
                self.record(name, "input", args)
            out = method(module, *args, **kwargs)
            if name is not None:
                self.record(name, "output", out)
            return out
        return call


def _key(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _flat(tree) -> list:
    """(dotted path, leaf) of a parameter tree, in its order."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(".".join(_key(k) for k in path if _key(k) != "value"), leaf) for path, leaf in leaves]


def _cotangents(out, cotangent):
    """The model's output tree with ``cotangent`` at its first floating leaf and zeros elsewhere."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    done, cots = False, []
    for leaf in leaves:
        if not done and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating):
            cots.append(jax.numpy.asarray(np.ascontiguousarray(cotangent), dtype=leaf.dtype))
            done = True
        else:
            cots.append(jax.numpy.zeros_like(leaf))
    if not done:
        raise UnsupportedTypeError("the model's output holds no floating array to take gradients of: pass loss= "
                                   "(a scalar of the output)")
    return jax.tree_util.tree_unflatten(treedef, cots)


HOOKS = JaxTrace()
