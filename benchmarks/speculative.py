"""Speculative decoding on the default model: speed against plain decoding, acceptance, and greedy exactness.

    python benchmarks/speculative.py [--targets fp32 int4] [--tokens 96] [--reps 1] [--threads 2]
                                     [--categories ...] [--variants plain layer-skip ...] [--fresh] [--ablations]
                                     [--history TURNS]

For each target package (fp32, int4) and prompt category (open chat, code, rewrite, summarise/extract, repeat with a
change in a second turn), each drafter's run sits between two runs of plain greedy decoding of the same prompt, so
the machine's drifting pace hits them alike (paired_runs); the table reports speed *ratios* to plain decoding (per
prompt the median over reps of the run's ratio to its two neighbours, then the geometric mean over the category's
prompts) and acceptance, with a control: plain decoding timed the same way as a drafter, and a bootstrap interval
per ratio (interval); it ends with issue 4's targets against the run (targets). Every speculative output
is compared with plain greedy output; where they differ, the table gives the first differing position and the
target's top-2 logit gap there (a near-tie that the multi-token verify step's different float rounding flips).
Drafters and their policies persist across prompts, as in a chat app's engine; --fresh makes them anew for every
run, as a process's first prompt (one edge-run call) has them. --ablations adds prompt lookup and lookup+head without
their kinds' measured acceptance, to time what it gives. Writes benchmarks/results/speculative.md.

The layer-skip variants run the target's skip-layer self-draft (export/self_draft.py). The benchmark adds one to a
hard-linked copy of each default package (~/.cache/edge/models/...-skip) the first time, choosing its layers by
measurement on calibration text (about 5 minutes for fp32 on 2 busy cores), and reports the choice.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

PASSAGE = ("The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual "
           "reefs and 900 islands stretching for over 2,300 kilometres over an area of approximately 344,400 square "
           "kilometres. The reef is located in the Coral Sea, off the coast of Queensland, Australia. It can be seen "
           "from outer space and is the world's biggest single structure made by living organisms. The reef was "
           "selected as a World Heritage Site in 1981.")
PARAGRAPH = ("Our team moved to the new office last monday. the move went mostly smooth, but the printers was not "
             "conected and the wifi password were wrong for two days. Next week we will organise a small party to "
             "celebrate the new space, and everyone are invited to bring a dish.")
CODE = ("def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n\n"
        "def variance(values):\n    m = mean(values)\n    total = 0\n    for v in values:\n"
        "        total += (v - m) ** 2\n    return total / len(values)\n")
CATEGORIES = {
    "open chat": [[("user", "What are some good habits for staying healthy?")],
                  [("user", "Tell me about the history of the bicycle.")]],
    "code": [[("user", "Write a Python function that returns the n-th Fibonacci number.")],
             [("user", f"Add docstrings to these functions:\n{CODE}")],
             # The int4 packages answer the prompt above with "```" and the end of the turn (nothing to time, see
             # MIN_TOKENS); asked this way, they rewrite the code.
             [("user", f"Here are two Python functions:\n{CODE}\nRewrite them with a docstring in each.")]],
    "rewrite": [[("user", f"Fix the grammar and spelling in this paragraph:\n{PARAGRAPH}")],
                [("user", f"Rewrite this paragraph in a formal tone:\n{PASSAGE}")]],
    "summarise/extract": [[("user", f"Summarise this passage in two sentences:\n{PASSAGE}")],
                          [("user", f"List every number in this passage with what it measures:\n{PASSAGE}")]],
    "repeat with change": [[("user", "Give me a short recipe for pancakes."), ("assistant", None),
                            ("user", "Repeat your recipe, but use oat milk instead of milk.")],
                           [("user", "Write a short poem about the sea."), ("assistant", None),
                            ("user", "Repeat the poem exactly, but change the title to 'Blue'.")]],
}


# A prompt whose plain answer is shorter than this is not timed for that target (a one-token answer's tok/s is the
# call overhead, whatever the drafter): the table lists it instead.
MIN_TOKENS = 16
SHORT: list = []  # (target, category, prompt index, tokens of the plain answer)

CURVES: dict = {}
SELF_DRAFTS: dict = {}
MEMORY: dict = {}
CEILINGS: dict = {}  # (target, category) -> prompt lookup's ceiling per prompt (lookup_ceiling)
PACE: dict = {}  # target -> (1-token, 8-token step seconds), just before and just after the runs


def skip_package(quant: str, threads: int):
    """The default package with a skip-layer self-draft, made once next to it (hard links, no second weights file)."""
    from edge.default_model import default_gguf, default_package
    from edge.export.load import load_model
    from edge.export.self_draft import add_skip_draft, linked_copy
    from edge.package import load_package

    source = default_package(quant)
    dest = source.with_name(f"{source.name}-skip")
    if not (dest / "manifest.json").exists():
        linked_copy(source, dest)
    package = load_package(dest, verify=False)
    if package.self_draft is None:
        print(f"{quant}: choosing the self-draft's layers (once)", file=sys.stderr)
        add_skip_draft(dest, load_model(default_gguf()), threads=threads,
                       progress=lambda line: print(f"  {quant} {line}", file=sys.stderr))
        package = load_package(dest, verify=False)
    SELF_DRAFTS[quant] = package.self_draft
    return package


EDGE_KERNEL_TARGETS = {"int4-edge": 4, "int4-edge-acc0": 0}  # target name -> edge.QMatMul accuracy_level


def edge_kernel_package(level: int):
    """The default model's int4 export on edge's kernels: the default package (int8 activations), or float
    activations (made once in the edge cache)."""
    from edge.default_model import EXPORTS, default_gguf, default_package, package_dir
    from edge.export.pipeline import export_model

    if level == 4:
        return default_package("int4-edge")
    dest = package_dir("int4-edge").with_name(f"{package_dir('int4-edge').name}-acc{level}")
    if not (dest / "manifest.json").exists():
        export_model(default_gguf(), dest, **{**EXPORTS["int4-edge"], "accuracy_level": level}, overwrite=True)
    return dest


def history(turns: int) -> list[dict]:
    """`turns` earlier exchanges (~210 tokens each) before a prompt: drafting after a long conversation, where a
    multi-row verify call costs more against a 1-token step (benchmarks/RESULTS.md, kernels) and lookup finds more
    stale matches."""
    return [message for i in range(turns) for message in (
        {"role": "user", "content": f"Tell me something interesting about topic number {i}, in detail."},
        {"role": "assistant", "content": PASSAGE + " " + PASSAGE})]


def messages_for(engine, turns, tokens):
    """Fill each None assistant turn with the model's own greedy answer (as a chat user would have seen it)."""
    messages = []
    for role, content in turns:
        if content is None:
            engine.reset()
            content = "".join(engine.chat(messages, max_tokens=tokens))
        messages.append({"role": role, "content": content})
    return messages


