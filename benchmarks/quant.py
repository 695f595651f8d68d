"""Quantized exports of the default model against the float model: bits per weight, size, perplexity, export time.

    python benchmarks/quant.py [--eval-tokens 4096] [--only spqr3,decoupleq2] [--model gemma3]

Perplexity runs through edge's own runtime on the evaluation split of the calibration text (CPython's
pydoc_data.topics, every third topic; calibration never sees it), windows of 1,024 tokens. The peer is onnxruntime's
own MatMulNBitsQuantizer with default settings applied to edge's float32 graph. Decode tok/s is the median of three
short greedy runs (64 tokens after 200) in the same process, so read it as a ratio within one run. Bits per weight
count the decoder's linear layers; the embedding column says how the (tied) embedding and output head are stored.
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
    "rtn int4 float zeros, int4 embedding": dict(quant="int4", zeros="float", embedding_bits=4),
    "rtn int4 float zeros": dict(quant="int4", zeros="float"),
    "rtn int4 float zeros (edge kernels)": dict(quant="int4", zeros="float", kernels="edge"),
    # the default model (edge.default_model.EXPORTS["int4-edge"]): Q4_1's float16 scale and min, int8 activations,
    # the 4-bit head calibrated with GPTQ (export/quant/head.py)
    "default: int4-edge (float16 scale and min; int4 embedding; GPTQ head)": dict(
        quant="int4", kernels="edge", accuracy_level=4, zeros="float", embedding_bits=4, head="gptq"),
    "int4-edge with round-to-nearest head (session 8 default)": dict(
        quant="int4", kernels="edge", accuracy_level=4, zeros="float", embedding_bits=4, head="rtn"),
    "int4-edge before (integer zeros)": dict(quant="int4", kernels="edge", accuracy_level=4, head="rtn"),
    "onnxruntime MatMulNBitsQuantizer": dict(peer=True),
    "rtn int2 (block 64)": dict(quant="rtn2"),
    "spqr 3-bit": dict(quant="spqr", bits=3),
    "spqr 4-bit": dict(quant="spqr", bits=4),
    "spqr 4-bit (group 32 and 8-bit stats)": dict(quant="spqr", bits=4, group_size=32, stat_bits=8),
    # edge.QMatMul keeps SpQR's second level (a byte per scale and zero point) and its outliers at run time
    "spqr 3-bit (edge kernels)": dict(quant="spqr", bits=3, kernels="edge", accuracy_level=4),
    "spqr 4-bit (group 32 and 8-bit stats; edge kernels)": dict(quant="spqr", bits=4, group_size=32, stat_bits=8,
                                                                 kernels="edge", accuracy_level=4),
    "decoupleq 2-bit": dict(quant="decoupleq", bits=2),
    "decoupleq 3-bit": dict(quant="decoupleq", bits=3),
    "decoupleq 4-bit": dict(quant="decoupleq", bits=4),
    # the peer's block size; integer zeros, since float offsets need K (576) to be a multiple of the block
    "decoupleq 4-bit (group 128)": dict(quant="decoupleq", bits=4, group_size=128, zeros="integer"),
}


MODEL = "smollm2"  # --model: the source GGUF (smollm2, the default model; gemma3, Gemma 3 270M Q4_K_M)


def out_dir() -> Path:
    from edge.default_model import cache_dir

    return cache_dir() / "bench" / "quant" / ("" if MODEL == "smollm2" else MODEL)


def source_gguf() -> Path:
    from edge.default_model import default_gguf
    from edge.export.gguf import fetch_gemma3

    return fetch_gemma3() if MODEL == "gemma3" else default_gguf()


def export(name: str, spec: dict, imported, fp32_dir: Path) -> tuple[Path, float]:
    from edge.export.pipeline import export_model, rtn_quantizer

    target = out_dir() / name.replace(" ", "-").replace("(", "").replace(")", "").replace(",", "")
    shutil.rmtree(target, ignore_errors=True)
    start = time.perf_counter()
    if spec.get("peer"):
        peer_quantize(fp32_dir, target)
    elif spec["quant"] == "rtn2":
        export_model(MODEL, target, quant="int4", model=imported, quantizer=rtn_2bit(rtn_quantizer))
    else:
        extra = {key: spec[key] for key in ("zeros", "embedding_bits", "kernels", "group_size", "stat_bits",
                                            "accuracy_level", "head")
                 if key in spec}
        export_model(MODEL, target, quant=spec["quant"], bits=spec.get("bits"), model=imported, progress=True,
                     **extra)
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


def embedding_kind(package) -> str:
    """How the embedding / tied head is stored (the bits columns count the decoder's linear layers only)."""
    q = package.manifest["quantization"]
    if q.get("method") == "fp32" or "MatMulNBitsQuantizer" in str(q.get("method")):
        return "fp32"  # the peer quantizes MatMul nodes only: the Gather/Gemm of the tied table stay float
    text = str(q.get("embedding", "int4"))
    return "int8" if "int8" in text else "int4"


def decode_speed(package, runs: int = 3) -> float:
    """Median over `runs` of 64 greedy tokens after a 200-token prompt."""
    import statistics

    from edge.model import Decoder

    decoder = Decoder(package, context_length=512, threads=2)
    speeds = []
    for _ in range(runs):
        decoder.reset()
        logits = decoder.prefill(list(range(100, 300)))
        start = time.perf_counter()
        for _ in range(64):
            logits = decoder.step([int(np.argmax(logits))])[0]
        speeds.append(64 / (time.perf_counter() - start))
    return statistics.median(speeds)


def main() -> None:
    global MODEL
    from edge.export.evaluate import perplexity
    from edge.export.gguf import load_gguf
    from edge.export.quant.calibration_text import corpus
    from edge.package import load_package
    from edge.tokenizer import Tokenizer

    p = argparse.ArgumentParser()
    p.add_argument("--eval-tokens", type=int, default=4096)
    p.add_argument("--only", help="comma-separated variant names (default: all)")
    p.add_argument("--model", choices=["smollm2", "gemma3"], default=MODEL,
                   help="source model (gemma3: the calibrated variants need a Llama-style model)")
    args = p.parse_args()
    MODEL = args.model
    imported = load_gguf(source_gguf())
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
        rows.append((name, embedding_kind(package), stored, runtime, size, ppl, seconds, decode_speed(package)))
        print(rows[-1], flush=True)
    lines = ["| weights | embedding | stored bits/weight | run-time bits/weight | package MiB | perplexity | "
             "vs fp32 | export s | decode tok/s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, emb, stored, runtime, size, ppl, seconds, speed in rows:
        fmt = lambda b: "-" if b is None else f"{b:.2f}"  # noqa: E731
        delta = f"{(ppl / base - 1) * 100:+.2f}%" if base else "-"
        lines.append(f"| {name} | {emb} | {fmt(stored)} | {fmt(runtime)} | {size:.1f} | {ppl:.3f} | {delta} | "
                     f"{seconds:.0f} | {speed:.1f} |")
    table = "\n".join(lines)
    print(table)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    command = f"python benchmarks/quant.py --eval-tokens {args.eval_tokens}" + (
        f" --model {MODEL}" if MODEL != "smollm2" else "")
    text = f"perplexity on {len(ids)} evaluation tokens, windows of 1,024.\n\n{table}\n"
    if args.only or MODEL != "smollm2":  # added to the (SmolLM2) full table's file, not replacing it
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        with open(results / "quant.md", "a") as f:
            f.write(f"\n`{command} --only '{args.only}'` ({when}); {text}")
    else:
        (results / "quant.md").write_text(f"`{command}`; {text}")


if __name__ == "__main__":
    main()
