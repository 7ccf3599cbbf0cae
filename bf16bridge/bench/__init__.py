"""The speed and memory harness (``bf16bridge bench``) and exhaustive checks."""
