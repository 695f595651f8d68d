"""edge-serve [MODEL]: an OpenAI-compatible server on 127.0.0.1 (edge.server).

    edge-serve --port 8000 --draft auto
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "Hi!"}], "stream": true}'

Any OpenAI client works with base_url http://127.0.0.1:8000/v1 (the API key is not checked unless --api-key is
given). With no MODEL the default model is used (fetched and exported once into ~/.cache/edge).
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from edge.apps.cli import VersionAction, int_at_least, run_main
from edge.apps.run import budget_options, draft_options


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edge-serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=VersionAction)
    p.add_argument("model", nargs="?", help="package folder or its model.onnx, or a GGUF file or Hugging Face folder "
                                            "(exported once into ~/.cache/edge); default: the default model")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    p.add_argument("--port", type=int_at_least(0), default=8000)
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("--model-name", help="the model id clients see (default: the package folder's name)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="let scripts of web pages from ORIGIN (e.g. http://localhost:3000) call the API from a "
                        "browser (CORS; repeatable); '*' lets any website you visit use the model")
    p.add_argument("--context", type=int_at_least(1),
                   help="context length to allocate (default: min(model, 2048), or planned)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--budget", help="memory budget (e.g. 2GiB, 512MB): the context and buffers are planned to fit")
    p.add_argument("--profile", help="device profile name (see edge-profile --list): its memory is the budget")
    p.add_argument("--kv-dtype", choices=["float32", "float16"],
                   help="KV cache type (default: the package's): float16 halves the cache's memory and speeds long "
                        "chats on the CPU (1-token steps 25%% faster at 2,000 tokens of SmolLM2; +0.35%% "
                        "perplexity); packages exported with edge's kernels, float16 on the CPU only")
    p.add_argument("--threads", type=int_at_least(1))
    p.add_argument("--on-full", choices=["error", "slide"], default="error",
                   help="a conversation longer than the context: refuse it (default, as OpenAI does) or drop its "
                        "oldest turns")
    p.add_argument("--draft", metavar="DRAFTER", help="speculative decoding, as edge-run --draft (e.g. auto)")
    p.add_argument("--prefix-slots", type=int_at_least(0),
                   help="other conversations whose cached prefixes are kept while clients take turns (default 4 on "
                        "the CPU without a budget, else 0; each holds its tokens' share of the KV cache)")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warm_up(engine) -> None:
    """What a first request would otherwise wait for: onnxruntime's first-run allocations and, with --draft, the
    speculator's cost curve (measured once per package and machine, ~1 s)."""
    if engine.speculator is not None:
        engine.speculator.prepare(engine.decoder)
    engine.generate("Hello", max_tokens=1)
    engine.reset()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    def run() -> None:
        from edge.engine import Engine
        from edge.server import make_server

        planned = args.budget is not None or args.profile is not None
        slots = args.prefix_slots if args.prefix_slots is not None else (0 if planned or args.device != "cpu" else 4)
        engine = Engine(args.model, device=args.device, context_length=args.context, threads=args.threads,
                        kv_dtype=args.kv_dtype, prefix_slots=slots, **budget_options(args), **draft_options(args))
        server = make_server(engine, args.host, args.port, args.model_name, args.api_key, args.on_full,
                             tuple(args.allow_origin))
        warm_up(engine)
        host, port = server.server_address[:2]
        if not is_loopback(args.host):
            print(f"edge-serve: warning: listening on {host}, so anyone who can reach this machine can use the "
                  f"model{'' if args.api_key else '; consider --api-key'}", file=sys.stderr)
        print(f"edge-serve: {server.RequestHandlerClass.service.model_id} on http://{host}:{port}/v1 "
              f"(context {engine.context_length} tokens); Ctrl-C stops", file=sys.stderr, flush=True)
        try:
            server.serve_forever()
        finally:
            server.server_close()

    return run_main(run, "edge-serve")


if __name__ == "__main__":
    sys.exit(main())
