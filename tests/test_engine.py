"""The generation loop: greedy equals a hand-written argmax loop, stops, limits, and KV reuse across calls."""

from __future__ import annotations


import numpy as np
import pytest

from edge.engine import Engine, GenerationConfig
from edge.errors import ChatTemplateError, ContextOverflowError
from edge.export.pipeline import export_model
from tiny_models import tiny_chat_llama, tiny_llama


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return export_model("tiny", tmp_path_factory.mktemp("e") / "pkg", quant="fp32", model=tiny_chat_llama())


@pytest.fixture
def engine(package):
    return Engine(package, context_length=64, threads=1)


def argmax_loop(engine, ids, n):
    engine.reset()
    logits, out = engine.decoder.prefill(ids), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.decoder.step([out[-1]])[0]
    engine.reset()
    return out


def words(ids):
    return " ".join(f"t{i}" for i in ids)


def test_greedy_stream_equals_argmax_loop(engine):
    prompt = [3, 14, 15, 9, 26]
    expected = argmax_loop(engine, prompt, 10)
    text = engine.generate(prompt, max_tokens=10)
    assert engine.tokenizer.encode(text, add_special_tokens=False) == expected
    assert engine.stats.generated_tokens == 10 and engine.stats.finish_reason == "length"
    assert engine.tokens == prompt + expected[:-1]  # the last sampled token was never fed


def test_eos_and_stop_strings_end_generation(engine):
    prompt = [3, 14, 15, 9, 26]
    expected = argmax_loop(engine, prompt, 6)
    k = next(i for i in range(1, 6) if expected[i] not in expected[:i])
    engine.tokenizer.eos_token_ids = [expected[k]]
    try:
        engine.generate(prompt, max_tokens=10)
        assert engine.stats.generated_tokens == k and engine.stats.finish_reason == "stop"
    finally:
        engine.tokenizer.eos_token_ids = []
    text = engine.generate(prompt, max_tokens=10, stop=(f"t{expected[k]}",))
    assert engine.stats.finish_reason == "stop" and text.split() == [f"t{i}" for i in expected[:k]]


def test_second_call_reuses_the_cached_prefix(engine, package):
    prompt = [3, 14, 15, 9, 26, 5, 35]
    first = engine.tokenizer.encode(engine.generate(prompt, max_tokens=5), add_special_tokens=False)
    follow = prompt + first + [8, 9]
    second = engine.generate(follow, max_tokens=5)
    assert engine.stats.reused_tokens == len(prompt) + len(first) - 1
    fresh = Engine(package, context_length=64, threads=1)
    assert fresh.generate(follow, max_tokens=5) == second and fresh.stats.reused_tokens == 0


def test_chat_second_turn_reuses_the_first(engine, package):
    messages = [{"role": "user", "content": "t5 t6 t7"}]
    reply = "".join(engine.chat(messages, max_tokens=4))
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "t8 t9"}]
    second = "".join(engine.chat(messages, max_tokens=4))
    assert engine.stats.reused_tokens > 10
    assert second == "".join(Engine(package, context_length=64, threads=1).chat(messages, max_tokens=4))


def test_prompt_longer_than_context_is_refused_or_truncated(engine):
    with pytest.raises(ContextOverflowError, match="70 tokens.*context holds 64"):
        engine.generate(list(range(70)), max_tokens=4)
    engine.generate(list(range(70)), max_tokens=4, truncate=True)
    assert engine.stats.prompt_tokens <= 64 - 4


def test_generation_stops_when_the_context_is_full(engine):
    engine.generate(list(range(1, 60)), max_tokens=20)
    assert engine.stats.finish_reason == "context" and len(engine.tokens) == 64


def test_seeded_sampling_reproduces(engine):
    config = GenerationConfig(max_tokens=12, temperature=1.0, top_p=0.9, seed=11)
    a = engine.generate([1, 2, 3], config)
    engine.reset()
    assert engine.generate([1, 2, 3], config) == a


def test_model_without_template_refuses_chat(tmp_path):
    _, imported = tiny_llama()
    engine = Engine(export_model("tiny", tmp_path / "p", quant="fp32", model=imported), context_length=32)
    with pytest.raises(ChatTemplateError, match="no chat template"):
        list(engine.chat([{"role": "user", "content": "hi"}]))


def test_generation_settings_are_checked_when_given():
    for bad in (dict(max_tokens=-1), dict(max_tokens=2.5), dict(on_full="drop"), dict(temperature=float("nan")),
                dict(seed=-3)):
        with pytest.raises(ValueError):
            GenerationConfig(**bad)
    assert GenerationConfig(max_tokens=np.int64(3)).max_tokens == 3
    assert GenerationConfig(stop="END").stop == ("END",)  # one stop string, not the characters E, N and D
    assert GenerationConfig(stop=["a", "b"]).stop == ("a", "b")


def test_a_context_beyond_the_model_is_capped_and_said(package):
    limit = Engine(package, threads=1).package.config.max_context
    with pytest.warns(UserWarning, match=f"takes at most {limit}"):
        engine = Engine(package, context_length=limit + 1000, threads=1)
    assert engine.context_length == limit
