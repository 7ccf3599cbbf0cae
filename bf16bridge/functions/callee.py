"""Running a bridged function on its own framework's tensors: its arguments rebuilt, its result taken
apart into tensor leaves, Python numbers (``numbers``) and the tree around them.

``run`` is what every call runs, eagerly, under the callee's autodiff and inside a compiled function
(``BridgeHooks.compile``): it depends on the call's signature only, never on a ``ForeignCall``.
"""

from __future__ import annotations

from typing import Any

from bf16bridge.core import registry
from bf16bridge.errors import Bf16BridgeError, UnsupportedTypeError
from bf16bridge.functions.numbers import not_held, number_array, numbers_as_leaves
from bf16bridge.functions.paths import result_paths
from bf16bridge.trees import walk as trees

#: set on an error of ours that the bridged function itself raised (a bb.convert or a bridged call
#: inside it): it reaches the caller as it was raised, its frames in the function kept
RAISED_IN_CALLEE = "bf16bridge_raised_in_callee"

#: what ``run`` gives beside the tensors: (the result's skeleton, ((position, 0-d numpy array), ...)
#: for its Python numbers); the same for every call of one signature
Aux = tuple[Any, tuple]


def run(fn, callee: str, caller: str | None, skeleton, flat: bool, *leaves) -> tuple[list, Aux]:
    """``fn`` on the callee's input ``leaves`` filled into ``skeleton`` (``flat``: the leaves are the
    positional arguments): its result's tensor leaves, and ``Aux``. A Python number in the result
    becomes a 0-d array of the dtype it takes for ``caller`` (``numbers``)."""
    try:
        if flat:
            out = fn(*leaves)
        else:
            args, kwargs = trees.fill(skeleton, leaves)
            out = fn(*args, **kwargs)
    except Bf16BridgeError as err:
        setattr(err, RAISED_IN_CALLEE, True)
        raise
    # one tensor of the callee's (the usual result) is known by one lookup of its type in the
    # registry's cache; anything else (a tree, a number, a type not cached yet) takes the walk
    if registry.TENSOR_TYPES.get(type(out)) == callee:
        return [out], (trees.SLOT, ())
    out, found = numbers_as_leaves(out)
    out_leaves, out_skeleton = trees.flatten(out)
    numbers: tuple = ()
    if found:
        out_leaves, numbers = _numbers(fn, callee, caller, out_skeleton, out_leaves, found)
    for x in out_leaves:
        if registry.framework_of(x) != callee:
            raise UnsupportedTypeError(
                f"the bridged {callee} function {getattr(fn, '__qualname__', fn)!r} returned a "
                f"{registry.framework_of(x)} tensor; return {callee} tensors (the bridge converts them for the caller)")
    return out_leaves, (out_skeleton, numbers)


def _numbers(fn, callee: str, caller: str | None, skeleton, leaves: list, found: dict) -> tuple[list, tuple]:
    """The tensor leaves among ``leaves`` and, for each number ``found`` stood in for, its position
    and its 0-d array for the caller; our error for one that array would not hold exactly."""
    adapter = registry.get(caller or "numpy")
    tensors, numbers = [], []
    for i, x in enumerate(leaves):
        value = found.get(id(x), x)
        if value is x:
            tensors.append(x)
            continue
        array, name = number_array(value, adapter)
        if array is None:
            raise not_held(fn, callee, adapter, result_paths(skeleton)[i], value, name)
        numbers.append((i, array))
    return tensors, tuple(numbers)
