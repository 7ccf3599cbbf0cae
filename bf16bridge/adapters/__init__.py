"""One package per framework, one file per concern: ``convert`` (the core ``Adapter``), each feature's
hooks (``hooks.py`` holds their protocols) and ``internals`` (its private APIs).

Nothing here imports a framework: ``bf16bridge.core.registry`` imports an adapter module on first use.
"""
