"""Functions across frameworks: ``bridge(framework)(fn)`` with the caller's autodiff reaching the callee's."""

from bf16bridge.functions.call import BridgedFunction, ForeignCall, bridge, second_order_refused

__all__ = ["BridgedFunction", "ForeignCall", "bridge", "second_order_refused"]
