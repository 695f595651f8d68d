"""The speculative loop on a tiny model: identical greedy output for every drafter, exact cache after a tree."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edge.engine import Engine
from edge.errors import EdgeError
from edge.export.pipeline import export_model
from edge.model import Decoder
from edge.package import load_package
from edge.speculative import (Draft, DraftModel, Drafter, PromptLookup, Speculator, TokenRecycling,
                              check_compatible, make_speculator)
from edge.speculative.decode import DORMANT_EVERY, QUIET_EVERY, SURE, root_is_sure
from edge.speculative.drafter import ROOT
from edge.speculative.verify import accept_greedy, tree_inputs
from tiny_models import VOCAB, tiny_llama


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Cost curves of the throwaway tiny packages go to a temporary cache, not ~/.cache/edge."""
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    _, imported = tiny_llama(seed=7, initializer_range=0.3)
    imported.special_tokens = dataclasses.replace(imported.special_tokens, eos_token_ids=[])
    root = tmp_path_factory.mktemp("spec")
    fp32 = export_model("tiny", root / "fp32", quant="fp32", model=imported)
    int4 = export_model("tiny", root / "int4", quant="int4", model=imported)
    return fp32, int4


def plain_greedy(package, prompt, n):
    engine = Engine(package, context_length=96, threads=1)
    return engine.tokenizer.encode(engine.generate(prompt, max_tokens=n), add_special_tokens=False)


class Oracle(Drafter):
    """Knows the greedy answer; proposes it as a tree with a wrong sibling and an error at `miss` depth."""

    name = "oracle"

    def __init__(self, answer, prompt_len, miss=3):
        self.answer, self.prompt_len, self.miss = answer, prompt_len, miss

    def size(self, depth):
        return depth + 1

    def propose(self, context, depth):
        done = len(context) - self.prompt_len  # the root is answer[done - 1]
        truth = self.answer[done:done + depth]
        if not truth:
            return Draft()
        wrong = [(t + 1) % VOCAB for t in truth]
        tokens, parents = [wrong[0]], [ROOT]  # a wrong first sibling, then the true chain with one error
        for i, t in enumerate(truth):
            tokens.append(wrong[i] if i == self.miss else t)
            parents.append(ROOT if i == 0 else len(tokens) - 2)
        return Draft(tokens, parents)


PROMPTS = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 3, 2], [1, 2, 3, 1, 2, 3, 1, 2], [40, 41, 42, 43, 44, 45],
           [11, 22, 11, 22, 11, 60, 61, 11, 22], [77, 12, 77, 12, 50]]


@pytest.mark.parametrize("kind", ["prompt-lookup", "recycling", "auto", "draft-int4", "oracle", "distrust-all"])
def test_greedy_speculation_emits_exactly_plain_greedy(packages, kind):
    fp32, int4 = packages
    engine = Engine(fp32, context_length=96, threads=1)
    accepted = ties = 0
    for prompt in PROMPTS:
        expected = plain_greedy(fp32, prompt, 24)
        if kind == "oracle":
            engine.speculator = Speculator([Oracle(expected, len(prompt))], draft_length=5)
        elif kind == "distrust-all":  # every multi-token row counts as a near-tie: the 1-token fallback path
            engine.speculator = Speculator([Oracle(expected, len(prompt))], draft_length=5, margin=1e9)
        elif kind == "draft-int4":
            engine.speculator = Speculator([DraftModel(load_package(int4), 96, threads=1)], draft_length=4)
        else:
            engine.speculator = make_speculator(kind, engine, draft_length=4)
        engine.reset()
        got = engine.tokenizer.encode(engine.generate(prompt, max_tokens=24), add_special_tokens=False)
        assert got == expected, (kind, prompt)
        assert engine.tokens == prompt + expected[:-1]  # exactly what plain decoding leaves in the cache
        assert engine.decoder.cache.length == len(engine.tokens)
        accepted += engine.stats.speculative.accepted
        ties += engine.stats.speculative.near_ties
    if kind == "distrust-all":
        assert ties >= len(PROMPTS) * 10
    elif kind in ("oracle", "draft-int4"):
        assert accepted > len(PROMPTS) * 5  # the comparison above is not vacuous


