"""Adaptive draft length: the cost curve decides, acceptance is tracked, a losing drafter is switched off."""

from __future__ import annotations

import numpy as np
import pytest

from edge.export.pipeline import export_model
from edge.model import Decoder
from edge.package import load_package
from edge.speculative import AdaptiveDepth, CostCurve, Pace, adaptive
from edge.speculative.adaptive import measured_sizes
from tiny_models import tiny_llama

FLAT = CostCurve((1, 2, 4, 8, 16), (1.0, 1.02, 1.10, 1.31, 1.78))  # float32 weights on this CPU
STEEP = CostCurve((1, 2, 4, 8, 16), (1.0, 1.64, 2.89, 3.06, 4.16))  # int4 MatMulNBits


def chain(depth):
    return depth


def test_curve_interpolates_and_extrapolates():
    assert FLAT(3) == pytest.approx(1.06) and FLAT(32) == pytest.approx(3.56)
    assert STEEP.relative()[4] == pytest.approx(2.89)


def test_cheap_verification_and_good_acceptance_draft_deep():
    policy = AdaptiveDepth(FLAT, chain, max_depth=8, successes=9, trials=10)
    assert policy.depth() >= 6 and policy.best()[1] > 2


def test_expensive_verification_and_poor_acceptance_switch_off_then_probe_as_often_as_probes_are_cheap():
    policy = AdaptiveDepth(STEEP, chain, max_depth=8, probe_every=4)
    for _ in range(20):
        policy.update(4, 0, 0.0)  # nothing accepted
    assert policy.acceptance < 0.1
    probe = 1  # a probe drafts one level: the cheapest verify that says whether first tokens pass again
    assert [policy.depth() for _ in range(4)] == [0, 0, 0, probe]
    policy.update(1, 0, 0.0, verify_seconds=STEEP(2), rows=2)  # a cheap probe lost: 0.64 of a plain step extra
    assert [policy.depth() for _ in range(32)] == [0] * 31 + [probe]  # 0.64 is 2% of 32 plain steps
    policy.update(1, 0, 0.01, verify_seconds=STEEP(1), rows=1)  # next to nothing: back to every 4 steps
    assert [policy.depth() for _ in range(4)] == [0, 0, 0, probe]
    policy.update(1, 0, 20.0, verify_seconds=STEEP(2), rows=2)  # a draft model that read 20 steps' worth first
    assert policy.probe_interval == policy.max_probe_every
    for _ in range(30):
        policy.update(4, 4, 0.0)  # the text changed: drafts land again
    assert policy.depth() > 0 and policy.probe_interval == 0  # drafting again; a later loss probes every 4 again


def test_a_probe_the_drafter_declines_is_not_spent():
    """A draft head unsure of its first guess proposes nothing: that probe learned nothing, so it neither counts as
    a loss nor waits a whole interval to come again."""
    policy = AdaptiveDepth(STEEP, chain, max_depth=8, probe_every=4)
    for _ in range(20):
        policy.update(4, 0, 0.0)
    assert [policy.depth() for _ in range(4)] == [0, 0, 0, 1]
    policy.declined()
    assert policy.depth() == 1  # probes again at once
    policy.declined()
    assert policy.depth() == 1
    policy.update(1, 0, 0.16)  # a probe that drafted and lost, at 16% of a plain step: 2% of 8 steps
    assert [policy.depth() for _ in range(8)] == [0] * 7 + [1]


def test_acceptance_estimate_follows_recent_outcomes():
    policy = AdaptiveDepth(STEEP, chain)
    for _ in range(30):
        policy.update(4, 4, 0.0)
    assert (policy.rates()[:4] > 0.9).all() and policy.depth() >= 4
    for _ in range(30):
        policy.update(4, 1, 0.0)  # the first token always lands, the second never: draft exactly one
    rates = policy.rates()
    assert rates[0] > 0.9 and rates[1] < 0.25 and policy.best()[0] == 1
    flat = AdaptiveDepth(FLAT, chain)
    for _ in range(30):
        flat.update(4, 1, 0.0)
    assert flat.best()[0] <= 2  # cheap verification: a second token is worth a try


