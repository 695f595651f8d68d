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

    python benchmarks/step_ab.py A.so B.so --paired [--pairs 150] [--past 200] [--package DIR]
    python benchmarks/step_ab.py PACKAGE_A PACKAGE_B --paired   # two exports of the model, the same library

--paired: both libraries in one process, an engine each (EDGE_SPIN=run, so the idle engine's workers do not spin on
the cores the other needs), their steps alternating A, B, A, B at each size, each timed step after a transition
step of its own. Prints per size the median of B/A over the pairs: a pair is ~20 ms apart, so the machine's pace,
which drifts over seconds (1-token steps of 3.8 to 8.2 ms within an hour on the Intel Xeon of sessions 17-20),
cancels out. Naming one library twice shows the method's resolution: medians of B/A 0.997-1.008 at every size on
that Xeon at 150 pairs (under a minute), against run-to-run swings of 5-10% in the fresh-process mode. A folder
(a package: manifest.json inside) in place of a library compares two graphs of the model on the installed library.

    python benchmarks/step_ab.py LIB LIB --paired --a-env EDGE_TEAM=0   # onnxruntime's threads (A) vs the team (B)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

SIZES = (1, 2, 4, 6, 8, 9, 12, 16)  # 9: a draft of 8 tokens and its root

# What both workers share: an engine on the default package with a `past`-token cache, and one timed step of
# `size` tokens on top of it, the cache trimmed back after.
COMMON = """
import json, os, shutil, sys, tempfile, time
from edge.default_model import default_package
from edge.engine import Engine

def ready_decoder(past, package=None):
    engine = Engine(package or default_package("int4-edge"), threads=2)
    engine.generate("Hello there", max_tokens=4)
    decoder = engine.decoder
    decoder.step([j % 1000 + 5 for j in range(past - decoder.cache.length)])
    return decoder, decoder.cache.length

def timed_step(decoder, base, size):
    start = time.perf_counter()
    decoder.step([7 * j % 1000 + 11 for j in range(size)], logits_rows=list(range(size)))
    seconds = time.perf_counter() - start
    decoder.cache.trim(base)
    return seconds
"""
WORKER = COMMON + """
import numpy as np
from edge.speculative import CostCurve
sizes, past = tuple(json.loads(sys.argv[1])), int(sys.argv[2])
decoder, base = ready_decoder(past, sys.argv[3] or None)
runs = {}
for size in sizes:
    times = [timed_step(decoder, base, size) for _ in range(21)]  # the first: a transition from the size before
    runs[size] = float(np.median(times[1:]))
curve = CostCurve.measure(decoder, sizes=sizes, past=past, repeats=15)
print(json.dumps({"runs": runs, "turns": dict(zip(curve.sizes, curve.seconds))}))
"""
PAIRED_WORKER = COMMON + """
libraries, sizes, past, pairs = json.loads(sys.argv[1]), tuple(json.loads(sys.argv[2])), int(sys.argv[3]), int(sys.argv[4])
package, a_env = sys.argv[5] or None, json.loads(sys.argv[6])
os.environ["EDGE_SPIN"] = "run"
folder = tempfile.mkdtemp()
decoders = []
for i, library in enumerate(libraries):
    env = dict(os.environ)
    os.environ.update(a_env if i == 0 else {})  # while engine A's sessions are created
    if os.path.isdir(library):  # a package on the installed library
        decoders.append(ready_decoder(past, library))
    else:
        copy = os.path.join(folder, f"lib{i}.so")  # a path of its own: the same file twice would be loaded once
        shutil.copy(library, copy)
        os.environ["EDGE_KERNELS_LIBRARY"] = copy
        decoders.append(ready_decoder(past, package))
    os.environ.clear()
    os.environ.update(env)
shutil.rmtree(folder)
times = {f"{w}/{s}": [] for w in (0, 1) for s in sizes}
for n in range(pairs):
    for size in sizes:
        for which in ((0, 1) if n % 2 == 0 else (1, 0)):
            timed_step(*decoders[which], size)  # a transition from the size before
            times[f"{which}/{size}"].append(timed_step(*decoders[which], size))
print(json.dumps(times))
"""


def paired(libraries: list[str], past: int, pairs: int, package: str = "",
           a_env: dict[str, str] | None = None) -> None:
    run = subprocess.run([sys.executable, "-c", PAIRED_WORKER, json.dumps(libraries), json.dumps(SIZES), str(past),
                          str(pairs), package, json.dumps(a_env or {})], capture_output=True, text=True, check=True)
    times = json.loads(run.stdout.strip().splitlines()[-1])
    a, b = libraries
    for size in SIZES:
        ta, tb = times[f"0/{size}"], times[f"1/{size}"]
        ratios = [y / x for x, y in zip(ta, tb)]
        print(f"S={size}: A {statistics.median(ta) * 1e3:.2f} ms, B {statistics.median(tb) * 1e3:.2f} ms, B/A "
              f"{statistics.median(ratios):.3f} (median of {len(ratios)} pairs; geometric mean "
              f"{math.exp(statistics.fmean(math.log(r) for r in ratios)):.3f})")
    for name, which in ((a, 0), (b, 1)):
        one = statistics.median(times[f"{which}/1"])
        print(f"{name}: " + ", ".join(f"S={s} {statistics.median(times[f'{which}/{s}']) / one:.2f}x" for s in SIZES[1:]))


def measure(library: str, past: int, package: str = "") -> dict[str, dict[str, float]]:
    env = {**os.environ, "EDGE_KERNELS_LIBRARY": library}
    run = subprocess.run([sys.executable, "-c", WORKER, json.dumps(SIZES), str(past), package], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("libraries", nargs="+")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--past", type=int, default=200)
    parser.add_argument("--paired", action="store_true", help="two libraries in one process, steps alternating")
    parser.add_argument("--pairs", type=int, default=150)
    parser.add_argument("--package", default="", help="the package the libraries run (default: the default model's)")
    parser.add_argument("--a-env", action="append", default=[], metavar="KEY=VALUE",
                        help="--paired: set while engine A is created (EDGE_TEAM=0: A on onnxruntime's threads)")
    args = parser.parse_args()
    if args.paired:
        if len(args.libraries) != 2:
            parser.error("--paired compares exactly two libraries (the same one twice: the method's resolution)")
        return paired(args.libraries, args.past, args.pairs, args.package,
                      dict(item.split("=", 1) for item in args.a_env))
    if len(set(args.libraries)) != len(args.libraries):
        parser.error("name each library once")
    results: dict[str, list[dict]] = {lib: [] for lib in args.libraries}
    for round_ in range(args.rounds):
        for lib in args.libraries if round_ % 2 == 0 else args.libraries[::-1]:
            results[lib].append(measure(lib, args.past, args.package))
    for lib, rounds in results.items():
        for way in ("runs", "turns"):
            median = {size: statistics.median(r[way][size] for r in rounds) for size in rounds[0][way]}
            one = median["1"]
            print(f"{lib} ({way}): " + ", ".join(f"S={s} {t * 1e3:.2f} ms ({t / one:.2f}x)" for s, t in median.items()))


if __name__ == "__main__":
    main()
