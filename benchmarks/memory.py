"""SpecMemo's headline on edge: generation memory and throughput, naive allocation against the planner's.

    python benchmarks/memory.py [--repeats 3] [--prompt 448] [--tokens 64] [--threads 2]
    python benchmarks/memory.py --terms     # the memory model term by term against measurement -> memory.terms.md

Workload: a prompt of --prompt tokens, then --tokens new tokens, greedy, EOS ignored. For each model setup (the
default int4 package, the fp32 package, and the fp32 package with the int4 package as its draft model):

- naive: what a runtime that preallocates for the model's full context does (onnxruntime-genai sizes its KV buffers
  for max_length, the model's context, by default): KV caches for the full context, target and draft. Measured twice:
  with the buffers as numpy allocates them (Linux commits a page only when it is written, so untouched cache costs no
  RSS), and "committed", with the whole buffers written once before generation, as a runtime that initialises its
  cache (or any GPU allocation) pays.
- planned: the planner's allocation for this workload (edge.Engine with a budget and the workload as its context),
  draft length from the plan; the naive runs use the same draft length, so only the allocation differs.

Generation memory is everything but weights: peak RSS while generating less RSS once the engine is loaded (weights,
runtime, tokenizer). Decode speed is the median of TIMING_RUNS repeats of the same generation in the same worker,
after the memory measurement, whose RSS sampler thread would otherwise compete for the 2 cores (it moved decode
speed by up to 30% between runs of one setup). Every run is a fresh subprocess; setups are interleaved run by run,
and the table has medians.
A reference row measures onnxruntime-genai itself (int4) with max_length at the model's context and at the workload.
The predicted columns are the memory model's generation bytes (all buffers written).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "memory.md"
TERMS_RESULTS = Path(__file__).parent / "results" / "memory.terms.md"
TERM_STEPS = (1, 16, 64, 128, 256, 512)  # tokens per step, each measured in its own process
TERM_CONTEXT = 2048
TIMING_RUNS = 3  # the same generation repeated in the worker, after the memory measurement, for its decode speed
# Varied prose, so that prompt lookup cannot simply copy the continuation (a repeated sentence would make every
# drafted token accepted and speculation look better than it is).
TEXT = (
    "Mara kept bees on the roof of a laundromat in a city that had forgotten what flowers were for. Each morning she "
    "climbed the iron ladder with a thermos of black tea, lifted the lids of three white hives and listened. A "
    "healthy colony hums in a low, even chord; a colony without a queen sounds anxious, higher and ragged, like a "
    "radio between stations. In the spring of her fourth year the middle hive went quiet in a way she had never "
    "heard before. She found no dead bees, no mites and no wax moth, only an empty comb and a few hundred workers "
    "circling as if they had lost the map home. The neighbours blamed the new cell tower; the man from the "
    "agricultural office blamed a pesticide sprayed on the park two miles east. Mara did not know whom to believe, "
    "so she started writing everything down: the weather, the bloom of every linden and chestnut within walking "
    "distance, the hour the first foragers left and the hour the last returned. By autumn the notebook had become "
    "three notebooks, and a pattern was beginning to show. Explain what a careful beekeeper could conclude from "
    "such records, what she could not conclude, and which single measurement would most help her decide between "
    "the two explanations the neighbours and the officer offered."
)
PLANNED_BUDGET = "8GiB"  # ample: the workload, not the budget, limits the planned context


def models() -> dict[str, Path]:
    from edge.default_model import default_package

    return {"int4": Path(default_package("int4")), "fp32": Path(default_package("fp32"))}


def prompt_ids(tokenizer, length: int) -> list[int]:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    return (ids * (length // len(ids) + 1))[:length]


def workload_context(prompt: int, tokens: int) -> int:
    return prompt + tokens + 16  # room for a verification step's nodes at the end (the runtime keeps plan.nodes)


def build_engine(setup: dict):
    """The engine of a setup: planned (budget + workload context) or naive (the model's full context)."""
    from edge.engine import Engine
    from edge.package import load_package
    from edge.speculative import make_speculator

    target = setup["target"]
    if setup["mode"] == "planned":
        engine = Engine(target, budget=PLANNED_BUDGET, context_length=setup["context"], threads=setup["threads"],
                        speculator=setup.get("draft"))
    else:
        engine = Engine(target, context_length=load_package(target, verify=False).config.max_context,
                        threads=setup["threads"])
        if setup.get("draft"):
            engine.speculator = make_speculator(setup["draft"], engine, draft_length=setup["draft_len"])
    return engine


def caches(engine) -> list:
    found = [engine.decoder.cache]
    for drafter in getattr(engine.speculator, "drafters", []):
        if hasattr(drafter, "decoder"):
            found.append(drafter.decoder.cache)
    return found


def worker_edge(setup: dict) -> dict:
    from edge.memory.phases import PhaseRecorder
    from edge.memory.usage import rss_bytes

    recorder = PhaseRecorder(interval=0.005).start()
    with recorder.phase("load"):
        engine = build_engine(setup)
    loaded = rss_bytes()
    engine.tokenizer.eos_token_ids = []
    ids = prompt_ids(engine.tokenizer, setup["prompt"])
    with recorder.phase("generate"):
        if setup["mode"] == "naive-committed":
            for cache in caches(engine):
                for array in cache.arrays:
                    array.fill(0)  # write every page once, as a runtime that initialises its buffers does
        engine.generate(ids, max_tokens=1)
        prefill = engine.stats.prompt_tokens_per_second
        engine.generate(ids, max_tokens=setup["tokens"])
        stats = engine.stats
    recorder.stop()
    spec = stats.speculative
    speeds = []
    for _ in range(TIMING_RUNS):  # timed again without the memory sampler's thread (it competes for the 2 cores)
        engine.generate(ids, max_tokens=setup["tokens"])
        speeds.append(engine.stats.generate_tokens_per_second)
    return {"generation_bytes": recorder.phases[-1].peak - loaded, "loaded_bytes": loaded,
            "decode_tps": statistics.median(speeds), "prefill_tps": prefill,
            "generated": stats.generated_tokens, "context": engine.context_length,
            "kv_allocated": sum(c.nbytes for c in caches(engine)),
            "tokens_per_call": spec.tokens_per_call if spec is not None else None}


def worker_genai(setup: dict) -> dict:
    import onnxruntime_genai as og

    from edge.memory.phases import PhaseRecorder
    from edge.memory.usage import rss_bytes

    recorder = PhaseRecorder(interval=0.005).start()
    with recorder.phase("load"):
        config = og.Config(setup["target"])
        config.clear_providers()
        model = og.Model(config)
        tokenizer = og.Tokenizer(model)
    loaded = rss_bytes()
    ids = list(tokenizer.encode(TEXT))
    ids = (ids * (setup["prompt"] // len(ids) + 1))[: setup["prompt"]]
    with recorder.phase("generate"):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=setup["context"],
                                  min_length=setup["prompt"] + setup["tokens"])
        gen = og.Generator(model, params)
        start = time.perf_counter()
        gen.append_tokens(ids)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(setup["tokens"]):
            gen.generate_next_token()
        decode = time.perf_counter() - start
    recorder.stop()
    return {"generation_bytes": recorder.phases[-1].peak - loaded, "loaded_bytes": loaded,
            "decode_tps": setup["tokens"] / decode, "prefill_tps": len(ids) / prefill,
            "generated": setup["tokens"], "context": setup["context"], "kv_allocated": None,
            "tokens_per_call": None}


def predicted_generation_bytes(setup: dict) -> int | None:
    """The memory model's generation bytes for the setup's allocation, every buffer written."""
    if setup["system"] != "edge":
        return None
    from edge.memory.budget import MemoryModel, ModelSpec, Plan

    target = ModelSpec.from_package(setup["target"])
    draft = ModelSpec.from_package(setup["draft"]) if setup.get("draft") else None
    model = MemoryModel(target, draft)
    context = setup["context"] if setup["mode"] == "planned" else target.config.max_context
    plan = Plan(context=context, prefill_chunk=setup["chunk"], draft_len=setup.get("draft_len", 0))
    return model.estimate(plan).generation_bytes


def run_worker(setup: dict, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(setup)], capture_output=True, text=True,
                         env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"worker failed for {setup['name']}:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def plan_setup(target: Path, draft: Path | None, context: int) -> tuple[int, int]:
    """Draft length and prefill chunk the planner picks for the workload."""
    from edge.memory.plan_runtime import plan_package
    from edge.package import load_package

    result = plan_package(load_package(target, verify=False), PLANNED_BUDGET, context=context,
                          draft=load_package(draft, verify=False) if draft else None).result
    return result.plan.draft_len, result.plan.prefill_chunk


def setups(args) -> list[dict]:
    paths = models()
    context = workload_context(args.prompt, args.tokens)
    base = {"system": "edge", "prompt": args.prompt, "tokens": args.tokens, "threads": args.threads,
            "context": context}
    pairs = [("int4", paths["int4"], None), ("fp32", paths["fp32"], None)]
    if not args.no_speculative:
        pairs.append(("fp32 + int4 draft", paths["fp32"], paths["int4"]))
    out = []
    for label, target, draft in pairs:
        draft_len, chunk = plan_setup(target, draft, context)
        if draft is not None and draft_len == 0:
            print(f"note: the planner does not keep the draft for {label}; measuring it with draft length 4")
            draft_len = 4
        for mode in ("naive", "naive-committed", "planned"):
            setup = dict(base, name=f"{label} | {mode}", label=label, mode=mode, target=str(target),
                         draft=str(draft) if draft else None, draft_len=draft_len, chunk=chunk)
            out.append(setup)
    if not args.no_genai:
        genai = Path.home() / ".cache/edge/bench/genai-int4"
        if (genai / "genai_config.json").exists():
            max_length = json.loads((genai / "genai_config.json").read_text())["search"]["max_length"]
            for mode, length in (("max_length = model context", max_length), ("max_length = workload", context)):
                out.append(dict(base, system="onnxruntime-genai", name=f"genai int4 | {mode}", label="genai int4",
                                mode=mode, target=str(genai), context=length))
    return out


NOTES = [
    "Notes:",
    "- Lazy pages do not save the naive allocation: numpy's zeroed buffers are committed only when written, yet the "
    "naive rows end with about 73% of their KV buffers resident. onnxruntime 1.31 (CPU) makes most of a bound "
    "cache resident on the first step of the graph, whatever its length (a single 4-token step into fresh 8192-token "
    "SmolLM2 caches raised RSS by 238 of their 360 MiB while writing 4 rows), so only a cache sized for the "
    "workload keeps generation memory small. The committed rows are what a runtime that initialises its buffers, or "
    "any GPU allocation, pays.",
    "- onnxruntime-genai shows the same effect (its rows, when its package is in the edge cache; measured "
    "2026-11-22 with 64 new tokens): max_length at the model's context cost 420 MiB of generation memory, "
    "max_length sized for the workload 74 MiB.",
    "- Speculative rows: the draft model plus prompt lookup (edge.speculative), draft length from the planner for "
    "both allocations.",
    "- Decode throughput on this shared 2-core machine varies by up to 2x between rounds; the paired ratio is the "
    "figure to read, and differences of a few percent are within its noise.",
]


def mib(n: float | None) -> str:
    return "" if n is None else f"{n / 2**20:.1f}"


def table(rows: list[dict], args) -> str:
    lines = [
        "# Generation memory: naive against planned allocation (SpecMemo headline)", "",
        f"`python benchmarks/memory.py --repeats {args.repeats} --prompt {args.prompt} --tokens {args.tokens} "
        f"--threads {args.threads}` on this machine (2 cores, shared with other jobs; medians of {args.repeats} "
        "fresh processes per row, rows interleaved). Workload: a "
        f"{args.prompt}-token prompt and {args.tokens} new tokens, greedy. Generation memory = peak RSS while "
        "generating less RSS after loading (weights, runtime and tokenizer excluded). Predicted = the memory "
        "model's generation bytes with every buffer written.", "",
        "| setup | allocation | context | KV allocated (MiB) | predicted gen. memory (MiB) | measured gen. memory "
        "(MiB) | decode tok/s | prefill tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['label']} | {r['mode']} | {r['context']} | {mib(r['kv_allocated'])} | "
                     f"{mib(r['predicted'])} | {mib(r['generation_bytes'])} | {r['decode_tps']:.1f} | "
                     f"{r['prefill_tps']:.1f} |")
    lines += ["", "Planned against naive (target: at least 65% less generation memory at no less than 96% of "
              "the throughput). Throughput is the median over rounds of planned / naive decode tok/s within a round "
              "(rows run back to back, so a busy neighbour slows both alike); the ratio of the medians is in "
              "brackets.", ""]
    by = {(r["label"], r["mode"]): r for r in rows}
    for label in dict.fromkeys(r["label"] for r in rows if r["system"] == "edge"):
        planned = by[(label, "planned")]
        for mode in ("naive", "naive-committed"):
            naive = by[(label, mode)]
            saved = 1 - planned["generation_bytes"] / naive["generation_bytes"] if naive["generation_bytes"] else 0
            speed = planned["decode_tps"] / naive["decode_tps"] if naive["decode_tps"] else 0
            paired = statistics.median(a["decode_tps"] / b["decode_tps"]
                                       for a, b in zip(planned["runs"], naive["runs"]))
            lines.append(f"- {label}, against {mode}: {saved:.0%} less generation memory, "
                         f"{paired:.0%} of the decode throughput ({speed:.0%})")
    lines += ["", *NOTES]
    return "\n".join(lines) + "\n"


def median_row(setup: dict, results: list[dict]) -> dict:
    row = dict(setup)
    for key in ("generation_bytes", "loaded_bytes", "decode_tps", "prefill_tps"):
        row[key] = statistics.median(r[key] for r in results)
    row["context"], row["kv_allocated"] = results[0]["context"], results[0]["kv_allocated"]
    row["predicted"] = predicted_generation_bytes(setup)
    row["runs"] = results
    return row


def paged_package(quant: str) -> Path:
    """The default model as a paged package (fp32, or int4 on edge.QMatMul), exported once into the bench cache."""
    from edge.default_model import cache_dir, default_gguf
    from edge.export.gguf import load_gguf
    from edge.export.paged import export_paged

    root = cache_dir() / "bench" / f"memory-terms-paged-{quant}"
    if not (root / "manifest.json").exists():
        export_paged(load_gguf(default_gguf()), root, rope_cache_len=256, quant=quant, overwrite=True,
                     kernels="edge" if quant == "int4" else "stock")
    return root


def term_rows() -> list[tuple[str, str, float, float]]:
    """(package, term, predicted MiB, measured MiB) for every term the memory model predicts and a process shows."""
    from edge.memory.budget import MemoryModel, ModelSpec, Plan, activation_bytes
    from edge.memory.usage import measure_paged, measure_resident

    rows, m = [], float(1 << 20)
    for quant, package in models().items():
        spec = ModelSpec.from_package(package)
        est = MemoryModel(spec).estimate(Plan(context=TERM_CONTEXT, prefill_chunk=max(TERM_STEPS)))
        runs = [measure_resident(package, TERM_CONTEXT, [tokens]) for tokens in TERM_STEPS]  # one step a process
        load = est.load_peak - est.tokenizer  # the measuring process loads no tokenizer
        rows.append((quant, "session: weights + prepack + runtime", load / m, runs[0]["session"] / m))
        rows.append((quant, f"+ KV cache ({TERM_CONTEXT} tokens) + a logits row",
                     (load + est.kv_target + est.logits) / m, runs[0]["buffers"] / m))
        for tokens, run in zip(TERM_STEPS, runs):
            rows.append((quant, f"activations of a {tokens}-token step",
                         activation_bytes(spec.config, tokens, TERM_CONTEXT, int8_activations=spec.int8_activations,
                                          edge_attention=spec.edge_attention, fused_mlp=spec.fused_mlp,
                                          pre_projections=spec.pre_projections) / m,
                         run["steps"][0] / m))
    for quant in ("fp32", "int4"):
        root = paged_package(quant)
        model = MemoryModel(ModelSpec.from_package(root))
        for pinned in (0, 30):
            plan = Plan(context=256, prefill_chunk=16, stream_window=2,
                        resident_layers=None if pinned == 30 else pinned)
            est = model.estimate(plan)
            rows.append((f"paged {quant}", f"peak, {pinned} layers pinned, 2 slots", (est.peak - est.tokenizer) / m,
                         measure_paged(root, pinned, 2) / m))
    return rows


def terms_table(rows: list[tuple[str, str, float, float]]) -> str:
    lines = [
        "# The memory model, term by term, against measurement",
        "",
        "`python benchmarks/memory.py --terms`: the default model (SmolLM2-135M) as edge packages, each measured in a "
        "fresh process by edge.memory.usage (2 threads): RSS after the session is created, after the KV cache and a "
        "logits row are written, and what one step of S tokens at a full "
        f"{TERM_CONTEXT}-token context adds (the activation term; a process per S); for paged packages "
        "(export/paged.py) the peak "
        "RSS (VmHWM) of a 16-token prefill and 4 decode steps at a 256-token context. Predicted: edge.memory.budget "
        "(less the tokenizer, which the measuring process does not load). tests/test_budget.py and "
        "tests/test_paging.py assert the same comparisons within 10% (the first, with growing steps in one process, "
        "where the arena's fragmentation adds up to 7% to a 512-token step).",
        "",
        "| package | term | predicted (MiB) | measured (MiB) | error |",
        "|---|---|---|---|---|",
    ]
    for package, term, predicted, measured in rows:
        lines.append(f"| {package} | {term} | {predicted:.1f} | {measured:.1f} | {predicted / measured - 1:+.1%} |")
    worst = max(abs(p / q - 1) for _, _, p, q in rows)
    lines += ["", f"Largest error: {worst:.1%}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-speculative", action="store_true")
    p.add_argument("--no-genai", action="store_true")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--table-only", action="store_true", help="rewrite the table from the last run's .json")
    p.add_argument("--terms", action="store_true", help="the memory model term by term against measurement")
    args = p.parse_args(argv)
    if args.terms:
        from edge.memory.chart import write_atomic

        print(write_atomic(TERMS_RESULTS, terms_table(term_rows())).read_text())
        return 0
    if args.table_only:
        rows = json.loads(Path(args.out).with_suffix(".json").read_text())
        args.repeats = len(rows[0]["runs"])
        args.prompt, args.tokens, args.threads = rows[0]["prompt"], rows[0]["tokens"], rows[0]["threads"]
        from edge.memory.chart import write_atomic

        print(write_atomic(Path(args.out), table(rows, args)).read_text())
        return 0
    if args.worker:
        setup = json.loads(args.worker)
        result = (worker_genai if setup["system"] == "onnxruntime-genai" else worker_edge)(setup)
        print(json.dumps(result))
        return 0
    plan = setups(args)
    results: dict[str, list[dict]] = {s["name"]: [] for s in plan}
    for repeat in range(args.repeats):
        for setup in plan:
            result = run_worker(setup, args.threads)
            results[setup["name"]].append(result)
            print(f"[{repeat + 1}/{args.repeats}] {setup['name']}: generation {mib(result['generation_bytes'])} MiB, "
                  f"decode {result['decode_tps']:.1f} tok/s", flush=True)
    rows = [median_row(s, results[s["name"]]) for s in plan]
    text = table(rows, args)
    from edge.memory.chart import write_atomic

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, text)
    write_atomic(out.with_suffix(".json"), json.dumps([{k: v for k, v in r.items()} for r in rows], indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
