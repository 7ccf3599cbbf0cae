"""NumPy 2.5's DLPack dtype registry (``np.dtypes.register_dlpack_dtype``, numpy#31256).

NumPy <= 2.4 refuses every ml_dtypes type over DLPack. NumPy 2.5 lets a library map a
DLPack ``(code, bits)`` pair to a NumPy dtype; the registry was made for ml_dtypes, which
does not call it yet (ml_dtypes#376). Where ml_dtypes has not, the bridge registers the
rows of its table that the registry can express, so that ``np.from_dlpack`` takes bf16 and
fp8 from torch and jax directly and the planner, which finds numpy's DLPack dtypes by trying
(``adapters/numpy.py``), prefers that route.

What the registry can express: lanes == 1 and ``bits == 8 * itemsize`` (it reads the bit
width from the dtype), so bf16 and the fp8 family, not fp6/fp4 (6 or 4 bits stored one a
byte) nor torch's packed fp4. A pair NumPy already maps (its own types, or one ml_dtypes
registered first) is left alone: the first registration wins, and NumPy's built-in
mappings win over any.

This changes NumPy's process-wide registry. It runs once, when ``bf16bridge.adapters.numpy``
is imported, and ``import bf16bridge`` imports it (numpy is the hub every route may pass
through, and which rows numpy passes over DLPack is found right after): so on NumPy >= 2.5,
importing bf16bridge registers the rows nobody has. A mapping NumPy or ml_dtypes already has is
never replaced. ``Registration`` (``adapters.numpy.REGISTRATION``) says what it did, and
``bb.probe()`` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bf16bridge.core import dtypes


@dataclass(frozen=True)
class Registration:
    """What the bridge found and did with NumPy's DLPack dtype registry."""

    #: numpy has ``np.dtypes.register_dlpack_dtype`` (NumPy >= 2.5)
    available: bool
    #: rows numpy already passed over DLPack before we looked (ml_dtypes or someone registered them;
    #: found by trying numpy's own round trip, with or without a registry)
    already: tuple[str, ...] = ()
    #: rows the bridge registered, each now passing numpy's own DLPack round trip
    registered: tuple[str, ...] = ()
    #: (row, why) for rows left out: not expressible, refused, or still failing after registering
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def passes(self) -> frozenset[str]:
        """The rows beyond numpy's own that this numpy now passes over DLPack, bits kept."""
        return frozenset(self.already) | frozenset(self.registered)

    def __str__(self) -> str:
        if not self.available:
            return "numpy has no DLPack dtype registry (np.dtypes.register_dlpack_dtype: NumPy >= 2.5)"
        parts = []
        if self.already:
            parts.append(f"already registered: {', '.join(self.already)}")
        if self.registered:
            parts.append(f"registered by bf16bridge: {', '.join(self.registered)}")
        if self.skipped:
            parts.append("not registered: " + "; ".join(f"{n} ({why})" for n, why in self.skipped))
        return "; ".join(parts) or "nothing to register"


def _round_trips(np_module, dt) -> bool:
    """Whether numpy passes ``dt`` through its own DLPack export and import, bits kept."""
    a = np_module.arange(4 * dt.itemsize, dtype=np_module.uint8).view(dt)
    try:
        b = np_module.from_dlpack(a)
    except (BufferError, RuntimeError, TypeError, ValueError):
        return False
    return b.dtype == dt and bytes(b.view(np_module.uint8)) == bytes(a.view(np_module.uint8))


def _expressible(row: dtypes.Dtype, dt) -> str | None:
    """Why the registry cannot map this row, or None."""
    if row.dlpack is None:
        return "DLPack defines no code for it"
    code, bits, lanes = row.dlpack
    if lanes != 1:
        return f"DLPack lanes={lanes}; the registry takes lanes=1 only"
    if bits != 8 * dt.itemsize:
        return f"{bits} bits stored in {dt.itemsize} byte(s); the registry needs bits == 8 x itemsize"
    return None


def register(np_module=np) -> Registration:
    """Register the table's ml_dtypes rows with numpy's DLPack registry where nobody has.

    ``np_module`` is numpy itself; a test passes a stand-in to check the logic on a NumPy
    without the registry (the real registry: tests/adapters/test_numpy_registry.py under
    ``make test-numpy25``, NumPy 2.5).
    """
    reg = getattr(getattr(np_module, "dtypes", None), "register_dlpack_dtype", None)
    already, done, skipped = [], [], []
    for row in dtypes.TABLE:
        if row.family == "standard" or dtypes.numpy_missing(row.name) is not None:
            continue
        dt = dtypes.numpy_dtype(row.name)
        if _round_trips(np_module, dt):
            already.append(row.name)
            continue
        if reg is None:
            continue
        why = _expressible(row, dt)
        if why is None:
            code, bits, _ = row.dlpack  # type: ignore[misc]  # _expressible checked it is set
            try:
                reg((code, bits), dt)
            except (TypeError, ValueError, RuntimeError) as err:
                why = f"the registry refused it: {type(err).__name__}: {err}"
            else:
                why = None if _round_trips(np_module, dt) else "registered, but numpy's DLPack round trip still fails"
        if why is None:
            done.append(row.name)
        else:
            skipped.append((row.name, why))
    return Registration(reg is not None, tuple(already), tuple(done), tuple(skipped))
