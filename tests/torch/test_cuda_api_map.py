"""docs/cuda_api.md maps every name of ``torch.cuda.__all__`` (read from the installed PyTorch) to its
``torch.openreg`` counterpart or says why it has none; a counterpart the map names must exist."""

from __future__ import annotations

import re
from pathlib import Path

import torch

MAP = Path(__file__).resolve().parents[2] / "docs" / "cuda_api.md"
ROW = re.compile(r"^\| `(?P<cuda>[A-Za-z_][A-Za-z0-9_]*)` \|(?P<ours>[^|]*)\|(?P<notes>[^|]*)\|$")


def _rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in MAP.read_text().splitlines():
        match = ROW.match(line.strip())
        if match:
            assert match["cuda"] not in rows, f"{match['cuda']} is mapped twice"
            rows[match["cuda"]] = (match["ours"].strip(), match["notes"].strip())
    return rows


def test_every_torch_cuda_name_is_mapped():
    rows = _rows()
    missing = sorted(set(torch.cuda.__all__) - set(rows))
    assert not missing, f"docs/cuda_api.md does not map these torch.cuda names: {missing}"
    stale = sorted(set(rows) - set(torch.cuda.__all__))
    assert not stale, f"docs/cuda_api.md maps names torch.cuda no longer has: {stale}"


def test_counterparts_exist_and_gaps_say_why():
    for cuda, (ours, notes) in _rows().items():
        if ours == "—":
            assert len(notes) > 10, f"{cuda}: no counterpart and no reason"
            continue
        name = re.fullmatch(r"`([A-Za-z_][A-Za-z0-9_.]*)`", ours)
        assert name, f"{cuda}: counterpart cell {ours!r} is not one backticked name"
        target = torch.openreg
        for part in name[1].split("."):
            assert hasattr(target, part), f"{cuda}: torch.openreg.{name[1]} does not exist"
            target = getattr(target, part)
        top = name[1].split(".")[0]
        assert top in torch.openreg.__all__ or top in ("amp", "graphs", "memory", "random", "streams"), (
            f"torch.openreg.{top} is not in torch.openreg.__all__")
