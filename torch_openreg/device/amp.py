"""``torch.openreg.amp``: ``torch.cuda.amp``'s names for openreg (autocast, GradScaler, custom_fwd/custom_bwd).

Code written against ``torch.cuda.amp`` runs with ``torch.openreg.amp`` in its place. Each name is the
device-generic ``torch.amp`` object with ``device_type="openreg"`` bound (the autocast policy itself
is ``torch_openreg/amp.py``); ``torch.amp`` stays the preferred spelling, as for CUDA.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]


# LITERALINCLUDE START: DEVICE AMP
class autocast(torch.amp.autocast):  # noqa: N801 - torch.cuda.amp's name
    """``torch.autocast("openreg", ...)`` with ``torch.cuda.amp.autocast``'s arguments and defaults."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True) -> None:
        super().__init__("openreg", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("openreg", ...)`` with ``torch.cuda.amp.GradScaler``'s arguments."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        super().__init__("openreg", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval, enabled=enabled)


custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="openreg")
custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="openreg")
# LITERALINCLUDE END: DEVICE AMP
