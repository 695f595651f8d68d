"""edge.kernels.library: finding and registering the built library, the ABI self-check, the missing-library error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

import edge.kernels as ek
from edge.errors import EdgeError
from kernels_util import ensure_library

_REGISTER_SCRIPT = """
import onnxruntime as ort
import edge.kernels as ek
so = ort.SessionOptions()
try:
    ek.register(so)
except ek.KernelLibraryError as exc:
    print("KernelLibraryError:", exc)
else:
    print("registered")
"""


def _register_in_subprocess(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    """Run registration in a child process, so a corrupted ABI slot that crashes cannot take pytest down."""
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", _REGISTER_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)


def test_library_path_points_at_built_library() -> None:
    ensure_library()
    path = ek.library_path()
    assert path is not None and path.is_file() and path.name == "libedge_kernels.so"
    # Without a CUDA build, asking for CUDA falls back to the CPU library (a model must load anywhere).
    assert ek.library_path(cuda=True) is not None


def test_kernel_isa_reports_a_known_path() -> None:
    ensure_library()
    assert ek.kernel_isa(4) in {"avx512vnni", "avx512", "avxvnni", "avx2", "portable"}
    # int8 activations get an integer kernel on any x86-64 CPU with AVX2
    assert ek.kernel_isa(4, accuracy_level=4) in {"avx512vnni", "avxvnni", "avx2-int8", "portable"}
    assert ek.kernel_isa(3) in {"avx512", "avx2", "portable"}  # no integer kernel for 3-bit


def test_register_adds_the_edge_domain() -> None:
    ensure_library()
    so = ort.SessionOptions()
    assert ek.register(so) == ek.library_path()


def test_missing_library_gives_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGE_KERNELS_LIBRARY", str(tmp_path / "absent.so"))
    assert ek.library_path() is None
    with pytest.raises(EdgeError, match=r"apt-get install g\+\+.*pip install -e"):
        ek.register(ort.SessionOptions())


def test_foreign_library_gives_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bogus = tmp_path / "libbogus.so"
    bogus.write_bytes(b"not an ELF file")
    monkeypatch.setenv("EDGE_KERNELS_LIBRARY", str(bogus))
    with pytest.raises(ek.KernelLibraryError, match="could not register"):
        ek.register(ort.SessionOptions())


def test_registration_succeeds_in_clean_process() -> None:
    ensure_library()
    proc = _register_in_subprocess({})
    assert proc.stdout.strip() == "registered", proc.stderr


@pytest.mark.parametrize("slot, entry", [(1, "GetErrorCode"), (60, "GetTensorElementType"), (62, "GetDimensions"),
                                         (64, "GetTensorShapeElementCount")])
def test_self_check_catches_a_wrong_slot(slot: int, entry: str) -> None:
    """EDGE_KERNELS_DEBUG_CORRUPT_SLOT binds one OrtApi entry to its neighbour; registration must refuse."""
    ensure_library()
    proc = _register_in_subprocess({"EDGE_KERNELS_DEBUG_CORRUPT_SLOT": str(slot)})
    assert proc.returncode == 0, f"child crashed: {proc.stderr[-2000:]}"
    out = proc.stdout
    assert out.startswith("KernelLibraryError:"), out + proc.stderr
    assert "ABI self-check failed" in out and entry in out


_SHAPE_ENTRY_SCRIPT = """
import ctypes, numpy as np
import edge.kernels as ek
from kernels_util import QMatMulRunner, make_weight
packed, _ = make_weight(np.random.default_rng(0), 16, 64, 4, 32)
before = ctypes.CDLL(str(ek.library_path())).EdgeShapeEntry()
y = QMatMulRunner(packed)(np.ones((3, 64), np.float32))
print(before, ctypes.CDLL(str(ek.library_path())).EdgeShapeEntry(), y.shape)
"""


def test_shapes_are_read_through_api_24_where_the_runtime_has_it() -> None:
    """onnxruntime 1.24 and later read an input's shape with one call (GetTensorElementTypeAndShapeDataReference,
    slot 414) once it agreed with the version-1 entries on the first tensor; the op's output shape shows the
    shapes it read were right. In a fresh process: the choice is made once per process."""
    ensure_library()
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _SHAPE_ENTRY_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version = tuple(int(p) for p in ort.__version__.split(".")[:2])
    assert proc.stdout.split() == ["0", "1" if version >= (1, 24) else "-1", "(3,", "16)"], proc.stdout


def test_the_default_model_falls_back_to_stock_ops_without_a_usable_library(monkeypatch, tmp_path) -> None:
    """edge-run with no model must work on an install whose compiler was missing or whose library does not match
    the installed onnxruntime: the default is then the stock-op int4 package."""
    from edge.default_model import default_quant

    ensure_library()
    assert default_quant() == "int4-edge" and default_quant("cuda") == "int4-edge"
    monkeypatch.setenv("EDGE_KERNELS_LIBRARY", str(tmp_path / "absent.so"))
    assert default_quant() == "int4"
    bogus = tmp_path / "libbogus.so"
    bogus.write_bytes(b"not an ELF file")
    monkeypatch.setenv("EDGE_KERNELS_LIBRARY", str(bogus))
    assert default_quant() == "int4"


_HUGE_PAGES_SCRIPT = """
import gc, json, sys
from pathlib import Path
import numpy as np
import onnx
import onnxruntime as ort
sys.path.insert(0, "tests")
import edge.kernels as ek
from edge.kernels.graph import qmatmul_model
from edge.kernels.library import huge_copy_stats
from kernels_util import ensure_library, make_weight
ensure_library()
rng = np.random.default_rng(3)
packed, _ = make_weight(rng, 256, 512, 4, 32, zeros="mins16")  # 64 KB of codes: copied; the statistics are not
model, _ = qmatmul_model(packed, ["M", 512])
inline_bytes = model.SerializeToString()  # before save_model moves the tensors out
path = Path(sys.argv[1]) / "m.onnx"  # external data, memory-mapped by onnxruntime, as in a package
onnx.save_model(model, path, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
def session(source):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    ek.register(so)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
x = rng.standard_normal((3, 512)).astype(np.float32)
before = huge_copy_stats()
a = session(str(path))
one = huge_copy_stats()
b = session(str(path))
two = huge_copy_stats()
ya, yb = a.run(None, {"X": x})[0], b.run(None, {"X": x})[0]
inline = session(inline_bytes)  # weights in onnxruntime's heap: left where they are
three = huge_copy_stats()
yi = inline.run(None, {"X": x})[0]
del a, b, inline
gc.collect()
print(json.dumps({"before": before, "one": one, "two": two, "three": three, "after": huge_copy_stats(),
                  "y": ya.tolist(), "same": bool(np.array_equal(ya, yb) and np.array_equal(ya, yi))}))
"""


def _huge_pages_run(folder: Path, env_extra: dict[str, str]) -> dict:
    folder.mkdir()
    run = subprocess.run([sys.executable, "-c", _HUGE_PAGES_SCRIPT, str(folder)], env={**os.environ, **env_extra},
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="2 MB weight pages are a Linux feature")
def test_constant_weights_are_read_from_shared_copies_in_huge_pages(tmp_path: Path) -> None:
    """A constant large enough is copied once per process, shared by a second session over the same bytes, freed
    with the last; the outputs are bitwise those read from onnxruntime's own buffer (EDGE_HUGE_PAGES=0)."""
    ensure_library()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("transparent huge pages are off on this machine")
    on = _huge_pages_run(tmp_path / "on", {})
    assert on["before"]["copies"] == 0 and on["after"] == on["before"]
    assert on["one"]["copies"] == 1 and on["one"]["bytes"] == 256 * 512 // 2 and on["one"]["blocks"] == 1
    assert on["two"]["copies"] == 1 and on["two"]["references"] == 2  # the second session shares the copy
    assert on["three"] == on["two"]  # inline weights are not copied
    off = _huge_pages_run(tmp_path / "off", {"EDGE_HUGE_PAGES": "0"})
    assert off["one"]["copies"] == 0 and off["two"]["copies"] == 0
    assert on["same"] and off["same"] and on["y"] == off["y"]
