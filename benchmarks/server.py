"""What serving through HTTP costs: edge-serve against the same engine called in-process, on the default model.

    python benchmarks/server.py [--requests 20] [--tokens 128] [--threads 2]

Both run at once in processes of their own: `edge-serve --port 0`, asked with streamed chat requests from this
process (a client's view: from sending the request to the stream's last event), and a worker that runs the same
request through `Engine.chat`. Requests alternate between the two in ABBA order, one at a time with a pause for the
other's worker threads to stop spinning, and each pair gives a ratio: the machine's pace drifts by tens of percent
over a minute, which a comparison of two separate series would take for a difference. Each request is a new
conversation (its first words differ), so only the chat template's system prompt is reused from the cache.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from decode import PROMPT  # noqa: E402  (the decode benchmark's ~200-token prompt)

WORKER = """
import json, sys, time
from edge.engine import Engine, GenerationConfig
engine = Engine(threads=int(sys.argv[1]))
engine.generate("Hello", max_tokens=4)  # warm up
print("ready", flush=True)
for line in sys.stdin:
    prompt, tokens = json.loads(line)
    start = time.perf_counter()
    for _ in engine.chat([{"role": "user", "content": prompt}], GenerationConfig(max_tokens=tokens)):
        pass
    print(json.dumps([engine.stats.generated_tokens, time.perf_counter() - start]), flush=True)
"""


class InProcess:
    """Engine.chat in a worker process of its own, one request per line on its stdin."""

    def __init__(self, threads: int):
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def __call__(self, prompt: str, tokens: int) -> tuple[int, float]:
        self.proc.stdin.write(json.dumps([prompt, tokens]) + "\n")
        self.proc.stdin.flush()
        return tuple(json.loads(self.proc.stdout.readline()))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


class Served:
    """edge-serve in its own process, asked over HTTP with a streamed chat request."""

    def __init__(self, threads: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "edge.apps.serve", "--port", "0", "--threads",
                                      str(threads)], stderr=subprocess.PIPE, text=True)
        match = re.search(r"http://([\d.]+):(\d+)/v1", self.proc.stderr.readline())
        self.host, self.port = match[1], int(match[2])
        self("Hello", 4)  # warm up

    def __call__(self, prompt: str, tokens: int) -> tuple[int, float]:
        """Tokens generated and seconds until the stream's last event."""
        body = json.dumps({"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                           "max_tokens": tokens, "stream": True, "stream_options": {"include_usage": True}})
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        usage = None
        for line in conn.getresponse():
            if line.startswith(b"data: {") and b'"usage"' in line:
                usage = json.loads(line[6:])["usage"]
        seconds = time.perf_counter() - start
        conn.close()
        return usage["completion_tokens"], seconds

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    paths = {"edge-serve": Served(args.threads), "in-process": InProcess(args.threads)}
    rates: dict[str, list[float]] = {name: [] for name in paths}
    ratios = []
    try:
        for i in range(args.requests):
            prompt = f"({i}) " + PROMPT  # a new conversation: only the template's system prompt is cached
            order = list(paths) if i % 2 == 0 else list(paths)[::-1]  # ABBA: whoever goes second is not favoured
            got = {}
            for name in order:
                time.sleep(0.05)  # let the other process's worker threads stop spinning
                n, seconds = paths[name](prompt, args.tokens)
                got[name] = n / seconds
                rates[name].append(got[name])
            ratios.append(got["edge-serve"] / got["in-process"])
    finally:
        for path in paths.values():
            path.close()
    a, b = statistics.median(rates["edge-serve"]), statistics.median(rates["in-process"])
    print(f"| path | tok/s (prompt + up to {args.tokens} tokens, median of {args.requests}) |\n|---|---|")
    print(f"| Engine.chat in-process | {b:.1f} |\n| edge-serve, streamed over HTTP | {a:.1f} |")
    print(f"\nedge-serve / in-process, request by request: median {statistics.median(ratios):.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