def test_cache_after_a_partly_accepted_tree_equals_decoding_the_path_one_by_one(packages):
    fp32, _ = packages
    prompt = [3, 14, 15, 9, 26, 5]
    answer = plain_greedy(fp32, prompt, 5)
    ref = Decoder(load_package(fp32), context_length=32, threads=1)
    ref.prefill(prompt + answer[:4])
    tree = Decoder(load_package(fp32), context_length=32, threads=1)
    tree.prefill(prompt)
    past = tree.cache.length
    g1, g2, g3 = answer[1:4]
    x, y, z = (g1 + 1) % VOCAB, (g2 + 1) % VOCAB, (g3 + 7) % VOCAB
    draft = Draft([x, g1, z, y, g2, g3], [ROOT, ROOT, 0, 1, 1, 4])  # accepted path g1 -> g2 -> g3 is not a prefix
    tokens, positions, bias = tree_inputs(past, answer[0], draft)
    verdict = accept_greedy(draft, tree.step(tokens, positions, list(range(len(tokens))), bias).copy())
    assert verdict.path == [0, 2, 5, 6] and verdict.accepted == [g1, g2, g3] and verdict.next_token == answer[4]
    tree.cache.keep(past, verdict.path)
    assert tree.cache.length == ref.cache.length == len(prompt) + 4
    for a, b in zip(tree.cache.arrays, ref.cache.arrays):
        n = ref.cache.length
        np.testing.assert_allclose(a[:, :, :n], b[:, :, :n], rtol=0, atol=1e-5 * np.abs(b[:, :, :n]).max())
    np.testing.assert_allclose(tree.step([answer[4]])[0], ref.step([answer[4]])[0], atol=1e-4)


def test_limits_and_prefix_reuse_hold_under_speculation(packages):
    fp32, _ = packages
    engine = Engine(fp32, context_length=40, threads=1)
    prompt = PROMPTS[2] * 4  # 32 tokens: 8 fit before the context is full
    engine.speculator = make_speculator("auto", engine, draft_length=6)
    out = engine.generate(prompt, max_tokens=30).split()
    assert engine.stats.finish_reason == "context" and len(out) == 9 and len(engine.tokens) == 40
    engine.generate(PROMPTS[1], max_tokens=7)
    first = engine.tokenizer.encode(engine.generate(PROMPTS[1], max_tokens=7), add_special_tokens=False)
    assert engine.stats.generated_tokens == 7 and engine.stats.finish_reason == "length"
    follow = PROMPTS[1] + first + [8]
    engine.generate(follow, max_tokens=3)
    assert engine.stats.reused_tokens == len(PROMPTS[1]) + len(first) - 1


def test_a_draft_with_another_tokenizer_is_refused(packages, tmp_path):
    fp32, _ = packages
    _, other = tiny_llama(seed=7)
    other.special_tokens = dataclasses.replace(other.special_tokens, eos_token_ids=[5])
    foreign = export_model("tiny", tmp_path / "other", quant="fp32", model=other)
    with pytest.raises(EdgeError, match="eos_token_ids"):
        check_compatible(load_package(fp32), load_package(foreign))
    with pytest.raises(EdgeError, match="unknown drafter"):
        make_speculator("no-such-drafter", Engine(fp32, context_length=32, threads=1))


def test_sampled_speculation_is_reproducible_and_stays_in_top_k(packages):
    fp32, int4 = packages
    engine = Engine(fp32, context_length=96, threads=1)
    engine.speculator = Speculator([PromptLookup(), DraftModel(load_package(int4), 96, threads=1)], draft_length=3)
    runs = [engine.generate(PROMPTS[0], max_tokens=20, temperature=0.8, top_k=3, seed=11) for _ in range(2)]
    assert runs[0] == runs[1] and engine.stats.generated_tokens == 20
    assert engine.stats.speculative.drafted > 0


