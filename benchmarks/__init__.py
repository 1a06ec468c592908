"""OpenReg benchmarks: ratios against CPU eager measured in the same run (never timed assertions)."""
