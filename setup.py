"""Builds the C++ bridge torch_openreg._C against the installed torch (ninja)."""

from pathlib import Path

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

# LITERALINCLUDE START: BUILD EXTENSION
csrc = Path("torch_openreg/csrc")
setup(
    ext_modules=[
        CppExtension(
            "torch_openreg._C",
            sorted(str(p) for p in (*csrc.glob("*.cpp"), *csrc.glob("distributed/*.cpp"))),
            # Kineto's headers (the profiler bridge) are shipped in include/kineto of the wheel
            include_dirs=[str(Path(include_paths()[0]) / "kineto")],
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
# LITERALINCLUDE END: BUILD EXTENSION
