"""Where a speculative step's time goes on a GPU: the draft head's step on the GPU and on the host's CPU, the loop
itself (a drafter that never drafts), and per target call the seconds of drafting and of verifying, for plain,
head and lookup + head on open chat and code (benchmarks/RESULTS.md, speculative section, session 12).

    bash benchmarks/gpu/run.sh profile    # GGUF at $GGUF (default /tmp/smollm2.gguf); DEV=cpu for the CPU
"""
import statistics, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, "benchmarks")
from speculative import CATEGORIES, messages_for, run_once
from edge.default_model import EXPORTS
from edge.engine import Engine
from edge.export.gguf import load_gguf
from edge.export.pipeline import export_model
from edge.speculative import Speculator
from edge.speculative.draft_head import DraftHead
from edge.speculative.drafter import Draft, Drafter

import os
DEV = os.environ.get("DEV", "cuda")
gguf = Path(os.environ.get("GGUF", "/tmp/smollm2.gguf"))
pkg = Path(os.environ.get("PKG", "/tmp/gpuwork/pkg0"))
if not (pkg / "manifest.json").exists():
    export_model(gguf, pkg, model=load_gguf(gguf), **EXPORTS["int4-edge"])

class Null(Drafter):
    name, cheap = "null", True
    def propose(self, context, depth):
        return Draft()

plain = Engine(pkg, device=DEV, context_length=2048)
hidden = plain.package.config.hidden_size
for dev in sorted({DEV, "cpu"}):
    h = DraftHead(plain.package, device=dev)
    state, tok = np.random.randn(1, hidden).astype(np.float32), np.array([42], np.int64)
    for _ in range(20):
        h.session.run(None, {"state": state, "token": tok})
    ts = []
    for _ in range(200):
        t = time.perf_counter(); h.session.run(None, {"state": state, "token": tok}); ts.append(time.perf_counter() - t)
    print(f"head step on {dev}: median {statistics.median(ts) * 1e6:.0f} us, p10 {np.percentile(ts, 10) * 1e6:.0f}", flush=True)
eng = {"plain": plain, "null": Engine(pkg, device=DEV, context_length=2048, speculator=Speculator([Null()])),
       "head": Engine(pkg, device=DEV, context_length=2048, speculator="head"),
       "lookup+head": Engine(pkg, device=DEV, context_length=2048, speculator="lookup+head")}
for e in eng.values():
    if e.speculator:
        e.speculator.prepare(e.decoder)
print("curve", {k: round(v, 3) for k, v in eng["head"].speculator.curve.relative().items()},
      "1-token s", eng["head"].speculator.curve.seconds[0])
for cat, idx in (("open chat", 0), ("open chat", 1), ("code", 0), ("code", 2))[:int(os.environ.get("N", 4))]:
    msgs = messages_for(plain, CATEGORIES[cat][idx], 128)
    r = {k: [] for k in eng}; st = {}
    for rep in range(3):
        for k, e in (eng.items() if rep % 2 == 0 else list(eng.items())[::-1]):
            o = run_once(e, msgs, 128); r[k].append(o["seconds"] / o["n"] * 1e3); st[k] = o["spec"]
    line = f"{cat} {idx}: ms/token " + " ".join(f"{k} {statistics.median(v):.3f}" for k, v in r.items())
    for k in ("null", "head", "lookup+head"):
        s = st[k]
        line += (f" | {k}: calls {s.target_calls} drafted {s.drafted} acc {s.accepted} draft ms/call "
                 f"{s.draft_seconds / s.target_calls * 1e3:.3f} verify ms/call {s.verify_seconds / s.target_calls * 1e3:.3f}")
    print(line, flush=True)
