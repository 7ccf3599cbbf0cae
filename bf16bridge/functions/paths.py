"""Where a leaf stands in a bridged call, as its errors name it: ``args[1]['w']``, ``kwargs['y']``,
``result``, ``result['loss']``, ``result[0]``."""

from __future__ import annotations

from bf16bridge.trees import walk as trees


def input_paths(skeleton) -> list[str]:
    """Each input leaf's place in a call's ``(args, kwargs)`` skeleton, in leaf order."""
    paths: list[str] = []

    def name(slot, path):
        head = f"args[{path[1]}]" if path[0] == 0 else f"kwargs[{path[1]!r}]"
        paths.append(head + "".join(f"[{p!r}]" for p in path[2:]))
        return slot

    trees.map_leaves(name, skeleton)
    return paths


def result_paths(skeleton) -> list[str]:
    """Each result leaf's place in a result's skeleton (``trees.SLOT``: the result itself), in leaf order."""
    paths: list[str] = []

    def name(slot, path):
        paths.append("result" + "".join(f"[{p!r}]" for p in path))
        return slot

    trees.map_leaves(name, skeleton)
    return paths


def result_path(skeleton, i: int) -> str:
    """Result leaf ``i``'s place (``result leaf i`` where the skeleton is not known or holds fewer)."""
    if skeleton is not None:
        paths = result_paths(skeleton)
        if i < len(paths):
            return paths[i]
    return f"result leaf {i}"
