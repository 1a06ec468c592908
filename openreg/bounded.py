"""Bounded caches that forget everything when full.

The runtime and its PyTorch client memoize what is dear to work out again (a buffer's pages, an
operator call's route, plan, output metadata or cost) in plain dicts, read on every call. A cache of
that kind needs a bound (a program can make endless distinct calls) but no eviction policy: once full
it is emptied and refills with what the program uses now, which costs one recomputation per entry.
Hits stay plain dict look-ups; only a miss goes through here. Every key holds all the result depends
on, global state included (the default dtype, deterministic mode): entries are never invalidated.
"""

from __future__ import annotations

from typing import Any, TypeVar

V = TypeVar("V")


# LITERALINCLUDE START: BOUNDED
def put(cache: dict, key: Any, value: V, size: int) -> V:
    """``cache[key] = value``, the cache emptied first if it holds ``size`` entries; returns ``value``."""
    if len(cache) >= size:
        cache.clear()
    cache[key] = value
    return value


class SharedBound:
    """One bound for several dicts (a cache split by its first key, as the fallback's plans are by operator):
    after ``size`` puts into them together, all of them are emptied."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.count = 0
        self.caches: list[dict] = []

    def new(self) -> dict:
        """A dict under this bound."""
        cache: dict = {}
        self.caches.append(cache)
        return cache

    def put(self, cache: dict, key: Any, value: V) -> V:
        """``cache[key] = value``; every dict under the bound emptied first once ``size`` puts were made."""
        if self.count >= self.size:
            for member in self.caches:
                member.clear()
            self.count = 0
        cache[key] = value
        self.count += 1
        return value
# LITERALINCLUDE END: BOUNDED