def test_edge_run_draft_prints_speculation_stats(packages, capsys):
    from edge.apps import run as run_cli

    fp32, _ = packages
    assert run_cli.main([str(fp32), "t1 t2 t3 t1 t2", "--raw", "-n", "8", "--stats", "--context", "64",
                         "--draft", "auto", "--draft-length", "3", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 8
    assert "[speculative (prompt-lookup+recycling): drafted" in err and "tokens per target call" in err
    assert run_cli.main([str(fp32), "t1", "--raw", "--context", "64", "--draft", "nonsense"]) == 2
    assert "unknown drafter" in capsys.readouterr().err


def test_a_draft_model_session_never_spins_and_times_its_catch_up(packages):
    """A spinning draft session takes the cores the target's verify needs right after a draft (measured: 2x slower
    verify). Its catch-up, the tokens it did not follow, is timed apart from the drafting itself."""
    _, int4 = packages
    draft = DraftModel(load_package(int4), 96, threads=1)
    assert draft.decoder.session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning") == "0"
    context = PROMPTS[1] + PROMPTS[0]
    chain = draft.propose(context, 3)
    assert draft.catch_up_seconds > 0  # read all of the context first
    following = context + chain.tokens[:2] + [7]  # two of three accepted, then the target's own next token
    draft.propose(following, 3)
    assert draft.catch_up_seconds == 0.0 and draft.tokens[:len(following)] == following


class CountingDraft(DraftModel):
    def begin(self, context):
        self.begun = getattr(self, "begun", 0) + 1
        super().begin(context)


def test_a_switched_off_draft_model_does_not_read_the_prompt(packages):
    """Its begin() is a prefill of the whole prompt: pure loss while the policy keeps it off (a probe catches up)."""
    fp32, int4 = packages
    engine = Engine(fp32, context_length=96, threads=1)
    draft = CountingDraft(load_package(int4), 96, threads=1)
    engine.speculator = Speculator([draft])
    engine.generate(PROMPTS[0], max_tokens=4)
    assert draft.begun == 1  # a new drafter earns its drafts: read eagerly
    policy = engine.speculator.policies["draft-model"]
    policy.draft_seconds_per_level = 1e3  # drafting now costs far more than it can gain
    assert policy.depth() == 0 and not policy.drafting()
    engine.reset()
    engine.generate(PROMPTS[1], max_tokens=4)
    assert draft.begun == 1 and engine.stats.speculative.drafted == 0


class CountingRecycling(TokenRecycling):
    """Keeps the wide tree whatever the cost curve: a learner that needs the top k of each row."""

    proposed = observed = 0

    def fit(self, cost):
        pass

    def propose(self, context, depth):
        self.proposed += 1
        return super().propose(context, depth)

    def observe(self, tokens, logits, produced=None):
        self.observed += 1
        super().observe(tokens, logits, produced)


def test_a_switched_off_learner_costs_little_between_probes(packages):
    """Token recycling's top-k per step and its proposals cost ~3% of an int4 step in the loop: while its policy
    has it off, it is not asked to propose and sees only every QUIET_EVERY-th verify call (its table stays fresh)."""
    fp32, _ = packages
    engine = Engine(fp32, context_length=96, threads=1)
    recycling = CountingRecycling(VOCAB)
    engine.speculator = Speculator([recycling])
    engine.generate(PROMPTS[0], max_tokens=8)
    assert recycling.observed >= 4  # on: every verify call
    policy = engine.speculator.policies["recycling"]
    policy.enabled = False  # off for good: never probes
    recycling.proposed = recycling.observed = 0
    engine.reset()
    engine.generate(PROMPTS[1], max_tokens=40)
    calls = engine.stats.speculative.target_calls
    assert recycling.proposed == 0 and calls >= 36
    assert calls // QUIET_EVERY - 1 <= recycling.observed <= calls // QUIET_EVERY + 1


def test_a_chain_learner_records_the_greedy_successors_on_every_step_even_when_off(packages):
    """Under greedy decoding a chain needs only each token's first successor, the token just produced: recorded on
    every step (no top-k, no throttle), and the table then holds plain greedy's continuation."""
    fp32, _ = packages
    prompt = PROMPTS[3]
    answer = plain_greedy(fp32, prompt, 30)
    engine = Engine(fp32, context_length=96, threads=1)
    recycling = CountingRecycling(VOCAB)
    recycling.widths = (1,) * 8
    engine.speculator = Speculator([recycling])
    engine.speculator._policy(recycling, engine.decoder).enabled = False  # never drafts: every step a plain one
    engine.generate(prompt, max_tokens=30)
    calls = engine.stats.speculative.target_calls
    assert recycling.observed == calls >= 29
    pairs = {(a, b) for a, b in zip(answer, answer[1:])}
    firsts = {(a, int(recycling.successors[a, 0])) for a, _ in pairs}
    later = {a: b for a, b in zip(answer, answer[1:])}  # the last occurrence of each token wins
    assert firsts == {(a, later[a]) for a, _ in pairs}


def test_drafters_are_fitted_to_the_cost_curve_once_it_is_known(packages):
    """A tree drafter shapes its tree for the device (TokenRecycling.fit): the speculator hands each drafter its
    measured cost curve once, before the first draft is sized, and the tree it drafts has the shape chosen."""
    fp32, _ = packages
    engine = Engine(fp32, context_length=96, threads=1)
    fitted = []

    class Fitting(TokenRecycling):
        def fit(self, cost):
            fitted.append(cost)
            self.widths = (1,) * 8  # as on a steep curve

    recycling = Fitting(VOCAB)
    engine.speculator = Speculator([recycling])
    engine.generate(PROMPTS[0], max_tokens=8)
    engine.generate(PROMPTS[1], max_tokens=8)
    assert fitted == [engine.speculator.curve] and recycling.size(4) == 4


class Guesser(Drafter):
    """A cheap drafter whose one-token guesses are right or wrong on demand (the greedy answer it is given)."""

    name = "guesser"
    cheap = True

    def __init__(self, answer, prompt_len):
        self.answer, self.prompt_len, self.right = answer, prompt_len, False
        self.asked = 0

    def propose(self, context, depth):
        self.asked += 1
        done = len(context) - self.prompt_len
        if done >= len(self.answer):
            return Draft()
        token = self.answer[done]
        return Draft.chain([token if self.right else (token + 1) % VOCAB])


def test_a_switched_off_cheap_drafter_is_scored_without_probes_and_comes_back_when_right(packages):
    """While its policy has it off, a cheap drafter's guess is compared with the token the target produced (no
    verify rows spent on probes); once its guesses pass, it drafts again. Output stays plain greedy throughout."""
    fp32, _ = packages
    prompt = PROMPTS[1]
    answer = plain_greedy(fp32, prompt, 60)
    engine = Engine(fp32, context_length=96, threads=1)
    guesser = Guesser(answer, len(prompt))
    engine.speculator = Speculator([guesser])
    engine.generate(prompt, max_tokens=30)  # wrong guesses: it starts off and stays off
    policy = engine.speculator.policies["guesser"]
    assert policy.off and policy.shadowed and engine.stats.speculative.drafted == 0
    engine.reset()
    asked = guesser.asked
    engine.generate(prompt, max_tokens=30)
    assert engine.stats.speculative.drafted == 0  # still wrong: no probe in 30 steps (probe_every is 16)
    # but asked for a shadow guess on every DORMANT_EVERY-th step
    assert 30 // DORMANT_EVERY - 2 <= guesser.asked - asked <= 30 // DORMANT_EVERY + 2
    guesser.right = True
    engine.reset()
    text = engine.generate(prompt, max_tokens=40)
    stats = engine.stats.speculative
    # Back on, every drafted guess passes. (Whether it stays on to the end depends on the tiny model's step timings,
    # ~0.1 ms, which the policy's pace estimates follow: a clean CI run once switched it off again after 3 drafts.)
    assert stats.drafted > 0 and stats.accepted == stats.drafted
    assert engine.tokenizer.encode(text, add_special_tokens=False) == answer[:40]


def test_the_root_is_sure_when_the_target_gives_it_at_least_SURE():
    peaked = np.log(np.array([SURE + 0.01, 0.1, 0.05, 0.03, 0.0099], np.float32))
    flat = np.log(np.array([SURE - 0.01, 0.1, 0.05, 0.03, 0.0299], np.float32))
    assert root_is_sure(peaked + 7.0)  # logits: any shift
    assert not root_is_sure(flat - 3.0)
    assert not root_is_sure(None)  # a root decided without its row (after a near-tie)
    rng, scratch = np.random.default_rng(0), np.empty(49152, np.float32)
    for _ in range(200):  # a vocabulary's worth of float32 logits, against the float64 softmax
        row = (rng.standard_normal(49152) * rng.uniform(0.5, 4)).astype(np.float32)
        row[rng.integers(row.size)] += rng.uniform(0, 25)
        kept = row.copy()
        full = np.exp(row.astype(np.float64) - row.max()).sum() <= 1.0 / SURE
        assert root_is_sure(row, scratch) == full
        assert np.array_equal(row, kept)  # the scratch, not the logits, holds the work


def test_short_lookup_matches_are_judged_by_how_sure_the_target_was_of_the_root(packages):
    """A 1-3 token match after a root the target hesitated on rarely passes (3-18% on the benchmark's outputs,
    33-67% after a sure root): each has its own policy, and output stays exactly plain greedy."""
    fp32, _ = packages
    engine = Engine(fp32, context_length=96, threads=1)
    engine.speculator = Speculator([PromptLookup()])
    prompt = PROMPTS[0] * 3
    text = engine.generate(prompt, max_tokens=24)
    assert engine.tokenizer.encode(text, add_special_tokens=False) == plain_greedy(fp32, prompt, 24)
    keys = set(engine.speculator.policies)
    short = {k for k in keys if k.split("/")[1] in PromptLookup.confidence_kinds}
    assert short and all(k.endswith(("/sure", "/unsure")) for k in short), keys
    long = keys - short
    assert all(not k.endswith(("/sure", "/unsure")) for k in long), keys


def test_a_float16_cache_keeps_greedy_speculation_exact(tmp_path):
    """A package with its KV cache in half (kv_dtype float16, edge's kernels): each verify row's keys and values are
    rounded as a 1-token step rounds them, so speculation still emits plain greedy decoding's tokens, and a tree's
    accepted path compacted into place is bit for bit the cache of decoding it one token at a time."""
    _, imported = tiny_llama(seed=7, initializer_range=0.3)
    imported.special_tokens = dataclasses.replace(imported.special_tokens, eos_token_ids=[])
    half = export_model("tiny", tmp_path / "half", quant="int4", model=imported, kernels="edge", head="rtn",
                        kv_dtype="float16")
    engine = Engine(half, context_length=96, threads=1)
    accepted = 0
    for prompt in PROMPTS:
        expected = plain_greedy(half, prompt, 24)
        for speculator in (Speculator([Oracle(expected, len(prompt))], draft_length=5),
                           make_speculator("prompt-lookup", engine, draft_length=4)):
            engine.speculator = speculator
            engine.reset()
            got = engine.tokenizer.encode(engine.generate(prompt, max_tokens=24), add_special_tokens=False)
            assert got == expected, prompt
            accepted += engine.stats.speculative.accepted
    assert accepted > len(PROMPTS) * 5
    prompt = [3, 14, 15, 9, 26, 5]
    answer = plain_greedy(half, prompt, 5)
    ref = Decoder(load_package(half), context_length=32, threads=1)
    for t in prompt + answer[:4]:
        ref.step([t])
    tree = Decoder(load_package(half), context_length=32, threads=1)
    tree.prefill(prompt[:-1])
    tree.step(prompt[-1:])
    past = tree.cache.length
    g1, g2, g3 = answer[1:4]
    draft = Draft([(g1 + 1) % VOCAB, g1, (g3 + 7) % VOCAB, (g2 + 1) % VOCAB, g2, g3], [ROOT, ROOT, 0, 1, 1, 4])
    tokens, positions, bias = tree_inputs(past, answer[0], draft)
    verdict = accept_greedy(draft, tree.step(tokens, positions, list(range(len(tokens))), bias).copy())
    assert verdict.path == [0, 2, 5, 6]
    tree.cache.keep(past, verdict.path)
    n = ref.cache.length
    assert tree.cache.length == n and tree.cache.arrays[0].dtype == np.float16
    for a, b in zip(tree.cache.arrays, ref.cache.arrays):
        np.testing.assert_array_equal(a[:, :, :n], b[:, :, :n])
