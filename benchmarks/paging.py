"""Weight paging at scale: a Llama-shaped float32 package several times larger than its memory budget.

    python benchmarks/paging.py [--quant fp32|int4] [--layers 22] [--tokens 4] [--threads 1] [--window N] [--keep]

1. Writes a synthetic paged package (random weights, TinyLlama's shape: hidden 2048, intermediate 5632, 32 heads,
   4 KV heads, vocab 32000, tied embeddings) into ~/.cache/edge/bench: float32, or int4 (RTN, groups of 32) on
   edge.QMatMul, whose packed weights the layer graph takes as inputs; never committed, deleted at the end unless
   --keep (a kept one is reused).
2. Measures the disk's sequential read speed on the layer data file, with its pages dropped from the page cache
   first (fsync, then posix_fadvise DONTNEED), in blocks of a layer: the best of buffered, read-ahead, drop-behind
   and O_DIRECT reads.
3. Plans a budget of a quarter of the package with the memory planner (paging allowed), then decodes in a fresh
   subprocess (so VmHWM is its own) with the file's pages dropped before the run and drop_behind on (O_DIRECT
   reads where the file system has them, else each layer's pages dropped after its read), so every token really
   reads the disk.
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
INT4_BYTES_PER_WEIGHT = 0.5 + 5 / 32  # codes, a float32 scale and a uint8 zero point per group of 32


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


def fp32_size(cfg) -> int:
    """Bytes of the model in float32: the layers' weights and the (tied) embedding table."""
    h, kv = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim
    layer = 2 * h + h * (h + 2 * kv) + h * h + 3 * h * cfg.intermediate_size
    return 4 * (cfg.num_layers * layer + cfg.vocab_size * h)


def package_size(cfg, quant: str) -> int:
    """Bytes the package takes on disk, roughly (int4: the tied table twice, for the gather and for the head)."""
    if quant == "fp32":
        return fp32_size(cfg)
    return int(fp32_size(cfg) / 4 * INT4_BYTES_PER_WEIGHT + cfg.vocab_size * cfg.hidden_size * INT4_BYTES_PER_WEIGHT)


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
    """Bytes/s of a cold sequential read of up to `limit` bytes of `path` in blocks of a layer: the best of plain
    reads, reads that ask the kernel for the next block ahead (POSIX_FADV_WILLNEED), reads that drop each block
    behind them, and O_DIRECT reads (what the paging reader does under a budget where it can), so the bound is the
    fastest way this disk was seen to read the file, whichever way the runtime reads it."""
    return max(_cold_read(path, limit, block, ahead=False), _cold_read(path, limit, block, ahead=True),
               _cold_read(path, limit, block, ahead=False, drop=True), _direct_read(path, limit, block))


def _direct_read(path: Path, limit: int, block: int) -> float:
    """Bytes/s of O_DIRECT reads into a page-aligned buffer (0 where the file system has none)."""
    import mmap

    from edge.paging import read_into

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except (OSError, AttributeError):
        return 0.0
    size = min(os.path.getsize(path), limit) // block * block
    buffer = mmap.mmap(-1, block)
    try:
        start = time.perf_counter()
        for offset in range(0, size, block):
            read_into(fd, memoryview(buffer), offset)
        return size / (time.perf_counter() - start)
    except OSError:
        return 0.0
    finally:
        os.close(fd)


def _cold_read(path: Path, limit: int, block: int, ahead: bool, drop: bool = False) -> float:
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
            if drop:
                os.posix_fadvise(fd, offset, block, os.POSIX_FADV_DONTNEED)
        seconds = time.perf_counter() - start
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return size / seconds


PROMPT = 8  # prompt tokens of a decode run
PLAN_CONTEXT = 256


def unwritten_kv_bytes(layers: int, written: int) -> int:
    """KV bytes of the planned context that a run writing `written` positions leaves untouched."""
    return synthetic_config(layers).kv_bytes_per_token() * (PLAN_CONTEXT - written)


