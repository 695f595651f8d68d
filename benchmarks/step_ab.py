"""A/B of CPU kernel libraries on the whole default model: what one decoder step over S tokens costs with each.

    python benchmarks/step_ab.py OLD.so NEW.so [MORE.so ...] [--rounds 8] [--past 200]

Each library runs in fresh processes (EDGE_KERNELS_LIBRARY), in alternating order round by round, so a busy
neighbour slows all of them alike. Each process times steps of 1-16 tokens on top of a `past`-token cache, the
cache trimmed back after each, two ways: in runs of 20 steps of one size (the steady state, as plain decoding
runs its 1-token steps) and with the sizes taking turns (CostCurve.measure, what the speculative policy uses; its
1-token cost is that of a short run of them since session 14: a 1-token step right after a larger one costs 5-17%
more, measured on a Zen 5). Prints the median over rounds of each size's time and its ratio to
the 1-token step. Build a library to compare with `python kernels/build.py --no-cuda` and copy
kernels/libedge_kernels.so away first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SIZES = (1, 2, 4, 6, 8, 9, 12, 16)  # 9: a draft of 8 tokens and its root
WORKER = """
import json, sys, time
import numpy as np
from edge.default_model import default_package
from edge.engine import Engine
from edge.speculative import CostCurve
sizes, past = tuple(json.loads(sys.argv[1])), int(sys.argv[2])
engine = Engine(default_package("int4-edge"), threads=2)
engine.generate("Hello there", max_tokens=4)
decoder = engine.decoder
decoder.step([i % 1000 + 5 for i in range(past - decoder.cache.length)])
base = decoder.cache.length
runs = {}
for size in sizes:
    times = []
    for _ in range(21):  # the first of a run is a transition from the size before
        start = time.perf_counter()
        decoder.step([7 * i % 1000 + 11 for i in range(size)], logits_rows=list(range(size)))
        times.append(time.perf_counter() - start)
        decoder.cache.trim(base)
    runs[size] = float(np.median(times[1:]))
curve = CostCurve.measure(decoder, sizes=sizes, past=past, repeats=15)
print(json.dumps({"runs": runs, "turns": dict(zip(curve.sizes, curve.seconds))}))
"""


def measure(library: str, past: int) -> dict[str, dict[str, float]]:
    env = {**os.environ, "EDGE_KERNELS_LIBRARY": library}
    run = subprocess.run([sys.executable, "-c", WORKER, json.dumps(SIZES), str(past)], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="+")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--past", type=int, default=200)
    args = parser.parse_args()
    if len(set(args.libraries)) != len(args.libraries):
        parser.error("name each library once")
    results: dict[str, list[dict]] = {lib: [] for lib in args.libraries}
    for round_ in range(args.rounds):
        for lib in args.libraries if round_ % 2 == 0 else args.libraries[::-1]:
            results[lib].append(measure(lib, args.past))
    for lib, rounds in results.items():
        for way in ("runs", "turns"):
            median = {size: statistics.median(r[way][size] for r in rounds) for size in rounds[0][way]}
            one = median["1"]
            print(f"{lib} ({way}): " + ", ".join(f"S={s} {t * 1e3:.2f} ms ({t / one:.2f}x)" for s, t in median.items()))


if __name__ == "__main__":
    main()
