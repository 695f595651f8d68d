"""Named drafter combinations for the CLI and the API: model-free first, a draft model where one is given."""

from __future__ import annotations

import os

from edge.errors import EdgeError
from edge.package import load_package
from edge.speculative.decode import Speculator
from edge.speculative.draft_head import DraftHead
from edge.speculative.draft_model import DraftModel, check_compatible
from edge.speculative.layer_skip import LayerSkipDraft
from edge.speculative.prompt_lookup import PromptLookup, case_classes
from edge.speculative.token_recycling import TokenRecycling

NAMES = ("prompt-lookup", "recycling", "lookup+recycling", "head", "lookup+head", "auto", "skip", "lookup+skip")


def verify_rows(spec) -> int:
    """Tokens one verify step of a model-free drafter scores (root included), for the memory plan; 0 for drafters
    with a model of their own, which the planner sizes itself."""
    if spec in ("prompt-lookup", "head", "lookup+head"):  # chains of at most the speculator's depth
        return 1 + Speculator([PromptLookup()]).max_depth
    if spec in ("recycling", "lookup+recycling", "auto"):
        return 1 + TokenRecycling(1).max_nodes
    return 0


def prompt_lookup(engine) -> PromptLookup:
    """Prompt lookup over the engine's vocabulary, matching tokens up to letter case."""
    return PromptLookup(fold=case_classes(engine.tokenizer.vocab()))


def make_speculator(spec: str, engine, draft_length: int | None = None) -> Speculator:
    """`spec`: prompt-lookup, recycling, lookup+recycling (prompt lookup, else recycling), head (the package's
    trained draft head), lookup+head (prompt lookup, else the head), auto (see auto_spec), skip (the package's
    skip-layer self-draft), lookup+skip (prompt lookup, else the self-draft), or a draft package's path (prompt
    lookup, else the draft model)."""
    package = engine.package
    vocab = package.config.vocab_size
    threads = engine.threads
    if spec == "auto":
        spec = auto_spec(engine)
    if spec in ("recycling", "lookup+recycling") and not package.tree_attention:
        raise EdgeError(f"{package.root} was exported without tree attention, which token recycling needs; "
                        f"re-export it or use --draft prompt-lookup")
    if spec == "prompt-lookup":
        drafters = [prompt_lookup(engine)]
    elif spec == "recycling":
        drafters = [TokenRecycling(vocab)]
    elif spec in ("head", "lookup+head"):
        head = DraftHead(package, device=engine.decoder.device)
        drafters = [head] if spec == "head" else [prompt_lookup(engine), head]
    elif spec == "lookup+recycling":
        drafters = [prompt_lookup(engine), TokenRecycling(vocab)]
    elif spec in ("skip", "lookup+skip"):
        skip = LayerSkipDraft(package, engine.context_length, threads=threads)
        drafters = [skip] if spec == "skip" else [prompt_lookup(engine), skip]
    elif os.path.exists(spec):
        from edge.cached_export import resolve

        draft = load_package(resolve(spec, engine.decoder.device))  # a GGUF or HF folder: exported once
        check_compatible(package, draft)
        drafters = [prompt_lookup(engine), DraftModel(draft, engine.context_length, threads=threads)]
    else:
        raise EdgeError(f"unknown drafter {spec!r}: use one of {', '.join(NAMES)} or a draft package's folder")
    return Speculator(drafters, draft_length=draft_length, threads=threads)


def auto_spec(engine) -> str:
    """Prompt lookup first, then the package's draft head on a CPU and token recycling on a GPU.

    Measured on the default model, each drafter behind prompt lookup (benchmarks/RESULTS.md, speculative section):
    on the 2-core CPU the head wins open chat and code (1.28x / 1.33x against recycling's 1.06x / 1.12x), where a
    verify row costs (8 rows ~1.6-2.2x one) and a head step is ~5% of a target step. On an H200 recycling wins open
    chat (1.28-1.32x against 0.91-0.96x) and rewrite (1.45-1.82x against 1.11-1.52x) and ties code, summarise and
    repeat, where 8 rows cost 1.2-1.4x one and a head step, dispatch-bound, ~10% of a 1.45 ms target step."""
    if engine.package.draft_head is None:
        return "lookup+recycling"
    if engine.decoder.device == "cpu" or not engine.package.tree_attention:
        return "lookup+head"
    return "lookup+recycling"
