"""Build hook for edge's custom-op libraries; all project metadata lives in pyproject.toml.

The build_ext step compiles kernels/ (see kernels/build.py) into edge/kernels/ of the wheel, or into kernels/ itself for
an editable install. It never fails the install: without g++ (or nvcc) it prints what to install and edge runs on
stock onnxruntime ops.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


def _kernels_build():
    """kernels/build.py loaded by path: the edge package is not importable while it is being built."""
    spec = importlib.util.spec_from_file_location("_edge_kernels_build", ROOT / "kernels" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildKernels(build_ext):
    """Compile the custom-op shared libraries with the system toolchain (not a Python extension module)."""

    def _out_dir(self) -> Path:
        if self.inplace or getattr(self, "editable_mode", False):
            return ROOT / "kernels"
        return Path(self.build_lib) / "edge" / "kernels"

    def run(self) -> None:
        build = _kernels_build()
        for note in build.build_all(self._out_dir(), log=lambda line: self.announce(line, level=2)):
            print(note, file=sys.stderr)

    def get_outputs(self) -> list[str]:
        build = _kernels_build()
        out = self._out_dir()
        return [str(out / name) for name in (build.CPU_LIBRARY, build.CUDA_LIBRARY) if (out / name).is_file()]


class BinaryDistribution(Distribution):
    """The wheel carries a compiled library, so it is platform-specific and build_ext must run."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_ext": BuildKernels}, distclass=BinaryDistribution)