def test_bursty_acceptance_drafts_deeper_than_one_rate_would():
    """A copying drafter: half the drafts miss at once, the other half copy the whole span. Per-level rates see
    0.5 then ~1.0 and pay for a deep draft even on a steep (int4) cost curve; one shared rate (~0.67) would not."""
    policy = AdaptiveDepth(STEEP, chain)
    for i in range(40):
        policy.update(8, 0 if i % 2 else 8, 0.0)
    rates = policy.rates()
    assert rates[0] == pytest.approx(0.5, abs=0.1) and (rates[1:] > 0.8).all()
    depth, gain = policy.best()
    assert depth >= 6 and gain > 1.05
    shared = 1.0 + sum(0.67 ** i for i in range(1, depth + 1))
    assert shared * STEEP(1) / STEEP(1 + depth) < policy.min_gain


def test_draft_time_counts_against_depth():
    free = AdaptiveDepth(FLAT, chain, successes=7, trials=10)
    costly = AdaptiveDepth(FLAT, chain, successes=7, trials=10, draft_seconds_per_level=0.5)
    assert costly.best()[0] < free.best()[0] and costly.best()[1] < free.best()[1]


def test_measuring_leaves_the_cache_as_it_was_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(adaptive, "others_share", lambda before, after: 0.0)  # a quiet machine
    _, imported = tiny_llama(seed=2)
    decoder = Decoder(load_package(export_model("tiny", tmp_path / "p", quant="fp32", model=imported)),
                      context_length=40, threads=1)
    decoder.prefill(list(range(1, 31)))  # 30 tokens: the 16-token probes must overwrite part of them
    before = [a[:, :, :30].copy() for a in decoder.cache.arrays]
    curve = CostCurve.cached(decoder, threads=1)
    assert decoder.cache.length == 30
    for a, b in zip(decoder.cache.arrays, before):
        np.testing.assert_array_equal(a[:, :, :30], b)
    assert curve.sizes == (1, 2, 4, 8, 16) and all(np.diff(curve.seconds) >= 0)
    assert 0 <= curve.deviation < 1e-3 and curve.margin == 2 * curve.deviation
    assert CostCurve(curve.sizes, curve.seconds, 0.5).margin == 0.0  # a different kernel path: no guard
    files = list((tmp_path / "cache" / "speculative").glob("cost-*-t1-r16.json"))  # keyed by package, threads and rows
    assert len(files) == 1
    assert CostCurve.cached(decoder, threads=1) == curve  # read back, not measured again


def test_sizes_reach_32_rows_where_the_step_and_the_cache_allow(tmp_path):
    """A GPU's recycling tree verifies 25 rows: its cost is measured, not extrapolated from 16, where a step may score
    that many rows and the cache leaves as long a past."""
    _, imported = tiny_llama(seed=2)
    package = load_package(export_model("tiny", tmp_path / "p", quant="fp32", model=imported))
    assert measured_sizes(Decoder(package, context_length=64, threads=1)) == (1, 2, 4, 8, 16, 32)
    assert measured_sizes(Decoder(package, context_length=63, threads=1)) == (1, 2, 4, 8, 16)
    assert measured_sizes(Decoder(package, context_length=64, threads=1, max_rows=9)) == (1, 2, 4, 8)
    assert measured_sizes(Decoder(package, context_length=64, threads=1, max_rows=1)) == (1,)
    curve = CostCurve.measure(Decoder(package, context_length=64, threads=1), repeats=1)
    assert curve.sizes == (1, 2, 4, 8, 16, 32) and all(np.diff(curve.seconds) >= 0)


