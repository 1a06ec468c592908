"""``nn.Module.to`` and ``param.data =`` keep Parameter identity to, from and within openreg, as on CUDA.

``Module._apply`` moves a parameter in place when ``torch._has_compatible_shallow_copy_type`` says
the old and new tensors are compatible; PyTorch 2.13 answers False between the CPU and PrivateUse1,
and openreg registers the operator (``torch_openreg/compat.py``). Every test compares with the same
computation on the CPU.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

compatible = torch._has_compatible_shallow_copy_type


class Net(nn.Module):
    """Linear layers, a batch norm (buffers) and a weight tied between the first and last layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 6)
        self.norm = nn.BatchNorm1d(6)
        self.out = nn.Linear(6, 6)
        self.out.weight = self.inp.weight  # tied, like GPT-2's lm_head and wte

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.inp(x))))


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


# LITERALINCLUDE START: TEST MODULE TO
CONVERSIONS = {  # name: (start device, conversion, device and dtype after it)
    "cpu->openreg": ("cpu", lambda m: m.to("openreg"), "openreg:0", torch.float32),
    "cpu->openreg()": ("cpu", lambda m: m.openreg(), "openreg:0", torch.float32),
    "cpu->openreg:1": ("cpu", lambda m: m.to("openreg:1"), "openreg:1", torch.float32),
    "openreg->cpu": ("openreg", lambda m: m.to("cpu"), "cpu", torch.float32),
    "openreg->cpu()": ("openreg", lambda m: m.cpu(), "cpu", torch.float32),
    "openreg:0->openreg:1": ("openreg:0", lambda m: m.to("openreg:1"), "openreg:1", torch.float32),
    "openreg half()": ("openreg", lambda m: m.half(), "openreg:0", torch.float16),
    "openreg to(float64)": ("openreg", lambda m: m.to(torch.float64), "openreg:0", torch.float64),
    "openreg bfloat16().float()": ("openreg", lambda m: m.bfloat16().float(), "openreg:0", torch.float32),
    "cpu->openreg float64": ("cpu", lambda m: m.to("openreg", torch.float64), "openreg:0", torch.float64),
    "openreg float64->cpu float32": ("openreg", lambda m: m.double().to("cpu", torch.float32), "cpu", torch.float32),
}


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_conversion_keeps_parameters_and_their_grads(name, two_devices):
    start, convert, device, dtype = CONVERSIONS[name]
    model = _net().to(start)
    model(torch.randn(4, 6, device=start)).sum().backward()
    params = dict(model.named_parameters())
    grads = {k: p.grad for k, p in params.items()}
    # the same conversion of the same values on the CPU
    expected = {k: convert(nn.Parameter(p.detach().cpu().clone())).detach().cpu() for k, p in params.items()}

    assert convert(model) is model
    for k, p in model.named_parameters():
        assert p is params[k], k  # the same Parameter object ...
        assert p.grad is grads[k], k  # ... with the same .grad object
        assert p.device == torch.device(device) and p.grad.device == p.device and p.dtype == dtype
        assert_close(p.detach().cpu(), expected[k].to(dtype), rtol=0, atol=0)
    assert model.out.weight is model.inp.weight  # still tied
# LITERALINCLUDE END: TEST MODULE TO


def test_buffers_follow_pytorchs_rule():
    """Buffers are replaced by their moved copies on every backend (``Module._apply``), on openreg too."""
    model = _net()
    model(torch.randn(4, 6))
    buffers = {k: b.clone() for k, b in model.named_buffers()}
    model.to("openreg")
    for k, b in model.named_buffers():
        assert b.device.type == "openreg"
        assert_close(b.cpu(), buffers[k], rtol=0, atol=0)


def _train(model: nn.Module, opt: torch.optim.Optimizer, device: str, steps: int = 4) -> list[float]:
    g = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", [
    lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    lambda ps: torch.optim.Adam(ps, lr=0.05),
    lambda ps: torch.optim.AdamW(ps, lr=0.05, foreach=False),
], ids=["sgd", "adam", "adamw-forloop"])
def test_optimizer_built_before_to_trains_like_cpu(optimizer):
    cpu = _net()
    dev = copy.deepcopy(cpu)
    opt_dev = optimizer(dev.parameters())  # built on the CPU parameters, before .to()
    dev.to("openreg")
    cpu_losses = _train(cpu, optimizer(cpu.parameters()), "cpu")
    dev_losses = _train(dev, opt_dev, "openreg")
    assert_close(dev_losses, cpu_losses)
    for (k, a), b in zip(cpu.named_parameters(), dev.parameters()):
        assert b.device.type == "openreg"
        assert_close(b.detach().cpu(), a.detach(), msg=k)
    assert dev.out.weight is dev.inp.weight


def test_hooks_and_registered_parameters_survive():
    model = _net()
    calls = []
    weight = model.inp.weight
    weight.register_hook(lambda g: calls.append(("grad", g.device.type)))
    weight.register_post_accumulate_grad_hook(lambda p: calls.append(("accumulated", p.grad.device.type)))
    model.inp.register_forward_hook(lambda m, i, o: calls.append(("forward", m.weight.device.type)))
    extra = nn.Parameter(torch.ones(6))
    model.register_parameter("scale", extra)
    kept = [model.inp.bias]  # a reference held outside the module, as optimizers and EMA helpers do
    model.to("openreg")
    assert model.scale is extra and extra.device.type == "openreg" and kept[0] is model.inp.bias
    (model(torch.randn(4, 6, device="openreg")) * model.scale).sum().backward()
    assert ("forward", "openreg") in calls and ("grad", "openreg") in calls and ("accumulated", "openreg") in calls
    assert weight.grad is not None and weight.grad.device.type == "openreg" and extra.grad.device.type == "openreg"


