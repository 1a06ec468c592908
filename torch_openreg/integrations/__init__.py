"""Integrations of openreg with training frameworks, each imported only when asked for.

- ``torch_openreg.integrations.lightning``: an ``Accelerator`` named ``"openreg"`` for Lightning's
  ``Trainer``, with the strategy and precision choices Lightning makes for CUDA.
- ``torch_openreg.integrations.safetensors``: loading safetensors files onto an openreg device.

Nothing here is imported by ``import torch`` or ``import torch_openreg``: each module imports its
framework, which the core package does not require. Hugging Face ``transformers`` and ``accelerate``
need no module (``ACCELERATE_TORCH_DEVICE=openreg``, see the frameworks chapter).
"""
