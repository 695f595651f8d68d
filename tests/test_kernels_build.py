"""edge.kernels.build: the library compiles into a chosen folder, and a missing compiler never breaks the install."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge.kernels import build


@pytest.mark.skipif(build.find_compiler() is None, reason="no C++ compiler here")
def test_build_cpu_into_folder(tmp_path: Path) -> None:
    lines: list[str] = []
    lib = build.build_cpu(tmp_path, log=lines.append)
    assert lib == tmp_path / build.CPU_LIBRARY and lib.stat().st_size > 10_000
    assert not list(tmp_path.glob("*.tmp"))
    # Only the ISA translation units get ISA flags: the portable code must run on any x86-64.
    assert all("-mavx2" not in line for line in lines if "qmatmul_portable.cc" in line or "register.cc" in line)
    assert any("-mavx2" in line for line in lines if "qmatmul_avx2.cc" in line)
    assert b"RegisterCustomOps" in lib.read_bytes()


def test_missing_compiler_is_a_note_not_a_failure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(build, "find_compiler", lambda: None)
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    notes = build.build_all(tmp_path, log=lambda _l: None)
    assert any("stock-op fallback" in n and "g++" in n for n in notes)
    assert any("nvcc not found" in n for n in notes)
    assert not list(tmp_path.iterdir())


def test_compiler_failure_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(build, "find_compiler", lambda: shutil.which("false"))
    with pytest.raises(build.BuildError, match="command failed"):
        build.build_cpu(tmp_path, log=lambda _l: None)


@pytest.mark.skipif(build.find_nvcc() is None or build.find_compiler() is None, reason="nvcc not installed")
def test_build_cuda_compiles(tmp_path: Path) -> None:
    """CI has nvcc: the CUDA library (CPU + CUDA registrations) must at least compile and link (one SM version here,
    to keep the test fast; the install builds all of CUDA_ARCHS)."""
    lib = build.build_cuda(tmp_path, log=lambda _l: None, archs=["75"])
    data = lib.read_bytes()
    assert b"RegisterCustomOps" in data and b"CUDAExecutionProvider" in data


@pytest.mark.skipif(not (build.HERE / build.CUDA_LIBRARY).is_file(), reason="CUDA library not built")
def test_cuda_library_still_runs_the_op_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA build also registers the CPU op, so a model using edge.QMatMul loads on a machine without a GPU."""
    import ctypes

    try:
        ctypes.CDLL("libcudart.so.13")
    except OSError:
        pytest.skip("libcudart.so.13 not loadable here")
    import numpy as np

    from kernels_util import QMatMulRunner, assert_close_to_reference, make_weight

    monkeypatch.setenv("EDGE_KERNELS_LIBRARY", str(build.HERE / build.CUDA_LIBRARY))
    rng = np.random.default_rng(0)
    packed, w = make_weight(rng, 24, 64, 4, 32)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    assert_close_to_reference(QMatMulRunner(packed)(x), x, w, None)
