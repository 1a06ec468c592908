"""Sparse COO and compressed (CSR/CSC/BSR) tensors on openreg, against CPU sparse."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

DEV = "openreg"
DENSE = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 4.0]])


def _uncoalesced(device):
    """Duplicate and unordered indices, as embedding gradients and sums make them."""
    indices = torch.tensor([[2, 0, 1, 0, 2], [3, 1, 0, 1, 3]])
    return torch.sparse_coo_tensor(indices, torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), (3, 4), device=device)


def _same(got, expected):
    """Same layout, device type openreg, components and values equal to the CPU's, bit for bit."""
    if not isinstance(expected, torch.Tensor):
        assert got == expected
        return
    assert got.device.type == DEV, got.device
    assert got.layout == expected.layout and got.dtype == expected.dtype and got.shape == expected.shape
    if expected.layout == torch.sparse_coo:
        assert got.is_coalesced() == expected.is_coalesced()
        assert torch.equal(got._indices().cpu(), expected._indices())
        torch.testing.assert_close(got._values().cpu(), expected._values(), rtol=0, atol=0)
    elif expected.layout != torch.strided:
        for name in ("crow_indices", "col_indices") if expected.layout in (torch.sparse_csr, torch.sparse_bsr) else (
                "ccol_indices", "row_indices"):
            assert torch.equal(getattr(got, name)().cpu(), getattr(expected, name)())
        torch.testing.assert_close(got.values().cpu(), expected.values(), rtol=0, atol=0)
    else:
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_coo_tensors_live_on_the_device(two_devices):
    expected = DENSE.to_sparse()
    got = DENSE.to(DEV).to_sparse()
    assert "SparsePrivateUse1" in str(torch._C._dispatch_keys(got))
    _same(got, expected)
    assert got._indices().device == got.device == got._values().device == torch.device("openreg:0")
    assert got._nnz() == 4 and got.sparse_dim() == 2 and got.dense_dim() == 0
    _same(got.indices(), expected.indices())
    _same(got.values(), expected.values())
    _same(expected.to(DEV), expected)
    back = got.cpu()
    assert back.layout == torch.sparse_coo and back.device.type == "cpu" and torch.equal(back.to_dense(), DENSE)
    other = got.to("openreg:1")
    assert other.device == other._values().device == torch.device("openreg:1")
    _same(other, expected)
    made = torch.sparse_coo_tensor(expected._indices(), expected._values(), (3, 4), device=DEV)
    _same(made.coalesce(), expected)
    assert "layout=torch.sparse_coo" in repr(got) and "openreg" in repr(got)


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_compressed_tensors_live_on_the_device(layout, two_devices):
    convert = {"csr": lambda t: t.to_sparse_csr(), "csc": lambda t: t.to_sparse_csc(),
               "bsr": lambda t: t.to_sparse_bsr((1, 2))}[layout]
    expected = convert(DENSE)
    got = convert(DENSE.to(DEV))
    assert "SparseCsrPrivateUse1" in str(torch._C._dispatch_keys(got))
    _same(got, expected)
    _same(got.to_dense(), DENSE)
    _same(expected.to(DEV), expected)
    assert got.cpu().layout == expected.layout and torch.equal(got.cpu().to_dense(), DENSE)
    _same(got.to("openreg:1"), expected)
    assert got.to("openreg:1").values().device == torch.device("openreg:1")


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_save_load_and_deepcopy(layout, tmp_path):
    convert = (lambda t: t.to_sparse()) if layout == "coo" else (lambda t: t.to_sparse_csr())
    expected = convert(DENSE)
    got = convert(DENSE.to(DEV))
    torch.save(got, tmp_path / "s.pt")
    _same(torch.load(tmp_path / "s.pt"), expected)
    _same(copy.deepcopy(got), expected)
    on_cpu = torch.load(tmp_path / "s.pt", map_location="cpu")
    assert on_cpu.device.type == "cpu" and torch.equal(on_cpu.to_dense(), DENSE)