def run_decode(root: Path, window: int, pinned: int, tokens: int, threads: int) -> dict:
    """In this (fresh) process: cold-start the paged decoder and time `tokens` decode steps after a short prompt."""
    from edge.memory.usage import peak_rss_bytes
    from edge.package import load_package
    from edge.paging import PagedDecoder

    package = load_package(root, verify=False)
    drop_page_cache(package_files(root))
    decoder = PagedDecoder(package, context_length=PLAN_CONTEXT, threads=threads, window=window, pinned=pinned,
                           max_tokens=16, drop_behind=True)
    prompt = list(range(1, PROMPT + 1))
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
            "window": stats["window"], "pinned": stats["pinned"], "direct": stats["direct"]}


def plan(root: Path, budget: int, window: int | None) -> tuple[int, int, str, int]:
    """Window and pinned layers from the memory planner (paging allowed), its description and its predicted peak
    less the tokenizer (the decode run loads none); 2 slots and none pinned when it refuses the budget, with its
    reason."""
    from edge.memory.budget import BudgetError, ModelSpec
    from edge.memory.planner import make_planner

    manifest = json.loads((root / "manifest.json").read_text())
    try:
        result = make_planner(ModelSpec.from_manifest(manifest), allow_paging=True).plan(budget, context=PLAN_CONTEXT)
    except BudgetError as exc:
        return window or 2, 0, f"refused the budget ({exc}); ran with 2 slots, none pinned", 0
    lines = result.describe().splitlines()
    predicted = result.memory.peak - result.memory.tokenizer
    return window or result.plan.stream_window, result.plan.resident_layers or 0, f"{lines[0]}; {lines[1]}", predicted


def head_resident_bytes(manifest: dict) -> int:
    """Bytes of the head's data file that become resident: all but a low-bit embedding table, which stays on disk."""
    head = manifest["files"]["model.onnx.data"]["bytes"]
    emb = manifest["paging"]["embedding"]
    if emb.get("format") != "matmulnbits":
        return head
    parts = [emb[k] for k in ("qweight", "scales", "zero_points")]
    return head - sum(int(np.prod(e["shape"])) * np.dtype(e["dtype"]).itemsize for e in parts)


