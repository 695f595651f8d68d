"""Prompt and decode speed and peak memory of edge against onnxruntime-genai, on the default model, in one run.

    python benchmarks/decode.py [--runs 3] [--threads 2] [--spin-both] [--team-both]
    python benchmarks/decode.py --pair PACKAGE_A PACKAGE_B     # A/B of two packages in one process

Each measurement runs in a fresh subprocess (so peak RSS is that system's own), systems are interleaved run by run
(so a noisy neighbour hits all of them alike), and the table reports medians. Prompt: about 200 tokens of English;
decode: 128 new tokens, greedy, EOS ignored. The peer is onnxruntime-genai's model builder (int4, CPU) on the same
float weights, which we write as a Hugging Face folder from the GGUF with transformers (a benchmark-only dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = (
    "The history of the printing press is a story about how ideas travel. Before movable type, every book was "
    "copied by hand, which made books rare, expensive and full of small differences between copies. When metal "
    "type, oil-based ink and a screw press were combined in the fifteenth century, a workshop could produce "
    "hundreds of identical pages in a day. Printers soon appeared in dozens of cities, and within fifty years "
    "millions of books were in circulation. Scholars could compare the same text across countries, errors could "
    "be corrected in a new edition instead of multiplying with every copy, and pamphlets carried arguments to "
    "people who had never owned a book. Historians still debate how much the press caused and how much it only "
    "accelerated changes that were already under way, but few doubt that it changed who could read, what they "
    "read, and how quickly a new idea could reach a distant town. Summarise this passage in three sentences and "
    "then explain which of its claims is the most debatable."
)
NEW_TOKENS = 128


def cache_root() -> Path:
    from edge.default_model import cache_dir

    return cache_dir() / "bench"


def prepare() -> dict[str, Path]:
    """Export edge's packages and the peer's model once; reuse them on later runs."""
    from edge.default_model import default_gguf, default_package

    packages = {"edge fp32": default_package("fp32"), "edge int4": default_package("int4")}
    out = cache_root() / "edge-int4-kernels-acc0"
    if not (out / "manifest.json").exists():
        from edge.export.pipeline import export_model

        export_model(default_gguf(), out, quant="int4", kernels="edge", accuracy_level=0, overwrite=True)
    packages["edge int4, edge kernels"] = out
    packages["edge int4, edge kernels, int8 activations"] = default_package("int4-edge")  # the default model
    hf = cache_root() / "smollm2-hf"
    if not (hf / "model.safetensors").exists():
        write_hf_folder(default_gguf(), hf)
    genai = cache_root() / "genai-int4"
    if not (genai / "genai_config.json").exists():
        subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", "smollm2", "-i", str(hf),
                        "-o", str(genai), "-p", "int4", "-e", "cpu", "-c", str(cache_root() / "genai-cache")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    packages["onnxruntime-genai int4"] = genai
    return packages


def write_hf_folder(gguf: Path, out: Path) -> None:
    """The float model as a Hugging Face folder, dequantized by transformers' own GGUF loader."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(out)


def worker_edge(path: str, threads: int) -> dict:
    import numpy as np

    from edge.engine import Engine

    engine = Engine(path, threads=threads, context_length=1024)
    ids = engine.tokenizer.encode(PROMPT)
    engine.generate(ids[:20], max_tokens=4)  # warm-up
    engine.reset()
    start = time.perf_counter()
    logits = engine.decoder.prefill(ids)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(NEW_TOKENS):
        logits = engine.decoder.step([int(np.argmax(logits))])[0]
    decode = time.perf_counter() - start
    return {"prompt_tokens": len(ids), "prefill_s": prefill, "decode_s": decode}


def worker_genai(path: str, threads: int) -> dict:
    import onnxruntime_genai as og

    config = og.Config(path)
    config.clear_providers()
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode(PROMPT)

    def run(prompt_ids, new_tokens):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt_ids) + new_tokens,
                                  min_length=len(prompt_ids) + new_tokens)
        gen = og.Generator(model, params)
        start = time.perf_counter()
        gen.append_tokens(prompt_ids)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(new_tokens):
            gen.generate_next_token()
        return prefill, time.perf_counter() - start

    run(ids[:20], 4)  # warm-up
    prefill, decode = run(ids, NEW_TOKENS)
    return {"prompt_tokens": len(ids), "prefill_s": prefill, "decode_s": decode}


