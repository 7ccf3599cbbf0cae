"""The speed and memory harness (``python -m benchmarks``) and exhaustive checks."""
