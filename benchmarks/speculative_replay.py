"""Replay prompt lookup over plain greedy outputs: what a drafting rule gains, without the machine's noise.

    python benchmarks/speculative_replay.py [--tokens 64] [--outputs FILE.json]

Decodes the speculative benchmark's prompts once with plain greedy decoding on the default package (kept in
FILE.json with whether the target was sure of each token, reused when it exists), then replays edge's PromptLookup
over each output, its short matches judged by that confidence as in the runtime: at every step it drafts
what the adaptive depth policy asks for (policies shared across prompts, as in benchmarks/speculative.py), the
output says how much passes, and the package's measured cost curve prices each verify call. Prints, per
category, the modelled speed-up over plain decoding, the same with every draft cut to what passes (the depth
policy's ceiling), and prompt lookup's ceiling (the best occurrence at every step). Used to choose the lookup's
kinds (session 12), its copy position (session 13) and its root-confidence kinds (session 14) before timing them in
benchmarks/speculative.py; a 2-prompt category is too small to decide on alone, so its numbers only say where to
look.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from speculative import CATEGORIES, MIN_TOKENS, lookup_ceiling, messages_for  # noqa: E402

from edge.speculative import AdaptiveDepth, CostCurve, PromptLookup  # noqa: E402
from edge.speculative.decode import root_is_sure  # noqa: E402

DRAFT_SECONDS = 20e-6  # a lookup proposal, measured in the loop


def capture(tokens: int) -> dict:
    """Plain greedy outputs of every benchmark prompt, whether the target was sure of each generated token
    (root_is_sure of the logits it was chosen from), and the package's cost curve."""
    from edge.default_model import default_package
    from edge.engine import Engine

    engine = Engine(default_package("int4-edge"), threads=2)
    decoder, step, sure = engine.decoder, engine.decoder.step, []
    scratch = np.empty(decoder.config.vocab_size, np.float32)

    def judged_step(*args, **kwargs):
        logits = step(*args, **kwargs)
        sure.append(root_is_sure(logits[-1], scratch))
        return logits

    runs = []
    for category, prompts in CATEGORIES.items():
        for turns in prompts:
            messages = messages_for(engine, turns, tokens)
            engine.reset()
            decoder.step = judged_step
            "".join(engine.chat(messages, max_tokens=tokens))
            decoder.step = step
            n = engine.stats.generated_tokens  # token i came from the i-th last call's logits (none fed the last)
            runs.append({"category": category, "ids": list(engine.tokens), "n": n, "sure": sure[-n:]})
    curve = CostCurve.cached(engine.decoder, engine.threads)
    return {"runs": runs, "sizes": list(curve.sizes), "seconds": list(curve.seconds)}


def replay(ids: list[int], generated: int, sure: list[bool], curve: CostCurve, policies: dict, cut: bool) -> float:
    """Modelled speed-up of prompt lookup on one output. cut: every draft is cut to what passes (perfect depth).
    sure[i]: whether the target was sure of generated token i (a short match's kind says, as in the runtime)."""
    lookup, position, seconds = PromptLookup(), len(ids) - generated, 0.0
    first = position
    lookup.begin(ids[:position])
    while position < len(ids) - 1:
        room = len(ids) - 1 - position
        draft = lookup.propose(ids[:position + 1], min(8, room))
        if draft.kind in lookup.confidence_kinds:
            draft.kind += "/sure" if sure[position - first] else "/unsure"
        policy = None if cut or not len(draft) else policies.setdefault(draft.kind, AdaptiveDepth(curve, int, 8))
        tokens = draft.tokens if cut else draft.tokens[:policy.depth()] if policy else []
        passed = next((i for i, t in enumerate(tokens) if t != ids[position + 1 + i]), len(tokens))
        if cut:
            tokens = tokens[:passed]
        elif tokens:
            policy.update(len(tokens), passed, DRAFT_SECONDS, None, 1 + len(tokens))
        seconds += curve(1 + len(tokens)) + (DRAFT_SECONDS if tokens else 0.0)
        position += passed + 1
    return (generated - 1) * curve(1) / seconds


def geomean(values: list[float]) -> float:
    return math.exp(float(np.mean(np.log(values))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--outputs", type=Path, default=Path("/tmp/edge-speculative-outputs.json"))
    args = parser.parse_args()
    data = json.loads(args.outputs.read_text()) if args.outputs.exists() else {}
    if "sure" not in (data.get("runs") or [{}])[0]:  # absent, or captured before root confidence was recorded
        data = capture(args.tokens)
        args.outputs.write_text(json.dumps(data))
    curve = CostCurve(tuple(data["sizes"]), tuple(data["seconds"]))
    runs = [r for r in data["runs"] if r["n"] >= MIN_TOKENS]
    policies: dict = {}
    rows = {}
    for run in runs:
        row = rows.setdefault(run["category"], {"policy": [], "cut": [], "ceiling": []})
        row["policy"].append(replay(run["ids"], run["n"], run["sure"], curve, policies, cut=False))
        row["cut"].append(replay(run["ids"], run["n"], run["sure"], curve, {}, cut=True))
        row["ceiling"].append(lookup_ceiling(run["ids"], run["n"], curve))
    print("| category | prompt lookup | drafts cut to what passes | lookup's ceiling |")
    print("|---|---|---|---|")
    for category, row in rows.items():
        print(f"| {category} | " + " | ".join(f"{geomean(row[k]):.2f}x" for k in ("policy", "cut", "ceiling")) + " |")


if __name__ == "__main__":
    main()