def without_kind_priors(speculator):
    for drafter in speculator.drafters:
        drafter.kind_acceptance = {}
    return speculator


def variants(target: str, engine, packages, ablations: bool = False):
    from edge.speculative import DraftModel, Speculator, make_speculator
    from edge.speculative.factory import prompt_lookup

    out = {"prompt-lookup": lambda: make_speculator("prompt-lookup", engine),
           "recycling": lambda: make_speculator("recycling", engine),
           "lookup+recycling": lambda: make_speculator("lookup+recycling", engine)}
    if engine.package.draft_head is not None:
        out["draft head"] = lambda: make_speculator("head", engine)
        out["lookup+head"] = lambda: make_speculator("lookup+head", engine)
    if ablations:  # prompt lookup's kinds starting from the policy's 1-in-3 guess, as before session 40
        for name in [n for n in ("prompt-lookup", "lookup+head") if n in out]:
            out[f"{name} (no kind priors)"] = lambda name=name: without_kind_priors(make_speculator(name, engine))
    if target == "fp32":
        out["lookup+draft int4"] = lambda: Speculator(
            [prompt_lookup(engine), DraftModel(packages["int4"], engine.context_length, threads=engine.threads)],
            threads=engine.threads)
    if engine.package.self_draft is not None:
        out["layer-skip"] = lambda: make_speculator("skip", engine)
        out["lookup+layer-skip"] = lambda: make_speculator("lookup+skip", engine)
    return out


