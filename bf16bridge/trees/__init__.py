"""Trees of tensors: walking them (``walk``) for ``convert_tree``, casting, checkpoints and parity."""
