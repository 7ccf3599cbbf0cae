"""Functions across frameworks: ``bridge(framework)(fn)`` with the caller's autodiff reaching the callee's.

``bridged`` holds ``bridge`` and ``BridgedFunction`` (a call, start to end); ``foreign`` the
``ForeignCall`` a caller's hooks run forward and backward; ``declared`` what a traced caller is
told before the callee runs; ``writes`` the callee's writes into its inputs.
"""

from bf16bridge.adapters.hooks import second_order_refused
from bf16bridge.functions.bridged import BridgedFunction, bridge
from bf16bridge.functions.foreign import ForeignCall

__all__ = ["BridgedFunction", "ForeignCall", "bridge", "second_order_refused"]
