"""One operator call as the fallback decided it (``fallback.decide``): the object a vendor follows.

The mechanism and its accelerations (``fast/``) ask the call for what they need, never the schema and the
argument tuples apart: its arguments' values (:meth:`Call.value`, :meth:`Call.named`,
:meth:`Call.given_value`), its outputs (:meth:`Call.outputs`), the CPU kernel's arguments over host views
(:meth:`Call.host_args`, :meth:`Call.now_args`, :meth:`Call.meta_args`) and what a launch of it writes
(:meth:`Call.writes`). The schema's facts are its :class:`~.traits.OpTraits` (read once per operator); how
arguments are mapped, ``arguments.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

from .arguments import (
    arguments_for,
    host_view_or_self,
    host_view_or_snapshot,
    read_view_or_self,
    read_view_or_snapshot,
    tensors_of,
    to_meta,
)
from .outputs import outputs
from .traits import OpTraits


class Route(enum.Enum):
    """How calls of one call shape run."""

    CHECK = "check"  # not seen yet: queued, but run at the call (Stream.run_here), its warnings counted
    QUEUE = "queue"  # its first call was clean: queued on the stream
    NOW = "now"  # the CPU kernel decides its outputs: wait for the stream, run it, copy new outputs over


# LITERALINCLUDE START: CALL
@dataclass(slots=True)
class Call:
    """One operator call, as decided. It never holds host views: it may be in an error's traceback."""

    op: torch._ops.OpOverload
    traits: OpTraits
    args: tuple  # as the CPU kernel takes them (Python numbers in ``Tensor`` positions wrapped)
    kwargs: dict
    given: tuple  # (args, kwargs) as called
    tensors: list[torch.Tensor]
    device: torch.device
    key: tuple | None  # the call shape (None: not hashable, every call is checked)
    route: Route
    meta: Any = None  # the outputs' metadata (meta tensors), for a queued route
    plan: Any = None  # what an acceleration learned from this call (see fast/)
    fresh: Any = ()  # the fresh outputs its launch allocated (launch_copy): written too

    def value(self, index: int) -> Any:
        """The argument at schema position ``index``, as the CPU kernel takes it (positional or keyword)."""
        return self.traits.value(self.args, self.kwargs, index)

    def named(self, name: str) -> Any:
        """The argument called ``name`` in the schema (its default when not passed)."""
        return self.traits.value(self.args, self.kwargs, self.traits.positions[name])

    def given_value(self, index: int) -> Any:
        """The argument at schema position ``index`` as called (a Python number stays a number)."""
        return self.traits.value(*self.given, index)

    def outputs(self) -> list:
        """Its outputs on the device, one per return: fresh ones allocated, views built, in-place and ``out=``
        arguments fitted to the meta run's metadata."""
        return outputs(self)

    def host_args(self) -> tuple[tuple, dict]:
        """The CPU kernel's arguments for a queued kernel: host views of the openreg tensors, CPU scalars and
        indices read now (as CUDA copies them at the call), the device generator's CPU state for generators."""
        views = host_view_or_snapshot if self.traits.mutates else read_view_or_snapshot  # read-only: copy-on-write
        return arguments_for(self.traits, self.args, self.kwargs, self.device, views, "cpu")

    def now_args(self) -> tuple[tuple, dict]:
        """The CPU kernel's arguments for a kernel run now, inside its launch: host views of every openreg tensor."""
        views = host_view_or_self if self.traits.mutates else read_view_or_self  # storages stay shared when read
        return arguments_for(self.traits, self.args, self.kwargs, self.device, views, "cpu")

    def meta_args(self) -> tuple[tuple, dict]:
        """Its arguments as meta tensors, for the meta run that describes its outputs."""
        return arguments_for(self.traits, self.args, self.kwargs, self.device, to_meta, "meta")

    # LITERALINCLUDE END: CALL

    # LITERALINCLUDE START: WRITE SET
    def writes(self) -> list[torch.Tensor]:
        """What a launch of it writes, for the stream sanitizer: the arguments its schema marks written (an
        in-place ``self``, ``out=``) and its fresh outputs. A launch asks (``writes=call.writes``) only while
        the sanitizer is on."""
        return written_by(self.traits, self.args, self.kwargs, self.fresh)


def written_by(traits: OpTraits, args: tuple, kwargs: dict, fresh: Any = ()) -> list[torch.Tensor]:
    """:meth:`Call.writes` for a caller that holds the arguments without a call (a call plan replays a call
    shape without deciding it again)."""
    written = [traits.value(args, kwargs, i) for i, a in enumerate(traits.arguments)
               if a.alias_info is not None and a.alias_info.is_write]
    return [*tensors_of(tuple(written), {}), *tensors_of(tuple(fresh), {})]
# LITERALINCLUDE END: WRITE SET
