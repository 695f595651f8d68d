"""GPU time per CUDA kernel of a prefill and of a decode step, for each of decode_gpu.py's packages: where the
fused graph's prefill loses to the unfused one (benchmarks/RESULTS.md, kernels, session 28), read off the GPU's own
activity record (torch.profiler's CUPTI tracing sees every kernel of the process, onnxruntime's included).

    bash benchmarks/gpu/run.sh python benchmarks/gpu/kernel_times.py [--work /tmp/edge-gpu-packages]
        (after decode_gpu.py has exported the packages there)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from decode import PROMPT  # noqa: E402  (benchmarks/decode.py's prompt, as decode_gpu.py's prefill)
from decode_gpu import PACKAGES  # noqa: E402

REPS = 5


def kernel_table(decoder, ids: list[int], what: str) -> tuple[dict[str, tuple[int, float]], float]:
    """{kernel name: (launches per call, GPU microseconds per call)} and the wall milliseconds per call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def call():
        if what == "prefill":
            decoder.reset()
            decoder.prefill(ids)
        else:
            decoder.cache.trim(len(ids))
            decoder.step([ids[-1]])

    decoder.reset()
    decoder.prefill(ids)
    for _ in range(3):
        call()
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    synchronize()
    start = time.perf_counter()
    for _ in range(REPS):
        call()
    wall = (time.perf_counter() - start) / REPS * 1e3
    with profile(activities=[ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU]) as prof:
        for _ in range(REPS):
            call()
        synchronize()
    per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and "memcpy" not in event.name.lower():
            per[event.name][0] += 1
            per[event.name][1] += event.time_range.elapsed_us()
    return {k: (v[0] // REPS, v[1] / REPS) for k, v in per.items()}, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/edge-gpu-packages"))
    parser.add_argument("--device", default="cuda", help="cuda (cpu only to try the script: no kernels to list)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "kernel_times.md")
    args = parser.parse_args()
    from edge.model import Decoder
    from edge.package import load_package
    from edge.tokenizer import Tokenizer

    lines = []
    for i, name in enumerate(PACKAGES):
        package = load_package(args.work / f"pkg{i}")
        ids = Tokenizer(package.tokenizer_path).encode(PROMPT)
        decoder = Decoder(package, context_length=1024, device=args.device)
        for what in ("prefill", "decode step"):
            table, wall = kernel_table(decoder, ids, what)
            total = sum(us for _, us in table.values())
            lines += [f"## {name}: {what} ({len(ids) if what == 'prefill' else 1} tokens), wall {wall:.2f} ms, "
                      f"GPU kernels {total / 1e3:.2f} ms in {sum(n for n, _ in table.values())} launches", "",
                      "| kernel | launches | GPU us | share |", "|---|---|---|---|"]
            for kernel, (n, us) in sorted(table.items(), key=lambda kv: -kv[1][1])[:12]:
                lines.append(f"| {kernel[:110]} | {n} | {us:.0f} | {us / total:.1%} |")
            lines.append("")
            print("\n".join(lines[-16:]), flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
