"""edge-run [MODEL] [PROMPT]: stream a reply, or chat with --chat.

With no MODEL the default model (SmolLM2-135M-Instruct, int4) is downloaded and exported once into ~/.cache/edge.
A prompt goes through the model's chat template as one user message unless --raw is given.
"""

from __future__ import annotations

import argparse
import os
import sys

from edge.apps.cli import VersionAction, float_in, int_at_least, run_main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edge-run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=VersionAction)
    p.add_argument("model", nargs="?", help="package folder or its model.onnx, or a GGUF file or Hugging Face folder "
                                            "(exported once into ~/.cache/edge); default: the default model")
    p.add_argument("prompt", nargs="?", help="prompt text (default: read stdin, or chat when stdin is a terminal)")
    p.add_argument("--chat", action="store_true", help="interactive chat; /reset forgets, /exit or Ctrl-D quits")
    p.add_argument("--system", help="system message for the chat template")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    p.add_argument("--stats", action="store_true", help="print prompt and generation tokens/s and peak memory")
    p.add_argument("-n", "--max-tokens", type=int_at_least(1), default=256)
    p.add_argument("--temperature", type=float_in(0.0, float("inf")), default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int_at_least(0), default=0, help="0 = no top-k cut (default)")
    p.add_argument("--top-p", type=float_in(0.0, 1.0, low_open=True), default=1.0)
    p.add_argument("--seed", type=int_at_least(0))
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--context", type=int_at_least(1),
                   help="context length to allocate (default: min(model, 2048), or planned)")
    p.add_argument("--truncate", action="store_true", help="drop the oldest prompt tokens if it does not fit")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--budget", help="memory budget (e.g. 2GiB, 512MB): the context and buffers are planned to fit")
    p.add_argument("--profile", help="device profile name (see edge-profile --list): its memory is the budget")
    p.add_argument("--on-full", choices=["error", "slide"], default="error",
                   help="a chat that fills the context: stop with an error (default) or drop the oldest turns")
    p.add_argument("--kv-dtype", choices=["float32", "float16"],
                   help="KV cache type (default: the package's): float16 halves the cache's memory and speeds long "
                        "chats on the CPU (1-token steps 25%% faster at 2,000 tokens of SmolLM2; +0.35%% "
                        "perplexity); packages exported with edge's kernels, float16 on the CPU only")
    p.add_argument("--threads", type=int_at_least(1))
    p.add_argument("--draft", metavar="DRAFTER",
                   help="speculative decoding: prompt-lookup, recycling, lookup+recycling, head (the package's trained "
                        "draft head, see edge-export --draft-head), lookup+head, auto (lookup+head on a CPU, "
                        "lookup+recycling on a GPU or for a package without a head), skip (the package's "
                        "skip-layer self-draft, see edge-export --self-draft), lookup+skip, or a draft package's "
                        "folder, GGUF file or Hugging Face folder (same tokenizer; prompt lookup first, the draft "
                        "model otherwise)")
    p.add_argument("--draft-length", type=int_at_least(1),
                   help="fixed draft depth (default: adaptive, from the measured cost of verifying)")
    return p


def split_model_and_prompt(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """`edge-run "Hello"` means the default model: a lone positional that is not a path is the prompt."""
    if args.model is not None and args.prompt is None and not os.path.exists(args.model):
        return None, args.model
    return args.model, args.prompt


def budget_options(args: argparse.Namespace) -> dict:
    """Engine keywords for --budget/--profile (a profile alone is the budget; with --budget it sets the device)."""
    if args.budget is None and args.profile is None:
        return {}
    return {"budget": args.budget if args.budget is not None else args.profile, "profile": args.profile}


def draft_options(args: argparse.Namespace) -> dict:
    """Engine keywords for --draft."""
    return {} if args.draft is None else {"speculator": args.draft}


def print_stats(engine) -> None:
    s = engine.stats
    kv = "" if engine.package.kv_dtype == "float32" else f" | KV cache {engine.package.kv_dtype}"
    print(f"\n[prompt {s.prompt_tokens} tokens ({s.reused_tokens} cached) {s.prompt_tokens_per_second:.1f} tok/s | "
          f"generated {s.generated_tokens} tokens {s.generate_tokens_per_second:.1f} tok/s | "
          f"finish {s.finish_reason} | peak RSS {s.peak_rss_bytes() / 2**20:.0f} MiB{kv}]", file=sys.stderr)
    if s.speculative is not None:
        print(f"[speculative ({engine.speculator.name}): {s.speculative.summary()}]", file=sys.stderr)


def stream_out(pieces) -> str:
    text = []
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
        text.append(piece)
    sys.stdout.write("\n")
    return "".join(text)


def chat_loop(engine, args, config) -> None:
    messages = [{"role": "system", "content": args.system}] if args.system else []
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        if line.strip() in ("/exit", "/quit"):
            return
        if line.strip() == "/reset":
            messages = messages[:1] if args.system else []
            engine.reset()
            continue
        messages.append({"role": "user", "content": line})
        reply = stream_out(engine.chat(messages, config))
        messages.append({"role": "assistant", "content": reply})
        if engine.stats.finish_reason == "context":
            print(f"[the context of {engine.context_length} tokens is full: /reset to start over, or use "
                  f"--on-full slide to drop the oldest turns]", file=sys.stderr)
        if args.stats:
            print_stats(engine)


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_intermixed_args(argv)  # flags may sit between MODEL and PROMPT
    if args.draft_length is not None and args.draft is None:
        p.error("--draft-length sets the depth of --draft's drafts; give --draft too (e.g. --draft auto)")

    def run() -> None:
        from edge.engine import Engine, GenerationConfig

        model, prompt = split_model_and_prompt(args)
        config = GenerationConfig(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), truncate=args.truncate,
                                  on_full=args.on_full)
        engine = Engine(model, device=args.device, context_length=args.context, threads=args.threads,
                        kv_dtype=args.kv_dtype, **budget_options(args), **draft_options(args))
        if engine.speculator is not None and args.draft_length is not None:
            engine.speculator.draft_length = args.draft_length
        if args.chat or (prompt is None and sys.stdin.isatty()):
            return chat_loop(engine, args, config)
        if prompt is None:
            prompt = sys.stdin.read()
        if args.raw or engine.template is None:
            stream_out(engine.stream(prompt, config))
        else:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": prompt}]
            stream_out(engine.chat(messages, config))
        if args.stats:
            print_stats(engine)

    return run_main(run, "edge-run")


if __name__ == "__main__":
    sys.exit(main())
