"""Every rank checks each call against its peers before any data moves.

Gloo trusts its callers: ranks that pass different sizes to one collective get corrupted data,
or an ``EnforceNotMet`` thrown on gloo's own thread that aborts the process. So each collective
carries a small description, exchanged on the ``ctrl`` context when the call is launched
(asynchronously, in program order, overlapping whatever the stream is still doing), and the
kernel compares the descriptions of all ranks before it issues the transfer. Every rank sees the
same descriptions, so every rank makes the same decision: all run the transfer, or all raise.

A description has three parts: a digest of what must be equal on every rank (operation, dtype,
element count, reduce operation, root), the bytes this rank sends to and expects from each peer
(for the uneven collectives: all_to_all, all_gather of lists), and readable text for the message.
Point-to-point calls send a header ahead of the data instead (:class:`Header`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

_TEXT = 240  # bytes of readable description kept per rank
_DIGEST = 16


class MismatchError(RuntimeError):
    """Ranks called one collective with arguments that do not fit together."""


class Signature:
    """What one rank passes to one collective, as the bytes exchanged with its peers."""

    def __init__(self, same: str, text: str | None = None, sends: Sequence[int] | None = None,
                 recvs: Sequence[int] | None = None, size: int = 1) -> None:
        pairs = torch.full((2, size), -1, dtype=torch.int64)
        if sends is not None:
            pairs[0] = torch.tensor(list(sends), dtype=torch.int64)
            pairs[1] = torch.tensor(list(recvs), dtype=torch.int64)
        self.buffer = torch.cat([
            pairs.view(-1).view(torch.uint8),
            torch.frombuffer(bytearray(hashlib.blake2b(same.encode(), digest_size=_DIGEST).digest()),
                             dtype=torch.uint8),
            _text(text or same),
        ])

    @staticmethod
    def verify(buffers: Sequence[torch.Tensor], group: str) -> None:
        """Raise :class:`MismatchError` unless the ranks' descriptions fit together."""
        size = len(buffers)
        pairs = [b[: 16 * size].view(torch.int64).view(2, size) for b in buffers]
        digests = [bytes(b[16 * size: 16 * size + _DIGEST].tolist()) for b in buffers]
        texts = [_read(b[16 * size + _DIGEST:]) for b in buffers]
        calls = "; ".join(f"rank {i}: {t}" for i, t in enumerate(texts))
        if len(set(digests)) > 1:
            raise MismatchError(f"occl: ranks of process group {group!r} called collectives that do not match "
                                f"(sizes, dtypes, operation or root differ): {calls}")
        for i in range(size):
            for j in range(size):
                sent, expected = int(pairs[i][0, j]), int(pairs[j][1, i])
                if sent >= 0 and expected >= 0 and sent != expected:
                    raise MismatchError(
                        f"occl: rank {i} sends {sent} bytes to rank {j}, which expects {expected} bytes from "
                        f"rank {i} (process group {group!r}): {calls}")


class Header:
    """What a send carries ahead of its data: byte count, digest of dtype and size, readable text."""

    LENGTH = 8 + _DIGEST + _TEXT

    def __init__(self, t: torch.Tensor) -> None:
        self.nbytes = t.numel() * t.element_size()
        same = f"{_dtype(t)}[{t.numel()}]"
        self.text = f"{same} ({self.nbytes} bytes)"
        self.buffer = torch.cat([
            torch.tensor([self.nbytes], dtype=torch.int64).view(torch.uint8),
            torch.frombuffer(bytearray(hashlib.blake2b(same.encode(), digest_size=_DIGEST).digest()),
                             dtype=torch.uint8),
            _text(self.text),
        ])

    @staticmethod
    def empty() -> torch.Tensor:
        return torch.zeros(Header.LENGTH, dtype=torch.uint8)

    def mismatch(self, received: torch.Tensor) -> tuple[int, str] | None:
        """``(bytes sent, their description)`` if ``received`` does not fit this receive, else None."""
        if bytes(received[:8 + _DIGEST].tolist()) == bytes(self.buffer[:8 + _DIGEST].tolist()):
            return None
        return int(received[:8].view(torch.int64)), _read(received[8 + _DIGEST:])


def describe(t: torch.Tensor) -> str:
    """``float32[2, 3]``: how a tensor appears in a mismatch message."""
    return f"{_dtype(t)}{list(t.shape)}"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _text(text: str) -> torch.Tensor:
    raw = text.encode()[:_TEXT].ljust(_TEXT, b"\0")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _read(raw: torch.Tensor) -> str:
    return bytes(raw.tolist()).rstrip(b"\0").decode(errors="replace")
