"""``torch.openreg.make_graphed_callables``: callables whose forward and backward replay openreg graphs.

The counterpart of ``torch.cuda.make_graphed_callables``, built on ``torch.openreg.Graph``: each callable
runs a few warm-up iterations on a side stream (so that every call shape has been seen, and its first,
checking, run done, before capture), then its forward is captured into one graph and its backward
(``torch.autograd.grad`` of the outputs) into another, all graphs sharing one memory pool. The result
is an autograd function: its forward copies the arguments into the captured (static) inputs and
replays the forward graph; its backward copies the incoming gradients into the static gradient
outputs and replays the backward graph. Python of the callable does not run again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree

from .graphs import Graph, graph, graph_pool_handle


# LITERALINCLUDE START: MAKE GRAPHED CALLABLES
def make_graphed_callables(callables: Any, sample_args: tuple, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool: tuple[int, int] | None = None) -> Any:
    """Graphed versions of ``callables`` (a callable or ``nn.Module``, or a tuple of them with a tuple of
    ``sample_args`` each), as ``torch.cuda.make_graphed_callables`` makes them.

    Modules keep their own forward for the training state they were not captured in. Arguments must be
    tensors, with the shapes, dtypes and ``requires_grad`` of the samples; parameters stay in place.
    """
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    flat_args, specs = [], []
    for fn, args in zip(callables, sample_args):
        if isinstance(fn, torch.nn.Module) and (fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks):
            raise RuntimeError("make_graphed_callables: modules must have no hooks registered (they would not run "
                               "on replay)")
        flat, spec = _pytree.tree_flatten(args)
        if not all(isinstance(a, torch.Tensor) and a.device.type == "openreg" for a in flat):
            raise TypeError("make_graphed_callables: sample arguments must be openreg tensors")
        flat_args.append(tuple(flat))
        specs.append(spec)
    params = [tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else () for fn in callables]
    inputs = [args + p for args, p in zip(flat_args, params)]
    pool = graph_pool_handle() if pool is None else pool

    torch.openreg.synchronize()
    with torch.openreg.stream(torch.openreg.Stream()):  # warm-up: every call shape seen, lazy work done
        for fn, args, spec, ins in zip(callables, flat_args, specs, inputs):
            for _ in range(num_warmup_iters):
                outputs = _pytree.tree_leaves(fn(*_pytree.tree_unflatten(list(args), spec)))
                _grads(outputs, ins, None, allow_unused_input)
            del outputs
    torch.openreg.synchronize()

    captured = []
    for fn, args, spec in zip(callables, flat_args, specs):  # forwards in order
        forward = Graph()
        with graph(forward, pool=pool):
            outputs = fn(*_pytree.tree_unflatten(list(args), spec))
        flat_out, out_spec = _pytree.tree_flatten(outputs)
        captured.append([forward, tuple(flat_out), out_spec])
    for entry, ins in reversed(list(zip(captured, inputs))):  # backwards in reverse order, as they will run
        flat_out = entry[1]
        grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None for o in flat_out)
        backward = Graph()
        with graph(backward, pool=pool):
            grads = _grads(flat_out, ins, grad_outputs, allow_unused_input)
        # Detached, the outputs let go of the captured autograd graph (and its AccumulateGrad nodes, which
        # would keep the capture's stream).
        entry[1] = tuple(o.detach() for o in flat_out)
        entry += [backward, grad_outputs, grads]
        del flat_out, grads

    graphed = [_graphed(fn, args, p, *entry)
               for fn, args, p, entry in zip(callables, flat_args, params, captured)]
    return graphed[0] if just_one else tuple(graphed)
# LITERALINCLUDE END: MAKE GRAPHED CALLABLES


def _grads(outputs: list, inputs: tuple, grad_outputs: tuple | None, allow_unused: bool) -> tuple:
    """Gradients of the outputs that need them with respect to the inputs that need them (None elsewhere)."""
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs or [None] * len(outputs)) if o.requires_grad]
    wanted = [i for i in inputs if i.requires_grad]
    if not pairs or not wanted:
        return tuple(None for _ in inputs)
    grads = iter(torch.autograd.grad(
        [o for o, _ in pairs], wanted,
        grad_outputs=[g if g is not None else torch.ones_like(o) for o, g in pairs],
        allow_unused=allow_unused,
    ))
    return tuple(next(grads) if i.requires_grad else None for i in inputs)


def _graphed(fn: Callable, static_args: tuple, params: tuple, forward: Graph, static_outputs: tuple,
             out_spec: Any, backward: Graph, grad_outputs: tuple, grad_inputs: tuple) -> Callable:
    """The graphed callable: an autograd function replaying the two graphs, wrapped to take the user's arguments."""

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            for static, given in zip(static_args, inputs):
                if static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            forward.replay()
            return tuple(o.detach() for o in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
            for static, given in zip(grad_outputs, grads):
                if static is not None and given is not None and static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            backward.replay()
            return tuple(g.detach() if g is not None else None for g in grad_inputs)

    def run(*user_args: Any) -> Any:
        flat = _pytree.tree_leaves(user_args)
        if len(flat) != len(static_args):
            raise TypeError(f"graphed callable: expected {len(static_args)} tensor arguments, got {len(flat)}")
        for given, static in zip(flat, static_args):
            if (given.shape, given.dtype, given.device) != (static.shape, static.dtype, static.device):
                raise ValueError(f"graphed callable: an argument of shape {tuple(given.shape)}, {given.dtype}, "
                                 f"{given.device} where the capture had {tuple(static.shape)}, {static.dtype}, "
                                 f"{static.device}; capture again for other shapes")
        outputs = Graphed.apply(*flat, *params)
        return _pytree.tree_unflatten(list(outputs), out_spec)

    if not isinstance(fn, torch.nn.Module):
        return run
    training, own_forward = fn.training, fn.forward

    def graphed_forward(*args: Any, **kwargs: Any) -> Any:
        if fn.training == training and not kwargs:
            return run(*args)
        return own_forward(*args, **kwargs)

    fn.forward = graphed_forward
    return fn
