"""Speculative decoding when sampling: speed against plain sampling on the speculative benchmark's prompts.

    python benchmarks/speculative_sampled.py [--temperature 0.7] [--draft auto] [--reps 6] [--tokens 64]

benchmarks/speculative.py measures greedy decoding, where a draft token passes when it is the target's argmax. When
sampling, a deterministic drafter's token passes with the target's probability of it (rejection sampling), so fewer
pass. Each prompt is generated plain and speculative in alternating order, `--reps` times with seeds 0..reps-1 (the
two runs of a seed differ in text: rejection sampling draws from the same distribution with other random numbers);
a prompt's ratio is the median over reps of speculative tok/s over plain tok/s, a category's the geometric mean.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from speculative import CATEGORIES, messages_for  # noqa: E402


def tokens_per_second(engine, messages, tokens: int, temperature: float, seed: int) -> float:
    engine.reset()
    for _ in engine.chat(messages, max_tokens=tokens, temperature=temperature, seed=seed):
        pass
    return engine.stats.generated_tokens / engine.stats.generate_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    from edge.default_model import default_package, default_quant
    from edge.engine import Engine
    from edge.speculative import make_speculator

    engine = Engine(default_package(default_quant()), threads=args.threads)
    spec = make_speculator(args.draft, engine)
    spec.prepare(engine.decoder)
    print(f"| category | {args.draft} x plain, temperature {args.temperature} ({args.reps} reps, {args.tokens} tokens) |")
    print("|---|---|")
    for category, prompts in CATEGORIES.items():
        per_prompt = []
        for turns in prompts:
            messages = messages_for(engine, turns, args.tokens)
            ratios = []
            for seed in range(args.reps):
                tps = {}
                for name in ("plain", "spec") if seed % 2 == 0 else ("spec", "plain"):
                    engine.speculator = spec if name == "spec" else None
                    tps[name] = tokens_per_second(engine, messages, args.tokens, args.temperature, seed)
                ratios.append(tps["spec"] / tps["plain"])
            per_prompt.append(statistics.median(ratios))
        print(f"| {category} | {math.exp(sum(map(math.log, per_prompt)) / len(per_prompt)):.2f} |", flush=True)


if __name__ == "__main__":
    main()
