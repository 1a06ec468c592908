"""``torch.compile(mode="reduce-overhead")`` on openreg: compiled graphs replayed as openreg device graphs.

Inductor hands every compiled graph that may use device graphs to ``config.cudagraph_policy`` (a
``CUDAGraphPolicy``, torch/_inductor/cudagraph_utils.py) when one is set, instead of its CUDA graph trees,
which are built on ``torch.cuda`` only. openreg's policy wraps openreg graphs in :class:`GraphedCall`:

* the first call with an input signature runs the compiled graph as usual (the warm-up: every kernel's
  first, checking, run happens outside a capture);
* the second captures it into a ``torch.openreg.Graph`` on a side stream, with inputs in static buffers
  of its own (parameters and other inputs that keep their address are used in place), and replays it;
* later calls copy the inputs into the static buffers (one launch), replay, and copy the outputs out
  into fresh tensors (one launch): outputs never alias the graph's memory, so a caller may keep them
  across calls, and a forward graph may run twice before its backward.

A graph whose in-place inputs moved (a parameter replaced) or whose input signature is new is recorded
again, up to ``MAX_RECORDINGS`` per compiled graph; beyond that it runs without a graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._inductor.cudagraph_utils import CUDAGraphPolicy
from torch._inductor.output_code import get_expanded_dims, index_expanded_dims

from torch_openreg.aten.launch import host_view, launch

MAX_RECORDINGS = 8


# LITERALINCLUDE START: COMPILE GRAPH POLICY
class OpenRegGraphPolicy(CUDAGraphPolicy):
    """Inductor's device-graph wrapping: openreg graphs get :class:`GraphedCall`, CUDA graphs PyTorch's trees."""

    def cudagraphify(self, model: Callable[..., Any], example_inputs: Sequence[Any], static_input_idxs: Sequence[int],
                     *, device_index: int, is_backward: bool, is_inference: bool, **kwargs: Any) -> Callable[..., Any]:
        if any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in example_inputs):
            return super().cudagraphify(model, example_inputs, static_input_idxs, device_index=device_index,
                                        is_backward=is_backward, is_inference=is_inference, **kwargs)
        return GraphedCall(model, static_input_idxs, device_index)


class GraphedCall:
    """A compiled graph (boxed: it takes a list of inputs) run through openreg device graphs.

    Inductor names the inputs it expects at the same address every call (``static_input_idxs``: parameters,
    buffers, and in a backward graph the forward's saved tensors). Those that kept their address from the
    warm-up call to the capture are used in place; the others are copied in like any input. A graph whose
    in-place inputs moved is recorded again.
    """

    def __init__(self, model: Callable[[list], Any], static_input_idxs: Sequence[int], device: int) -> None:
        self.model, self.static, self.device = model, frozenset(static_input_idxs), device
        self.warmed: dict[tuple, list[int]] = {}  # signature -> the static inputs' addresses at the warm-up
        self.recordings: dict[tuple, _Recording] = {}

    def __call__(self, inputs: list) -> Any:
        key = tuple((x.shape, x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x for x in inputs)
        recording = self.recordings.get(key)
        if recording is not None and not recording.moved(inputs):
            return recording.run(inputs)
        addresses = self._addresses(inputs)
        before = self.warmed.get(key)
        if before is None or len(self.recordings) >= MAX_RECORDINGS:
            self.warmed[key] = addresses
            return self.model(inputs)  # the warm-up (or too many signatures): no graph
        in_place = frozenset(i for i, a, b in zip(sorted(self.static), addresses, before) if a == b)
        recording = self.recordings[key] = _Recording(self.model, inputs, in_place, self.device)
        return recording.run(inputs)

    def _addresses(self, inputs: list) -> list[int]:
        return [inputs[i].data_ptr() if isinstance(inputs[i], torch.Tensor) else -1 for i in sorted(self.static)]
# LITERALINCLUDE END: COMPILE GRAPH POLICY


# LITERALINCLUDE START: COMPILE GRAPH RECORDING
class _Recording:
    """One capture of a compiled graph: its static input buffers, its graph and its static outputs."""

    def __init__(self, model: Callable[[list], Any], inputs: list, in_place: frozenset, device: int) -> None:
        self.device = device
        self.in_place = {i: inputs[i].data_ptr() for i in in_place if isinstance(inputs[i], torch.Tensor)}
        self.copied = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and i not in in_place]
        self.inputs = list(inputs)
        for i in self.copied:
            x = inputs[i]
            self.inputs[i] = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
        self.expanded = {i: get_expanded_dims(inputs[i]) for i in self.copied}
        self.graph = torch.openreg.Graph()
        with torch.openreg.device(device), torch.openreg.graph(self.graph, capture_error_mode="thread_local"):
            outputs = model(list(self.inputs))  # on the device's side stream for captures
        self.outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]

    def moved(self, inputs: list) -> bool:
        """Whether an input used in place is somewhere else now (the graph would read the old memory)."""
        return any(inputs[i].data_ptr() != ptr for i, ptr in self.in_place.items())

    def run(self, inputs: list) -> list:
        pairs = [(self.inputs[i], inputs[i], self.expanded[i]) for i in self.copied]
        inputs.clear()  # the boxed calling convention: the callee frees its inputs
        _copy(self.device, pairs, "graph inputs")
        self.graph.replay()
        fresh = [torch.empty_strided(o.size(), o.stride(), dtype=o.dtype, device=o.device)
                 if isinstance(o, torch.Tensor) else o for o in self.outputs]
        _copy(self.device, [(f, o, []) for f, o in zip(fresh, self.outputs) if isinstance(o, torch.Tensor)],
              "graph outputs")
        return fresh


def _copy(device: int, pairs: list, name: str) -> None:
    """Copy every ``(dst, src, expanded dims)`` in one launch on the device's current stream."""
    if not pairs:
        return
    if any(src.device != dst.device for dst, src, _ in pairs):  # a CPU input: copied on its own
        for dst, src, dims in pairs:
            index_expanded_dims(dst, dims).copy_(index_expanded_dims(src, dims))
        return
    views = [(index_expanded_dims(host_view(dst), dims), index_expanded_dims(host_view(src), dims))
             for dst, src, dims in pairs if dst.numel()]
    launch(device, _copy_views, views, tensors=[t for dst, src, _ in pairs for t in (dst, src)], name=name)


def _copy_views(views: list) -> None:
    for dst, src in views:
        dst.copy_(src)
# LITERALINCLUDE END: COMPILE GRAPH RECORDING
