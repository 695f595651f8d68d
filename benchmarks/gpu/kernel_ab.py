"""A/B of CUDA kernel libraries at the kernel level: edge_qmatmul_cuda through torch (benchmarks/kernels_cuda.py's
KernelBench), each library in fresh processes, in alternating order, after warming the GPU. Prints one SmolLM2 step's
matmuls (30 layers + lm_head, 4-bit group 32) per M and every shape's median. This is how session 12 found session 8's
kernel 1.26-1.46x slower than session 6's (benchmarks/RESULTS.md).

    python benchmarks/gpu/kernel_ab.py OLD.so NEW.so [MORE.so ...]    # ROUNDS=3; PYTHONPATH etc. as run.sh sets them
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

LAYER = [(576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576)]
HEAD = (576, 49152)
ROWS = (1, 2, 4, 8, 16)


def worker() -> None:
    """Kernel times (us) of the library in EDGE_KERNELS_LIBRARY for every shape and M, as one JSON line."""
    import numpy as np
    import torch

    sys.path.insert(0, "benchmarks")
    import kernels_cuda as kc

    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start = time.time()
    while time.time() - start < 1.5:  # clocks up before anything is timed
        x @ x
    torch.cuda.synchronize()
    bench = kc.KernelBench()
    timed = bench._time_graph
    bench._time_graph = lambda body, reps=7: timed(body, reps=25)
    rng = np.random.default_rng(0)
    out = {}
    for k, n in sorted(set(LAYER + [HEAD])):
        for r in bench.run(k, n, kc.weight_copies(k, n, rng), rng):
            out[f"{k}x{n}x{r['M']}"] = r["kernel"] * 1e6
    print("JSON" + json.dumps(out))


def measure(path: str) -> dict[str, float]:
    env = {**os.environ, "EDGE_KERNELS_LIBRARY": os.path.abspath(path)}
    run = subprocess.run([sys.executable, __file__, "--worker"], env=env, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.startswith("JSON")]
    if not lines:
        raise SystemExit(f"{path}: {run.stdout[-2000:]}{run.stderr[-3000:]}")
    return json.loads(lines[0][4:])


def main(paths: list[str]) -> None:
    names = "ABCDEFGH"[:len(paths)]
    print(dict(zip(names, paths)))
    res: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    for rnd in range(int(os.environ.get("ROUNDS", 3))):
        for name, path in (list(zip(names, paths)) if rnd % 2 == 0 else list(zip(names, paths))[::-1]):
            res[name].append(measure(path))
    for m in ROWS:
        step = {k: [30 * sum(d[f"{a}x{b}x{m}"] for a, b in LAYER) + d[f"{HEAD[0]}x{HEAD[1]}x{m}"] for d in v]
                for k, v in res.items()}
        med = {k: statistics.median(v) for k, v in step.items()}
        print(f"M={m}: step matmuls us " + " ".join(f"{k}={[round(v) for v in step[k]]}" for k in names) + " " +
              " ".join(f"{k}/A {med[k] / med['A']:.3f}" for k in names[1:]))
    for key in res["A"][0]:
        med = {k: statistics.median(d[key] for d in res[k]) for k in names}
        print(f"{key}: " + " ".join(f"{k} {v:.2f}" for k, v in med.items()) + " " +
              " ".join(f"{k}/A {med[k] / med['A']:.2f}" for k in names[1:]))


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main(sys.argv[1:])