MEMORY_PROBE = """
import json, sys
from edge.engine import Engine
from edge.memory.usage import peak_rss_bytes
engine = Engine(sys.argv[1], threads=int(sys.argv[3]), speculator=None if sys.argv[2] == "plain" else sys.argv[2])
engine.generate("Tell me about the history of the bicycle.", max_tokens=32)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"peak": peak_rss_bytes(), "anon": int(status["RssAnon"].split()[0]) * 1024,
                  "file": int(status["RssFile"].split()[0]) * 1024}))
"""


def measure_memory(package, threads: int) -> dict[str, dict[str, int]]:
    """Peak RSS (VmHWM, a fresh process each) of plain decoding and of decoding with the self-draft's second
    session, and the anonymous vs file-backed split at the end: what the second session over the same weights
    file costs in RAM."""
    import json
    import subprocess

    out = {}
    for spec in ("plain", "skip"):
        run = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(package.root), spec, str(threads)],
                             capture_output=True, text=True, check=True)
        out[spec] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def run_once(engine, messages, tokens):
    engine.reset()
    text = "".join(engine.chat(messages, max_tokens=tokens))
    s = engine.stats
    return {"text": text, "ids": list(engine.tokens), "n": s.generated_tokens, "seconds": s.generate_seconds,
            "spec": s.speculative}


def near_tie(engine, prompt_ids, plain_ids, position):
    """Top-2 logit gap of the target (one token per step, as plain decoding ran) where outputs first differ."""
    engine.reset()
    dec = engine.decoder
    logits = dec.prefill(plain_ids[: len(prompt_ids)])
    for t in plain_ids[len(prompt_ids):position]:
        logits = dec.step([t])[0]
    top = np.sort(logits)[-2:]
    engine.reset()
    return float(top[1] - top[0])


