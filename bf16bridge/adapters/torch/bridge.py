"""torch's hooks for the function bridge (``bb.bridge``): autodiff as caller and callee, device
streams, in-place writes, and which results a callee keeps."""

from __future__ import annotations

import contextlib
import functools
import weakref

import torch

from bf16bridge.adapters import cpython
from bf16bridge.adapters.hooks import BridgeHooks, second_order_refused
from bf16bridge.adapters.torch import internals
from bf16bridge.errors import UnsupportedTypeError


def _named(fn) -> str:
    return repr(getattr(fn, "__qualname__", fn))


class TorchBridge(BridgeHooks):
    """A bridged call as seen by torch: ``_Foreign`` is the caller's op, ``vjp`` the callee's autodiff."""

    name = "torch"
    differentiates = True

    def differentiable(self, x):
        return x.requires_grad and torch.is_grad_enabled()

    def differentiable_leaves(self, leaves, traced):
        # asked on every bridged call: whether autograd records at all, once for all leaves
        if not torch.is_grad_enabled():
            return [False] * len(leaves)
        return [x.requires_grad for x in leaves]

    def call_foreign(self, call, leaves):
        if internals.functorch_active() and any(internals.functorch_wrapped(x) for x in leaves):
            raise UnsupportedTypeError(
                f"the bridged function {_named(call.fn)} called under a torch.func transform (grad, vmap, jacrev, "
                "vjp, ...): its tensors are torch.func's wrappers, which hold no data to hand to another framework; "
                "call it under torch.autograd instead (loss.backward(), torch.autograd.grad), one example at a time "
                "for vmap")
        if internals.dual_level() >= 0 and any(internals.has_tangent(x) for x in leaves):
            raise UnsupportedTypeError(
                f"the bridged function {_named(call.fn)} called with a dual tensor (torch.autograd.forward_ad): "
                "forward-mode tangents do not cross to another framework, and would be lost; take the gradient in "
                "reverse mode (loss.backward(), torch.autograd.grad) instead")
        if not any(call.diff):
            return call.forward(leaves, False, self.name)[0]
        return list(_Foreign.apply(call, *leaves))

    def device_streams(self):
        return ("cuda",) if torch.cuda.is_available() else ()

    @contextlib.contextmanager
    def on_device_stream(self, platform, index, stream):
        device = torch.device(platform, index)
        # torch's current device and stream become the foreign runtime's: the callee's kernels, its
        # temporaries (the caching allocator keys blocks by stream) and the copy of its results queue
        # behind that runtime's earlier work and ahead of its later work
        with torch.cuda.device(device), torch.cuda.stream(torch.cuda.ExternalStream(stream, device=device)):
            yield

    def write_into(self, dst, src):
        if src is None:
            dst.zero_()
        else:
            dst.copy_(src)

    def watch_writes(self, leaves):
        # every in-place op (add_, x[i] = v, out=, copy_) bumps the version counter a tensor shares
        # with its views and detached copies. Not seen: writes through .data, .numpy() or a raw
        # pointer, and into tensors made under inference_mode (no counter)
        return leaves, internals.version_counters(leaves)

    def written(self, watched):
        leaves, versions = watched
        now = internals.version_counters(leaves)
        return [] if now == versions else [i for i, (v, w) in enumerate(zip(versions, now)) if v != w]

    # a tensor alone on its storage, as kept reads it (measured, with no dispatch mode of the
    # user's active, on first need): its storage's use count and that storage object's refcount
    @functools.cached_property
    def _alone(self) -> tuple[int | None, int]:
        with internals.no_dispatch_modes():
            t = torch.empty(1)
            storage = t.untyped_storage()
            return internals.storage_use_count(storage), internals.storage_refs(storage)

    # what base_holders reads of the base of one view that alone holds it (measured, not assumed:
    # how torch keeps a base's Python object alive beside its C++ holders changes); None: not known
    @functools.cached_property
    def _lone_base(self) -> tuple | None:
        try:
            with internals.no_dispatch_modes():
                got = internals.base_holders(torch.empty(2).view(2))  # a view of an intermediate nothing else holds
        except (AttributeError, RuntimeError):
            return None
        return None if got is None else got[1:]

    def kept(self, outs, pullback=None):
        # the same tensor object held elsewhere (BridgeHooks.kept's reference count), or a new tensor
        # over kept memory: a view, a detach of a parameter (its storage's use count), unless what shares
        # it is only the view's base, an intermediate nothing else holds (_lone_base)
        counts = cpython.refcounts(outs)
        found = []
        for i, o in enumerate(outs):
            if counts[i] > cpython.FRESH or (isinstance(o, torch.Tensor) and weakref.getweakrefcount(o)):
                found.append(i)  # (a weak reference to it: a handle the callee may dereference and write)
            elif isinstance(o, torch.Tensor) and self._shares_memory(o, outs, counts):
                found.append(i)
        return found

    def _shares_memory(self, o, outs: list, counts: list[int]) -> bool:
        """Whether result ``o``, held by nothing else, shares its memory with a holder the callee may keep."""
        alone, refs = self._alone
        try:
            storage = o.untyped_storage()
            # memory torch did not allocate (torch.from_numpy of the callee's own array, a DLPack
            # import: its owner may write it; not resizable), a storage object held elsewhere (torch
            # keeps one Python object a storage, which its use count does not count twice)
            if not storage.resizable() or internals.storage_refs(storage) != refs or weakref.getweakrefcount(storage):
                return True
            count = internals.storage_use_count(storage)
        except (RuntimeError, NotImplementedError, AttributeError):  # no storage of its own (a wrapper)
            return False
        if count is None or alone is None:  # this torch cannot tell: taken as shared (a copy)
            return True
        shared = count - alone
        return shared > 0 and not _only_a_lone_base(o, outs, counts, shared, self._lone_base)

    def aliased(self, outs, ins):
        # an output that shares an input's memory starts inside it: the callee only had the input's
        # own bytes (its data pointer to data pointer + nbytes), so no output's extent is needed
        spans = [(p, p + x.nbytes) for x in ins if isinstance(x, torch.Tensor) and (p := x.data_ptr())]
        if not spans:
            return []
        found = []
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                p = o.data_ptr()
                if any(start <= p < end for start, end in spans):
                    found.append(i)
        return found

    def outside_compiler(self, call):
        # torch.compile's tracer cannot follow foreign code (DLPack, jax): a graph break here,
        # the bridged call runs eagerly, and tracing resumes after it
        if torch.compiler.is_compiling():
            return torch.compiler.disable(call)
        return None

    def vjp(self, fn, leaves, diff):
        ins = [x.detach().requires_grad_() if d else x for x, d in zip(leaves, diff)]
        with torch.enable_grad():
            outs = fn(*ins)

        def pullback(cts):
            pairs = [(o, c) for o, c in zip(outs, cts) if c is not None and o.requires_grad]
            wrt = [x for x, d in zip(ins, diff) if d]
            # the graph kept for another use: a persistent tf.GradientTape asks twice (two targets,
            # tape.jacobian's rows); it lives as long as the pullback, which the caller's tape holds
            grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True,
                                             retain_graph=True)
                         if pairs else [None] * len(wrt))
            return [next(grads) if d else None for d in diff]

        return outs, pullback


