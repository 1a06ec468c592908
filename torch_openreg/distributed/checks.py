"""Every rank checks each collective against its peers before any data moves.

Gloo trusts its callers: ranks that pass different sizes to one collective get corrupted data,
or an ``EnforceNotMet`` thrown on gloo's own thread that aborts the process. So each collective
is described when it is launched (:class:`Signature`), and its kernel compares the descriptions of
all ranks before it issues the transfer. Every rank sees the same descriptions, so every rank makes
the same decision: all run the transfer, or all raise.

The descriptions travel on the transport's ``ctrl`` context in *windows* (:class:`Checker`): the
first kernel that needs an unchecked collective exchanges the descriptions of every collective its
rank has launched from there on (up to the window's size, which grows from :data:`WINDOW` while
windows fill up, the same way on every rank), and the collectives that every rank had launched are
settled at once. A loop of collectives pays one small exchange for many of them.
Point-to-point calls send a header ahead of their data instead (:class:`Header`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

import torch

WINDOW, MAX_WINDOW = 32, 512  # collectives one exchange settles at most: at first, and when windows keep filling
_TEXT = 240  # bytes of readable description, exchanged only to explain a mismatch
_DIGEST = 16
_WITHDRAWN = "(nothing: the call failed when it was launched)"


class MismatchError(RuntimeError):
    """Ranks called one collective with arguments that do not fit together."""


_RECORDS: dict[tuple[str, int], bytes] = {}  # (what must be equal, world size) -> record


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=_DIGEST).digest()


class Signature:
    """One rank's collective: a digest of what must be equal on every rank (operation, dtype, count,
    reduce operation, root), the bytes it sends to and expects from each peer (uneven collectives),
    and readable text for a mismatch message."""

    __slots__ = ("record", "text")

    def __init__(self, same: str, text: str | None = None, sends: Sequence[int] | None = None,
                 recvs: Sequence[int] | None = None, size: int = 1) -> None:
        if sends is None:  # the common case, and the same records over and over in a training loop
            key = (same, size)
            record = _RECORDS.get(key)
            if record is None:
                record = _digest(same) + struct.pack(f"<{2 * size}q", *[-1] * (2 * size))
                if len(_RECORDS) < 4096:
                    _RECORDS[key] = record
        else:
            record = _digest(same) + struct.pack(f"<{2 * size}q", *sends, *recvs)
        self.record = record
        self.text = text or same

    @staticmethod
    def withdrawn(size: int) -> Signature:
        """The place of a collective whose launch failed on this rank (its peers then fail clearly)."""
        return Signature("(withdrawn)", _WITHDRAWN, size=size)


def compare(records: Sequence[bytes], size: int) -> str | None:
    """Why the ranks' records of one collective do not fit together, or None."""
    if len({r[:_DIGEST] for r in records}) > 1:
        return "called collectives that do not match (sizes, dtypes, operation or root differ)"
    pairs = [struct.unpack(f"<{2 * size}q", r[_DIGEST:]) for r in records]
    for i in range(size):
        for j in range(size):
            sent, expected = pairs[i][j], pairs[j][size + i]
            if sent >= 0 and expected >= 0 and sent != expected:
                return f"disagree on sizes: rank {i} sends {sent} bytes to rank {j}, which expects {expected} bytes " \
                       f"from rank {i}"
    return None


