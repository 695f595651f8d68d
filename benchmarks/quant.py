"""Quantized exports of the default model against the float model: bits per weight, size, perplexity, export time.

    python benchmarks/quant.py [--eval-tokens 4096] [--only spqr3,decoupleq2]

Perplexity runs through edge's own runtime on the evaluation split of the calibration text (CPython's
pydoc_data.topics, every third topic; calibration never sees it), windows of 1,024 tokens. The peer is onnxruntime's
own MatMulNBitsQuantizer with default settings applied to edge's float32 graph. Decode tok/s is a short greedy run
(64 tokens after 200) in the same process, so read it as a ratio within one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

VARIANTS = {
    "fp32": dict(quant="fp32"),
    "rtn int4 (block 32)": dict(quant="int4"),
    "onnxruntime MatMulNBitsQuantizer": dict(peer=True),
    "rtn int2 (block 64)": dict(quant="rtn2"),
    "spqr 3-bit": dict(quant="spqr", bits=3),
    "spqr 4-bit": dict(quant="spqr", bits=4),
    "decoupleq 2-bit": dict(quant="decoupleq", bits=2),
    "decoupleq 3-bit": dict(quant="decoupleq", bits=3),
    "decoupleq 4-bit": dict(quant="decoupleq", bits=4),
}


def out_dir() -> Path:
    from edge.default_model import cache_dir

    return cache_dir() / "bench" / "quant"


def export(name: str, spec: dict, imported, fp32_dir: Path) -> tuple[Path, float]:
    from edge.export.pipeline import export_model, rtn_quantizer

    target = out_dir() / name.replace(" ", "-").replace("(", "").replace(")", "")
    shutil.rmtree(target, ignore_errors=True)
    start = time.perf_counter()
    if spec.get("peer"):
        peer_quantize(fp32_dir, target)
    elif spec["quant"] == "rtn2":
        export_model("smollm2", target, quant="int4", model=imported, quantizer=rtn_2bit(rtn_quantizer))
    else:
        export_model("smollm2", target, quant=spec["quant"], bits=spec.get("bits"), model=imported, progress=True)
    return target, time.perf_counter() - start


def rtn_2bit(rtn_quantizer):
    two, four = rtn_quantizer(2, 64), rtn_quantizer(4, 32)
    return lambda name, w: four(name, w) if name == "model.embed_tokens" else two(name, w)


def peer_quantize(fp32_dir: Path, target: Path) -> None:
    """onnxruntime.quantization's MatMulNBitsQuantizer, default settings, on our float32 graph."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from edge.package import write_manifest

    model = onnx.load(str(fp32_dir / "model.onnx"))
    quantizer = MatMulNBitsQuantizer(model)
    quantizer.process()
    target.mkdir(parents=True)
    quantizer.model.save_model_to_file(str(target / "model.onnx"), use_external_data_format=True)
    produced = target / "model.onnx.data"
    if not produced.exists():  # the quantizer names the data file after the graph; the package wants this name
        data = [p for p in target.iterdir() if p.name != "model.onnx"]
        data[0].rename(produced)
    shutil.copy(fp32_dir / "tokenizer.json", target / "tokenizer.json")
    manifest = json.loads((fp32_dir / "manifest.json").read_text())
    manifest["quantization"] = {"method": "onnxruntime MatMulNBitsQuantizer (defaults)"}
    write_manifest(target, manifest)


def bits_per_weight(package) -> tuple[float | None, float | None]:
    q = package.manifest["quantization"]
    return q.get("storage_bits_per_weight"), q.get("runtime_bits_per_weight")


def decode_speed(package) -> float:
    from edge.model import Decoder

    decoder = Decoder(package, context_length=512, threads=2)
    logits = decoder.prefill(list(range(100, 300)))
    start = time.perf_counter()
    for _ in range(64):
        logits = decoder.step([int(np.argmax(logits))])[0]
    return 64 / (time.perf_counter() - start)


def main() -> None:
    from edge.default_model import default_gguf
    from edge.export.evaluate import perplexity
    from edge.export.gguf import load_gguf
    from edge.export.quant.calibration_text import corpus
    from edge.package import load_package
    from edge.tokenizer import Tokenizer

    p = argparse.ArgumentParser()
    p.add_argument("--eval-tokens", type=int, default=4096)
    p.add_argument("--only", help="comma-separated variant names (default: all)")
    args = p.parse_args()
    imported = load_gguf(default_gguf())
    ids = Tokenizer(imported.tokenizer_json).encode(corpus("evaluation")[0], add_special_tokens=False)
    ids = ids[: args.eval_tokens]
    chosen = [v for v in VARIANTS if not args.only or v in args.only.split(",")]
    fp32_dir, _ = export("fp32", VARIANTS["fp32"], imported, None)
    rows, base = [], None
    for name in chosen:
        path, seconds = (fp32_dir, 0.0) if name == "fp32" else export(name, VARIANTS[name], imported, fp32_dir)
        package = load_package(path)
        ppl = perplexity(package, ids, threads=2)
        base = base or (ppl if name == "fp32" else None)
        stored, runtime = bits_per_weight(package)
        size = sum(f.stat().st_size for f in path.iterdir()) / 2**20
        rows.append((name, stored, runtime, size, ppl, seconds, decode_speed(package)))
        print(rows[-1], flush=True)
    lines = [f"| weights | stored bits/weight | run-time bits/weight | package MiB | perplexity | vs fp32 | "
             f"export s | decode tok/s |", "|---|---|---|---|---|---|---|---|"]
    for name, stored, runtime, size, ppl, seconds, speed in rows:
        fmt = lambda b: "-" if b is None else f"{b:.2f}"  # noqa: E731
        delta = f"{(ppl / base - 1) * 100:+.1f}%" if base else "-"
        lines.append(f"| {name} | {fmt(stored)} | {fmt(runtime)} | {size:.1f} | {ppl:.2f} | {delta} | "
                     f"{seconds:.0f} | {speed:.1f} |")
    table = "\n".join(lines)
    print(table)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "quant.md").write_text(f"`python benchmarks/quant.py --eval-tokens {args.eval_tokens}`; perplexity "
                                      f"on {len(ids)} evaluation tokens, windows of 1,024.\n\n{table}\n")


if __name__ == "__main__":
    main()
