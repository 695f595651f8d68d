"""Every drafter on the real default model (fp32): greedy speculative output is token-for-token plain greedy."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

PASSAGE = ("The Amazon rainforest covers much of the Amazon basin of South America. The basin spans 7,000,000 km2, "
           "of which 5,500,000 km2 are covered by the rainforest. The region includes territory of nine nations.")
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Why is the sky blue?",
    "Write a haiku about autumn.",
    "Explain what a hash table is.",
    "Write a Python function that reverses a string.",
    "Write a Python function that checks whether a number is prime.",
    f"Add a multiply function to this code:\n{CODE}",
    f"Add type hints to this code:\n{CODE}",
    f"Rewrite this paragraph in simpler words: {PASSAGE}",
    f"Fix any typos in this text: Teh quick brown fox jumpd over the lazy dog. {PASSAGE}",
    "Rewrite this in the passive voice: The committee approved the budget and the mayor signed it.",
    f"Summarise this passage in one sentence: {PASSAGE}",
    f"Extract every number from this passage as a JSON list: {PASSAGE}",
    f"How many nations does the rainforest span, according to this passage? {PASSAGE}",
    "List the days of the week.",
    "Count from one to ten in words.",
    "Translate 'good morning' into Spanish and French.",
    "What are the primary colors?",
    "Repeat after me: the rain in Spain stays mainly in the plain.",
]
MAX_TOKENS = 20




@pytest.fixture(scope="module")
def setup():
    from edge.default_model import default_package
    from edge.engine import Engine
    from edge.package import load_package

    try:
        fp32, int4 = default_package("fp32"), default_package("int4")
    except Exception as exc:  # no network and no cache
        pytest.skip(f"default model unavailable: {exc}")
    engine = Engine(load_package(fp32, verify=False), threads=2)
    expected = [generated_ids(engine, p) for p in PROMPTS]
    return engine, load_package(int4, verify=False), expected


def generated_ids(engine, prompt):
    """The generated ids but the last (from the cache bookkeeping, not re-tokenised text), the text, accepted."""
    engine.reset()
    chunks = list(engine.chat([{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS))
    n = engine.stats.generated_tokens
    ids = engine.tokens[len(engine.tokens) - (n - 1):] if n > 1 else []
    spec = engine.stats.speculative
    return ids, "".join(chunks), spec.accepted if spec else 0


@pytest.mark.parametrize("kind", ["prompt-lookup", "recycling", "draft-int4"])
def test_greedy_speculation_equals_plain_greedy_on_20_prompts(setup, kind):
    from edge.speculative import DraftModel, Speculator, make_speculator

    engine, int4, expected = setup
    if kind == "draft-int4":  # a fixed depth: the adaptive policy turns this draft off on a busy machine
        engine.speculator = Speculator([DraftModel(int4, engine.context_length, threads=2)], draft_length=3)
    elif kind == "recycling":  # a fixed depth too: on fp32 its gain is marginal, and the adaptive policy, seeing
        # what its tree verify calls really cost, often keeps it off for all 20 prompts (nothing to compare then)
        engine.speculator = make_speculator(kind, engine, draft_length=3)
    else:  # the default, adaptive configuration
        engine.speculator = make_speculator(kind, engine)
    try:
        got = [generated_ids(engine, p) for p in PROMPTS]
    finally:
        engine.speculator = None
    accepted = sum(g[2] for g in got)
    differing = [i for i, (a, b) in enumerate(zip(got, expected)) if a[:2] != b[:2]]
    assert not differing, f"{kind}: output differs from plain greedy on prompts {differing}"
    assert accepted > 0


@pytest.mark.parametrize("kind", ["prompt-lookup", "recycling", "head"])
def test_the_default_int4_package_on_edge_kernels_is_exact_too(kind):
    """int4 with int8 activations (edge.QMatMul level 4) and edge.Attention: every verify row is bitwise a one-token
    step's, so speculation is lossless on quantized weights (on stock MatMulNBits + GroupQueryAttention near-ties
    flip). Fixed depths: every step drafts, so every step is a multi-token verify call."""
    from edge.default_model import default_package
    from edge.engine import Engine
    from edge.kernels import library_path
    from edge.package import load_package
    from edge.speculative import make_speculator

    if library_path() is None:
        pytest.skip("kernel library not built")
    engine = Engine(load_package(default_package("int4-edge"), verify=False), threads=2)
    expected = [generated_ids(engine, p) for p in PROMPTS]
    engine.speculator = make_speculator(kind, engine, draft_length={"prompt-lookup": 4, "head": 3}.get(kind, 2))
    got = [generated_ids(engine, p) for p in PROMPTS]
    differing = [i for i, (a, b) in enumerate(zip(got, expected)) if a[:2] != b[:2]]
    assert not differing, f"{kind}: output differs from plain greedy on prompts {differing}"
    # the trained draft head guesses the open questions too (offline: half its first guesses are right)
    assert sum(g[2] for g in got) > (len(PROMPTS) * 3 if kind == "head" else 0)