W = torch.randn(4, 5, generator=torch.Generator().manual_seed(3))
OPS = {
    "coalesce": lambda d: _uncoalesced(d).coalesce(),
    "to_dense": lambda d: _uncoalesced(d).to_dense(),
    "sparse_mm": lambda d: torch.sparse.mm(_uncoalesced(d), W.to(d)),
    "csr_mm": lambda d: torch.sparse.mm(DENSE.to(d).to_sparse_csr(), W.to(d)),
    "csr_matmul": lambda d: DENSE.to(d).to_sparse_csr() @ W.to(d),
    "addmm": lambda d: torch.sparse.addmm(torch.ones(3, 5, device=d), _uncoalesced(d), W.to(d), beta=0.5, alpha=2),
    "sampled_addmm": lambda d: torch.sparse.sampled_addmm(DENSE.to(d).to_sparse_csr(), W[:3].to(d), W.t().to(d)),
    "add_sparse": lambda d: _uncoalesced(d) + DENSE.to(d).to_sparse(),
    "add_dense": lambda d: DENSE.to(d) * 2 + _uncoalesced(d),
    "mul_scalar_neg": lambda d: -(DENSE.to(d).to_sparse() * 3),
    "sum": lambda d: torch.sparse.sum(_uncoalesced(d)),
    "sum_dim": lambda d: torch.sparse.sum(_uncoalesced(d), 1),
    "transpose": lambda d: _uncoalesced(d).t().coalesce(),
    "cat": lambda d: torch.cat([_uncoalesced(d), DENSE.to(d).to_sparse()], 1),
    "index_select": lambda d: DENSE.to(d).to_sparse().index_select(1, torch.tensor([3, 0], device=d)),
    "sparse_mask": lambda d: (DENSE.to(d) + 7).sparse_mask(DENSE.to(d).to_sparse()),
    "softmax": lambda d: torch.sparse.softmax(DENSE.to(d).to_sparse(), 1),
    "coo_to_csr": lambda d: _uncoalesced(d).coalesce().to_sparse_csr(),
    "csr_to_coo": lambda d: DENSE.to(d).to_sparse_csr().to_sparse(),
    "csr_unary": lambda d: DENSE.to(d).to_sparse_csr().neg().abs().sqrt(),
    "mul_inplace": lambda d: DENSE.to(d).to_sparse().mul_(3),
    "add_inplace_grows": lambda d: DENSE.to(d).to_sparse().add_(_uncoalesced(d)),
    "dense_add_inplace": lambda d: torch.ones(3, 4, device=d).add_(_uncoalesced(d), alpha=-0.5),
    "zero_inplace": lambda d: DENSE.to(d).to_sparse().zero_(),
    "clone_copy": lambda d: torch.sparse_coo_tensor(size=(3, 4), device=d).copy_(_uncoalesced(d).clone()),
}


@pytest.mark.parametrize("name", list(OPS))
def test_operators_match_cpu_sparse(name):
    _same(OPS[name](DEV), OPS[name]("cpu"))


def test_arithmetic_runs_as_named_launches(launches):
    _uncoalesced(DEV).coalesce()
    torch.openreg.synchronize()
    assert "aten::_coalesce" in {name for name, _, _ in launches}


def test_gradients_through_sparse_operators_match_cpu():
    results = []
    for device in ("cpu", DEV):
        s = DENSE.to(device).to_sparse().requires_grad_()
        w = W.clone().to(device).requires_grad_()
        torch.sparse.mm(s, w).pow(2).sum().backward()
        d = DENSE.clone().to(device).requires_grad_()
        (d.to_sparse() * 3).to_dense().sum().backward()
        results.append([s.grad, w.grad, d.grad])
    for got, expected in zip(*reversed(results)):
        _same(got, expected)


class _Bag(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4, sparse=True)
        self.out = nn.Linear(4, 1)

    def forward(self, idx):
        return self.out(self.embedding(idx)).pow(2).sum()


OPTIMIZERS = {
    "sgd": lambda m: [torch.optim.SGD(m.parameters(), lr=0.1)],
    "sgd_momentum": lambda m: [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)],
    "sparse_adam": lambda m: [torch.optim.SparseAdam(list(m.embedding.parameters()), lr=0.1),
                              torch.optim.Adam(m.out.parameters(), lr=0.1)],
    "adagrad": lambda m: [torch.optim.Adagrad(m.parameters(), lr=0.1)],
}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_sparse_embedding_training_matches_cpu(optimizer):
    torch.manual_seed(0)
    model = _Bag()
    idx = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])
    trained = []
    for device in ("cpu", DEV):
        m = copy.deepcopy(model).to(device)
        optimizers = OPTIMIZERS[optimizer](m)
        for _ in range(3):
            for o in optimizers:
                o.zero_grad()
            m(idx.to(device)).backward()
            assert m.embedding.weight.grad.layout == torch.sparse_coo
            assert m.embedding.weight.grad.device.type == device
            for o in optimizers:
                o.step()
        trained.append([p.detach().cpu() for p in m.parameters()])
    for got, expected in zip(trained[1], trained[0]):
        torch.testing.assert_close(got, expected)


def test_sparse_training_leaves_no_memory_behind(no_leak):
    m = _Bag().to(DEV)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        optimizer.zero_grad()
        m(torch.tensor([[1, 2], [2, 3]], device=DEV)).backward()
        optimizer.step()
    del m, optimizer


