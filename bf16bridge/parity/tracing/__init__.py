"""``bb.parity.trace`` and ``trace_cast``: two models judged layer by layer (docs/parity-trace.md)."""
