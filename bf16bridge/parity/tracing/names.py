"""How ``bb.parity.trace`` pairs the layers (and the parameters) of two models: by name after a rename
rule, by order, or by a mapping the user gives; parameters also by their bits (weights that crossed
with the bridge hold the same bits, a transposed copy included). Whatever is not paired is listed."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping

import numpy as np

from bf16bridge.errors import InvalidArgumentError
from bf16bridge.parity import metrics

_INDEX = re.compile(r"_(\d+)(?=\.|\[|#|$)")


def canonical(name: str) -> str:
    """The default rule, applied to both sides: "/" read as ".", flax's numbered names ("blocks_0")
    as torch's ("blocks.0"), case ignored."""
    return _INDEX.sub(r".\1", name.replace("/", ".")).lower()


def renamer(rename) -> Callable[[str], str]:
    """``rename=`` as a function of a side-b name: None (the default rule alone), a function, or a dict
    of regular expressions to their replacements (``re.sub``, in order)."""
    if rename is None:
        return lambda n: n
    if callable(rename):
        return rename
    if isinstance(rename, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in rename.items()):
        rules = []
        for pat, repl in rename.items():
            try:
                rules.append((re.compile(pat), repl))
            except re.error as err:
                raise InvalidArgumentError(f"trace: rename={{{pat!r}: ...}} is not a regular expression ({err}); "
                                           "escape it with re.escape") from err

        def apply(n: str) -> str:
            for rx, repl in rules:
                n = rx.sub(repl, n)
            return n
        return apply
    raise InvalidArgumentError(f"trace: rename= must be a function of a model_b layer name, or a dict of regular "
                               f"expressions to replacements; got {type(rename).__name__}")


def layer_of(row: str) -> str:
    """The layer a row belongs to: its name without an output index ("attn[0]") or call count ("#2")."""
    return re.sub(r"(#\d+)?(\[.*\])?$", "", row)


def ancestors(layer: str) -> list[str]:
    """"blocks.0.attn" -> ["blocks.0", "blocks", ""]: the enclosing layers, innermost first."""
    parts = layer.split(".") if layer else []
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


class Pairing:
    """Pairs the rows of the side run second (``streamed``) with those of the side run first
    (``stored``, all known), as the second side's rows arrive. ``pairs``: {model_a row: model_b row};
    ``rename``: model_b's names to model_a's; ``by``: "name" or "order"; ``stored_is_a``: which model the
    stored side is."""

    def __init__(self, stored: list[str], *, pairs: Mapping | None, rename, by: str, stored_is_a: bool):
        self.stored, self.by, self.stored_is_a = stored, by, stored_is_a
        rule = renamer(rename)
        pairs = dict(pairs or {})
        explicit = pairs if stored_is_a else {b: a for a, b in pairs.items()}
        missing = [s for s in explicit if s not in stored]
        if missing:
            side = "model_a" if stored_is_a else "model_b"
            close = difflib.get_close_matches(missing[0], stored, n=3)
            raise InvalidArgumentError(f"trace: pairs= names {missing[0]!r}, which is no layer of {side}"
                                       f"{' (close: ' + ', '.join(close) + ')' if close else ''}; its layers: "
                                       f"{', '.join(stored[:12])}{' ...' if len(stored) > 12 else ''}")
        self.explicit = {v: k for k, v in explicit.items()}  # streamed name -> stored name
        taken = set(explicit)
        b_key = lambda n: canonical(rule(n))  # noqa: E731
        self.streamed_key = b_key if stored_is_a else canonical
        s_key = canonical if stored_is_a else b_key
        self.by_key: dict[str, str] = {}
        for s in stored:
            if s not in taken:
                self.by_key.setdefault(s_key(s), s)
        self.free = [s for s in stored if s not in taken]
        self.used: set[str] = set()
        self.seen: list[str] = []
        self.unpaired_streamed: list[str] = []

    def match(self, name: str) -> str | None:
        """The stored row paired with the streamed row ``name`` (None: unpaired, and listed)."""
        self.seen.append(name)
        found = self.explicit.get(name)
        if found is None and self.by == "order":
            i = len(self.seen) - 1 - sum(1 for n in self.seen[:-1] if n in self.explicit)
            found = self.free[i] if i < len(self.free) else None
        elif found is None:
            found = self.by_key.get(self.streamed_key(name))
        if found is None or found in self.used:
            self.unpaired_streamed.append(name)
            return None
        self.used.add(found)
        return found

    def unpaired_stored(self) -> list[str]:
        return [s for s in self.stored if s not in self.used]

    def check_seen(self) -> None:
        """pairs= naming a streamed row that never ran is our error, naming it."""
        never = [n for n in self.explicit if n not in self.seen]
        if never:
            side = "model_b" if self.stored_is_a else "model_a"
            raise InvalidArgumentError(f"trace: pairs= names {never[0]!r}, which is no layer of {side} (it ran: "
                                       f"{', '.join(self.seen[:12])}{' ...' if len(self.seen) > 12 else ''})")


