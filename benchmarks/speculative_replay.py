"""Replay prompt lookup over plain greedy outputs: what a drafting rule gains, without the machine's noise.

    python benchmarks/speculative_replay.py [--tokens 64] [--prompts benchmark|held-out] [--orders 20]
                                            [--fresh] [--kinds] [--history TURNS] [--outputs FILE.json]

Decodes the speculative benchmark's prompts once with plain greedy decoding on the default package (kept in
FILE.json with whether the target was sure of each token, reused when it exists), then replays edge's PromptLookup
over each output, its short matches judged by that confidence as in the runtime: at every step it drafts
what the adaptive depth policy asks for (policies shared across prompts, as in benchmarks/speculative.py), the
output says how much passes, and the package's measured cost curve prices each verify call. Prints, per
category, the modelled speed-up over plain decoding, the same with every draft cut to what passes (the depth
policy's ceiling), and prompt lookup's ceiling (the best occurrence at every step). Used to choose the lookup's
kinds (session 12), its copy position (session 13) and its root-confidence kinds (session 14) before timing them in
benchmarks/speculative.py; a 2-prompt category is too small to decide on alone, so its numbers only say where to
look. --fresh gives every prompt new policies (a process's first prompt, as one `edge-run` call has); --kinds
prints how often each kind of draft passes per level instead (PromptLookup.kind_acceptance, session 40).
--history TURNS puts earlier turns before every prompt (benchmarks/speculative.py --history), and prices the verify
calls on a curve measured at that past, where a multi-row call costs far more against a 1-token step.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from speculative import CATEGORIES, MIN_TOKENS, history, lookup_ceiling, messages_for  # noqa: E402

from edge.speculative import AdaptiveDepth, CostCurve, PromptLookup  # noqa: E402
from edge.speculative.adaptive import Pace  # noqa: E402
from edge.speculative.prompt_lookup import case_classes  # noqa: E402
from edge.speculative.decode import known_prior, root_is_sure  # noqa: E402

DRAFT_SECONDS = 20e-6  # a lookup proposal, measured in the loop
FOLD: list[int] | None = None  # token -> the class prompt lookup matches it as (main sets it)

# Held-out prompts (--prompts held-out): other passages and tasks of the same categories, to check that a rule chosen
# on the benchmark's 11 prompts is not fitted to them.
FACTS = ("The Eiffel Tower was built between 1887 and 1889 as the entrance arch for the 1889 World's Fair in Paris. It "
         "is 330 metres tall, was the tallest man-made structure in the world for 41 years, and is named after the "
         "engineer Gustave Eiffel, whose company designed and built it. Around seven million people visit it every "
         "year.")
SCIENCE = ("Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose "
           "and oxygen. It takes place mainly in the leaves, inside small structures called chloroplasts, which "
           "contain the green pigment chlorophyll. The oxygen released is what most animals need to breathe.")
EMAIL = ("hi all, just a reminder that the quartely report is due on friday. please send me you're numbers by "
         "thursday noon so i can put everything together. if their is any problem let me know asap. thanks, Dana")
PRODUCT = ("The X200 vacuum cleaner weighs 2.4 kilograms, runs for 45 minutes on one charge and takes 3 hours to "
           "recharge. Its dust bin holds 0.6 litres, and it comes with two brushes and a wall mount. The warranty "
           "lasts two years.")
WORDS = ("def count_words(text):\n    counts = {}\n    for word in text.split():\n        word = word.lower()\n"
         "        counts[word] = counts.get(word, 0) + 1\n    return counts\n")
HELD_OUT = {
    "open chat": [[("user", "What is the difference between weather and climate?")],
                  [("user", "How do I make a good cup of tea?")]],
    "code": [[("user", f"Add type hints to this function:\n{WORDS}")],
             [("user", f"Here is a Python function:\n{WORDS}\nRewrite it using collections.Counter.")]],
    "rewrite": [[("user", f"Fix the grammar and spelling in this email:\n{EMAIL}")],
                [("user", f"Rewrite this paragraph in a formal tone:\n{FACTS}")],
                [("user", f"Rewrite this paragraph in simpler words:\n{SCIENCE}")],
                [("user", f"Make this text more concise:\n{PRODUCT}")]],
    "summarise/extract": [[("user", f"Summarise this passage in one sentence:\n{FACTS}")],
                          [("user", f"List every number in this passage with what it measures:\n{PRODUCT}")],
                          [("user", f"What does this passage say about chloroplasts?\n{SCIENCE}")],
                          [("user", f"Extract the deadlines from this email:\n{EMAIL}")]],
    "repeat with change": [[("user", "Give me three tips for learning a new language."), ("assistant", None),
                            ("user", "Repeat your tips, but add a fourth one about music.")],
                           [("user", "Write a short story about a lost cat."), ("assistant", None),
                            ("user", "Repeat the story exactly, but call the cat Milo.")]],
}
PROMPT_SETS = {"benchmark": CATEGORIES, "held-out": HELD_OUT}


def capture(tokens: int, categories: dict, turns: int = 0) -> dict:
    """Plain greedy outputs of every benchmark prompt (after `turns` earlier turns), whether the target was sure of
    each generated token (root_is_sure of the logits it was chosen from), and the package's cost curve (at the
    prompts' past when there is a history)."""
    from edge.default_model import default_package
    from edge.engine import Engine

    engine = Engine(default_package("int4-edge"), threads=2, context_length=4096 if turns else None)
    decoder, step, sure = engine.decoder, engine.decoder.step, []
    scratch = np.empty(decoder.config.vocab_size, np.float32)

    def judged_step(*args, **kwargs):
        logits = step(*args, **kwargs)
        sure.append(root_is_sure(logits[-1], scratch))
        return logits

    runs, earlier = [], history(turns)
    for category, prompts in categories.items():
        for prompt in prompts:
            messages = earlier + messages_for(engine, prompt, tokens)
            engine.reset()
            decoder.step = judged_step
            "".join(engine.chat(messages, max_tokens=tokens))
            decoder.step = step
            n = engine.stats.generated_tokens  # token i came from the i-th last call's logits (none fed the last)
            runs.append({"category": category, "ids": list(engine.tokens), "n": n, "sure": sure[-n:]})
    believed = CostCurve.cached(engine.decoder, engine.threads)
    curve = believed
    if turns:  # what the calls cost at the prompts' past; the runtime's policies still start from the cached curve
        engine.reset()
        engine.decoder.prefill(runs[0]["ids"][:-runs[0]["n"]])
        curve = CostCurve.measure(engine.decoder, past=engine.decoder.cache.length)
    return {"runs": runs, "sizes": list(curve.sizes), "seconds": list(curve.seconds),
            "believed": [list(believed.sizes), list(believed.seconds)]}