def test_a_curve_measured_beside_busy_neighbours_is_used_but_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))
    _, imported = tiny_llama(seed=2)
    decoder = Decoder(load_package(export_model("tiny", tmp_path / "p", quant="fp32", model=imported)),
                      context_length=40, threads=1)
    monkeypatch.setattr(adaptive, "others_share", lambda before, after: 0.5)  # another process held a core
    curve = CostCurve.cached(decoder, threads=1)
    assert curve.sizes == (1, 2, 4, 8, 16)
    assert not list((tmp_path / "cache").rglob("cost-*.json"))  # the next process measures again
    monkeypatch.setattr(adaptive, "others_share", lambda before, after: 0.0)
    CostCurve.cached(decoder, threads=1)
    assert len(list((tmp_path / "cache").rglob("cost-*.json"))) == 1


def test_others_share_counts_only_other_processes():
    """This process's own work is not a neighbour's; a process spinning on the same core is (both pinned to one
    core, so the answer does not depend on how many the machine has)."""
    import subprocess
    import sys
    import time

    import psutil

    me = psutil.Process()
    if not hasattr(me, "cpu_affinity"):
        pytest.skip("no CPU affinity on this platform")
    cores = me.cpu_affinity()

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    me.cpu_affinity(cores[:1])
    neighbour = None
    try:
        before = adaptive._cpu_snapshot()
        spin(0.3)
        alone = adaptive.others_share(before, adaptive._cpu_snapshot())
        busy = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
        neighbour = subprocess.Popen([sys.executable, "-c", busy])
        psutil.Process(neighbour.pid).cpu_affinity(cores[:1])
        time.sleep(0.3)  # the neighbour is running
        before = adaptive._cpu_snapshot()
        spin(0.6)
        beside = adaptive.others_share(before, adaptive._cpu_snapshot())
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
        me.cpu_affinity(cores)
    assert alone < 0.2 and beside > 0.3  # sharing one core: about half of it


def test_the_one_token_cost_is_that_of_a_run_of_them(tmp_path):
    """Plain decoding runs 1-token steps back to back; one right after a larger step costs more (on a Zen 5, 5-10%).
    Here such a step costs 20 ms more: the curve's S=1 must not include it, or every draft looks that much better."""
    import time

    _, imported = tiny_llama(seed=2)
    decoder = Decoder(load_package(export_model("tiny", tmp_path / "p", quant="fp32", model=imported)),
                      context_length=40, threads=1)
    step, last = decoder.step, [1]

    def step_after(tokens, *args, **kwargs):
        if len(tokens) == 1 and last[0] > 1:
            time.sleep(0.02)
        last[0] = len(tokens)
        return step(tokens, *args, **kwargs)

    decoder.step = step_after
    curve = CostCurve.measure(decoder, sizes=(1, 2, 4), past=8, repeats=3)
    assert curve.seconds[0] < 0.01  # the old curve: a turn after the 4-token step, >= 20 ms


def test_pace_starts_at_the_first_observation_then_follows():
    pace = Pace()
    assert pace.ratio == 1.0
    pace.observe(3.0, 1.5)
    assert pace.ratio == pytest.approx(2.0)
    for _ in range(40):
        pace.observe(1.0, 1.0)
    assert pace.ratio == pytest.approx(1.0, abs=0.01)


def test_verify_steps_slower_than_predicted_switch_drafting_off():
    """The draft-model failure: acceptance that pays on the curve, verify calls that in fact run twice as slow
    (another session's threads on the same cores) while plain steps run as measured."""
    on_paper = AdaptiveDepth(FLAT, chain, successes=6, trials=10)
    assert on_paper.depth() > 0
    slowed = AdaptiveDepth(FLAT, chain, successes=6, trials=10)
    for _ in range(5):
        slowed.plain.observe(FLAT(1), FLAT(1))
        slowed.update(2, 1, 0.0, verify_seconds=2 * FLAT(3), rows=3)  # 1 of 2 levels accepted, at twice the cost
        on_paper.update(2, 1, 0.0)
    assert on_paper.best()[1] >= on_paper.min_gain and on_paper.depth() > 0
    assert slowed.verify.ratio == pytest.approx(2.0) and slowed.best()[1] < 1 and slowed.depth() == 0