def write_results(rows: list[dict], args: str, quant: str) -> None:
    gib, first = 1 << 30, rows[0]
    fmt = ("float32" if quant == "fp32" else
           f"int4 (RTN, groups of 32, edge.QMatMul taking its packed weights as inputs; "
           f"{first['fp32_bytes'] / gib:.2f} GiB in float32 terms)")
    lines = [
        "# Weight paging at scale",
        "",
        f"`python benchmarks/paging.py {args}` on this machine (2 cores shared with other jobs, virtio disk). "
        f"A synthetic Llama-shaped {fmt} paged package (TinyLlama's shape, random weights) run under a budget "
        "of a quarter of its size. The file's pages are dropped before each run, and layers are read with O_DIRECT "
        "(or dropped after every read where the file system has no direct reads), so "
        "every token reads the paged layers from the disk. Bound: the paged layers' bytes read once per token at "
        "the disk's cold sequential speed, the mean of a measurement just before and just after each run (the "
        "disk and the cores are shared, so both vary from minute to minute). Load: the 1-minute load average at the "
        "start of the run (2 cores).",
        "",
        f"Package {first['package_bytes'] / gib:.2f} GiB ({first['layers']} layers of "
        f"{first['layer_bytes'] / 2**20:.0f} MiB, the rest embedding and head); budget "
        f"{first['budget'] / gib:.2f} GiB; window {first['window']} slots, {first['pinned']} layers pinned; "
        f"reads {'O_DIRECT' if first.get('direct') else 'buffered, dropped behind'}. Planner: {first['plan']}.",
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
    peak = max(row["peak_rss"] for row in rows)
    lines += ["", f"Median: {ratios[len(ratios) // 2]:.0%} of the bound; peak RSS at most {peak / gib:.2f} GiB "
              f"({peak / 2**20:.0f} MiB) against the budget of {first['budget'] / gib:.2f} GiB; the memory model "
              f"predicted {first['predicted_peak'] / 2**20:.0f} MiB for this run (the plan's peak less the "
              f"tokenizer, which the decode run does not load): {first['predicted_peak'] / peak - 1:+.1%}, of which "
              f"{first['unwritten_kv'] / 2**20:.0f} MiB are KV cache rows this short run never writes (RSS counts "
              "written pages; the plan's context is 256)."]
    lines += ["", f"Decode: {first['tokens']} tokens after an 8-token prompt; the first token (cold sessions and "
              f"window) took {first['first_token_s']:.1f} s and is not counted. What the peak holds: the window's "
              f"{first['window']} slots and {first['pinned']} pinned layers "
              f"({(first['window'] + first['pinned']) * first['layer_bytes'] / gib:.2f} GiB), the head's "
              f"resident weights ({first['head_bytes'] / gib:.2f} GiB: "
              + ("final norm and the head Gemm's packed copy of the tied table; token embeddings are gathered "
                 "from the original through a memory map" if quant == "fp32" else
                 "final norm and the head's edge.QMatMul copy of the tied table; token embeddings are gathered "
                 "and dequantized row by row from the int4 table through a memory map, which stays on disk")
              + "), the runtime (Python, numpy, onnxruntime) and the KV cache and activations.", ""]
    save_section(quant, "\n".join(lines))


def save_section(quant: str, text: str) -> None:
    """Replace this format's section of the results file, keeping the other format's (written atomically)."""
    sections = {}
    if RESULTS.exists():
        old = RESULTS.read_text()
        parts = old.split("<!-- paging:")
        if len(parts) == 1:
            sections["fp32"] = old.strip()  # a file from before the int4 section existed
        for part in parts[1:]:
            name, _, body = part.partition("-->")
            sections[name.strip()] = body.strip()
    sections[quant] = text.strip()
    body = "\n\n".join(f"<!-- paging: {name} -->\n{sections[name]}" for name in ("fp32", "int4") if name in sections)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".md.tmp")
    tmp.write_text(body + "\n")
    os.replace(tmp, RESULTS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--quant", choices=["fp32", "int4"], default="fp32")
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

    root = cache_dir() / "bench" / f"paging-synthetic-{args.quant}-{args.layers}l"
    cfg = synthetic_config(args.layers)
    need = package_size(cfg, args.quant)
    if not (root / "manifest.json").exists():
        free = shutil.disk_usage(root.parent if root.parent.exists() else Path.home()).free
        if free < need * 1.2:
            sys.exit(f"need about {need * 1.2 / 1e9:.1f} GB free for the synthetic package, {free / 1e9:.1f} GB free")
        shutil.rmtree(root, ignore_errors=True)
        start = time.perf_counter()
        export_paged(synthetic_model(args.layers), root, rope_cache_len=2048, quant=args.quant,
                     kernels="edge" if args.quant == "int4" else "stock")
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
    window, pinned, planned, predicted = plan(root, budget, args.window)
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
                     "plan": planned, "load": load, "head_bytes": head_resident_bytes(manifest),
                     "fp32_bytes": fp32_size(synthetic_config(args.layers)), "predicted_peak": predicted,
                     "unwritten_kv": unwritten_kv_bytes(args.layers, PROMPT + args.tokens)})
        verdict = "under" if run["peak_rss"] <= budget else "OVER"
        print(f"load {load:.1f}; disk {disk / 1e6:.0f} MB/s; peak RSS {run['peak_rss'] / 2**30:.2f} GiB ({verdict} "
              f"the budget of {budget / 2**30:.2f} GiB); {run['tokens_per_s']:.3f} tok/s = {rows[-1]['ratio']:.0%} "
              f"of the disk bound {bound:.3f} tok/s; waited {run['wait_s']:.1f} of {run['decode_s']:.1f} s",
              file=sys.stderr)
    write_results(rows, f"--quant {args.quant} --layers {args.layers} --tokens {args.tokens} --threads {args.threads} "
                        f"--runs {args.runs}", args.quant)


if __name__ == "__main__":
    main()
