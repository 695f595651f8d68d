"""What sampling costs a decoded token: edge's plain and speculative decoding of the default model, greedy and at
common sampling settings, beside llama.cpp's decoding of the same GGUF with the same settings, in one run.

    python benchmarks/sampling.py [--reps 3] [--tokens 96] [--threads 2] [--out benchmarks/results/sampling.md]

A chat app or the OpenAI-compatible server samples (the server's temperature defaults to 1, as OpenAI's): there the
sampler runs once a token over the whole vocabulary (49,152 logits), and a verify call of speculative sampling once
a row. Settings: greedy, temperature 0.8 alone, with top-p 0.95, and with top-k 40 (llama.cpp's defaults are
these three together, with min-p 0.05; every other llama.cpp sampler is off here). Prompts: three open questions,
and a paragraph to rewrite twice (where speculation has something to copy), rendered by edge's chat template and
tokenized by edge's tokenizer, so llama.cpp sees the same ids. Every run starts from an empty cache; systems,
settings and prompts interleave run by run, so a noisy neighbour hits all alike. Reported per group: decode tok/s (median over prompts and reps), and each setting against the same
system's greedy decoding in the same run (x greedy: what sampling costs it). llama-cpp-python is optional (see
benchmarks/llamacpp_lookup.py for its wheel); without it the llama.cpp column is left out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_lookup import LlamaCpp, available, edge_encoder, machine, write_atomic  # noqa: E402

PASSAGE = ("The Eiffel Tower was built between 1887 and 1889 as the entrance arch for the 1889 World's Fair in Paris. It "
           "is 330 metres tall, was the tallest man-made structure in the world for 41 years, and is named after the "
           "engineer Gustave Eiffel, whose company designed and built it.")
# Open questions, where a drafter has little to copy, and a given paragraph rewritten, where prompt lookup has it all.
PROMPTS = {"open": ("Write a short story about a lost cat.", "Explain how a refrigerator works, step by step.",
                    "Give me three tips for learning a new language."),
           "rewrite": (f"Rewrite this paragraph in a formal tone:\n{PASSAGE}",
                       f"Rewrite this paragraph in simpler words:\n{PASSAGE}")}
# edge's settings (GenerationConfig fields) and llama.cpp's names for the same ones
SETTINGS = {
    "greedy": ({}, {}),
    "temperature 0.8": ({"temperature": 0.8}, {"temp": 0.8}),
    "temperature 0.8, top-p 0.95": ({"temperature": 0.8, "top_p": 0.95}, {"temp": 0.8, "top_p": 0.95}),
    "temperature 0.8, top-k 40": ({"temperature": 0.8, "top_k": 40}, {"temp": 0.8, "top_k": 40}),
}


def edge_systems(threads: int) -> dict:
    """Plain decoding and `edge-run --draft auto` of the default package: name -> run(prompt, settings, new_tokens,
    seed), one generation's tok/s."""
    from edge.default_model import default_package, default_quant
    from edge.engine import Engine

    systems = {}
    for name, speculator in (("edge", None), ("edge --draft auto", "auto")):
        engine = Engine(default_package(default_quant()), threads=threads, speculator=speculator)
        engine.generate("Hello", max_tokens=8)  # warm up (and a speculator's cost curve)

        def run(prompt: str, settings: dict, new_tokens: int, seed: int, engine=engine) -> float:
            engine.reset()
            "".join(engine.chat([{"role": "user", "content": prompt}], max_tokens=new_tokens, seed=seed,
                                **settings))
            return engine.stats.generate_tokens_per_second
        systems[name] = run
    return systems


def llamacpp_system(threads: int):
    """llama.cpp's plain decoding of the default GGUF, as edge_systems' runs, and its version."""
    from edge.default_model import default_gguf

    encode, _, eos = edge_encoder()
    llm = LlamaCpp(Path(default_gguf()), threads=threads, eos=eos)

    def run(prompt: str, settings: dict, new_tokens: int, seed: int) -> float:
        llm._plain.set_seed(seed)  # the plain context's sampler: LlamaCpp.generate uses it without a drafter
        return llm.generate(encode([{"role": "user", "content": prompt}]), new_tokens, sampling=settings).tps
    return run, llm.version


def measure(systems: dict, reps: int, new_tokens: int) -> dict:
    """(prompt group, system, setting) -> tok/s of every run."""
    speeds: dict = {}
    for rep in range(reps):
        for group, prompts in PROMPTS.items():
            for i, prompt in enumerate(prompts):
                for setting, (ours, theirs) in SETTINGS.items():
                    for name, run in systems.items():
                        settings = theirs if name == "llama.cpp" else ours
                        tps = run(prompt, settings, new_tokens, rep * 10 + i)
                        speeds.setdefault((group, name, setting), []).append(tps)
    return speeds


def report(speeds: dict, names: list[str], args, seconds: float, version: str | None) -> str:
    lines = [f"# Sampling's cost per decoded token (SmolLM2-135M-Instruct, {args.threads} threads, {args.tokens} new "
             f"tokens, {args.reps} reps)", "",
             f"`python benchmarks/sampling.py --reps {args.reps} --tokens {args.tokens}` on {machine()}, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds:.0f} s"
             + (f"; llama-cpp-python {version}" if version else "") + ". Median tok/s over the group's prompts and "
             "the reps; x greedy: against the same system's greedy decoding of the same prompts in this run."]
    median = {key: statistics.median(values) for key, values in speeds.items()}
    for group, prompts in PROMPTS.items():
        lines += ["", f"{group} ({len(prompts)} prompts):", ""]
        header = "| setting | " + " | ".join(f"{n} tok/s | x greedy" for n in names)
        if "llama.cpp" in names:
            header += " | edge / llama.cpp | edge --draft auto / llama.cpp"
        lines += [header + " |", "|---|" + "---|" * (2 * len(names) + (2 if "llama.cpp" in names else 0))]
        for setting in SETTINGS:
            cells = [f"{median[(group, n, setting)]:.1f} | "
                     f"{median[(group, n, setting)] / median[(group, n, 'greedy')]:.2f}" for n in names]
            if "llama.cpp" in names:
                cells += [f"{median[(group, n, setting)] / median[(group, 'llama.cpp', setting)]:.2f}"
                          for n in ("edge", "edge --draft auto")]
            lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sampling.md")
    args = parser.parse_args()
    systems, version = edge_systems(args.threads), None
    if available():
        systems["llama.cpp"], version = llamacpp_system(args.threads)
    else:
        print("llama-cpp-python is not installed: edge only", file=sys.stderr)
    start = time.perf_counter()
    speeds = measure(systems, args.reps, args.tokens)
    text = report(speeds, list(systems), args, time.perf_counter() - start, version)
    write_atomic(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
