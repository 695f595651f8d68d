"""Where a speculative step's time goes on a GPU: the draft head's step on the GPU and on the host's CPU, the loop
itself (a drafter that never drafts), and per target call the seconds of drafting and of verifying, for plain,
head and lookup + head on open chat and code (benchmarks/RESULTS.md, speculative section, session 12).

    bash benchmarks/gpu/run.sh profile    # GGUF at $GGUF (default /tmp/smollm2.gguf); DEV=cpu for the CPU
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from speculative import CATEGORIES, messages_for, run_once  # noqa: E402  (benchmarks/speculative.py's prompts)

from edge.engine import Engine  # noqa: E402
from edge.speculative import Speculator  # noqa: E402
from edge.speculative.draft_head import DraftHead  # noqa: E402
from edge.speculative.drafter import Draft, Drafter  # noqa: E402

PROMPTS = (("open chat", 0), ("open chat", 1), ("code", 0), ("code", 2))
TOKENS, REPS = 128, 3


class Never(Drafter):
    """Drafts nothing: what the speculative loop costs by itself."""

    name, cheap = "never", True

    def propose(self, context: list[int], depth: int) -> Draft:
        return Draft()


def package(gguf: Path, dest: Path) -> Path:
    """The GPU's default export (int4-edge with its draft head), made once."""
    if not (dest / "manifest.json").exists():
        from edge.default_model import EXPORTS
        from edge.export.gguf import load_gguf
        from edge.export.pipeline import export_model

        export_model(gguf, dest, model=load_gguf(gguf), **EXPORTS["int4-edge"])
    return dest


def head_step_us(engine: Engine, device: str, runs: int = 200) -> tuple[float, float]:
    """Median and 10th percentile of one head step (the session alone, warm)."""
    head = DraftHead(engine.package, device=device)
    feeds = {"state": np.random.randn(1, engine.package.config.hidden_size).astype(np.float32),
             "token": np.array([42], np.int64)}
    for _ in range(20):
        head.session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        head.session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6, float(np.percentile(times, 10)) * 1e6


def per_call(stats) -> str:
    calls = stats.target_calls
    return (f"calls {calls} drafted {stats.drafted} acc {stats.accepted} draft ms/call "
            f"{stats.draft_seconds / calls * 1e3:.3f} verify ms/call {stats.verify_seconds / calls * 1e3:.3f}")


def main() -> None:
    device = os.environ.get("DEV", "cuda")
    pkg = package(Path(os.environ.get("GGUF", "/tmp/smollm2.gguf")), Path(os.environ.get("PKG", "/tmp/gpuwork/pkg0")))
    plain = Engine(pkg, device=device, context_length=2048)
    for where in sorted({device, "cpu"}):
        median, p10 = head_step_us(plain, where)
        print(f"head step on {where}: median {median:.0f} us, p10 {p10:.0f}", flush=True)
    engines = {"plain": plain,
               "never": Engine(pkg, device=device, context_length=2048, speculator=Speculator([Never()])),
               "head": Engine(pkg, device=device, context_length=2048, speculator="head"),
               "lookup+head": Engine(pkg, device=device, context_length=2048, speculator="lookup+head")}
    for engine in engines.values():
        if engine.speculator:
            engine.speculator.prepare(engine.decoder)
    curve = engines["head"].speculator.curve
    print("curve", {k: round(v, 3) for k, v in curve.relative().items()}, "1-token s", curve.seconds[0])
    for category, index in PROMPTS[:int(os.environ.get("N", len(PROMPTS)))]:
        messages = messages_for(plain, CATEGORIES[category][index], TOKENS)
        ms: dict[str, list[float]] = {name: [] for name in engines}
        last = {}
        for rep in range(REPS):
            for name, engine in (list(engines.items()) if rep % 2 == 0 else list(engines.items())[::-1]):
                run = run_once(engine, messages, TOKENS)
                ms[name].append(run["seconds"] / run["n"] * 1e3)
                last[name] = run["spec"]
        line = f"{category} {index}: ms/token " + " ".join(f"{k} {statistics.median(v):.3f}" for k, v in ms.items())
        print(line + "".join(f" | {k}: {per_call(last[k])}" for k in ("never", "head", "lookup+head")), flush=True)


if __name__ == "__main__":
    main()
