"""One module per framework, the same shape in each (see ``_base.Adapter``).

Nothing here imports a framework: ``bf16bridge.core.registry`` imports an adapter
module on first use.
"""