def _values_key(x: np.ndarray, kind: str) -> tuple:
    """A parameter's shape and values as ``kind`` holds them (a float32 weight crossed to bf16 rounds)."""
    return (x.shape, metrics.to_float64(metrics.rounded(np.ascontiguousarray(metrics.to_float64(x)), kind)).tobytes())


def pair_params(a: list[tuple[str, np.ndarray]], b: list[tuple[str, np.ndarray]], *, pairs: Mapping | None,
                rename) -> tuple[list[tuple[str, str, bool]], list[str], list[str]]:
    """Parameters of model_a and model_b paired: by ``pairs`` ({a name: b name}), then by name (the
    default rule and ``rename``), then by their values (b's equal to a's, or to a's transposed, first
    unused first). Returns ([(a name, b name, b is a's transposed)], a unpaired, b unpaired)."""
    rule = renamer(rename)
    av, bv = dict(a), dict(b)
    out: list[tuple[str, str, bool]] = []
    used_a: set[str] = set()
    used_b: set[str] = set()

    def take(na: str, nb: str, transposed: bool | None = None) -> None:
        if transposed is None:  # paired by name: transposed where only the transpose's shape fits
            transposed = av[na].shape != bv[nb].shape and av[na].T.shape == bv[nb].shape
        out.append((na, nb, transposed))
        used_a.add(na)
        used_b.add(nb)

    for na, nb in (pairs or {}).items():
        if na in av and nb in bv:
            take(na, nb)
    keys = {canonical(n): n for n, _ in a if n not in used_a}
    for nb, x in b:
        na = keys.get(canonical(rule(nb)))
        if nb not in used_b and na is not None and na not in used_a and av[na].size == x.size:
            take(na, nb)
    tables: dict[str, tuple[dict, dict]] = {}
    for nb, x in b:
        if nb in used_b or not x.size:
            continue
        kind = metrics.kind_of(x)
        if kind not in tables:
            tables[kind] = _tables([(n, y) for n, y in a if n not in used_a], kind)
        for flipped, table in enumerate(tables[kind]):
            cands = [n for n in table.get(_values_key(x, kind), []) if n not in used_a]
            if cands:
                take(cands[0], nb, bool(flipped))
                break
    order = {n: i for i, (n, _) in enumerate(a)}
    out.sort(key=lambda p: order[p[0]])
    return out, [n for n, _ in a if n not in used_a], [n for n, _ in b if n not in used_b]


def _tables(a: list[tuple[str, np.ndarray]], kind: str) -> tuple[dict, dict]:
    """model_a's parameters by their values as ``kind`` holds them, and by their transposes' (2-d ones)."""
    direct: dict[tuple, list[str]] = {}
    flipped: dict[tuple, list[str]] = {}
    for na, x in a:
        direct.setdefault(_values_key(x, kind), []).append(na)
        if x.ndim == 2:
            flipped.setdefault(_values_key(np.ascontiguousarray(x.T), kind), []).append(na)
    return direct, flipped