@pytest.mark.parametrize("bad, error, match", [
    (lambda: DENSE.to(DEV).to_sparse().exp(), NotImplementedError, "aten::exp.*SparsePrivateUse1"),
    (lambda: DENSE.to(DEV).to_sparse_csr().cumsum(0), NotImplementedError, "SparseCsrPrivateUse1"),
    (lambda: torch.sparse.mm(DENSE.to(DEV).to_sparse(), torch.randn(5, 2, device=DEV)), RuntimeError,
     "Expected dim 0 size 4"),
    (lambda: torch.sparse.mm(DENSE.to(DEV).to_sparse(), W), RuntimeError, "same device"),
    (lambda: DENSE.to(DEV).to_sparse().pin_memory(), NotImplementedError, "pinned"),
    (lambda: torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.tensor([1.0, 2.0]), (3,), device=DEV,
                                     check_invariants=True), RuntimeError, "found index 5"),
    (lambda: torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.tensor([1.0, 2.0]), (3,), device=DEV,
                                     check_invariants=False).to_dense(), RuntimeError, "found index 5"),
    (lambda: torch.ones(3, device=DEV).add_(torch.sparse_coo_tensor(
        torch.tensor([[0, 9]]), torch.tensor([1.0, 2.0]), (3,), device=DEV, check_invariants=False)), RuntimeError,
     "found index 9"),
    (lambda: torch.sparse_csr_tensor(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), torch.tensor([1.0, 2.0]),
                                     (2, 2), device=DEV, check_invariants=True), RuntimeError, "nnz"),
])
def test_bad_input_and_unsupported_operators_fail_clearly(bad, error, match, no_leak):
    with pytest.raises(error, match=match):
        bad()


def test_compressed_results_that_change_the_number_of_elements_in_place_and_out():
    """A CPU kernel that adds specified elements resizes its output's parts, which host views of device memory
    cannot be (PyTorch's test_sparse_csr test_sparse_add: "Trying to resize storage that is not resizable")."""
    layout = torch.sparse_csr  # the CPU adds CSR only
    a, b = DENSE.to_sparse(layout=layout), (DENSE.T @ DENSE)[:3].to_sparse(layout=layout)
    got = a.to(DEV)
    got.add_(b.to(DEV))
    _same(got, a.clone().add_(b))
    out = torch.eye(3, 4).to_sparse(layout=layout).to(DEV)
    result = torch.add(a.to(DEV), b.to(DEV), alpha=0.5, out=out)
    assert result is out
    _same(out, torch.add(a, b, alpha=0.5, out=torch.eye(3, 4).to_sparse(layout=layout)))


def test_a_batched_compressed_view_stays_on_the_device():
    """select of a batch dimension returns a compressed view of the input's parts: rebuilt on openreg (its
    factory was not told the device and refused openreg parts: test_sparse_csr test_select)."""
    crow, col = torch.tensor([0, 1, 2, 2]).repeat(2, 3, 1), torch.tensor([1, 3]).repeat(2, 3, 1)
    s = torch.sparse_csr_tensor(crow, col, torch.arange(12.0).reshape(2, 3, 2), size=(2, 3, 3, 4))
    _same(s.to(DEV).select(1, 2), s.select(1, 2))


@pytest.mark.parametrize("layout,blocksize", [(torch.sparse_csr, None), (torch.sparse_csc, None),
                                              (torch.sparse_bsr, (1, 2)), (torch.sparse_bsc, (1, 2))])
def test_compressed_in_place_operators_write_their_values(layout, blocksize):
    """An in-place operator that keeps the structure (mul_ by a scalar) writes the values of the host-owned copy
    the kernel computed in: they were dropped (PyTorch's test_sparse_csr test_mul_scalar)."""
    s = DENSE.to_sparse(layout=layout, blocksize=blocksize) if blocksize else DENSE.to_sparse(layout=layout)
    got = s.to(DEV)
    assert got.mul_(2.5) is got
    _same(got, s.clone().mul_(2.5))


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("transpose", [True, False])
def test_bsr_triangular_solve_with_a_unit_diagonal_as_cuda(upper, transpose):
    """CUDA solves it; the CPU's sparse kernel raises (PyTorch's test_sparse_csr skips the case for the CPU only):
    openreg gives CUDA's answer, the dense system's solution, and NaN for a matrix without stored blocks."""
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(6, 6, dtype=torch.float64, generator=g)
    dense = dense.triu() if upper else dense.tril()
    dense[2:4, 4:6] = dense[4:6, 2:4] = 0  # a block left unstored
    a, b = dense.to_sparse_bsr((2, 2)), torch.randn(6, 3, dtype=torch.float64, generator=g)
    with pytest.raises(RuntimeError, match="without blocksize"):
        torch.triangular_solve(b, a, upper=upper, transpose=transpose, unitriangular=True)  # the CPU's kernel
    expected = torch.triangular_solve(b, dense, upper=upper, transpose=transpose, unitriangular=True).solution
    solution, cloned = torch.triangular_solve(b.to(DEV), a.to(DEV), upper=upper, transpose=transpose,
                                              unitriangular=True)
    torch.testing.assert_close(solution.cpu(), expected)
    assert cloned.numel() == 0 and cloned.device.type == DEV
    out, clone_out = torch.empty(1, dtype=torch.float64, device=DEV), torch.empty(0, dtype=torch.float64, device=DEV)
    got = torch.triangular_solve(b.to(DEV), a.to(DEV), upper=upper, transpose=transpose, unitriangular=True,
                                 out=(out, clone_out))
    assert got[0] is out and got[1] is clone_out
    torch.testing.assert_close(out.cpu(), expected)
    empty = torch.zeros(6, 6, dtype=torch.float64).to_sparse_bsr((2, 2)).to(DEV)
    assert torch.triangular_solve(b.to(DEV), empty, upper=upper, unitriangular=True).solution.isnan().all()
