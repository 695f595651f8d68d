"""A/B of CPU kernel libraries on the whole default model: what one decoder step over S tokens costs with each.

    python benchmarks/step_ab.py OLD.so NEW.so [MORE.so ...] [--rounds 8] [--past 200]

Each library runs in fresh processes (EDGE_KERNELS_LIBRARY), in alternating order round by round, so a busy
neighbour slows all of them alike; each process times steps of 1-16 tokens on top of a `past`-token cache
(CostCurve.measure: sizes take turns, the cache is trimmed back after each). Prints the median over rounds of each
size's time and its ratio to the 1-token step: the verify cost curve speculative decoding pays. Build a library to
compare with `python kernels/build.py --no-cuda` and copy kernels/libedge_kernels.so away first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SIZES = (1, 2, 4, 6, 8, 12, 16)
WORKER = """
import json, sys
from edge.default_model import default_package
from edge.engine import Engine
from edge.speculative import CostCurve
engine = Engine(default_package("int4-edge"), threads=2)
engine.generate("Hello there", max_tokens=4)
curve = CostCurve.measure(engine.decoder, sizes=tuple(json.loads(sys.argv[1])), past=int(sys.argv[2]), repeats=15)
print(json.dumps(dict(zip(curve.sizes, curve.seconds))))
"""


def measure(library: str, past: int) -> dict[str, float]:
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
    runs: dict[str, list[dict[str, float]]] = {lib: [] for lib in args.libraries}
    for round_ in range(args.rounds):
        for lib in args.libraries if round_ % 2 == 0 else args.libraries[::-1]:
            runs[lib].append(measure(lib, args.past))
    for lib, results in runs.items():
        median = {size: statistics.median(r[size] for r in results) for size in results[0]}
        one = median["1"]
        print(lib + ": " + ", ".join(f"S={s} {t * 1e3:.2f} ms ({t / one:.2f}x)" for s, t in median.items()))


if __name__ == "__main__":
    main()