# LITERALINCLUDE START: OCCL CHECKER
class Checker:
    """The collectives of one process group, numbered at launch and settled in windows.

    :meth:`add` runs at launch (under the group's launch lock), :meth:`verify` in kernels, which
    hold their turn (:meth:`.Transport.turn`): windows are exchanged in the same order on every
    rank, each starting at the first collective not yet settled.
    """

    def __init__(self, transport, group: str) -> None:
        self.transport, self.group, self.size = transport, group, transport.size
        self.record_size = _DIGEST + 16 * self.size
        self._launched: dict[int, Signature] = {}  # number -> signature, until settled
        self._settled: dict[int, str | None] = {}  # number -> mismatch message, until its kernel asks
        self._next = 0
        self.window = WINDOW  # collectives one exchange can settle (the same on every rank)
        self._no_counts = struct.pack(f"<{2 * self.size}q", *[-1] * (2 * self.size))

    def _same(self, records: list[bytes]) -> bool:
        """The common case, settled without unpacking: every rank's record is the same, with no byte counts."""
        first = records[0]
        return first.endswith(self._no_counts) and all(r == first for r in records)

    def add(self, signature: Signature) -> int:
        """Number the collective just launched (in program order, the same on every rank)."""
        number, self._next = self._next, self._next + 1
        self._launched[number] = signature
        return number

    def withdraw(self, number: int) -> None:
        """Collective ``number`` failed to launch here: its peers will find it missing and raise."""
        self._launched[number] = Signature.withdrawn(self.size)

    def verify(self, number: int) -> None:
        """Raise :class:`MismatchError` unless collective ``number`` fits its peers' calls."""
        while number not in self._settled:  # earlier numbers are settled already, but for withdrawn ones
            self._exchange(min(self._launched))
        problem = self._settled.pop(number)
        if problem is not None:
            raise MismatchError(problem)

    def _exchange(self, start: int) -> None:
        window, limit = [], self.window
        while start + len(window) in self._launched and len(window) < limit:
            window.append(self._launched[start + len(window)])
        mine = bytearray(8 + limit * self.record_size)
        struct.pack_into("<q", mine, 0, len(window))
        for i, signature in enumerate(window):
            mine[8 + i * self.record_size: 8 + (i + 1) * self.record_size] = signature.record
        theirs = self.transport.exchange(mine)
        counts = [struct.unpack_from("<q", b)[0] for b in theirs]
        settled = min(counts)  # launched on every rank
        # every rank sees the same counts, so every rank sizes its next window the same way: larger while
        # windows fill up (fewer exchanges when launches run ahead), smaller when they stay nearly empty
        if max(counts) >= limit:
            self.window = min(2 * limit, MAX_WINDOW)
        elif 4 * max(counts) <= limit:
            self.window = max(limit // 2, WINDOW)
        for i in range(settled):
            records = [b[8 + i * self.record_size: 8 + (i + 1) * self.record_size] for b in theirs]
            problem = None if self._same(records) else compare(records, self.size)
            if problem is not None:  # every rank sees it: every rank asks for the texts, in the same order
                texts = self.transport.exchange(window[i].text.encode()[:_TEXT].ljust(_TEXT, b"\0"))
                calls = "; ".join(f"rank {r}: {_read(t)}" for r, t in enumerate(texts))
                problem = f"occl: ranks of process group {self.group!r} {problem}: {calls}"
            if window[i].text != _WITHDRAWN:
                self._settled[start + i] = problem
            del self._launched[start + i]
# LITERALINCLUDE END: OCCL CHECKER


class Header:
    """What a send carries ahead of its data: byte count, digest of dtype and size, readable text."""

    LENGTH = 8 + _DIGEST + _TEXT

    def __init__(self, t: torch.Tensor) -> None:
        self.nbytes = t.numel() * t.element_size()
        same = f"{_dtype(t)}[{t.numel()}]"
        self.text = f"{same} ({self.nbytes} bytes)"
        raw = struct.pack("<q", self.nbytes) + _digest(same) + self.text.encode()[:_TEXT].ljust(_TEXT, b"\0")
        self.buffer = torch.frombuffer(bytearray(raw), dtype=torch.uint8)

    @staticmethod
    def empty() -> torch.Tensor:
        return torch.zeros(Header.LENGTH, dtype=torch.uint8)

    def mismatch(self, received: torch.Tensor) -> tuple[int, str] | None:
        """``(bytes sent, their description)`` if ``received`` does not fit this receive, else None."""
        raw = bytes(received.tolist())
        if raw[:8 + _DIGEST] == bytes(self.buffer[:8 + _DIGEST].tolist()):
            return None
        return struct.unpack_from("<q", raw)[0], _read(raw[8 + _DIGEST:])


def describe(t: torch.Tensor) -> str:
    """``float32[2, 3]``: how a tensor appears in a mismatch message."""
    return f"{_dtype(t)}{list(t.shape)}"


def _read(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode(errors="replace")


def _dtype(t: torch.Tensor) -> str:
    name = _DTYPES.get(t.dtype)
    if name is None:
        name = _DTYPES[t.dtype] = str(t.dtype).removeprefix("torch.")
    return name


_DTYPES: dict[torch.dtype, str] = {}
