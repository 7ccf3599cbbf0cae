"""The ``bf16bridge`` command (``main``), its demo and the tables it prints."""
