"""Weight paging at scale: a Llama-shaped float32 package several times larger than its memory budget.

    python benchmarks/paging.py [--layers 22] [--tokens 4] [--threads 1] [--window N] [--keep]

1. Writes a synthetic paged package (random weights, TinyLlama's shape: hidden 2048, intermediate 5632, 32 heads,
   4 KV heads, vocab 32000, tied embeddings) into ~/.cache/edge/bench; never committed, deleted at the end unless
   --keep (a kept one is reused).
2. Measures the disk's sequential read speed on the layer data file, with its pages dropped from the page cache
   first (fsync, then posix_fadvise DONTNEED), reading in the runtime's own chunk size.
3. Plans a budget of a quarter of the package with the memory planner (paging allowed), then decodes in a fresh
   subprocess (so VmHWM is its own) with the file's pages dropped before the run and after every layer read
   (drop_behind), so every token really reads the disk.
4. Reports peak RSS against the budget, decode tokens/s against the bound (one read of the paged layers' bytes per
   token at the measured disk speed), and writes benchmarks/results/paging.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "paging.md"


def synthetic_config(layers: int):
    from edge.config import ModelConfig

    return ModelConfig(architecture="llama", vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                       num_layers=layers, num_heads=32, num_kv_heads=4, head_dim=64, max_context=2048,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True)


def synthetic_model(layers: int):
    """Random weights produced on access (LazyTensors), so the export never holds more than a layer."""
    from edge.export.source import ImportedModel, LazyTensors, SpecialTokens

    cfg = synthetic_config(layers)
    h, inter, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_kv_heads * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes.update({f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
                       f"{p}.self_attn.q_proj.weight": (h, h), f"{p}.self_attn.k_proj.weight": (kv, h),
                       f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, h),
                       f"{p}.mlp.gate_proj.weight": (inter, h), f"{p}.mlp.up_proj.weight": (inter, h),
                       f"{p}.mlp.down_proj.weight": (h, inter)})

    def loader(name: str, shape: tuple[int, ...]):
        def load() -> np.ndarray:
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            if name.endswith("norm.weight"):
                return np.ones(shape, np.float32)
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        return load

    tensors = LazyTensors({name: loader(name, shape) for name, shape in shapes.items()})
    vocab = {f"t{i}": i for i in range(cfg.vocab_size)}
    tokenizer = json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                            "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                            "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}})
    return ImportedModel(cfg, tensors, tokenizer, SpecialTokens(None, [cfg.vocab_size - 1]), None,
                         {"format": "synthetic", "name": f"synthetic-llama-{layers}l"})


def package_size(cfg) -> int:
    """Bytes of the float32 package: the layers' weights and the (tied) embedding table."""
    h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    layer = 2 * h + h * (h + 2 * kv) + h * h + 3 * h * cfg.intermediate_size
    return 4 * (cfg.num_layers * layer + cfg.vocab_size * h)


def package_files(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.suffix in (".onnx", ".data")]


