"""Time edge.QMatMul against MatMulNBits and float32 MatMul on SmolLM2-135M's matmul shapes.

Per (K, N) and M rows: edge.QMatMul with constant weights and with weights fed as graph inputs (what weight paging
needs), MatMulNBits (4-bit, block 32, uint8 zero points, constant, accuracy_level 4: its fastest CPU path) and a
float32 MatMul. 2 intra-op threads by default, inputs bound once through IOBinding; medians and fastest calls
of alternating bursts (the machine is shared), plus the sum over one SmolLM2-135M step.

    python benchmarks/kernels.py [--quick] [--threads 2[,1]] [--out benchmarks/results/kernels.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import edge.kernels as ek
from edge.kernels.graph import IR_VERSION, OPSET, qmatmul_model

SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]
ROWS = [1, 2, 4, 8, 16]
BITS, GROUP = 4, 32
THREADS = 2


def session(model_bytes: bytes, custom: bool) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    if custom:
        ek.register(so)
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def matmulnbits_model(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, k: int, n: int) -> bytes:
    """MatMulNBits with B (N, blocks, 16) low nibble first, scales (N*blocks,), packed uint8 zero points."""
    blocks = k // GROUP
    c = codes.reshape(n, blocks, GROUP // 2, 2).astype(np.uint8)
    b = (c[..., 0] | (c[..., 1] << 4)).astype(np.uint8)
    zp = np.zeros((n, (blocks + 1) // 2 * 2), dtype=np.uint8)
    zp[:, :blocks] = zeros
    zp_packed = (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scales.reshape(-1).astype(np.float32), "S"),
             numpy_helper.from_array(zp_packed.reshape(-1), "Z")]
    node = helper.make_node("MatMulNBits", ["X", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=n, bits=BITS,
                            block_size=GROUP, accuracy_level=4)
    return _model(node, inits, k, n, "com.microsoft")


def float_model(w: np.ndarray, k: int, n: int) -> bytes:
    node = helper.make_node("MatMul", ["X", "WT"], ["Y"])
    return _model(node, [numpy_helper.from_array(np.ascontiguousarray(w.T), "WT")], k, n, None)


def _model(node, inits, k: int, n: int, domain: str | None) -> bytes:
    graph = helper.make_graph([node], "bench", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])], inits)
    opsets = [helper.make_opsetid("", OPSET)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION).SerializeToString()


def bind(sess: ort.InferenceSession, x: np.ndarray, feeds: dict[str, np.ndarray]) -> tuple:
    """IOBinding with X and any weight inputs bound once (the OrtValues are kept alive with it)."""
    io = sess.io_binding()
    values = [ort.OrtValue.ortvalue_from_numpy(x)] + [ort.OrtValue.ortvalue_from_numpy(a) for a in feeds.values()]
    for name, value in zip(["X", *feeds], values):
        io.bind_ortvalue_input(name, value)
    io.bind_output("Y", "cpu")
    for _ in range(3):
        sess.run_with_iobinding(io)
    return sess, io, values


def time_interleaved(cases: dict[str, tuple], budget_s: float) -> dict[str, float]:
    """Median seconds per run of each case, measured in alternating bursts so that load from other processes
    (this machine is shared) falls on all cases alike. The order rotates every round and the first run of each
    burst is not counted, so no case is always the one running after another case flushed the caches."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    t0 = time.perf_counter()
    for sess, io, _values in cases.values():
        sess.run_with_iobinding(io)
    burst = 8 if time.perf_counter() - t0 < 1e-3 * len(cases) else 3
    deadline = time.perf_counter() + budget_s * len(cases)
    while min(len(t) for t in times.values()) < 20 or time.perf_counter() < deadline:
        for name in order:
            sess, io, _values = cases[name]
            sess.run_with_iobinding(io)  # warm-up, not counted
            for _ in range(burst - 1):
                t1 = time.perf_counter()
                sess.run_with_iobinding(io)
                times[name].append(time.perf_counter() - t1)
        order = order[1:] + order[:1]
        if min(len(t) for t in times.values()) >= 3000:
            break
    return {**{name: statistics.median(t) for name, t in times.items()},
            **{f"{name}_min": min(t) for name, t in times.items()}}


def bench_shape(k: int, n: int, budget_s: float, rng: np.random.Generator) -> list[dict]:
    w = rng.standard_normal((n, k)).astype(np.float32)
    codes, scales, zeros = ek.quantize(w, BITS, GROUP)
    packed = ek.pack(codes, scales, zeros, bits=BITS, group_size=GROUP)
    q_model, q_feeds = qmatmul_model(packed, ["M", k], weights_as_inputs=True)
    sessions = {"qmatmul": (session(qmatmul_model(packed, ["M", k])[0].SerializeToString(), True), {}),
                "qmatmul_inputs": (session(q_model.SerializeToString(), True), q_feeds),
                "qmatmul_int8": (session(qmatmul_model(packed, ["M", k], accuracy_level=4)[0].SerializeToString(),
                                         True), {}),
                "matmulnbits": (session(matmulnbits_model(codes, scales, zeros, k, n), False), {}),
                "matmul_f32": (session(float_model(w, k, n), False), {})}
    rows = []
    for m in ROWS:
        x = rng.standard_normal((m, k)).astype(np.float32)
        cases = {name: bind(sess, x, feeds) for name, (sess, feeds) in sessions.items()}
        rows.append({"K": k, "N": n, "M": m, **time_interleaved(cases, budget_s)})
    return rows


