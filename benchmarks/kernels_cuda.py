"""Time edge.QMatMul's CUDA kernel against MatMulNBits on the CUDA EP and dequantize-then-cuBLAS, SmolLM2 shapes.

Two levels, both on SmolLM2-135M's matmul shapes (4-bit, group 32, uint8 zero points) at M = 1, 2, 4, 8, 16:

* onnxruntime (what a session pays, launch and dispatch included): graphs of L parallel copies of one op on one X,
  each copy with its own weights (so large ones stream from memory, not L2); time per op = (t(L=17) - t(L=1)) / 16,
  medians of alternating runs through IOBinding with everything on the device. Variants: edge.QMatMul with constant
  weights and with weights as graph inputs; MatMulNBits with float32 and float16 activations; MatMul (cuBLAS) on
  float32 and float16 weights.
* kernel (GPU time alone): CUDA graphs of 17 calls, one per weight copy, timed with CUDA events: edge's kernel through
  its C entry point, and dequantize-then-matmul in torch (eager dequantization of the same packed codes, then
  cuBLAS); also cuBLAS on weights dequantized in advance, which bounds any dequantize-then-cuBLAS from below.

    python benchmarks/kernels_cuda.py [--quick] [--out benchmarks/results/kernels_cuda.md]

Needs onnxruntime-gpu, torch with CUDA and the CUDA build of the kernels (python kernels/build.py).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import edge.kernels as ek
from edge.kernels.graph import IR_VERSION, OPSET, qmatmul_node, qmatmul_tensors

SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]
ROWS = [1, 2, 4, 8, 16]
BITS, GROUP, COPIES = 4, 32, 9
ORT_VARIANTS = ("qmatmul", "qmatmul_inputs", "matmulnbits", "matmulnbits_f16", "matmul_f32", "matmul_f16")


def weight_copies(k: int, n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """COPIES distinct quantized weights (codes, scales, zeros) of shape (n, k)."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    codes, scales, zeros = ek.quantize(w, BITS, GROUP)
    return [(np.roll(codes, i, axis=1), scales * np.float32(1 + i / 64), np.roll(zeros, i, axis=1))
            for i in range(COPIES)]


