"""Shared helpers for the edge.kernels tests: the built library, sessions for one-node QMatMul models, poisoned runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import edge.kernels as ek
from edge.kernels.build import build_cpu
from edge.kernels.graph import qmatmul_model
from edge.kernels.library import CUDA_LIBRARY


def ensure_library() -> None:
    """Build the CPU library in place when the install step did not (e.g. a fresh checkout)."""
    if ek.library_path() is None:
        build_cpu(log=lambda _line: None)


def make_weight(rng: np.random.Generator, n: int, k: int, bits: int, group: int, zeros: str = "uint8",
                outliers: int = 0) -> tuple[ek.PackedWeight, np.ndarray]:
    """Random codes/scales/zeros (and outliers) packed; returns the packed weight and its float64 W.

    zeros: "uint8", "float32" or "none" zero points with float32 scales; "scales16": float16 scales, uint8 zeros;
    "mins32" / "mins16": W = code * scale + min with float32 / float16 scales and mins; "two-level": SpQR's
    second level for scales and float zero points (stat rows of 16 columns); "two-level-scales": for scales, with
    uint8 zero points."""
    groups = -(-k // group)
    codes = rng.integers(0, 1 << bits, size=(n, k)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, size=(n, groups)).astype(np.float32)
    z = mins = None
    if zeros in ("scales16", "mins16"):
        scales = scales.astype(np.float16)
    if zeros.startswith("mins"):
        mins = rng.uniform(-0.8, 0.0, size=(n, groups)).astype(np.float16 if zeros == "mins16" else np.float32)
    if zeros in ("uint8", "scales16", "two-level-scales"):
        z = rng.integers(0, 1 << bits, size=(n, groups)).astype(np.uint8)
    elif zeros == "float32":
        z = rng.uniform(0, (1 << bits) - 1, size=(n, groups)).astype(np.float32)
    o = None
    if outliers:
        o = ek.make_outliers(n, k, rng.integers(0, n, outliers), rng.integers(0, k, outliers),
                             rng.standard_normal(outliers).astype(np.float16))
    if zeros.startswith("two-level"):
        packed = ek.pack_two_level(codes, two_level(rng, n, groups, zeros == "two-level", bits), z, bits=bits,
                                   group_size=group, outliers=o)
    else:
        packed = ek.pack(codes, scales, z, bits=bits, group_size=group, outliers=o, mins=mins)
    return packed, ek.dequantize(packed, codes)


def two_level(rng: np.random.Generator, n: int, groups: int, with_zeros: bool, bits: int) -> ek.TwoLevel:
    """Random SpQR second-level statistics: 8-bit codes, float16 (base, step) per 16 columns and group."""
    r = -(-n // 16)
    scale_stats = np.stack([rng.uniform(0.01, 0.05, (r, groups)), rng.uniform(1e-4, 3e-4, (r, groups))], -1)
    zero_stats = np.stack([rng.uniform(0, 2, (r, groups)), rng.uniform(0.001, (2 ** bits - 3) / 255, (r, groups))], -1)
    return ek.TwoLevel(scale_codes=rng.integers(0, 256, (n, groups)).astype(np.uint8),
                       scale_stats=scale_stats.astype(np.float16), rows=np.arange(n) // 16,
                       zero_codes=rng.integers(0, 256, (n, groups)).astype(np.uint8) if with_zeros else None,
                       zero_stats=zero_stats.astype(np.float16) if with_zeros else None)


# EDGE_TEST_DEVICE=cuda: QMatMulRunner defaults to the CUDA EP (test_kernels.py re-runs itself so on a GPU).
DEVICE = os.environ.get("EDGE_TEST_DEVICE", "cpu")


def cuda_available() -> bool:
    """onnxruntime-gpu with a usable GPU and the CUDA build of the kernels (tests/test_kernels_cuda.py needs all)."""
    path = ek.library_path(cuda=True)
    return "CUDAExecutionProvider" in ort.get_available_providers() and path is not None and path.name == CUDA_LIBRARY


class QMatMulRunner:
    """One session of a one-node QMatMul model, run through IOBinding with an output pre-filled with NaN.

    cuda=True (default: EDGE_TEST_DEVICE=cuda) places the node on the CUDAExecutionProvider, refusing a silent CPU
    fallback, with the inputs, weights and the poisoned output in device memory.
    """

    def __init__(self, packed: ek.PackedWeight, bias: np.ndarray | None = None, weights_as_inputs: bool = False,
                 rank3: bool = False, threads: int = 2, accuracy_level: int = 0, cuda: bool | None = None,
                 float16: bool = False, gated: int = 0):
        ensure_library()
        cuda = DEVICE == "cuda" if cuda is None else cuda
        x_shape = [1, "M", packed.k] if rank3 else ["M", packed.k]
        model, self.feeds = qmatmul_model(packed, x_shape, bias, weights_as_inputs, accuracy_level, float16, gated)
        self.dtype = np.float16 if float16 else np.float32
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        ek.register(so, cuda=cuda)
        providers = ["CPUExecutionProvider"]
        if cuda:
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            providers = ["CUDAExecutionProvider"]
        self.device = ("cuda", 0) if cuda else ("cpu", 0)
        self.sess = ort.InferenceSession(model.SerializeToString(), so, providers=providers)
        self.n = packed.n // 2 if gated else packed.n
        self.weights = {name: ort.OrtValue.ortvalue_from_numpy(a, *self.device) for name, a in self.feeds.items()}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        io = self.sess.io_binding()
        x = np.ascontiguousarray(x, dtype=self.dtype)
        io.bind_ortvalue_input("X", ort.OrtValue.ortvalue_from_numpy(x, *self.device))
        for name, value in self.weights.items():
            io.bind_ortvalue_input(name, value)
        out = np.full((*x.shape[:-1], self.n), np.nan, dtype=self.dtype)
        y = ort.OrtValue.ortvalue_from_numpy(out, *self.device)  # on the CPU: wraps `out` without a copy
        io.bind_ortvalue_output("Y", y)
        self.sess.run_with_iobinding(io)
        if self.device[0] == "cuda":
            return y.numpy()
        assert out.size == 0 or y.data_ptr() == out.ctypes.data, "onnxruntime did not write into the bound output"
        return out


def assert_close_to_reference(y: np.ndarray, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None,
                              rtol: float = 1e-5) -> None:
    """Each element within rtol of the float64 result, relative to its magnitude bound sum_k |x_k w_k| (+|bias|)."""
    ref = ek.reference(x, w, bias)
    bound = np.abs(x.astype(np.float64)) @ np.abs(w).T + (0 if bias is None else np.abs(bias))
    assert np.isfinite(y).all(), "output left unwritten (NaN poison survived)"
    err = np.abs(y - ref) / np.maximum(bound, 1e-30)
    assert err.max() < rtol, f"max relative error {err.max():.3g}"


def run_test_file(path: str, **env: str) -> None:
    """Run a test file again in a fresh process with `env` set: the kernel choice (EDGE_KERNELS_ISA) and the device
    (EDGE_TEST_DEVICE) are made once per process."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path]
    run = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True,
                         cwd=Path(path).resolve().parent.parent)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def export_and_decode(folder, imported, ids: list[int], **options) -> tuple[onnx.GraphProto, np.ndarray]:
    """An int4 --kernels edge export of `imported` (options: export_model's) and the logits of a 12-token prompt
    (every row) and then of one step per remaining id, decoded on DEVICE: what the fusion passes must not change."""
    from edge.export.pipeline import export_model
    from edge.model import Decoder
    from edge.package import load_package

    package = load_package(export_model("tiny", folder, quant="int4", model=imported, kernels="edge", head="rtn",
                                        **options))
    graph = onnx.load(str(package.graph_path), load_external_data=False).graph
    decoder = Decoder(package, context_length=32, threads=1, device=DEVICE)
    steps = [decoder.step(ids[:12], logits_rows=list(range(12))).copy()]
    steps += [decoder.step([t]).copy() for t in ids[12:]]
    return graph, np.concatenate(steps)


def device_session(graph: onnx.GraphProto) -> ort.InferenceSession:
    """A session of a graph of edge's ops on DEVICE (2 threads; on CUDA no silent fallback to the CPU)."""
    from edge.kernels.graph import IR_VERSION, OPSET
    from edge.kernels.library import DOMAIN

    model = onnx.helper.make_model(graph, ir_version=IR_VERSION, opset_imports=[
        onnx.helper.make_opsetid("", OPSET), onnx.helper.make_opsetid(DOMAIN, 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    cuda = DEVICE == "cuda"
    ek.register(so, cuda=cuda)
    if cuda:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CUDAExecutionProvider" if cuda else "CPUExecutionProvider"])