def worker(system: str, path: str, threads: int) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    from edge.memory.usage import peak_rss_bytes

    result = (worker_genai if system.startswith("onnxruntime-genai") else worker_edge)(path, threads)
    result["peak_rss_mib"] = peak_rss_bytes() / 2**20
    print(json.dumps(result))


def pair(paths: list[str], threads: int, rounds: int = 30, block: int = 16) -> None:
    """Two edge packages in one process, taking turns at blocks of `block` decode steps after the same 200-token
    prompt, the order swapped every round: on a shared machine, whatever slows one block slows its neighbour in
    the other package too, so the per-round ratios are far steadier than fresh processes' (same library)."""
    import numpy as np

    from edge.engine import Engine

    engines = [Engine(path, threads=threads, context_length=1024) for path in paths]
    ids = engines[0].tokenizer.encode(PROMPT)
    for engine in engines:
        engine.decoder.prefill(ids)
    past = engines[0].decoder.cache.length
    seconds: list[list[float]] = [[], []]
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            decoder = engines[i].decoder
            start = time.perf_counter()
            for k in range(block):
                decoder.step([ids[k]])
            seconds[i].append((time.perf_counter() - start) / block)
            decoder.cache.trim(past)
    a, b = np.array(seconds[0]), np.array(seconds[1])
    ratio = a / b  # > 1: the second package is faster
    print(f"decode tok/s: {1 / np.median(a):.1f} ({paths[0]}), {1 / np.median(b):.1f} ({paths[1]}); second/first "
          f"speed per round: median {np.median(ratio):.3f}, quartiles {np.percentile(ratio, 25):.3f}-"
          f"{np.percentile(ratio, 75):.3f} ({rounds} rounds of {block} steps)")


def measure(system: str, path: Path, threads: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", system, str(path), "--threads", str(threads)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker", nargs=2, metavar=("SYSTEM", "PATH"))
    p.add_argument("--spin-both", action="store_true", help="measure edge with and without thread spinning")
    p.add_argument("--team-both", action="store_true",
                   help="measure edge-kernel packages on the kernel library's threads and on onnxruntime's (EDGE_TEAM=0)")
    p.add_argument("--pair", nargs=2, metavar=("PACKAGE_A", "PACKAGE_B"),
                   help="decode speed of two edge packages taking turns in one process (A/B of a change)")
    args = p.parse_args()
    if args.worker:
        return worker(*args.worker, args.threads)
    if args.pair:
        return pair(args.pair, args.threads)
    packages = prepare()
    if args.spin_both:  # edge with worker threads spinning (EDGE_SPIN=1) and sleeping (0), side by side
        for name in [n for n in packages if n.startswith("edge")]:
            path = packages.pop(name)
            packages[f"{name} spin"], packages[f"{name} no-spin"] = path, path
    if args.team_both:
        for name in [n for n in packages if n.startswith("edge")]:
            packages[f"{name} ort-threads"] = packages[name]
    runs: dict[str, list[dict]] = {name: [] for name in packages}
    for _ in range(args.runs):
        for name, path in packages.items():
            os.environ["EDGE_SPIN"] = "0" if name.endswith("no-spin") else "1"
            os.environ["EDGE_TEAM"] = "0" if name.endswith("ort-threads") else "1"
            runs[name].append(measure(name, path, args.threads))
    print(f"| system | prompt tokens | prefill tok/s | decode tok/s | peak RSS MiB |  (medians of {args.runs}, "
          f"{args.threads} threads, {NEW_TOKENS} new tokens)")
    print("|---|---|---|---|---|")
    for name, results in runs.items():
        prefill = statistics.median(r["prompt_tokens"] / r["prefill_s"] for r in results)
        decode = statistics.median(NEW_TOKENS / r["decode_s"] for r in results)
        rss = statistics.median(r["peak_rss_mib"] for r in results)
        print(f"| {name} | {results[0]['prompt_tokens']} | {prefill:.0f} | {decode:.1f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
