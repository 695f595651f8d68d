"""Saved conversation prefixes: conversations taking turns on one engine are each read once, and every reply is
the one a fresh engine gives."""

from __future__ import annotations


import numpy as np
import pytest

from edge.engine import Engine
from edge.errors import EdgeError
from edge.export.pipeline import export_model
from edge.prefix_store import MIN_SAVED, PrefixStore
from tiny_models import tiny_chat_llama


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return export_model("tiny", tmp_path_factory.mktemp("p") / "pkg", quant="fp32", model=tiny_chat_llama())


def conversation(first: int) -> list[dict]:
    """A user message of 40 words of the tiny vocabulary, different for each `first`."""
    return [{"role": "user", "content": " ".join(f"t{(first + 7 * i) % 80}" for i in range(40))}]


def reply(engine, messages, n=6) -> str:
    return "".join(engine.chat(messages, max_tokens=n, temperature=0))


def test_conversations_taking_turns_are_read_once(package):
    engine = Engine(package, context_length=160, threads=1, prefix_slots=2)
    fresh = Engine(package, context_length=160, threads=1)
    a, b = conversation(1), conversation(2)
    for turn in range(3):
        for messages in (a, b):
            text = reply(engine, messages)
            fresh.reset()
            assert text == reply(fresh, messages)  # restored keys and values are the ones it computed
            if turn > 0:  # from the second turn on, each conversation's earlier turns come from its saved prefix
                assert engine.stats.reused_tokens >= engine.stats.prompt_tokens - 12
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"t{turn + 3}"}]


def test_without_slots_a_switch_reads_the_conversation_again(package):
    engine = Engine(package, context_length=160, threads=1)
    a, b = conversation(1), conversation(2)
    reply(engine, a)
    reply(engine, b)
    reply(engine, a + [{"role": "assistant", "content": "t1"}, {"role": "user", "content": "t2"}])
    assert engine.stats.reused_tokens < 10  # only the template's first tokens


def test_the_store_keeps_its_slots_and_drops_superseded_prefixes(package):
    engine = Engine(package, context_length=160, threads=1)
    cache = engine.decoder.cache
    engine.decoder.prefill(list(range(1, 81)))
    store = PrefixStore(2)
    store.save(list(range(1, 11)), cache)  # shorter than MIN_SAVED: not kept
    assert store.saved == []
    store.save(list(range(1, 41)), cache)
    store.save(list(range(1, 81)), cache)  # continues the first: it replaces it
    assert [len(e.tokens) for e in store.saved] == [80]
    store.save(list(range(1, 61)), cache)  # held within the saved 80
    assert [len(e.tokens) for e in store.saved] == [80]
    assert store.best(list(range(1, 50)) + [99])[0] == 49
    rows = [a[:, :, :80].copy() for a in cache.arrays]
    for a in cache.arrays:
        a[:] = np.nan
    assert store.restore(store.saved[0], cache) == list(range(1, 81)) and cache.length == 80
    for a, r in zip(cache.arrays, rows):
        np.testing.assert_array_equal(a[:, :, :80], r)
    assert MIN_SAVED > 10


def test_slots_under_a_budget_are_refused(package):
    with pytest.raises(EdgeError, match="outside the budget"):
        Engine(package, context_length=64, threads=1, budget="1GiB", prefix_slots=2)
