"""Declared results of a bridged call: what a traced caller is told before the callee runs.

A traced caller declares the results' shapes and dtypes before anything runs. They are found by
one call on zeros of the inputs' shapes and dtypes, checked against what later runs return, and
refused where the caller cannot hold them. ``DeclaredResults`` is the part of ``ForeignCall``
that does this; its errors say why a value-dependent result cannot cross a traced call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bf16bridge.core import dtypes
from bf16bridge.core import registry
from bf16bridge.errors import Bf16BridgeError, UnsupportedDtypeError, UnsupportedTypeError
from bf16bridge.functions.paths import result_path
from bf16bridge.trees import walk as trees


class DeclaredResults:
    """The declared-results half of ``ForeignCall`` (the attributes it reads are ForeignCall's)."""

    __slots__ = ("out_specs", "_declared")
    out_specs: list | None  # [(shape, dtype name)] of the output leaves, once known
    _declared: tuple | None  # (the declared results' values key,), once compared
    # ForeignCall's attributes and method this half reads
    fn: Any
    callee: str
    caller: str | None
    vmap_method: str | None
    out_skeleton: Any
    forward: Callable[..., Any]

    def specs(self, leaves, shapes_dtypes: Callable[[Any], tuple]) -> list:
        """The output leaves' (shape, dtype name), found by one call on zeros of the inputs'
        shapes and dtypes (for callers that must declare results before running: traced ones)."""
        if self.out_specs is None:
            inputs = [shapes_dtypes(x) for x in leaves]
            try:
                specs = self._specs_at(inputs, np.zeros)
            except Bf16BridgeError:
                raise  # ours name what is wrong, which is no matter of zeros
            except Exception as err:
                err.add_note(
                    f"(bf16bridge: the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} "
                    "is being traced, and a traced caller declares its results before it runs: they are found by "
                    "this call on zeros of the inputs' shapes and dtypes, which failed. Make the function accept "
                    "zeros, or call it eagerly)")
                raise
            if any(0 in shape for shape, _ in specs) and any(0 not in shape for shape, _ in inputs):
                # an empty result from non-empty inputs may have a value-dependent shape (a[a > 0] of
                # zeros): asked again on ones, it differs only where it does
                self._check_fixed(specs, inputs)
            self.out_specs = specs
        assert self.out_specs is not None
        if self.caller is not None:
            self._check_held(self.caller, self.out_specs)
        return self.out_specs

    def _specs_at(self, inputs: list, fill: Callable) -> list:
        """The output leaves' (shape, dtype name) for inputs of ``inputs``' (shape, dtype name),
        filled by ``fill`` (np.zeros, np.ones)."""
        outs, _ = self.forward([fill(shape, dtypes.numpy_dtype(dtype)) for shape, dtype in inputs], False, "numpy")
        return [registry.get("numpy").shape_dtype(y) for y in outs]

    def _check_fixed(self, specs: list, inputs: list) -> None:
        try:
            again = self._specs_at(inputs, np.ones)
        except Bf16BridgeError:
            raise  # ours: a non-tensor result that differs on ones is a value-dependence too (_check_declared)
        except Exception:  # noqa: BLE001 - a function that refuses ones says nothing about its shapes
            return
        if again != specs:
            i = next(i for i, (a, b) in enumerate(zip(specs, again)) if a != b) if len(again) == len(specs) else 0
            raise self.not_declared(i, again[i] if i < len(again) else None, specs[i], "on ones")

    def _check_declared(self, skeleton) -> None:
        """Our error for a run whose non-tensor results differ from the declared ones: a traced
        caller hands back the results' tree as found by the call on zeros, so a value computed
        from the inputs (``str(x.sum())``; numbers are tensors) would come back as it was on zeros, silently."""
        # values only: an object compared by identity (a fresh instance each run) counts by its type
        if skeleton is self.out_skeleton:  # the same object (trees.SLOT: one tensor)
            return
        if self._declared is None:
            self._declared = (trees.key(self.out_skeleton, values_only=True),)
        declared = self._declared[0]
        if declared is None or trees.key(skeleton, values_only=True) == declared:
            return  # (a tree holding unhashable values cannot be compared: taken as declared)
        raise UnsupportedTypeError(
            f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returned "
            f"{short(skeleton)} around its tensors, but {short(self.out_skeleton)} when its results were "
            "declared (under a transformation they are found by one call on zeros): a result that is not a "
            "tensor nor a Python number (those come back as 0-d tensors) must not depend on the inputs' values; "
            "return it as a tensor")

    def check_declared(self, outs, to: str) -> None:
        """Our error where results ``outs`` (tensors of ``to``, from ``forward``) differ in shape or
        dtype from the declared ones: a traced caller would take them as declared (or raise an
        error of its own)."""
        specs = self.out_specs
        if specs is None:
            return
        shape_dtype = registry.get(to).shape_dtype
        for i, (y, want) in enumerate(zip(outs, specs)):
            got = shape_dtype(y)
            if got != want:
                raise self.not_declared(i, got, want, "here")

    def not_declared(self, i: int, got, want, where: str) -> UnsupportedTypeError:
        """Our error for result leaf ``i`` found ``got`` ``where`` (a (shape, dtype name)) but
        declared ``want``."""
        show = shape_dtype_words
        return UnsupportedTypeError(
            f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returned "
            f"{show(got)} {where} ({result_path(self.out_skeleton, i)}), but {show(want)} when its results were "
            "declared (a traced "
            f"caller, as {self.caller} is here, declares them before the function runs, by one call on zeros of "
            "the inputs' shapes): a result whose shape depends on the inputs' values cannot cross a traced call. "
            "Call the function eagerly, or return a shape fixed by the inputs' shapes (pad it, or return a mask)")

    def not_batched(self, i: int, got, want) -> UnsupportedTypeError:
        """Our error for a result of another shape or dtype than the batch's, under a vectorized vmap
        method (the callee is handed the whole batch and must return batched results)."""
        show = shape_dtype_words
        return UnsupportedTypeError(
            f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returned "
            f"{show(got)} under vmap (vmap_method={self.vmap_method!r}, {result_path(self.out_skeleton, i)}), where "
            "the batch's result "
            f"is {show(want)}: with that method the function is handed the whole batch (a batch dimension on its "
            "inputs) and must return results with the batch dimension the caller asks for. Return batched results, "
            "or pass vmap_method='sequential' (one call per batch element)")

    def _check_held(self, caller_name: str, specs: list) -> None:
        """Our error for a declared result the caller cannot hold (``Adapter.cannot_hold``): eagerly
        ``convert`` refuses it. No fallback applies: what it gives depends on values not yet
        computed when the results are declared."""
        caller = registry.get(caller_name)
        for i, (_, dtype) in enumerate(specs):
            why = caller.cannot_hold(dtype)
            if why is not None:
                raise UnsupportedDtypeError(
                    f"the bridged {self.callee} function {getattr(self.fn, '__qualname__', self.fn)!r} returns "
                    f"{dtype} ({result_path(self.out_skeleton, i)}), which {self.caller} cannot hold here: {why}. "
                    f"Under a transformation a result's dtype is declared before the function runs, so no fallback "
                    f"applies: return a dtype {self.caller} holds (cast in the function), or call it eagerly")


def shape_dtype_words(sd) -> str:
    """A (shape, dtype name) in an error's words; None: nothing."""
    return "nothing" if sd is None else f"{sd[1]} of shape {tuple(sd[0])}"


def short(skeleton) -> str:
    """A result tree's repr for an error, cut to 160 characters."""
    text = repr(skeleton)
    return text if len(text) <= 160 else text[:157] + "..."