def _only_a_lone_base(o, outs: list, counts: list[int], shared: int, lone: tuple | None) -> bool:
    """Whether the ``shared`` tensors beside result ``o`` on its storage are its base, an intermediate
    held by nothing but its views, and other such views among the results ``outs`` that nothing else
    holds (``(x * 2).reshape(...)``, ``torch.split`` at a model's end): memory the callee keeps no handle
    on. Anything else on that storage (a parameter, a buffer, an input, a view or a detach of one kept
    anywhere, a base with any other holder in Python or in C++: autograd's saved tensors, a scripted
    module, a weak reference) is counted by torch's own counts and makes it kept."""
    got = internals.base_holders(o) if lone is not None else None
    if got is None or lone is None:
        return False
    base, cpp, py = got
    views = 0
    for x, n in zip(outs, counts):
        if n == cpython.FRESH and isinstance(x, torch.Tensor) and internals.view_base(x) is base:
            views += 1
    # each view of the base holds it once in C++, and the storage once (o among them); a weak reference
    # to the base is a handle on it too
    return (shared == views and cpp == lone[0] + views - 1 and py == lone[1]
            and not weakref.getweakrefcount(base))


class _Foreign(torch.autograd.Function):
    """A bridged function's call as one torch op: its backward is the callee's vjp."""

    @staticmethod
    def forward(ctx, call, *xs):
        # detached: the same memory and version counter, without the grad that makes convert plan afresh
        outs, pullback = call.forward([x.detach() for x in xs], True, "torch")
        ctx.call, ctx.pullback = call, pullback
        ctx.set_materialize_grads(False)  # an unused output's cotangent stays None: nothing to convert
        # a result that was a Python number is a constant: no gradient flows through it
        numbers = {i for i, _ in call.numbers}
        ctx.mark_non_differentiable(*[o for i, o in enumerate(outs)
                                      if i in numbers or not (o.is_floating_point() or o.is_complex())])
        # the callee's pullback may keep views of these (zero-copy): saved, so that torch's own
        # check refuses a backward after one was written in place, as it would natively
        ctx.save_for_backward(*xs, *outs)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *cts):
        saved = ctx.saved_tensors  # raises torch's error if an input or output was written since
        grads = ctx.call.backward(ctx.pullback, list(cts), "torch")
        if torch.is_grad_enabled():  # create_graph=True: a gradient of these must be refused, not short
            grads = _first_order_only(ctx.call, grads, saved[:len(grads)])
        return (None, *grads)


def _first_order_only(call, grads, xs):
    """``grads`` that raise our error when differentiated (their graph reaches the inputs ``xs``)."""
    live = [i for i, g in enumerate(grads) if g is not None]
    if not live:
        return grads
    got = _SecondOrder.apply(call, len(live), *[grads[i] for i in live], *xs)
    out = list(grads)
    for i, g in zip(live, got):
        out[i] = g
    return out


class _SecondOrder(torch.autograd.Function):
    """The gradients of a bridged call as they are; differentiating them raises our error."""

    @staticmethod
    def forward(ctx, call, n, *ts):
        ctx.call = call
        return tuple(t.view_as(t) for t in ts[:n])

    @staticmethod
    def backward(ctx, *_):
        raise second_order_refused("torch", ctx.call.fn)


HOOKS = TorchBridge()
