"""Decoding after a long conversation: edge (float32 and float16 KV cache, plain and `--draft auto`) against
llama.cpp's plain decoding of the same GGUF, on the same prompt ids.

    python benchmarks/long_context.py [--pasts 200 1000 2000] [--tokens 64] [--reps 3] [--out FILE]

A short benchmark prompt reads a few MB of KV cache a step; a chat that has gone on for a while reads more than the
weights (SmolLM2 in float32: 92 MB at 2,000 tokens against 84 MB of int4 weights). Each prompt is a conversation of
earlier turns (the speculative benchmark's passage as every answer) cut to about `past` tokens, then an open
question. Decode speed only (from the first generated token on), greedy; the systems take turns within each rep,
rotated each rep. llama.cpp keeps its cache in float16 (its default) and runs with 1 and with 2 threads: on this
VM its 2 threads have measured 103 tok/s (session 37) and 41 tok/s (session 38, 72 with 1 thread), so ratios are
to the faster of the two in the same run. llama-cpp-python is a bench dependency (see benchmarks/llamacpp_lookup.py
for building its wheel).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_lookup import LlamaCpp, edge_encoder  # noqa: E402
from speculative import PASSAGE  # noqa: E402

QUESTION = "Thanks. Now tell me about the history of the bicycle."


def conversation(encode, past: int) -> list[dict]:
    """Earlier turns until the rendered prompt holds about `past` tokens, then the question."""
    messages: list[dict] = []
    while True:
        turn = [{"role": "user", "content": f"Tell me something about topic {len(messages) // 2 + 1}."},
                {"role": "assistant", "content": PASSAGE}]
        if len(encode(messages + turn + [{"role": "user", "content": QUESTION}])) > past and messages:
            return messages + [{"role": "user", "content": QUESTION}]
        messages += turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pasts", type=int, nargs="+", default=[200, 1000, 2000])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "long_context.md")
    args = parser.parse_args()

    from edge.default_model import default_gguf, default_package
    from edge.engine import Engine
    from edge.speculative import make_speculator

    context = max(args.pasts) + args.tokens + 64
    encode, _, eos = edge_encoder()
    peers = {f"llama.cpp, {n} thread{'s' if n > 1 else ''}": LlamaCpp(Path(default_gguf()), threads=n, eos=eos,
                                                                      context=context)
             for n in sorted({1, args.threads})}
    engines = {"edge, float32 cache": Engine(default_package("int4-edge"), threads=args.threads,
                                             context_length=context),
               "edge, float16 cache": Engine(default_package("int4-edge"), threads=args.threads,
                                             context_length=context, kv_dtype="float16")}  # edge-run --kv-dtype
    auto = {name: make_speculator("auto", engine) for name, engine in engines.items()}
    for spec, engine in zip(auto.values(), engines.values()):
        spec.prepare(engine.decoder)

    def run_edge(name: str, draft: bool, messages: list[dict]) -> float:
        engine = engines[name]
        engine.speculator = auto[name] if draft else None
        engine.reset()
        "".join(engine.chat(messages, max_tokens=args.tokens))
        return engine.stats.generate_tokens_per_second

    systems = {**{name: None for name in peers}, **{n: (n, False) for n in engines},
               **{f"{n}, --draft auto": (n, True) for n in engines}}
    rows = []
    for past in args.pasts:
        messages = conversation(encode, past)
        ids = encode(messages)
        for llm in peers.values():
            llm.generate(ids, 4)  # warm up at this size
        speeds: dict[str, list[float]] = {name: [] for name in systems}
        order = list(systems)
        for rep in range(args.reps):
            for name in order[rep % len(order):] + order[:rep % len(order)]:
                if systems[name] is None:
                    out = peers[name].generate(ids, args.tokens)
                    speeds[name].append(len(out.ids) / out.seconds)
                else:
                    speeds[name].append(run_edge(*systems[name], messages))
        medians = {name: statistics.median(v) for name, v in speeds.items()}
        rows.append((len(ids), medians))
        print(len(ids), {k: round(v, 1) for k, v in medians.items()}, file=sys.stderr, flush=True)

    names = list(systems)
    lines = [f"# Decoding after a long conversation (SmolLM2-135M-Instruct Q4_1 GGUF, {args.threads} threads, greedy, "
             f"{args.tokens} new tokens, median of {args.reps} reps, systems taking turns)", "",
             "Decode tok/s (from the first generated token on); in brackets the ratio to llama.cpp's plain decoding "
             "of the same prompt ids with the faster of its thread counts.", "",
             "| prompt tokens | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for tokens, medians in rows:
        peer = max(medians[name] for name in peers)
        lines.append(f"| {tokens} | " + " | ".join(f"{medians[n]:.1f} ({medians[n] / peer:.2f}x)" for n in names)
                     + " |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
