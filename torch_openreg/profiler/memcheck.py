"""What a host access to device memory hit, in PyTorch's terms: the ``cuda-memcheck``-like part of a fault report.

The runtime's fault reporter (``openreg.fault``) names the device allocation a stray host access
hit. That allocation is a segment of the caching allocator; this annotator adds the block inside it
(a tensor's storage, or free cache), its size and stream, and the Python stack that allocated it
when memory history is recorded (``torch.openreg.memory._record_memory_history()``, which keeps a
stack per live block, as CUDA's does).

It runs inside the SIGSEGV handler, after the fault: it reads the allocator's tables and formats text,
nothing more.
"""

from __future__ import annotations

import openreg
from torch_openreg.memory import allocator

_FRAMES = 12  # innermost frames shown


# LITERALINCLUDE START: MEMCHECK
def describe(addr: int) -> str | None:
    """The caching-allocator block at ``addr`` and where it was allocated, or None if none holds it."""
    for device in range(openreg.device_count()):
        alloc = allocator(device)
        for base, head in list(alloc.segments.items()):
            block = head
            while block is not None and not block.ptr <= addr < block.ptr + block.size:
                block = block.next
            if block is None:
                continue
            state = "an allocated" if block.allocated else "a free (cached)"
            text = (f"openreg: it is {state} block 0x{block.ptr:x} of {block.size} bytes of the caching allocator "
                    f"(offset {addr - block.ptr}; {block.requested} bytes requested) in segment 0x{base:x}, "
                    f"stream {block.stream.id} of openreg:{device}.\n")
            if block.frames:
                text += "openreg: the block was allocated at (most recent call first):\n" + "".join(
                    f"    {f['filename']}:{f['line']} in {f['name']}\n" for f in block.frames[:_FRAMES])
            elif block.allocated:
                text += ("openreg: record allocation stacks with torch.openreg.memory._record_memory_history() "
                         "to see where it was allocated.\n")
            return text
    return None
# LITERALINCLUDE END: MEMCHECK
