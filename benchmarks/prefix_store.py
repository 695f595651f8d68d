"""What saved conversation prefixes (edge.prefix_store) spare two conversations that take turns on one engine.

    python benchmarks/prefix_store.py [--rounds 2] [--turns 4] [--threads 2]

Two chats of ~950 tokens each (the decode benchmark's prompt four times, opened by a different number), answered in
turns, 32 tokens a reply; from the second turn on, each prompt follows the other chat's reply. Prints, per setting,
the median time to read a prompt after a switch and the prompt tokens taken from the cache; settings alternate by
round, each in a fresh Engine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from decode import PROMPT  # noqa: E402


def measure(slots: int, turns: int, threads: int) -> tuple[float, float, int]:
    from edge.default_model import default_package, default_quant
    from edge.engine import Engine

    engine = Engine(default_package(default_quant()), threads=threads, prefix_slots=slots)
    chats = [[{"role": "user", "content": f"({k}) " + PROMPT * 4}] for k in range(2)]
    seconds, reused = [], []
    for turn in range(turns):
        for messages in chats:
            text = "".join(engine.chat(messages, max_tokens=32))
            if turn:
                seconds.append(engine.stats.prompt_seconds)
                reused.append(engine.stats.reused_tokens)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Say more."}]
    return statistics.median(seconds), statistics.median(reused), engine.stats.prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print("| prefix slots | prompt after a switch (median) | prompt tokens from the cache | prompt tokens |")
    print("|---|---|---|---|")
    for _ in range(args.rounds):
        for slots in (0, 4):
            seconds, reused, total = measure(slots, args.turns, args.threads)
            print(f"| {slots} | {seconds * 1e3:.0f} ms | {reused:.0f} | {total} |", flush=True)


if __name__ == "__main__":
    main()
