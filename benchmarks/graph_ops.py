"""Do the graph choices of export/builder.py pay? Each variant is the default int4 package with one choice undone.

    python benchmarks/graph_ops.py [--runs 3] [--threads 2]

Variants: the default (fused q/k/v and gate/up matmuls, MatMulNBits accuracy level 4, int4 tied embedding and head
through GatherBlockQuantized + MatMulNBits, attention_bias input for draft trees), unfused projections, accuracy
level 0, a float32 embedding and head, and no attention_bias input. Same measurement as decode.py (fresh process per
run, interleaved, medians).
"""

from __future__ import annotations

import argparse
import statistics

import decode  # benchmarks/decode.py: prompt, worker subprocess and cache folder

VARIANTS = {
    "default": {},
    "unfused q/k/v and gate/up": {"fuse_projections": False},
    "MatMulNBits accuracy_level 0": {"accuracy_level": 0},
    "float32 embedding and head": {"float_embedding": True},
    "no attention_bias input": {"tree_attention": False},
}


def export_variant(name: str, overrides: dict):
    from edge.default_model import default_gguf
    from edge.export.gguf import load_gguf
    from edge.export.pipeline import build_options, export_model

    target = decode.cache_root() / "graph-ops" / name.replace(" ", "-").replace("/", "-")
    if (target / "manifest.json").exists():
        return target
    overrides = dict(overrides)
    tree = overrides.pop("tree_attention", True)
    if overrides.pop("float_embedding", False):
        quantize = build_options("int4", tree)[0].quantizer
        overrides["quantizer"] = lambda layer, w: None if layer == "model.embed_tokens" else quantize(layer, w)
    return export_model(default_gguf(), target, quant="int4", tree_attention=tree, model=load_gguf(default_gguf()),
                        **overrides)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    paths = {name: export_variant(name, overrides) for name, overrides in VARIANTS.items()}
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    for _ in range(args.runs):
        for name, path in paths.items():
            runs[name].append(decode.measure("edge int4", path, args.threads))
    base = statistics.median(decode.NEW_TOKENS / r["decode_s"] for r in runs["default"])
    print(f"| int4 variant | prefill tok/s | decode tok/s | decode vs default | peak RSS MiB |  (medians of {args.runs})")
    print("|---|---|---|---|---|")
    for name, results in runs.items():
        prefill = statistics.median(r["prompt_tokens"] / r["prefill_s"] for r in results)
        dec = statistics.median(decode.NEW_TOKENS / r["decode_s"] for r in results)
        rss = statistics.median(r["peak_rss_mib"] for r in results)
        print(f"| {name} | {prefill:.0f} | {dec:.1f} | {dec / base:.2f}x | {rss:.0f} |")


if __name__ == "__main__":
    main()