def proposals(ids: list[int], generated: int, sure: list[bool]):
    """Prompt lookup's draft at each position of an output, its short matches' kinds judged by the target's
    confidence as in the runtime; send() the number of tokens the step emitted to move on (default 1)."""
    lookup, position = PromptLookup(fold=FOLD), len(ids) - generated
    first = position
    lookup.begin(ids[:position])
    while position < len(ids) - 1:
        draft = lookup.propose(ids[:position + 1], min(8, len(ids) - 1 - position))
        if draft.kind in lookup.confidence_kinds:
            draft.kind += "/sure" if sure[position - first] else "/unsure"
        possible = next((i for i, t in enumerate(draft.tokens) if t != ids[position + 1 + i]), len(draft))
        position += (yield draft, possible) or 1


class Lookup:
    """What a speculator keeps for prompt lookup across the prompts it serves: a policy per kind of draft, and the
    paces they share (plain steps' and the drafter's verify calls' against the curve the policies believe).
    believed: the curve the policies price drafts with (the runtime's cached one); the replay's own curve says what
    the calls cost (the same one, unless --history measured it at a long past)."""

    def __init__(self, believed: CostCurve):
        self.believed, self.policies = believed, {}
        self.plain, self.verify = Pace(), Pace()

    def policy(self, kind: str) -> AdaptiveDepth:
        if kind not in self.policies:
            self.policies[kind] = AdaptiveDepth(self.believed, int, 8, shadowed=True, plain=self.plain,
                                                verify=self.verify, **known_prior(PromptLookup, kind))
        return self.policies[kind]


def replay(ids: list[int], generated: int, sure: list[bool], curve: CostCurve, lookup: Lookup | None) -> float:
    """Modelled speed-up of prompt lookup on one output. lookup None: every draft is cut to what passes (perfect
    depth). Policies are made as the runtime makes them (their known priors; off until a shadow guess passes, unless
    the prior promises a gain), and a switched-off one scores its first guess against the output."""
    seconds, steps = 0.0, proposals(ids, generated, sure)
    draft, possible = next(steps)
    while True:
        policy = lookup.policy(draft.kind) if lookup is not None and len(draft) else None
        depth = len(draft) if lookup is None else policy.depth() if policy else 0
        passed = min(depth, possible)
        tokens = draft.tokens[:passed if lookup is None else depth]
        if policy is not None and depth == 0 and policy.off:
            policy.shadow(possible > 0)
        cost = curve(1 + len(tokens))
        if tokens and lookup is not None:
            policy.update(len(tokens), passed, DRAFT_SECONDS, cost, 1 + len(tokens))
        elif lookup is not None:
            lookup.plain.observe(cost, lookup.believed(1))
        seconds += cost + (DRAFT_SECONDS if tokens else 0.0)
        try:
            draft, possible = steps.send(passed + 1)
        except StopIteration:
            return (generated - 1) * curve(1) / seconds


