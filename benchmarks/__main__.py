"""``python -m benchmarks``: the whole suite (see benchmarks/suite.py)."""

from .suite import main

main()
