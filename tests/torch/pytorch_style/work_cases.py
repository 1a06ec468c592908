"""A PyTorch-style device-generic file whose work depends on the device type, as ``test_optim.py``'s does.

PyTorch's ``common_optimizers`` gives each device type its own optimizer configurations (``foreach=True`` for
the foreach devices, openreg among them and the CPU not; ``fused=True`` for an ``OptimizerInfo``'s
``supports_fused_on``). ``tests/torch/test_pytorch_suites.py`` runs this file with the suites runner's
``--same-work``: ``test_configurations_are_the_privateuse1_backends`` passes on openreg and on the CPU run that
loads ``torch_openreg.testing.same_work``, and fails on the plain CPU run, which gets the CPU's own configurations.
"""

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests
from torch.testing._internal.common_optimizers import _get_optim_inputs_including_global_cliquey_kwargs, optim_db
from torch.testing._internal.common_utils import TestCase, run_tests

SGD = next(info for info in optim_db if info.optim_cls is torch.optim.SGD)


def _flags(device) -> list[tuple[bool, bool]]:
    """(foreach, fused) of each SGD configuration the helper gives ``device``."""
    inputs = _get_optim_inputs_including_global_cliquey_kwargs(device, torch.float32, SGD, skip=("differentiable",))
    return [(i.kwargs.get("foreach", False), i.kwargs.get("fused", False)) for i in inputs]


class TestWork(TestCase):
    def test_configurations_are_the_privateuse1_backends(self, device):
        self.assertEqual(_flags(device), _flags(torch._C._get_privateuse1_backend_name()))

    def test_sgd_steps_of_every_configuration(self, device):
        inputs = _get_optim_inputs_including_global_cliquey_kwargs(device, torch.float32, SGD, skip=("differentiable",))
        for optim_input in inputs:
            weight = torch.nn.Parameter(torch.ones(3, 2, device=device))
            optimizer = torch.optim.SGD([weight], **optim_input.kwargs)
            for _ in range(3):
                optimizer.zero_grad()
                (weight * 2).sum().backward()
                optimizer.step()
            moved = weight.sum().item() - 6.0  # the gradient is 2 everywhere: a step lowers the sum, maximize raises it
            self.assertGreater(-moved if not optim_input.kwargs.get("maximize") else moved, 0, optim_input.desc)


instantiate_device_type_tests(TestWork, globals())

if __name__ == "__main__":
    run_tests()
