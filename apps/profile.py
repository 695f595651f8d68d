"""edge-profile [MODEL] [--draft PKG] [--budget 2GiB | --profile NAME] [--tokens N] [--chart out.html|out.png]

Prints the plan and the memory it predicts by component, runs a short generation, measures this process's memory by
phase (imports, session creation, prefill, decode: RSS with psutil, and GPU memory through NVML when pynvml and a GPU
are there), and prints predicted against measured. The prompt fills the planned context by default, because RSS only
counts pages that were written: a half-empty KV cache would look smaller than the plan promises.

--chart writes memory over time by phase and tokens/s against budget, as a self-contained HTML page (inline SVG), or a
PNG when matplotlib is installed (without it, the HTML page is written next to the PNG's name).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from edge.apps.cli import VersionAction, int_at_least, run_main

FILLER = ("The river carried the boat past the old mill, where the miller's children counted the barges and wrote "
          "their names in a ledger that nobody else ever read. ")
DRAFT_DEPTH = 8  # the speculator's largest adaptive depth: what a draft may verify per step without a plan
SWEEP_POINTS = 10


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edge-profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=VersionAction)
    p.add_argument("model", nargs="?", help="package folder, or a GGUF file or Hugging Face folder (exported once "
                                            "into ~/.cache/edge); default: the default model")
    p.add_argument("--draft", help="draft model package for speculative decoding")
    p.add_argument("--budget", help="memory budget, e.g. 2GiB or 512MB (default: no budget, the engine's defaults)")
    p.add_argument("--profile", help="device profile name: its memory is the budget, its bandwidths the speed model")
    p.add_argument("--tokens", type=int_at_least(1), default=32, help="tokens to generate (default 32)")
    p.add_argument("--prompt-tokens", type=int_at_least(1),
                   help="prompt length (default: fill the planned context, less the generated tokens)")
    p.add_argument("--context", type=int_at_least(2),
                   help="cap on the context length (at least 2: a prompt token and a generated one)")
    p.add_argument("--threads", type=int_at_least(1))
    p.add_argument("--kv-dtype", choices=["float32", "float16"],
                   help="KV cache type (default: the package's), as edge-run --kv-dtype: float16 halves the cache")
    p.add_argument("--chart", help="write the charts to this .html or .png file")
    p.add_argument("--list", action="store_true", help="list the device profiles and exit")
    return p


@dataclass(frozen=True)
class Prediction:
    """The plan's memory, and what it predicts for each measured phase."""

    describe: str
    terms: dict[str, int]
    by_phase: dict[str, int]
    budget: int | None
    decode_tokens_per_s: float


def _at_fill(memory, tokens: int, context: int) -> int:
    """Predicted peak with `tokens` of the KV caches written (RSS counts only written pages)."""
    unwritten = (memory.kv_target + memory.kv_draft) * (1 - min(tokens, context) / context)
    return int(memory.run_peak - unwritten)


def predict(result_memory, describe: str, budget: int | None, rate: float, prompt: int, tokens: int,
            context: int) -> Prediction:
    from edge.memory.budget import SESSION_RUNTIME_BYTES

    m = result_memory
    return Prediction(
        describe=describe, terms=m.terms(), budget=budget, decode_tokens_per_s=rate,
        by_phase={"imports": m.overhead - SESSION_RUNTIME_BYTES, "session": m.load_peak,
                  "prefill": _at_fill(m, prompt, context), "decode": _at_fill(m, prompt + tokens, context)})


def unbudgeted_plan(planner, args, draft: bool):
    """The plan an Engine without a budget allocates: its default context and prefill chunk."""
    from edge.engine import DEFAULT_CONTEXT
    from edge.memory.budget import Plan
    from edge.model import DEFAULT_PREFILL_CHUNK

    context = min(args.context or DEFAULT_CONTEXT, planner.max_context)
    return Plan(context=context, prefill_chunk=min(DEFAULT_PREFILL_CHUNK, context),
                draft_len=DRAFT_DEPTH if draft else 0)


def budget_sweep(target, draft, device, around: int) -> list[dict]:
    """Plans for a few budgets from the smallest that runs (weight paging allowed) to twice `around`."""
    from edge.memory.budget import BudgetError
    from edge.memory.planner import make_planner

    planner = make_planner(target, draft=draft, device=device, allow_paging=True)
    low = planner.bounds().runs_at_all
    high = max(2 * around, int(low * 1.5))
    rows = []
    for i in range(SWEEP_POINTS):
        budget = int(low * (high / low) ** (i / (SWEEP_POINTS - 1)))
        try:
            result = planner.plan(budget)
        except BudgetError:
            continue
        p = result.plan
        rows.append({"budget": budget, "context": p.context, "draft": p.draft_len, "nodes": p.nodes,
                     "paged": p.resident_layers is not None, "tokens_per_s": result.decode_tokens_per_s})
    return rows


