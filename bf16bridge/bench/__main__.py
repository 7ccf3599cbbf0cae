"""python -m bf16bridge.bench: the same as ``bf16bridge bench`` (bf16bridge/bench/command.py)."""

import os
import sys

from bf16bridge.bench.command import main

if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # torch, tensorflow and jax together have crashed at shutdown here
