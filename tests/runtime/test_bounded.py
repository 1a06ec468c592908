"""openreg/bounded.py: the caches that forget everything when full."""

from __future__ import annotations

from openreg import bounded


def test_put_empties_a_full_cache_first():
    cache: dict = {}
    for i in range(3):
        assert bounded.put(cache, i, str(i), 3) == str(i)
    assert cache == {0: "0", 1: "1", 2: "2"}
    bounded.put(cache, 3, "3", 3)  # full: emptied, then the new entry
    assert cache == {3: "3"}


def test_put_of_a_key_already_there_still_counts_the_cache_as_full():
    cache = {0: "a", 1: "b"}
    bounded.put(cache, 0, "c", 2)  # the bound is on the size before the put, as the hand-written caches had it
    assert cache == {0: "c"}


def test_a_shared_bound_empties_every_cache_under_it():
    bound = bounded.SharedBound(3)
    a, b = bound.new(), bound.new()
    bound.put(a, "x", 1)
    bound.put(b, "y", 2)
    bound.put(a, "x", 3)  # puts count, not keys
    assert a == {"x": 3} and b == {"y": 2}
    bound.put(b, "z", 4)
    assert a == {} and b == {"z": 4}
    assert bound.count == 1