def test_parametrizations_move_with_the_module():
    torch.manual_seed(1)
    cpu = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3))
    dev = copy.deepcopy(cpu)
    originals = list(dev.parametrizations.weight.parameters())
    dev.to("openreg")
    assert list(dev.parametrizations.weight.parameters()) == originals
    assert all(p.device.type == "openreg" for p in originals)
    x = torch.randn(5, 4)
    assert_close(dev(x.to("openreg")).cpu(), cpu(x))


def test_set_data_moves_in_place_both_ways():
    p = nn.Parameter(torch.arange(4.0))
    device_data = torch.full((4,), 7.0, device="openreg")
    p.data = device_data
    assert p.device.type == "openreg" and p.data_ptr() == device_data.data_ptr()
    assert_close(p.detach().cpu(), torch.full((4,), 7.0))
    p.data = torch.zeros(2, 2)
    assert p.device.type == "cpu" and p.shape == (2, 2)


def test_set_data_refuses_other_layouts_with_pytorchs_error():
    p = nn.Parameter(torch.ones(3, device="openreg"))
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        p.data = torch.ones(3).to_sparse()
    q = nn.Parameter(torch.ones(3))
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        q.data = torch.quantize_per_tensor(torch.ones(3, device="openreg"), 0.1, 0, torch.qint8)
    assert p.device.type == "openreg" and q.device.type == "cpu"  # left as they were


def test_only_dense_tensors_are_compatible():
    dense, cpu = torch.ones(3, device="openreg"), torch.ones(3)
    assert compatible(dense, cpu) and compatible(cpu, dense)
    assert compatible(dense, torch.ones(3, dtype=torch.half, device="openreg"))
    assert compatible(torch.ones(3, device="openreg:0"), torch.ones(3, device="openreg:1"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse invariant-check note
        sparse = torch.ones(3).to_sparse()
    quantized = torch.quantize_per_tensor(torch.ones(3, device="openreg"), 0.1, 0, torch.qint8)
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged).to("openreg")
    meta = torch.ones(3, device="meta")
    for other in (sparse, quantized, nested, meta):
        for a, b in ((dense, other), (other, dense), (cpu, other), (other, cpu)):
            assert not compatible(a, b), (a.device, a.layout, b.device, b.layout)
    with torch.inference_mode():  # no autograd keys: the backend-key registration answers
        assert compatible(torch.ones(3, device="openreg"), torch.ones(3))


def test_swap_tensors_future_flag_also_keeps_parameters():
    model = _net()
    weight = model.inp.weight
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to("openreg")
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert model.inp.weight is weight and weight.device.type == "openreg"
    assert model.out.weight is model.inp.weight


# -- Hugging Face models (tiny configurations built from config classes: nothing is downloaded) -------

transformers = pytest.importorskip("transformers")


def _hf_models():
    # Attention dropout is off: PyTorch picks a different SDPA kernel on openreg than on the CPU, so its
    # mask is drawn differently (docs/status.md); the other dropouts draw the CPU's numbers.
    gpt2 = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, attn_pdrop=0.0,
                                   bos_token_id=0, eos_token_id=0)
    bert = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=32, attention_probs_dropout_prob=0.0)
    return {
        "gpt2": lambda: transformers.GPT2LMHeadModel(gpt2),
        "bert": lambda: transformers.BertForMaskedLM(bert),
    }


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_hugging_face_training_matches_cpu_step_for_step(name):
    torch.manual_seed(0)
    cpu = _hf_models()[name]()
    dev = copy.deepcopy(cpu)
    # AdamW's eps is raised so that its update is smooth in the gradient: at the default 1e-8 the first
    # steps are sign(grad) * lr, which turns last-bit differences of a near-zero gradient (a different
    # kernel or summation order, allowed by assert_close) into lr-sized parameter differences.
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-2, eps=1e-3)  # a Trainer's order: optimizer, then .to()
    dev.to("openreg")
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-2, eps=1e-3)
    tied = {"gpt2": lambda m: (m.lm_head.weight, m.transformer.wte.weight),
            "bert": lambda m: (m.cls.predictions.decoder.weight, m.bert.embeddings.word_embeddings.weight)}[name]
    head, embedding = tied(dev)
    assert head is embedding and head.device.type == "openreg"  # the tie survived .to()
    trained = {id(p) for group in opt_dev.param_groups for p in group["params"]}
    assert trained == {id(p) for p in dev.parameters()}  # the optimizer holds the module's own parameters
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    for step in range(3):
        losses = []
        for model, opt, device in ((cpu, opt_cpu, "cpu"), (dev, opt_dev, "openreg")):
            torch.manual_seed(100 + step)  # the same dropout masks on both
            loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().cpu())
        assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5, msg=f"step {step}")
    for (k, a), b in zip(cpu.named_parameters(), dev.parameters()):
        assert_close(b.detach().cpu(), a.detach(), rtol=1e-4, atol=1e-5, msg=k)