def fill_prompt(tokenizer, length: int) -> list[int]:
    ids = tokenizer.encode(FILLER, add_special_tokens=False) or [0]
    return (ids * (length // len(ids) + 1))[:length]


def phase_table(prediction: Prediction, recorder) -> list[tuple[str, int, int]]:
    return [(ph.name, prediction.by_phase.get(ph.name, 0), ph.peak) for ph in recorder.phases]


def report(prediction: Prediction, rows, recorder, measured_rate: float, prefill_rate: float, prompt: int,
           tokens: int) -> str:
    from edge.memory.budget import format_bytes

    lines = [prediction.describe, "", f"{'phase':<9}{'predicted':>12}{'measured peak':>15}{'diff':>8}"]
    for name, predicted, measured in rows:
        diff = f"{(measured - predicted) / predicted:+.1%}" if predicted else ""
        lines.append(f"{name:<9}{format_bytes(predicted):>12}{format_bytes(measured):>15}{diff:>8}")
    gpu = [ph for ph in recorder.phases if ph.gpu_peak is not None]
    for ph in gpu:
        lines.append(f"GPU memory used, {ph.name}: {format_bytes(ph.gpu_peak)}")
    if prediction.budget is not None:
        peak = max(m for _, _, m in rows)
        verdict = "within" if peak <= prediction.budget else "OVER"
        lines.append(f"measured peak {format_bytes(peak)} is {verdict} the budget of {format_bytes(prediction.budget)}")
    lines.append(f"prefill {prompt} tokens at {prefill_rate:.1f} tok/s; decode {tokens} tokens at "
                 f"{measured_rate:.1f} tok/s (planner's upper bound {prediction.decode_tokens_per_s:.1f})")
    return "\n".join(lines)


def charts(prediction: Prediction, recorder, sweep: list[dict], measured_rate: float, run_budget: int):
    from edge.memory.chart import Band, Chart, Line

    memory = Chart("Memory over time by phase", "seconds", "MiB")
    samples = recorder.samples[:: max(1, len(recorder.samples) // 1500)]
    memory.series["process RSS"] = [(s.seconds, s.rss / 2**20) for s in samples]
    if any(s.gpu is not None for s in samples):
        memory.series["GPU memory used"] = [(s.seconds, s.gpu / 2**20) for s in samples if s.gpu is not None]
    memory.bands = [Band(ph.name, ph.start, ph.end) for ph in recorder.phases]
    memory.lines = [Line("predicted peak", prediction.terms["peak"] / 2**20, "#7f7f7f")]
    if prediction.budget is not None:
        memory.lines.append(Line("budget", prediction.budget / 2**20))
    speed = Chart("Tokens/s against budget (planner, scaled to the measured rate)", "budget (MiB)", "tokens/s",
                  step=True)
    scale = measured_rate / prediction.decode_tokens_per_s if prediction.decode_tokens_per_s else 0.0
    speed.series[f"planned decode tok/s x {scale:.3f}"] = [(r["budget"] / 2**20, r["tokens_per_s"] * scale)
                                                         for r in sweep]
    speed.markers = [(f"this run: {measured_rate:.1f} tok/s", run_budget / 2**20, measured_rate)]
    return [memory, speed]


def write_chart(path: str, prediction: Prediction, rows, sweep, figures, text: str) -> Path:
    from edge.memory.budget import format_bytes
    from edge.memory.chart import html_page, html_table, write_atomic, write_png

    target = Path(path)
    if target.suffix.lower() == ".png":
        if write_png(target, figures):
            return target
        target = target.with_suffix(".html")
        print(f"edge-profile: matplotlib is not installed; writing {target} instead", file=sys.stderr)
    tables = [
        ("Predicted memory by component", html_table(
            [(k, format_bytes(v)) for k, v in prediction.terms.items()], ["component", "predicted"])),
        ("Predicted against measured, by phase", html_table(
            [(n, format_bytes(p), format_bytes(m), f"{(m - p) / p:+.1%}" if p else "") for n, p, m in rows],
            ["phase", "predicted", "measured peak", "diff"])),
        ("Budgets planned by the planner", html_table(
            [(format_bytes(r["budget"]), r["context"], r["draft"], "yes" if r["paged"] else "no",
              f"{r['tokens_per_s']:.1f}") for r in sweep],
            ["budget", "context", "draft length", "weights paged", "predicted tok/s (upper bound)"])),
    ]
    return write_atomic(target, html_page("edge-profile", figures, tables, notes=text))


def profile(args, recorder) -> None:
    with recorder.phase("imports"):
        import onnx  # noqa: F401  (load_package imports it: counted here, with the rest of the runtime's imports)

        from edge.engine import Engine
        from edge.memory.budget import ModelSpec, format_bytes
        from edge.memory.plan_runtime import is_profile_name, plan_package
        from edge.memory.planner import make_planner
        from edge.memory.profiles import load_profile, profile_names
        from edge.package import Package, resolve_package_dir

    if args.list:
        for name in profile_names():
            p = load_profile(name)
            print(f"{name:<22}{format_bytes(p.memory_bytes):>11}  {p.description}")
        return
    import json

    from edge.cached_export import resolve

    root = resolve_package_dir(resolve(args.model)) if args.model else _default_package()
    manifest = json.loads((root / "manifest.json").read_text())
    package = Package(root, manifest)  # the manifest alone: planning precedes loading, as in the Engine
    if args.kv_dtype is not None:
        package = package.with_kv_dtype(args.kv_dtype)
        manifest = package.manifest
    draft = None
    if args.draft:
        draft_root = resolve_package_dir(resolve(args.draft))
        draft = Package(draft_root, json.loads((draft_root / "manifest.json").read_text()))
    budget = args.budget if args.budget is not None else args.profile
    device = load_profile(args.profile) if args.profile else (
        load_profile(budget) if is_profile_name(budget) else None)
    target_spec = ModelSpec.from_manifest(manifest, name=root.name)
    draft_spec = ModelSpec.from_manifest(draft.manifest, name=draft.root.name) if draft else None
    if budget is not None:
        planned = plan_package(package, budget, profile=args.profile, context=args.context, draft=draft)
        result, describe, budget_bytes = planned.result, planned.describe(), planned.result.budget
        memory, plan, rate = result.memory, result.plan, result.decode_tokens_per_s
    else:
        planner = make_planner(target_spec, draft=draft_spec, device=device)
        plan = unbudgeted_plan(planner, args, draft is not None)
        memory, budget_bytes = planner.model.estimate(plan), None
        rate = planner.speed.decode_rate(planner.model, plan)
        describe = (f"no budget: the engine's defaults\nplan: context {plan.context}, prefill chunk "
                    f"{plan.prefill_chunk}, {'draft up to ' + str(plan.draft_len) if draft else 'no draft'}\n"
                    f"predicted peak {format_bytes(memory.peak)}\n{memory.table()}")
    context = plan.context
    prompt_len = args.prompt_tokens or max(1, context - args.tokens - plan.nodes - 1)
    print(describe, flush=True)

    with recorder.phase("session"):
        engine = Engine(root, context_length=args.context, threads=args.threads, kv_dtype=args.kv_dtype,
                        speculator=str(draft.root) if draft else None,
                        **({"budget": budget, "profile": args.profile} if budget is not None else {}))
    ids = fill_prompt(engine.tokenizer, min(prompt_len, engine.context_length - 1))
    with recorder.phase("prefill"):
        engine.generate(ids, max_tokens=1)
        prefill_rate = engine.stats.prompt_tokens_per_second
    with recorder.phase("decode"):
        engine.generate(ids, max_tokens=args.tokens)
        decode_rate, generated = engine.stats.generate_tokens_per_second, engine.stats.generated_tokens
    recorder.stop()

    prediction = predict(memory, describe, budget_bytes, rate, len(ids), generated, context)
    rows = phase_table(prediction, recorder)
    text = report(prediction, rows, recorder, decode_rate, prefill_rate, len(ids), generated)
    print("\n".join(text.splitlines()[len(describe.splitlines()):]))
    if args.chart:
        sweep = budget_sweep(target_spec, draft_spec, device, budget_bytes or memory.peak)
        figures = charts(prediction, recorder, sweep, decode_rate, budget_bytes or memory.peak)
        written = write_chart(args.chart, prediction, rows, sweep, figures, text)
        print(f"chart written to {written}")


def _default_package() -> Path:
    from edge.default_model import default_package, default_quant

    return Path(default_package(default_quant()))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from edge.memory.phases import PhaseRecorder, nvml_reader

    recorder = PhaseRecorder(gpu=nvml_reader()).start()
    try:
        return run_main(lambda: profile(args, recorder), "edge-profile")
    finally:
        recorder.stop()


if __name__ == "__main__":
    sys.exit(main())