def table(rows: list[dict], load: str, stat: str = "") -> str:
    """The per-op table; stat "" for medians, "_min" for the fastest call (less disturbed by other processes)."""
    get = {r_id: {v: r[v + stat] for v in VARIANTS} for r_id, r in enumerate(rows)}
    one = {(r["K"], r["N"]): get[i]["qmatmul"] for i, r in enumerate(rows) if r["M"] == 1}
    one8 = {(r["K"], r["N"]): get[i]["qmatmul_int8"] for i, r in enumerate(rows) if r["M"] == 1}
    what = "Median" if not stat else "Fastest"
    lines = [
        f"## edge.QMatMul vs MatMulNBits vs float32 MatMul (CPU, {THREADS} thread{'s' if THREADS > 1 else ''}, "
        f"{what.lower()} per call)", "",
        f"onnxruntime {ort.__version__}, edge.QMatMul kernel: {ek.kernel_isa(BITS)}, {BITS}-bit, group {GROUP}, "
        f"uint8 zero points; MatMulNBits constant, accuracy_level 4. {what} time per call in microseconds "
        f"(variants timed in alternating bursts, warm caches). Load while measuring: {load}.",
        "QMatMul int8: accuracy_level 4 (int8 activations, like MatMulNBits' level 4).",
        "", "| K | N | M | QMatMul | QMatMul (W as inputs) | QMatMul int8 | MatMulNBits | f32 MatMul "
        "| QMatMul / MatMulNBits | QMatMul int8 / MatMulNBits | QMatMul M / M=1 | int8 M / M=1 | inputs / const |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        t = get[i]
        us = {key: t[key] * 1e6 for key in VARIANTS}
        lines.append(f"| {r['K']} | {r['N']} | {r['M']} | {us['qmatmul']:.1f} | {us['qmatmul_inputs']:.1f} | "
                     f"{us['qmatmul_int8']:.1f} | {us['matmulnbits']:.1f} | {us['matmul_f32']:.1f} | "
                     f"{t['qmatmul'] / t['matmulnbits']:.2f} | {t['qmatmul_int8'] / t['matmulnbits']:.2f} | "
                     f"{t['qmatmul'] / one[(r['K'], r['N'])]:.2f} | {t['qmatmul_int8'] / one8[(r['K'], r['N'])]:.2f} | "
                     f"{t['qmatmul_inputs'] / t['qmatmul']:.2f} |")
    return "\n".join(lines) + "\n" + model_table(rows, stat)


# SmolLM2-135M's matmuls per step, unfused: per layer q, o (576x576), k, v (576x192), gate, up (576x1536 as K x N),
# down (1536x576); 30 layers; plus the tied lm_head (576x49152).
MODEL_STEP = {(576, 576): 60, (576, 192): 60, (576, 1536): 60, (1536, 576): 30, (576, 49152): 1}
VARIANTS = ("qmatmul", "qmatmul_inputs", "qmatmul_int8", "matmulnbits", "matmul_f32")


def model_table(rows: list[dict], stat: str = "") -> str:
    """Sum of the per-op times over one SmolLM2-135M step: what the matmuls of an M-token step cost."""
    by_m: dict[int, dict[str, float]] = {}
    for r in rows:
        step = by_m.setdefault(r["M"], dict.fromkeys(VARIANTS, 0.0))
        for v in VARIANTS:
            step[v] += MODEL_STEP[(r["K"], r["N"])] * r[v + stat]
    lines = ["", "Matmuls of one SmolLM2-135M step (the times above summed over 30 layers and the lm_head), ms; "
             "in brackets the cost relative to the same variant's 1-token step.", "",
             "| M | QMatMul | QMatMul (W as inputs) | QMatMul int8 | MatMulNBits | f32 MatMul |",
             "|---|---|---|---|---|---|"]
    for m, step in sorted(by_m.items()):
        cells = [f"{step[v] * 1e3:.2f} ({step[v] / by_m[1][v]:.2f}x)" for v in VARIANTS]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def uptime_load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


def main() -> int:
    global THREADS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing budget per case")
    parser.add_argument("--threads", default="2", help="intra-op thread counts, comma-separated (default 2)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "kernels.md")
    args = parser.parse_args()
    if ek.library_path() is None:
        raise SystemExit("edge kernel library not built: run `python -m edge.kernels.build` first")
    sections = []
    for threads in [int(t) for t in args.threads.split(",")]:
        THREADS = threads
        rng = np.random.default_rng(0)
        load_before = uptime_load()
        rows = [r for k, n in SHAPES for r in bench_shape(k, n, 0.1 if args.quick else 0.4, rng)]
        load = f"before {load_before}, after {uptime_load()}"
        sections += [table(rows, load), table(rows, load, "_min")]
        print(sections[-2] + "\n" + sections[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text("\n".join(sections))
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