def test_a_machine_slow_for_everyone_does_not_switch_drafting_off():
    policy = AdaptiveDepth(FLAT, chain, successes=6, trials=10)
    for _ in range(5):
        policy.plain.observe(2 * FLAT(1), FLAT(1))  # plain steps are as slow as the verify calls
        policy.update(2, 1, 0.0, verify_seconds=2 * FLAT(3), rows=3)
    assert policy.best()[1] >= policy.min_gain and policy.depth() > 0


def test_once_off_only_a_probe_switches_drafting_back_on():
    policy = AdaptiveDepth(FLAT, chain, successes=6, trials=10, probe_every=8, draft_seconds_per_level=0.6)
    assert policy.depth() == 0 and policy.off and not policy.drafting()
    policy.plain.observe(3 * FLAT(1), FLAT(1))  # noise makes drafting look good, but nothing new was learned
    assert policy.best()[1] >= policy.min_gain
    assert [policy.depth() for _ in range(7)] == [0] * 6 + [1]  # the probe, one level at the 8th step
    policy.update(policy.best()[0], 1, 0.0)
    assert policy.depth() > 0 and policy.drafting()


def test_a_shadowed_policy_never_probes_and_its_shadow_guesses_switch_it_back_on():
    """A cheap drafter's guesses are scored against the target's tokens while it is off: no paid probes."""
    policy = AdaptiveDepth(STEEP, chain, probe_every=4, shadowed=True)
    assert policy.depth() == 0 and policy.off  # the prior (1 in 3) loses on the steep curve
    for _ in range(40):
        policy.shadow(False)
    assert [policy.depth() for _ in range(40)] == [0] * 40  # never a probe, whatever the wait
    hits = 0
    while policy.off:
        policy.shadow(True)
        hits += 1
    assert 1 <= hits <= 16 and policy.depth() > 0  # passing guesses earn drafts again (~72% pass: 1.64x)
    level_two = policy.rates()[1]
    plain = AdaptiveDepth(STEEP, chain, probe_every=4)
    plain.depth()
    plain.shadow(True)  # not shadowed: shadow evidence is ignored, probes decide
    assert plain.off and plain.rates()[0] == pytest.approx(1 / 3) and level_two > 0


def test_a_shadowed_policy_starts_off_and_drafts_once_a_guess_has_passed():
    """Its first guesses are scored for free: no verify rows are paid to learn what a kind of draft is worth."""
    policy = AdaptiveDepth(FLAT, chain, shadowed=True)  # on the flat curve the prior (1 in 3) would draft at once
    assert AdaptiveDepth(FLAT, chain).depth() > 0
    assert policy.off and policy.depth() == 0
    policy.shadow(False)
    assert policy.depth() == 0
    policy.shadow(True)
    assert not policy.off and policy.depth() > 0


def test_catch_up_counts_while_drafting_but_a_probe_only_spaces_the_next_probe():
    """A draft model reads the tokens prompt lookup supplied before each draft: a cost of keeping it on. A probe
    reads everything since drafting stopped: a one-off, which sets how long until the next probe instead."""
    free = AdaptiveDepth(FLAT, chain, successes=6, trials=10)
    behind = AdaptiveDepth(FLAT, chain, successes=6, trials=10)
    for _ in range(10):
        free.update(2, 1, 0.02, catch_up_seconds=0.0)
        behind.update(2, 1, 1.02, catch_up_seconds=1.0)
    assert free.draft_seconds_per_level == pytest.approx(behind.draft_seconds_per_level) == pytest.approx(0.01)
    assert free.depth() > 0 and behind.catch_up_seconds_per_step > 0.8 and behind.depth() == 0

    policy = AdaptiveDepth(STEEP, chain, probe_every=4)
    for _ in range(20):
        policy.update(4, 0, 0.0)
    assert [policy.depth() for _ in range(4)][-1] > 0 and policy.probing
    policy.update(1, 0, 2.02, catch_up_seconds=2.0)  # the probe lost and read 2 s of missed tokens
    assert policy.catch_up_seconds_per_step == 0.0 and policy.draft_seconds_per_level == pytest.approx(0.02)
    assert policy.probe_interval == 101  # 2.02 s is 2% of 101 plain steps (1 s each)
    assert policy.depth() == 0 and not policy.probing


