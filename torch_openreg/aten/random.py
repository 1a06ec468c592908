"""Random operators whose schema names no generator.

The fallback gives every operator with a ``Generator`` argument the openreg generator (see the
fallback chapter). ``aten::native_dropout`` has none: ``F.dropout`` on an accelerator calls it (the
"fused" path PyTorch picks for CUDA, XPU and PrivateUse1), and its CPU kernel, run over host views,
would draw from the CPU's default generator, asynchronously. This kernel draws its mask with
``bernoulli_`` on the openreg device instead, exactly as the CPU's unfused dropout does.
"""

from __future__ import annotations

import torch


# LITERALINCLUDE START: NATIVE DROPOUT
def native_dropout(input: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    if train is False or p == 0 or input.numel() == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = 1.0 - p
    noise = torch.empty_like(input).bernoulli_(keep)  # the device's default generator, in program order
    mask = noise.bool()
    return input * noise.div_(keep) if keep > 0 else input * 0, mask
# LITERALINCLUDE END: NATIVE DROPOUT