def _matmulnbits(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, k: int, n: int, p: str,
                 f16: bool) -> tuple[list, list]:
    blocks = k // GROUP
    c = codes.reshape(n, blocks, GROUP // 2, 2)
    b = (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8)
    zp = np.zeros((n, (blocks + 1) // 2 * 2), dtype=np.uint8)
    zp[:, :blocks] = zeros
    z = (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8).reshape(-1)
    s = scales.reshape(-1).astype(np.float16 if f16 else np.float32)
    inits = [numpy_helper.from_array(b, f"{p}.B"), numpy_helper.from_array(s, f"{p}.S"),
             numpy_helper.from_array(z, f"{p}.Z")]
    node = helper.make_node("MatMulNBits", ["X", f"{p}.B", f"{p}.S", f"{p}.Z"], [f"Y{p}"], domain="com.microsoft",
                            K=k, N=n, bits=BITS, block_size=GROUP, accuracy_level=4)
    return [node], inits


def ort_model(variant: str, copies: list, k: int, n: int) -> tuple[bytes, dict[str, np.ndarray]]:
    """L = len(copies) parallel ops on X; returns the model and the weight feeds (weights-as-inputs variant)."""
    f16 = variant.endswith("f16")
    nodes, inits, inputs, feeds = [], [], [], {}
    for i, (codes, scales, zeros) in enumerate(copies):
        p = f"c{i}"
        if variant.startswith("qmatmul"):
            packed = ek.pack(codes, scales, zeros, bits=BITS, group_size=GROUP)
            node = qmatmul_node("X", f"Y{p}", packed, p)
            tensors = qmatmul_tensors(packed, p)
            if variant == "qmatmul_inputs":
                feeds.update(tensors)
                inputs += [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                           for name, a in tensors.items()]
            else:
                inits += [numpy_helper.from_array(a, name) for name, a in tensors.items()]
            nodes.append(node)
        elif variant.startswith("matmulnbits"):
            more_nodes, more_inits = _matmulnbits(codes, scales, zeros, k, n, p, f16)
            nodes += more_nodes
            inits += more_inits
        else:
            w = ek.dequantize(ek.pack(codes, scales, zeros, bits=BITS, group_size=GROUP), codes)
            wt = np.ascontiguousarray(w.T).astype(np.float16 if f16 else np.float32)
            inits.append(numpy_helper.from_array(wt, f"{p}.WT"))
            nodes.append(helper.make_node("MatMul", ["X", f"{p}.WT"], [f"Y{p}"]))
    dtype = TensorProto.FLOAT16 if f16 else TensorProto.FLOAT
    graph = helper.make_graph(nodes, "bench", [helper.make_tensor_value_info("X", dtype, ["M", k]), *inputs],
                              [helper.make_tensor_value_info(f"Yc{i}", dtype, ["M", n]) for i in range(len(copies))],
                              inits)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(ek.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION).SerializeToString(), feeds


def ort_session(model: bytes) -> ort.InferenceSession:
    so = ort.SessionOptions()
    ek.register(so, cuda=True)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # every node on the GPU, or an error
    return ort.InferenceSession(model, so, providers=["CUDAExecutionProvider"])


def bound(sess: ort.InferenceSession, x: np.ndarray, feeds: dict[str, np.ndarray], n: int) -> tuple:
    """IOBinding with X, weight feeds and every output on the device, bound once (values kept alive with it)."""
    io = sess.io_binding()
    values = {"X": ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)}
    values.update({name: ort.OrtValue.ortvalue_from_numpy(a, "cuda", 0) for name, a in feeds.items()})
    for name, value in values.items():
        io.bind_ortvalue_input(name, value)
    for out in sess.get_outputs():
        y = ort.OrtValue.ortvalue_from_shape_and_type([len(x), n], x.dtype, "cuda", 0)
        values[out.name] = y
        io.bind_ortvalue_output(out.name, y)
    for _ in range(5):
        sess.run_with_iobinding(io)
    return sess, io, values


def time_runs(cases: dict[str, tuple], runs: int) -> dict[str, float]:
    """Median seconds per run of each case, in alternating bursts of 10."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    while min(len(t) for t in times.values()) < runs:
        for name, (sess, io, _values) in cases.items():
            for _ in range(10):
                t0 = time.perf_counter()
                sess.run_with_iobinding(io)
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_ort(k: int, n: int, copies: list, rng: np.random.Generator, runs: int) -> list[dict]:
    sessions = {}
    for variant in ORT_VARIANTS:
        for count in (1, COPIES):
            model, feeds = ort_model(variant, copies[:count], k, n)
            sessions[(variant, count)] = (ort_session(model), feeds)
    rows = []
    for m in ROWS:
        x32 = rng.standard_normal((m, k)).astype(np.float32)
        cases = {key: bound(sess, x32.astype(np.float16) if key[0].endswith("f16") else x32, feeds, n)
                 for key, (sess, feeds) in sessions.items()}
        t = time_runs(cases, runs)
        row = {"K": k, "N": n, "M": m}
        for variant in ORT_VARIANTS:
            row[variant] = (t[(variant, COPIES)] - t[(variant, 1)]) / (COPIES - 1)
            row[variant + "_call"] = t[(variant, 1)]
        rows.append(row)
    return rows


class KernelBench:
    """GPU-only timing through torch: edge's C entry point and torch's dequantize-then-matmul, in CUDA graphs."""

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self.torch, self.device = torch, device
        if device != "cuda":
            return
        lib = ctypes.CDLL(str(ek.library_path(cuda=True)))
        self.fn = lib.edge_qmatmul_cuda
        self.fn.restype = ctypes.c_char_p
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self.fn.argtypes = [p, i64, i64, i64, ctypes.c_int, i64, p, p, p, p, p, p, p, p, i64, p, p]

    def _packed(self, copies: list) -> list[dict]:
        t = self.torch
        out = []
        for codes, scales, zeros in copies:
            packed = ek.pack(codes, scales, zeros, bits=BITS, group_size=GROUP)
            arrays = dict(zip(("codes", "scales", "zeros"), packed.inputs()[:3]))
            out.append({name: t.from_numpy(np.ascontiguousarray(a)).to(self.device) for name, a in arrays.items()})
        return out

    def _dequantize(self, w: dict, k: int, n: int):
        """W (n, k) float32 from the packed tile layout, in eager torch ops."""
        t = self.torch
        tiles = (n + 7) // 8
        words = w["codes"].view(t.int32).view(tiles, -1, 8)  # (tiles, units, column)
        shifts = t.arange(0, 32, 4, device=self.device, dtype=t.int32)
        q = (words.unsqueeze(-1) >> shifts) & 15  # (tiles, units, column, k in unit)
        q = q.permute(0, 2, 1, 3).reshape(tiles * 8, -1).float()  # (n_pad, kp)
        groups = q.shape[1] // GROUP
        s = w["scales"].view(tiles, groups, 8).permute(0, 2, 1).reshape(tiles * 8, groups, 1)
        z = w["zeros"].view(tiles, groups, 8).permute(0, 2, 1).reshape(tiles * 8, groups, 1).float()
        return ((q.view(tiles * 8, groups, GROUP) - z) * s).view(tiles * 8, -1)[:n, :k]

    def _time_graph(self, body, reps: int = 7) -> float:
        t = self.torch
        body()
        t.cuda.synchronize()
        graph = t.cuda.CUDAGraph()
        with t.cuda.graph(graph):
            body()
        graph.replay()
        t.cuda.synchronize()
        samples = []
        for _ in range(reps):
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(samples)

    def run(self, k: int, n: int, copies: list, rng: np.random.Generator) -> list[dict]:
        t = self.torch
        packed = self._packed(copies)
        dense = [self._dequantize(w, k, n).contiguous() for w in packed]
        rows = []
        for m in ROWS:
            x = t.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda()
            y = t.empty((m, n), device="cuda")

            def edge_calls() -> None:
                stream = t.cuda.current_stream().cuda_stream
                for w in packed:
                    err = self.fn(x.data_ptr(), m, k, n, BITS, GROUP, w["codes"].data_ptr(), w["scales"].data_ptr(),
                                  w["zeros"].data_ptr(), None, None, None, None, None, 0, y.data_ptr(), stream)
                    if err:
                        raise RuntimeError(err.decode())

            def dequant_matmul() -> None:
                for w in packed:
                    t.matmul(x, self._dequantize(w, k, n).T, out=y)

            def cublas_only() -> None:
                for w in dense:
                    t.matmul(x, w.T, out=y)

            edge_calls()
            ref = x.double() @ dense[-1].double().T
            err = ((y.double() - ref).norm() / ref.norm()).item()
            assert err < 1e-5, f"edge kernel off by {err:.3g} (K={k}, N={n}, M={m})"
            rows.append({"K": k, "N": n, "M": m, "kernel": self._time_graph(edge_calls) / COPIES,
                         "dequant_cublas": self._time_graph(dequant_matmul) / COPIES,
                         "cublas_dense": self._time_graph(cublas_only) / COPIES})
        return rows


def ort_table(rows: list[dict]) -> str:
    one = {(r["K"], r["N"]): r["qmatmul"] for r in rows if r["M"] == 1}
    lines = ["## onnxruntime, CUDA EP: time per op (microseconds)", "",
             f"onnxruntime {ort.__version__}; per op = (t(L={COPIES}) - t(L=1)) / {COPIES - 1} over graphs of L "
             "parallel ops with distinct weights; 'call' = a whole run of the 1-op graph (dispatch included).", "",
             "| K | N | M | QMatMul | QMatMul (W as inputs) | MatMulNBits f32 | MatMulNBits f16 | MatMul f32 | "
             "MatMul f16 | QMatMul / MatMulNBits f32 | QMatMul M / M=1 | QMatMul call | MatMulNBits call |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        us = {v: r[v] * 1e6 for v in ORT_VARIANTS}
        lines.append(f"| {r['K']} | {r['N']} | {r['M']} | " + " | ".join(f"{us[v]:.1f}" for v in ORT_VARIANTS) +
                     f" | {r['qmatmul'] / r['matmulnbits']:.2f} | {r['qmatmul'] / one[(r['K'], r['N'])]:.2f} | "
                     f"{r['qmatmul_call'] * 1e6:.1f} | {r['matmulnbits_call'] * 1e6:.1f} |")
    return "\n".join(lines) + "\n"


def kernel_table(rows: list[dict]) -> str:
    one = {(r["K"], r["N"]): r["kernel"] for r in rows if r["M"] == 1}
    lines = ["## GPU time per call (microseconds, CUDA graphs, CUDA events)", "",
             "| K | N | M | edge kernel | dequantize + cuBLAS (torch) | cuBLAS on dense W | edge / dequant+cuBLAS | "
             "edge / dense cuBLAS | edge M / M=1 | weight GB/s (edge) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gbs = r["K"] * r["N"] * (BITS / 8 + 5 / GROUP) / r["kernel"] / 1e9  # codes + float scale + uint8 zero
        lines.append(f"| {r['K']} | {r['N']} | {r['M']} | {r['kernel'] * 1e6:.2f} | {r['dequant_cublas'] * 1e6:.2f} | "
                     f"{r['cublas_dense'] * 1e6:.2f} | {r['kernel'] / r['dequant_cublas']:.2f} | "
                     f"{r['kernel'] / r['cublas_dense']:.2f} | {r['kernel'] / one[(r['K'], r['N'])]:.2f} | {gbs:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed runs")
    parser.add_argument("--no-ort", action="store_true", help="kernel level only (no onnxruntime-gpu needed)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "kernels_cuda.md")
    args = parser.parse_args()
    import torch

    device = torch.cuda.get_device_name()
    rng = np.random.default_rng(0)
    kernel_rows, ort_rows = [], []
    bench = KernelBench()
    for k, n in SHAPES:
        copies = weight_copies(k, n, rng)
        kernel_rows += bench.run(k, n, copies, rng)
        print(kernel_table(kernel_rows[-len(ROWS):]), flush=True)
        if not args.no_ort:
            ort_rows += bench_ort(k, n, copies, rng, 100 if args.quick else 400)
            print(ort_table(ort_rows[-len(ROWS):]), flush=True)
    text = f"# edge.QMatMul on {device}\n\n{kernel_table(kernel_rows)}\n" + (ort_table(ort_rows) if ort_rows else "")
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