def first_difference(plain, spec):
    a, b = plain["ids"], spec["ids"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def lookup_ceiling(ids: list[int], generated: int, curve, max_depth: int = 8) -> float:
    """The most any prompt-lookup drafter could gain on this output with this cost curve: at every step it copies
    from the earlier occurrence of the last token (any n-gram) whose continuation matches the output longest, and
    drafts exactly the tokens that will be accepted (a perfect depth). Real drafters pick one occurrence and guess
    the depth; this is what the package's output and verify costs leave them."""
    prompt = len(ids) - generated
    pos, seconds = 0, 0.0
    while pos < generated - 1:
        context, end = ids[:prompt + pos + 1], prompt + generated
        best = 0
        for j in range(len(context) - 1):
            if context[j] != context[-1]:
                continue
            k = 0
            while k < max_depth and prompt + pos + 1 + k < end and ids[j + 1 + k] == ids[prompt + pos + 1 + k]:
                k += 1
            best = max(best, k)
        seconds += curve(1 + best)
        pos += best + 1
    return (generated - 1) * curve(1) / seconds if seconds else 1.0


def modelled_ratio(spec, curve) -> float:
    """Speed over plain decoding predicted from the measured cost curve and this run's calls (verify cost only):
    immune to the neighbours' load, which the measured ratio is not. Each call is priced at its own size: the curve
    is convex past a few rows, so pricing a mix of 1- and 9-row calls at their mean size overstated the ratio ~7%."""
    if spec is None or not spec.target_calls:
        return 1.0
    seconds = sum(calls * curve(rows) for rows, calls in spec.calls_by_rows.items())
    return (spec.accepted + spec.target_calls) * curve(1) / seconds


CONTROL = "plain (control)"


def step_times(engine, rows: int = 8, steps: int = 30) -> tuple[float, float]:
    """Seconds of a 1-token and of an 8-token step now, at a 200-token past (medians of `steps` each).

    The host sometimes runs this VM's two vCPUs on one core's two hyper-threads: then a 2-thread 8-token step takes
    ~1.3x longer and a 1-token step no longer, for seconds to minutes (RESULTS.md, session 39), and every drafter's
    x plain falls with it. The 1-token step's own pace moves too (3.0-4.3 ms in sessions 43-44, while the 8-token
    step stayed at 6.2-6.7 ms outside those spells), and x plain moves against it, so the ratio alone cannot tell
    the states apart. Timed before and after the runs, the two times say which state a run met."""
    import time

    engine.reset()
    decoder = engine.decoder
    decoder.prefill([100 + i for i in range(200)])
    base, median = decoder.cache.length, {}
    for size in (1, rows):
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            decoder.step([500 + i for i in range(size)], logits_rows=list(range(size)))
            times.append(time.perf_counter() - start)
            decoder.cache.trim(base)
        median[size] = statistics.median(times[3:])
    engine.reset()
    return median[1], median[rows]


def learned(speculators: dict) -> dict:
    """What the learning drafters (token recycling's successor table) know, to put back before each rep of a prompt:
    otherwise rep 2 on drafts from rep 1's copy of the very same answer. Measured before this (session 15):
    recycling x1.32 on open chat with 1.03 tokens per target call in its first rep (x0.88 modelled)."""
    return {name: [copy.deepcopy(vars(d)) if d.learns else None for d in spec.drafters]
            for name, spec in speculators.items()}


def restore(speculators: dict, state: dict) -> None:
    for name, spec in speculators.items():
        for drafter, saved in zip(spec.drafters, state[name]):
            if saved is not None:
                vars(drafter).update(copy.deepcopy(saved))


def tokens_per_second(run: dict) -> float:
    return run["n"] / run["seconds"]


def paired_runs(engine, speculators: dict, messages, args, makers: dict | None = None
                ) -> tuple[dict[str, list], dict[str, list[float]]]:
    """Every variant's run between two plain runs: its ratio is its tok/s over their geometric mean, one per rep.

    The machine's pace drifts over seconds (80 plain runs of one prompt back to back: 7.6% spread, consecutive runs
    correlated 0.59), so a run is compared with the plain runs next to it, not with plain's median over the whole
    rotation: two consecutive runs differ by 6.9% where two at random differ by 10.5%. CONTROL, plain decoding
    timed as if it were a drafter, shows how far from 1 the noise alone moves a ratio. makers (--fresh): every rep's
    drafters are made anew, policies included, as a process's first prompt has them."""
    runs_of = {name: [] for name in ["plain", *speculators, CONTROL]}
    ratios = {name: [] for name in [*speculators, CONTROL]}
    before = learned(speculators)
    for rep in range(args.reps):
        restore(speculators, before)  # each rep sees the prompt for the first time, as a user would
        if makers:
            speculators = {name: make() for name, make in makers.items()}
        names = [*speculators, CONTROL]
        names = names[rep % len(names):] + names[: rep % len(names)]
        engine.speculator = None
        last = run_once(engine, messages, args.tokens)
        runs_of["plain"].append(last)
        for name in names:
            engine.speculator = speculators.get(name)
            run = run_once(engine, messages, args.tokens)
            engine.speculator = None
            after = run_once(engine, messages, args.tokens)
            runs_of[name].append(run)
            runs_of["plain"].append(after)
            ratios[name].append(tokens_per_second(run) / math.sqrt(tokens_per_second(last) * tokens_per_second(after)))
            last = after
    return runs_of, ratios


def bench_target(target, packages, args, rows, ties):
    from edge.engine import Engine

    wanted = set(args.variants or [])
    if target in ("fp32", "int4") and (not wanted or wanted & {"layer-skip", "lookup+layer-skip"}):
        package = skip_package(target, args.threads)
        MEMORY[target] = measure_memory(package, args.threads)
        engine = Engine(package, threads=args.threads)
    else:
        engine = Engine(packages[target], threads=args.threads, context_length=4096 if args.history else None)
    makers = {name: make for name, make in variants(target, engine, packages, args.ablations).items()
              if not wanted or name in wanted}
    speculators = {name: make() for name, make in makers.items()}  # persistent: policies learn across prompts
    engine.speculator = None
    engine.generate("Hello", max_tokens=8)  # warm up
    for name, spec in speculators.items():  # measure the cost curve (cached) and warm the drafters
        engine.speculator = spec
        engine.generate("Hello there, how are you?", max_tokens=8)
    from edge.speculative import CostCurve

    curve = CostCurve.cached(engine.decoder, engine.threads)
    CURVES[target] = curve
    print(f"{target}: cost of a k-token step relative to 1 token: {curve.relative()}", file=sys.stderr)
    PACE[target] = [step_times(engine)]
    for category in args.categories:
        for index, turns in enumerate(CATEGORIES[category]):
            engine.speculator = None
            messages = history(args.history) + messages_for(engine, turns, args.tokens)
            answer = run_once(engine, messages, args.tokens)["n"]
            if answer < MIN_TOKENS:
                SHORT.append((target, category, index, answer))
                print(f"{target} {category} prompt {index}: a {answer}-token answer, not timed", file=sys.stderr)
                continue
            runs_of, ratios = paired_runs(engine, speculators, messages, args, makers if args.fresh else None)
            plain = runs_of["plain"][0]
            CEILINGS.setdefault((target, category), []).append(lookup_ceiling(plain["ids"], plain["n"], curve))
            for name, runs in runs_of.items():
                tps = statistics.median(tokens_per_second(r) for r in runs)
                same = runs[0]["ids"] == plain["ids"] and runs[0]["text"] == plain["text"]
                spec = runs[0]["spec"]
                rows.append({"target": target, "category": category, "variant": name, "tps": tps,
                             "ratio": statistics.median(ratios[name]) if name in ratios else 1.0,
                             "ratios": ratios.get(name), "same": same,
                             "accept": spec.acceptance_rate if spec else None,
                             "per_call": spec.tokens_per_call if spec else 1.0,
                             "modelled": modelled_ratio(spec, curve),
                             "drafted": spec.drafted if spec else 0})
                if not same:
                    pos = first_difference(plain, runs[0])
                    prompt_len = len(plain["ids"]) - plain["n"] + 1
                    gap = near_tie(engine, plain["ids"][:prompt_len], plain["ids"], max(pos, prompt_len))
                    ties.append((target, category, name, pos - prompt_len, gap))
                print(f"{target} {category:20s} {name:24s} {tps:6.1f} tok/s x{rows[-1]['ratio']:.2f} "
                      f"same={same} {spec.summary() if spec else ''}", file=sys.stderr)
    PACE[target].append(step_times(engine))


INTERVAL = 0.90  # the central share of the bootstrap draws that a cell's interval spans
AUTO = ("lookup+head", "lookup+recycling")  # what `--draft auto` runs with a draft head, and without one


def interval(per_prompt: list[list[float]], draws: int = 4000) -> tuple[float, float]:
    """A cell's x plain (the median over reps per prompt, the geometric mean over prompts) recomputed from reps
    drawn with replacement: the central INTERVAL of the draws. It says how far the reps' noise alone moves the
    cell within this run; not how far a run hours later lands, when the machine's pace has changed the cost of
    a verify call against a plain step (sessions 19-25: a quiet machine speeds the 1-token step, not the 8-token
    one)."""
    rng = np.random.default_rng(0)
    logs = np.zeros(draws)
    for ratios in per_prompt:
        r = np.asarray(ratios)
        logs += np.log(np.median(r[rng.integers(0, len(r), size=(draws, len(r)))], axis=1))
    lo, hi = np.quantile(logs / len(per_prompt), [(1 - INTERVAL) / 2, (1 + INTERVAL) / 2])
    return math.exp(lo), math.exp(hi)


def cell_stats(rows) -> dict[tuple, dict]:
    """(target, category, variant) -> its x plain, interval and the rest of the table's columns."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["target"], r["category"], r["variant"]), []).append(r)
    out = {}
    for key, rs in groups.items():
        timed = [r["ratios"] for r in rs if r["ratios"]]
        out[key] = {"ratio": math.exp(sum(math.log(r["ratio"]) for r in rs) / len(rs)),
                    "interval": interval(timed) if timed else None,  # plain: the reference itself
                    "rows": rs}
    return out


def targets(found: dict[tuple, dict]) -> list[str]:
    """Issue 4's targets against this run: auto (the first of AUTO that ran) at least 2x on each input-grounded
    category and 1.2x over open chat and code (geometric mean), no drafter below 0.95x on any category; each with
    its interval."""
    lines = ["", f"Issue 4's targets in this run (x plain, in brackets the {INTERVAL:.0%} bootstrap interval over "
             "the reps):", ""]
    for target in dict.fromkeys(t for t, _, _ in found):
        name = next((v for v in AUTO if any(t == target and v == w for t, _, w in found)), None)
        auto = {c: found[t, c, v] for t, c, v in found if t == target and v == name}
        for category in ("rewrite", "summarise/extract", "repeat with change"):
            if category in auto:
                cell = auto[category]
                lo, hi = cell["interval"]
                lines.append(f"- {target}, {name}, {category} >= 2x: {cell['ratio']:.2f} [{lo:.2f}, {hi:.2f}]")
        if "open chat" in auto and "code" in auto:
            both = math.sqrt(auto["open chat"]["ratio"] * auto["code"]["ratio"])
            lines.append(f"- {target}, {name}, open chat and code >= 1.2x: {both:.2f} (open chat "
                         f"{auto['open chat']['ratio']:.2f}, code {auto['code']['ratio']:.2f})")
        drafted = [(cell["ratio"], cell["interval"], c, v) for (t, c, v), cell in found.items()
                   if t == target and v not in ("plain", CONTROL)]
        if drafted:
            ratio, (lo, hi), category, variant = min(drafted)
            lines.append(f"- {target}, every drafter >= 0.95x: lowest {ratio:.2f} [{lo:.2f}, {hi:.2f}] ({variant}, "
                         f"{category})")
        control = [found[t, c, v]["interval"] for t, c, v in found if t == target and v == CONTROL]
        if control:
            lines.append(f"- {target}, the control's intervals span {min(lo for lo, _ in control):.2f} to "
                         f"{max(hi for _, hi in control):.2f}: what noise alone does to a cell")
    return lines


def table(rows, ties, args) -> str:
    lines = [f"# Speculative decoding (SmolLM2-135M-Instruct, {args.threads} threads, greedy, {args.tokens} new "
             f"tokens, {args.reps} rep(s), each drafter's run between two plain runs; the machine was shared, so "
             "compare ratios, not tok/s)", "",
             *(["Every run with new drafters and policies (--fresh): each as a process's first prompt.", ""]
               if args.fresh else []),
             *([f"Every prompt after {args.history} earlier turns (--history; ~210 tokens each).", ""]
               if args.history else []),
             "Cost of a verify call over S tokens relative to S=1, measured on the loaded package (the adaptive "
             "policy's input):", ""]
    for target, curve in CURVES.items():
        lines.append(f"- {target}: " + ", ".join(f"S={s}: {r:.2f}x" for s, r in curve.relative().items())
                     + f" (multi-row vs 1-row logit deviation {curve.deviation:.2g})")
    if PACE:
        lines += ["", "The machine during the run: a 1-token and an 8-token step at a 200-token past, timed just "
                  "before and just after the runs. An 8-token step well above its usual time (6.2-6.7 ms on the "
                  "Zen 4 of sessions 31-44, 3.2-3.7 ms on the Zen 5 of session 45) means the host was slowing "
                  "multi-row work, e.g. running the two vCPUs on one core's hyper-threads, which slows multi-row "
                  "verify calls and not plain decoding (benchmarks/RESULTS.md, session 39). The 1-token step's pace "
                  "moves on its own (3.0-4.3 ms in sessions 43-44), and every x plain moves against it: a slow one "
                  "flatters them (session 44):", ""]
        for target, pace in PACE.items():
            times = [f"{when} S=1 {one * 1e3:.2f} ms, S=8 {eight * 1e3:.2f} ms ({eight / one:.2f}x)"
                     for when, (one, eight) in zip(("before", "after"), pace)]
            lines.append(f"- {target}: " + ", ".join(times))
    if SELF_DRAFTS:
        lines += ["", "Skip-layer self-drafts (chosen at export by agreement with the target's greedy continuation of "
                  "calibration text; cost = share of the weights a draft step reads):", ""]
    for target, record in SELF_DRAFTS.items():
        c = record["chosen"]
        lines.append(f"- {target}: {c['family']}, keeps {len(c['layers'])} layers {c['layers']}: agreement "
                     f"{c['agreement']:.2f}, cost {c['cost']:.2f}, predicted x{c['predicted_speedup']:.2f} at depth "
                     f"{c['depth']}")
        if target in MEMORY:
            m = MEMORY[target]
            mib = {k: {f: v / 2**20 for f, v in d.items()} for k, d in m.items()}
            lines.append(f"  - memory: peak RSS {mib['plain']['peak']:.0f} MiB plain, {mib['skip']['peak']:.0f} MiB "
                         f"with the self-draft (anonymous {mib['plain']['anon']:.0f} -> {mib['skip']['anon']:.0f} MiB, "
                         f"file-backed {mib['plain']['file']:.0f} -> {mib['skip']['file']:.0f} MiB)")
    lines += ["", "x plain: measured tok/s ratio to the plain runs on either side (median over reps, geometric mean "
              f"over the category's prompts); {CONTROL!r} is plain decoding measured the same way, the noise alone. "
              f"interval: the central {INTERVAL:.0%} of x plain recomputed from reps drawn with replacement. "
              "x model: the ratio the cost curve predicts from the run's tokens per target call and verify sizes, "
              "without the noise.",
              "", "| target | category | variant | tok/s | x plain | interval | x model | acceptance | "
              "tokens/target call | identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    found = cell_stats(rows)
    for (target, category, variant), cell in found.items():
        rs, bounds = cell["rows"], cell["interval"]
        acc = [r["accept"] for r in rs if r["accept"] is not None and r["drafted"]]
        model = math.exp(sum(math.log(r["modelled"]) for r in rs) / len(rs))
        lines.append(f"| {target} | {category} | {variant} | {statistics.mean(r['tps'] for r in rs):.1f} | "
                     f"{cell['ratio']:.2f} | {'%.2f-%.2f' % bounds if bounds else '-'} | {model:.2f} | "
                     f"{statistics.mean(acc) if acc else 0:.2f} | "
                     f"{statistics.mean(r['per_call'] for r in rs):.2f} | "
                     f"{sum(r['same'] for r in rs)}/{len(rs)} |")
    lines += targets(found)
    for target, category, index, n in SHORT:
        lines.append(f"\nNot timed: {target} answered {category} prompt {index + 1} of "
                     f"{len(CATEGORIES[category])} in {n} token(s) (fewer than {MIN_TOKENS}).")
    lines += ["", "Prompt lookup's ceiling: the speed-up a lookup drafter would reach copying, at every step, from the "
              "earlier occurrence that matches the plain output longest and drafting exactly the tokens that pass "
              "(geometric mean over the prompts; from each plain output and the target's cost curve):", "",
              "| target | " + " | ".join(args.categories) + " |", "|---|" + "---|" * len(args.categories)]
    for target in dict.fromkeys(t for t, _ in CEILINGS):
        cells = [math.exp(statistics.mean(math.log(c) for c in CEILINGS[target, cat])) if (target, cat) in CEILINGS
                 else float("nan") for cat in args.categories]
        lines.append(f"| {target} | " + " | ".join(f"{c:.2f}x" for c in cells) + " |")
    lines += ["", "Where speculative output differed from plain greedy: first differing generated token and the "
              "target's top-2 logit gap there (plain decoding's logits).", ""]
    if not ties:
        lines.append("None: every speculative output was token-for-token identical to plain greedy.")
    for target, category, name, pos, gap in ties:
        lines.append(f"- {target} / {category} / {name}: token {pos}, top-2 gap {gap:.4f}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=["fp32", "int4", "int4-edge"],
                    choices=["fp32", "int4", *EDGE_KERNEL_TARGETS],
                    help="int4: stock ops; int4-edge (the default model where the kernels are built) / int4-edge-acc0: "
                         "int4 on edge.QMatMul and edge.Attention, int8 / float activations")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--categories", nargs="+", choices=list(CATEGORIES), default=list(CATEGORIES))
    ap.add_argument("--variants", nargs="+", help="drafters to run (default: all); plain always runs, e.g. "
                    "--variants layer-skip lookup+layer-skip prompt-lookup")
    ap.add_argument("--fresh", action="store_true", help="new drafters and policies for every run (each run as a "
                    "process's first prompt, as one edge-run call has); default: policies learn across prompts")
    ap.add_argument("--history", type=int, default=0, help="earlier turns before each prompt (6: ~1,300 tokens)")
    ap.add_argument("--ablations", action="store_true", help="also prompt lookup and lookup+head without its kinds' "
                    "measured acceptance (PromptLookup.kind_acceptance)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "speculative.md"))
    args = ap.parse_args()
    from edge.default_model import default_package
    from edge.package import load_package

    packages = {q: load_package(default_package(q), verify=False) for q in ("fp32", "int4")}
    packages.update({t: load_package(edge_kernel_package(level), verify=False)
                     for t, level in EDGE_KERNEL_TARGETS.items() if t in args.targets})
    rows, ties = [], []
    for target in args.targets:
        bench_target(target, packages, args, rows, ties)
    text = table(rows, ties, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
    os.replace(tmp.name, out)
    print(text)


if __name__ == "__main__":
    main()