def test_a_new_policy_assumes_its_verify_calls_run_at_the_plain_pace():
    """Plain steps seen faster than the (cached) curve must not make an untried drafter look like a loss."""
    policy = AdaptiveDepth(FLAT, chain, successes=6, trials=10)
    policy.plain.observe(0.8 * FLAT(1), FLAT(1))
    assert policy.verify_pace() == pytest.approx(0.8) and policy.depth() > 0


def test_a_drafter_of_known_acceptance_starts_from_it():
    """A trained draft head's held-out accuracy is evidence: three early misses (or a noisy start) must not switch it
    off, while a drafter with nothing known is off after them."""
    from edge.speculative import Drafter, Speculator

    class Unknown(Drafter):
        name = "unknown"

    class Known(Drafter):
        name = "known"
        known_acceptance = 0.57  # the shipped head's held-out first-guess accuracy

    spec = Speculator([Unknown(), Known()])
    spec.curve = CostCurve((1, 2, 4, 8, 16), (1.0, 1.10, 1.40, 2.28, 4.06))  # the int4-edge package's
    fresh, known = spec._policy(spec.drafters[0], None), spec._policy(spec.drafters[1], None)
    assert known.acceptance == pytest.approx(0.57) and fresh.acceptance == pytest.approx(1 / 3)
    for policy in (fresh, known):
        for _ in range(3):
            policy.update(1, 0, 0.0)  # three misses in a row
    assert not fresh.drafting() and known.drafting()


def test_a_kind_of_draft_known_to_pay_starts_on_and_one_known_to_lose_starts_off():
    """Prompt lookup's long matches are right ~9 times in 10 (PromptLookup.kind_acceptance): the first 8-token match
    of a generation drafts at once and deep, instead of waiting a verify call for a shadow guess and starting from
    the 1-in-3 guess; a 1-token match after an unsure root (right ~1 in 10) waits as before."""
    from edge.speculative import PromptLookup, Speculator

    spec = Speculator([PromptLookup()])
    spec.curve = CostCurve((1, 2, 4, 8, 16), (1.0, 1.10, 1.40, 2.28, 4.06))  # the int4-edge package's
    long, short = (spec._policy(spec.drafters[0], None, kind) for kind in ("8+-gram", "1-gram/unsure"))
    new = AdaptiveDepth(spec.curve, chain, shadowed=True)  # a kind nothing is known of
    assert long.acceptance == pytest.approx(PromptLookup.kind_acceptance["8+-gram"])
    assert not long.off and long.depth() >= 4
    assert short.off and short.depth() == 0 and new.off and new.depth() == 0


def test_the_kinds_of_one_drafter_share_how_their_verify_calls_run():
    """After a long conversation a multi-row call costs far more than the cached curve says: once one kind's verify
    call has shown it, a kind drafting for the first time prices its calls at that pace, not on the curve."""
    from edge.speculative import PromptLookup, Speculator

    spec = Speculator([PromptLookup()])
    spec.curve = CostCurve((1, 2, 4, 8, 16), (1.0, 1.10, 1.40, 2.28, 4.06))
    first = spec._policy(spec.drafters[0], None, "8+-gram")
    first.update(4, 0, 0.0, verify_seconds=2.0 * spec.curve(5), rows=5)  # ran at twice the curve's cost
    later = spec._policy(spec.drafters[0], None, "4-7-gram")
    assert later.verify_pace() == pytest.approx(2.0) and later.verify is first.verify