def drop_page_cache(paths: list[Path]) -> None:
    """Write back and evict the files' pages, so the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def disk_read_speed(path: Path, limit: int, block: int) -> float:
    """Bytes/s of a cold sequential read of up to `limit` bytes of `path` in the runtime's read size: the better of
    plain reads and of reads that ask the kernel for the next `block` ahead (what the paging reader does)."""
    return max(_cold_read(path, limit, block, ahead=False), _cold_read(path, limit, block, ahead=True))


def _cold_read(path: Path, limit: int, block: int, ahead: bool) -> float:
    from edge.paging import read_into

    drop_page_cache([path])
    size = min(os.path.getsize(path), limit) // block * block
    buffer = np.empty(block, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        start = time.perf_counter()
        for offset in range(0, size, block):
            if ahead:
                os.posix_fadvise(fd, offset + block, block, os.POSIX_FADV_WILLNEED)
            read_into(fd, memoryview(buffer), offset)
        seconds = time.perf_counter() - start
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return size / seconds


def run_decode(root: Path, window: int, pinned: int, tokens: int, threads: int) -> dict:
    """In this (fresh) process: cold-start the paged decoder and time `tokens` decode steps after a short prompt."""
    from edge.memory.usage import peak_rss_bytes
    from edge.package import load_package
    from edge.paging import PagedDecoder

    package = load_package(root, verify=False)
    drop_page_cache(package_files(root))
    decoder = PagedDecoder(package, context_length=256, threads=threads, window=window, pinned=pinned,
                           max_tokens=16, drop_behind=True)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    start = time.perf_counter()
    logits = decoder.prefill(prompt)
    first = time.perf_counter() - start
    waited, start = decoder.window.wait_seconds if decoder.window else 0.0, time.perf_counter()
    for _ in range(tokens):
        logits = decoder.step([int(np.argmax(logits))])[0]
    seconds = time.perf_counter() - start
    stats = decoder.stats()
    decoder.close()
    return {"first_token_s": first, "decode_s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "wait_s": stats["wait_seconds"] - waited, "peak_rss": peak_rss_bytes(), "max_in_use": stats["max_in_use"],
            "window": stats["window"], "pinned": stats["pinned"]}


def plan(root: Path, budget: int, window: int | None) -> tuple[int, int, str]:
    """Window and pinned layers from the memory planner (paging allowed); 2 slots and none pinned when it refuses
    the budget (its memory model may not know this runtime's layout), with its reason."""
    from edge.memory.budget import BudgetError, ModelSpec
    from edge.memory.planner import make_planner

    manifest = json.loads((root / "manifest.json").read_text())
    try:
        result = make_planner(ModelSpec.from_manifest(manifest), allow_paging=True).plan(budget, context=256)
    except BudgetError as exc:
        return window or 2, 0, f"refused the budget ({exc}); ran with 2 slots, none pinned"
    lines = result.describe().splitlines()
    return window or result.plan.stream_window, result.plan.resident_layers or 0, f"{lines[0]}; {lines[1]}"


def write_results(rows: list[dict], args: str) -> None:
    gib, first = 1 << 30, rows[0]
    lines = [
        "# Weight paging at scale",
        "",
        f"`python benchmarks/paging.py {args}` on this machine (2 cores shared with other jobs, virtio disk). "
        "A synthetic Llama-shaped float32 paged package (TinyLlama's shape, random weights) run under a budget "
        "of a quarter of its size. The file's pages are dropped before each run and after every layer read, so "
        "every token reads the paged layers from the disk. Bound: the paged layers' bytes read once per token at "
        "the disk's cold sequential speed, the mean of a measurement just before and just after each run (the "
        "disk and the cores are shared, so both vary from minute to minute). Load: the 1-minute load average at the "
        "start of the run (2 cores).",
        "",
        f"Package {first['package_bytes'] / gib:.2f} GiB ({first['layers']} layers of "
        f"{first['layer_bytes'] / 2**20:.0f} MiB, the rest embedding and head); budget "
        f"{first['budget'] / gib:.2f} GiB; window {first['window']} slots, {first['pinned']} layers pinned. "
        f"Planner: {first['plan']}.",
        "",
        "| run | load | peak RSS (VmHWM) | disk read | bound | decode | of bound | compute waiting for reads |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(rows, 1):
        lines.append(
            f"| {i} | {row['load']:.1f} | {row['peak_rss'] / gib:.2f} GiB | {row['disk_bps'] / 1e6:.0f} MB/s "
            f"| {row['bound']:.3f} tok/s | {row['tokens_per_s']:.3f} tok/s | {row['ratio']:.0%} "
            f"| {row['wait_s']:.1f} of {row['decode_s']:.1f} s |")
    ratios = sorted(row["ratio"] for row in rows)
    lines += ["", f"Median: {ratios[len(ratios) // 2]:.0%} of the bound; peak RSS at most "
              f"{max(row['peak_rss'] for row in rows) / gib:.2f} GiB against the budget of {first['budget'] / gib:.2f} GiB."]
    lines += ["", f"Decode: {first['tokens']} tokens after an 8-token prompt; the first token (cold sessions and "
              f"window) took {first['first_token_s']:.1f} s and is not counted. What the peak holds: the window's "
              f"{first['window']} slots ({first['window'] * first['layer_bytes'] / gib:.2f} GiB), the head's "
              f"resident weights ({first['head_bytes'] / gib:.2f} GiB: final norm and the tied embedding table, "
              "which token embeddings are gathered from through a memory map), the runtime (Python, numpy, "
              "onnxruntime) and the KV cache and activations.", ""]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".md.tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, RESULTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--window", type=int, default=None, help="slots (default: the planner's)")
    parser.add_argument("--keep", action="store_true", help="keep the synthetic package for the next run")
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # the subprocess: decode this package
    parser.add_argument("--pinned", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_decode(args.run, args.window, args.pinned, args.tokens, args.threads)))
        return

    from edge.default_model import cache_dir
    from edge.export.paged import export_paged

    root = cache_dir() / "bench" / f"paging-synthetic-{args.layers}l"
    cfg = synthetic_config(args.layers)
    need = package_size(cfg)
    if not (root / "manifest.json").exists():
        free = shutil.disk_usage(root.parent if root.parent.exists() else Path.home()).free
        if free < need * 1.2:
            sys.exit(f"need about {need * 1.2 / 1e9:.1f} GB free for the synthetic package, {free / 1e9:.1f} GB free")
        shutil.rmtree(root, ignore_errors=True)
        start = time.perf_counter()
        export_paged(synthetic_model(args.layers), root, rope_cache_len=2048)
        print(f"wrote {root} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    try:
        measure(root, args)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def measure(root: Path, args) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    paging = manifest["paging"]
    package_bytes = sum(f["bytes"] for f in manifest["files"].values())
    budget = package_bytes // 4
    window, pinned, planned = plan(root, budget, args.window)
    paged_bytes = (args.layers - pinned) * paging["layer_bytes"]
    rows = []
    for _ in range(args.runs):
        data = root / paging["layer_data"]
        before = disk_read_speed(data, limit=2 << 30, block=paging["layer_bytes"])
        load = os.getloadavg()[0]
        out = subprocess.run([sys.executable, __file__, "--run", str(root), "--window", str(window), "--pinned",
                              str(pinned), "--tokens", str(args.tokens), "--threads", str(args.threads)],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"the decode run failed:\n{out.stderr}")
        disk = (before + disk_read_speed(data, limit=2 << 30, block=paging["layer_bytes"])) / 2  # the disk is shared
        run = json.loads(out.stdout.strip().splitlines()[-1])
        bound = disk / paged_bytes
        rows.append({**run, "package_bytes": package_bytes, "layers": args.layers, "layer_bytes": paging["layer_bytes"],
                     "budget": budget, "disk_bps": disk, "bound": bound, "ratio": run["tokens_per_s"] / bound,
                     "plan": planned, "load": load, "head_bytes": manifest["files"]["model.onnx.data"]["bytes"]})
        verdict = "under" if run["peak_rss"] <= budget else "OVER"
        print(f"load {load:.1f}; disk {disk / 1e6:.0f} MB/s; peak RSS {run['peak_rss'] / 2**30:.2f} GiB ({verdict} "
              f"the budget of {budget / 2**30:.2f} GiB); {run['tokens_per_s']:.3f} tok/s = {rows[-1]['ratio']:.0%} "
              f"of the disk bound {bound:.3f} tok/s; waited {run['wait_s']:.1f} of {run['decode_s']:.1f} s",
              file=sys.stderr)
    write_results(rows, f"--layers {args.layers} --tokens {args.tokens} --threads {args.threads} --runs {args.runs}")


if __name__ == "__main__":
    main()
