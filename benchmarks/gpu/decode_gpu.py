"""Decode on a GPU (CUDA EP): the default model on edge's kernels, plain and speculative.

The default package (int4 on edge's kernels, exported here from the GGUF): prefill of benchmarks/decode.py's
prompt, 128 greedy tokens, and the cost of an M-token step with M logits rows (what verifying M drafted tokens
costs) relative to a 1-token step; the GPU's greedy tokens against the CPU's for the same package; then speculative
decoding on the GPU: plain vs each drafter and auto on benchmarks/speculative.py's prompts (tokens/s, identical output).

    python benchmarks/gpu/decode_gpu.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf [--work DIR] [--runs 3] [--out F]
        [--speculative-package N] [--no-peer] [--no-speculative]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decode import PROMPT  # noqa: E402  (benchmarks/decode.py: the same prompt as the CPU decode benchmark)

from edge.default_model import EXPORTS  # noqa: E402

# The default package (int4-edge, with its draft head), exported with the default's own options, and the same with
# o_proj and down_proj as nodes of their own instead of inside the norm-mode edge.QMatMul after them (59 nodes more;
# until session 37 the second package had the norms as nodes of their own), timed in the same runs. Stock-op packages
# are refused on CUDA (edge.session.check_cuda_graph): onnxruntime runs their float32 GroupQueryAttention on the CPU,
# which gave wrong tokens here (benchmarks/RESULTS.md).
PACKAGES = {"edge int4-edge (edge.QMatMul with norms and pre-projections inside + edge.Attention)":
            EXPORTS["int4-edge"],
            "the same, pre-projections as nodes of their own": dict(EXPORTS["int4-edge"], fuse_pre_projections=False)}
SPEC_TOKENS = 128
NEW_TOKENS = 128
STEP_ROWS = (1, 2, 4, 8, 16)


def export(gguf: Path, work: Path) -> dict[str, Path]:
    from edge.export.gguf import load_gguf
    from edge.export.pipeline import export_model

    out = {}
    for i, (name, options) in enumerate(PACKAGES.items()):
        target = work / f"pkg{i}"
        if not (target / "manifest.json").exists():
            start = time.perf_counter()
            export_model(gguf, target, model=load_gguf(gguf), **options)
            print(f"exported {name} in {time.perf_counter() - start:.0f} s", flush=True)
        out[name] = target
    return out


def greedy(decoder, ids: list[int], n: int) -> tuple[list[int], float, float]:
    decoder.reset()
    start = time.perf_counter()
    logits = decoder.prefill(ids)
    prefill = time.perf_counter() - start
    tokens = []
    start = time.perf_counter()
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = decoder.step([tokens[-1]])[0]
    return tokens, prefill, time.perf_counter() - start


def compare_with_cpu(cpu, ids: list[int], gpu_tokens: list[int]) -> str:
    """How many of the GPU's greedy tokens the CPU decodes too, and at the first difference how far apart the CPU's
    logits of the two choices are (a near-tie flips under different arithmetic; a bug shows as a wide gap)."""
    cpu.reset()
    logits = cpu.prefill(ids)
    for i, token in enumerate(gpu_tokens):
        choice = int(np.argmax(logits))
        if choice != token:
            gap = float(logits[choice] - logits[token])
            return (f"first {i} of {len(gpu_tokens)} identical; there the CPU's logit of its token is {gap:.3f} above "
                    f"the GPU's token's")
        logits = cpu.step([token])[0]
    return f"all {len(gpu_tokens)} identical"


def step_costs(decoder, tokens: list[int], reps: int = 30) -> dict[int, float]:
    """Median seconds of an M-token step with M logits rows, each rolled back (the cache trimmed) after timing."""
    base = decoder.cache.length
    out = {}
    for m in STEP_ROWS:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            decoder.step(tokens[:m], logits_rows=list(range(m)))
            times.append(time.perf_counter() - start)
            decoder.cache.trim(base)
        out[m] = statistics.median(times)
    return out


def transformers_peer(gguf: Path, ids: list[int], runs: int) -> list[str]:
    """Hugging Face transformers on the same GPU (the GGUF dequantized by its own loader, greedy generate with its
    default cache), float32 and bfloat16: prefill and decode tokens/s, medians."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).to("cuda")
    x = torch.tensor([ids], device="cuda")
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        timings = {"prefill": [], "total": []}
        for i in range(runs + 1):
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.no_grad():
                model(x)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            model.generate(x, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            torch.cuda.synchronize()
            if i:  # the first run warms up
                timings["prefill"].append(prefill)
                timings["total"].append(time.perf_counter() - start)
        pre, total = statistics.median(timings["prefill"]), statistics.median(timings["total"])
        rows.append(f"| transformers {transformers.__version__} (torch {torch.__version__}) {str(dtype).split('.')[-1]} | "
                    f"{len(ids) / pre:.0f} | {NEW_TOKENS / (total - pre):.1f} | | | | | |")
    return rows


DRAFTERS = ("prompt-lookup", "recycling", "head", "lookup+head", "lookup+recycling", "auto")


def speculative_table(path: Path, device: str, runs: int) -> str:
    """Plain vs each drafter on the GPU, benchmarks/speculative.py's categories, `runs` alternating runs each."""
    from speculative import CATEGORIES, messages_for, run_once

    from edge.engine import Engine
    from edge.speculative import CostCurve
    from edge.speculative.factory import auto_spec

    engines = {"plain": Engine(path, device=device, context_length=2048)}
    engines.update({d: Engine(path, device=device, context_length=2048, speculator=d) for d in DRAFTERS})
    drafters = DRAFTERS
    curve = CostCurve.cached(engines["plain"].decoder, engines["plain"].threads)
    lines = [f"## Speculative decoding on the GPU ({SPEC_TOKENS} tokens, edge kernels): tok/s, ratio to plain, "
             "tokens per target call; identical = every drafter's output equals plain greedy", "",
             "The package's cost curve here (S-token step / 1-token step): " +
             ", ".join(f"S={s} {r:.2f}" for s, r in curve.relative().items()) +
             f"; auto chose {auto_spec(engines['plain'])}.", "",
             "| category | prompt | plain tok/s | " + " | ".join(drafters) + " | identical |",
             "|---|---|---|" + "---|" * len(drafters) + "---|"]
    for category, prompts in CATEGORIES.items():
        for i, turns in enumerate(prompts):
            messages = messages_for(engines["plain"], turns, SPEC_TOKENS)
            done: dict[str, list] = {name: [] for name in engines}
            for _ in range(runs):
                for name, engine in engines.items():
                    done[name].append(run_once(engine, messages, SPEC_TOKENS))
            rate = {k: statistics.median(r["n"] / r["seconds"] for r in v) for k, v in done.items()}
            cells = []
            for d in drafters:
                st = done[d][-1]["spec"]
                per_call = (st.accepted + st.target_calls) / st.target_calls if st and st.target_calls else float("nan")
                cells.append(f"{rate[d]:.0f} ({rate[d] / rate['plain']:.2f}x, {per_call:.2f})")
            same = all(r["ids"] == done["plain"][-1]["ids"] for d in drafters for r in done[d])
            lines.append(f"| {category} | {i + 1} | {rate['plain']:.0f} | " + " | ".join(cells) +
                         f" | {'yes' if same else 'NO'} |")
            print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/edge-gpu-packages"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda", help="cuda (cpu only to try the script)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "decode_gpu.md")
    parser.add_argument("--speculative-package", type=int, default=0, help="which of PACKAGES (0 or 1) to speculate on")
    parser.add_argument("--no-peer", action="store_true", help="leave out transformers (a short device lease)")
    parser.add_argument("--no-speculative", action="store_true", help="leave out the speculative table")
    args = parser.parse_args()
    from edge.model import Decoder
    from edge.package import load_package
    from edge.tokenizer import Tokenizer

    paths = export(args.gguf, args.work)
    packages = {name: load_package(p) for name, p in paths.items()}
    ids = Tokenizer(next(iter(packages.values())).tokenizer_path).encode(PROMPT)
    decoders = {name: Decoder(p, context_length=1024, device=args.device) for name, p in packages.items()}
    for d in decoders.values():  # warm-up: CUDA kernels loaded, allocator grown
        greedy(d, ids[:32], 8)
    results: dict[str, dict[str, list]] = {name: {"prefill": [], "decode": [], "steps": []} for name in decoders}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.runs):
        for name, d in decoders.items():
            toks, prefill, decode = greedy(d, ids, NEW_TOKENS)
            tokens[name] = toks
            results[name]["prefill"].append(prefill)
            results[name]["decode"].append(decode)
            results[name]["steps"].append(step_costs(d, toks))
    lines = [f"## Decode on the GPU: {len(ids)}-token prompt, {NEW_TOKENS} greedy tokens, medians of {args.runs} runs",
             "", "| package | prefill tok/s | decode tok/s | step M=2 / M=1 | M=4 | M=8 | M=16 | 1-token step ms |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        steps = {m: statistics.median(s[m] for s in r["steps"]) for m in STEP_ROWS}
        lines.append(f"| {name} | {len(ids) / statistics.median(r['prefill']):.0f} | "
                     f"{NEW_TOKENS / statistics.median(r['decode']):.1f} | " +
                     " | ".join(f"{steps[m] / steps[1]:.2f}" for m in STEP_ROWS[1:]) + f" | {steps[1] * 1e3:.2f} |")
    del decoders
    if args.device == "cuda" and not args.no_peer:
        lines += transformers_peer(args.gguf, ids, args.runs)
    lines += ["", "GPU greedy tokens vs the CPU's (same package, first 32 tokens; the CPU quantizes activations to "
              "int8 where the package asks for accuracy_level 4, the GPU keeps them float32):", ""]
    for name, package in packages.items():
        lines.append(f"- {name}: " + compare_with_cpu(Decoder(package, context_length=1024, device="cpu"), ids,
                                                       tokens[name][:32]))
    if not args.no_speculative:
        spec_name = list(PACKAGES)[args.speculative_package]
        lines += ["", f"Speculating on: {spec_name}", speculative_table(paths[spec_name], args.device, args.runs)]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