def kind_rates(runs: list[dict], levels: int = 8) -> dict[str, list[tuple[int, int]]]:
    """Per kind of draft, (trials, passes) of each level: level i is tried where levels 1..i-1 passed, at every
    position of the outputs (what PromptLookup.kind_acceptance's first levels come from)."""
    rates: dict[str, list[list[int]]] = {}
    for run in runs:
        for draft, possible in proposals(run["ids"], run["n"], run["sure"]):
            row = rates.setdefault(draft.kind, [[0, 0] for _ in range(levels)])
            for i in range(min(possible + 1, len(draft), levels)):
                row[i][0] += 1
                row[i][1] += i < possible
    return {kind: [tuple(level) for level in row] for kind, row in rates.items() if kind}


def policy_speedups(runs: list[dict], curve: CostCurve, believed: CostCurve, orders: int,
                    fresh: bool) -> dict[str, list[float]]:
    """Each category's per-prompt speed-ups under the adaptive policy, the prompts replayed in the benchmark's order
    and then in `orders - 1` shuffled orders, policies shared across the prompts as in the runtime; a prompt's value
    is its geometric mean over the orders. What the shared policies learned from earlier prompts moves a single
    prompt by up to ~30% (session 24: a rule that gained 5-9% on a category in one order gained nothing over 20).
    fresh: new policies for every prompt, as one `edge-run` call has."""
    logs = [[] for _ in runs]
    rng = random.Random(0)
    order = list(range(len(runs)))
    for _ in range(1 if fresh else orders):
        lookup = Lookup(believed)
        for i in order:
            if fresh:
                lookup = Lookup(believed)
            logs[i].append(math.log(replay(runs[i]["ids"], runs[i]["n"], runs[i]["sure"], curve, lookup)))
        rng.shuffle(order)
    out: dict[str, list[float]] = {}
    for run, values in zip(runs, logs):
        out.setdefault(run["category"], []).append(math.exp(float(np.mean(values))))
    return out


def geomean(values: list[float]) -> float:
    return math.exp(float(np.mean(np.log(values))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", choices=list(PROMPT_SETS), default="benchmark")
    parser.add_argument("--orders", type=int, default=20, help="prompt orders to average the policy over")
    parser.add_argument("--no-fold", action="store_true", help="tokens match only themselves, not up to case")
    parser.add_argument("--fresh", action="store_true", help="new policies for every prompt (one edge-run call)")
    parser.add_argument("--kinds", action="store_true", help="print each kind of draft's pass rate per level")
    parser.add_argument("--history", type=int, default=0, help="earlier turns before each prompt (6: ~1,300 tokens)")
    parser.add_argument("--outputs", type=Path, help="where the plain outputs are kept (default: "
                        "/tmp/edge-speculative-outputs[-held-out][-historyN].json)")
    args = parser.parse_args()
    suffix = ("" if args.prompts == "benchmark" else f"-{args.prompts}") + (f"-history{args.history}"
                                                                            if args.history else "")
    args.outputs = args.outputs or Path(f"/tmp/edge-speculative-outputs{suffix}.json")
    data = json.loads(args.outputs.read_text()) if args.outputs.exists() else {}
    if "sure" not in (data.get("runs") or [{}])[0]:  # absent, or captured before root confidence was recorded
        data = capture(args.tokens, PROMPT_SETS[args.prompts], args.history)
        args.outputs.write_text(json.dumps(data))
    curve = CostCurve(tuple(data["sizes"]), tuple(data["seconds"]))
    global FOLD
    if not args.no_fold:  # as the runtime's drafters match (edge.speculative.factory.prompt_lookup)
        from edge.default_model import default_package
        from edge.package import load_package
        from edge.tokenizer import Tokenizer

        FOLD = case_classes(Tokenizer(load_package(default_package("int4-edge")).tokenizer_path).vocab())
    runs = [r for r in data["runs"] if r["n"] >= MIN_TOKENS]
    if args.kinds:
        print("| kind | " + " | ".join(f"level {i + 1}" for i in range(8)) + " |")
        print("|---|" + "---|" * 8)
        for kind, levels in sorted(kind_rates(runs).items()):
            print(f"| {kind} | " + " | ".join(f"{p / t:.2f} ({t})" if t else "-" for t, p in levels) + " |")
        return
    rows: dict = {}
    for run in runs:
        row = rows.setdefault(run["category"], {"policy": [], "cut": [], "ceiling": []})
        row["cut"].append(replay(run["ids"], run["n"], run["sure"], curve, None))
        row["ceiling"].append(lookup_ceiling(run["ids"], run["n"], curve))
    sizes, seconds = data.get("believed", (data["sizes"], data["seconds"]))
    believed = CostCurve(tuple(sizes), tuple(seconds))
    for category, values in policy_speedups(runs, curve, believed, args.orders, args.fresh).items():
        rows[category]["policy"] = values
    print("| category | prompt lookup | drafts cut to what passes | lookup's ceiling |")
    print("|---|---|---|---|")
    for category, row in rows.items():
        print(f"| {category} | " + " | ".join(f"{geomean(row[k]):.2f}x" for k in ("policy", "cut", "ceiling")) + " |")


if __name__ == "__main__":
    main()
