"""The error classes. Every failure of ours is a Bf16BridgeError.

Each subclass is also the builtin exception a caller would expect
(TypeError, ValueError, ImportError), so ``except TypeError`` still works.
Messages name the input and the way out.
"""

from __future__ import annotations


class Bf16BridgeError(Exception):
    """Base class of every error raised by bf16bridge."""

    # Exception's own constructor (one message), not the second base's: tensorflow's autograph
    # re-raises an error from code it converted (a bridged call inside tf.function) with its
    # location added only when the error's __init__ is Exception's; any other it turns into its
    # own StagingError, and `except bb.UnsupportedDtypeError` would miss ours there.
    __init__ = Exception.__init__


class UnsupportedTypeError(Bf16BridgeError, TypeError):
    """The input is not a tensor of any registered framework."""


class UnknownFrameworkError(Bf16BridgeError, ValueError):
    """The target framework name (or alias) is not registered."""


class FrameworkNotInstalledError(Bf16BridgeError, ImportError):
    """The target framework is registered but cannot be imported here."""

    __init__ = ImportError.__init__  # keeps ImportError's msg / name / path


class PrivateApiError(Bf16BridgeError, RuntimeError):
    """A private API of a framework that bf16bridge relies on is missing from the installed version
    (docs/adapters.md lists each, what stops working without it, and the versions checked)."""


class UnsupportedDtypeError(Bf16BridgeError, TypeError):
    """No route keeps this dtype bit for bit, and no fallback was asked for."""


class CopyRequiredError(Bf16BridgeError, ValueError):
    """``copy=False`` was asked for, but this input cannot cross without a copy."""


class DeviceError(Bf16BridgeError, ValueError):
    """The target framework cannot hold data on the input's device, or ``device=`` names a device
    the target framework does not have in this process (the message lists those it has)."""


class InvalidArgumentError(Bf16BridgeError, ValueError, TypeError):
    """A keyword has a value outside its choices (``copy="yes"``, ``fallback="float16"``)."""


class CopyTooLargeError(Bf16BridgeError, MemoryError):
    """A route must copy, and the copy would not fit in this machine's memory."""


class ShapeTooLargeError(Bf16BridgeError, ValueError):
    """The input's shape spans more bytes than a framework on the route can describe, even as a view
    of less memory (numpy: the largest intp; a huge expanded or broadcast tensor)."""


class InputWrittenError(Bf16BridgeError, ValueError):
    """A bridged function wrote in place into an input that was a view of the caller's immutable or
    read-only memory (a torch callee's ``x.add_(1)`` on a jax array): names the argument, says the
    caller's array has already changed, and the way out (``copy_inputs=True``)."""


class CheckpointError(Bf16BridgeError, ValueError):
    """A checkpoint file is malformed or does not match what was asked (names the file and the key)."""


class MissingKeyError(Bf16BridgeError, KeyError):
    """A key asked of a checkpoint (or of a load report) is not in it: names the file and how to
    list the keys that are."""

    __str__ = Exception.__str__  # the message as written, not KeyError's repr of it


class Bf16BridgeWarning(UserWarning):
    """What a call did that its plan knew mattered: a writable alias of read-only or
    immutable memory, a gradient dropped. Filter it with
    ``warnings.filterwarnings("ignore", category=bf16bridge.Bf16BridgeWarning)``,
    or choose per call (``on_alias=``, ``on_grad=``)."""
