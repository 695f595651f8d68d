"""The speculative benchmark's summary (its bootstrap intervals, the issue targets it reports) and its replay."""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import speculative  # noqa: E402


def test_interval_collapses_without_noise_and_widens_with_it():
    assert speculative.interval([[2.0] * 8, [2.0] * 8]) == (2.0, 2.0)
    rng = random.Random(0)
    quiet = [[2.0 * rng.gauss(1, 0.01) for _ in range(8)] for _ in range(2)]
    noisy = [[2.0 * rng.gauss(1, 0.05) for _ in range(8)] for _ in range(2)]
    lo_q, hi_q = speculative.interval(quiet)
    lo_n, hi_n = speculative.interval(noisy)
    assert lo_q < 2.0 < hi_q and hi_q - lo_q < hi_n - lo_n


def test_targets_name_the_lowest_cell_and_auto():
    def row(category, variant, ratios):
        return {"target": "t", "category": category, "variant": variant, "ratio": sorted(ratios)[len(ratios) // 2],
                "ratios": ratios}

    rows = [row("rewrite", speculative.AUTO[0], [2.1, 2.2, 2.0]), row("rewrite", "recycling", [0.93, 0.94, 0.95]),
            row("open chat", speculative.AUTO[0], [1.1, 1.1, 1.1]), row("code", speculative.AUTO[0], [1.6, 1.6, 1.6]),
            {"target": "t", "category": "rewrite", "variant": "plain", "ratio": 1.0, "ratios": None}]
    text = "\n".join(speculative.targets(speculative.cell_stats(rows)))
    assert "lookup+head, rewrite >= 2x: 2.10" in text
    assert "open chat and code >= 1.2x: 1.33" in text
    assert "lowest 0.94" in text and "(recycling, rewrite)" in text


def test_the_model_prices_each_call_at_its_own_size():
    from edge.speculative import CostCurve
    from edge.speculative.stats import SpeculativeStats

    curve = CostCurve((1, 5, 9), (1.0, 1.1, 2.0))
    stats = SpeculativeStats()
    stats.record("lookup", 8, 8)  # 9 rows, 9 tokens
    stats.record("", 0, 0)  # 1 row, 1 token
    assert stats.calls_by_rows == {9: 1, 1: 1}
    # 10 tokens for 3.0 of 1-token time; the mean size (5 rows, 1.1) would have said 10 / 2.2
    assert abs(speculative.modelled_ratio(stats, curve) - 10 / 3.0) < 1e-12


def test_the_replay_prices_a_copy_and_counts_its_kinds_passes():
    """benchmarks/speculative_replay.py on a synthetic answer that copies its prompt and then leaves it: long matches
    pass at every level until the answer leaves the copy, the replay prices the copy above plain decoding, and
    drafts cut to what passes price at least as well as the policy's."""
    import speculative_replay as replay
    from edge.speculative import CostCurve

    prompt = list(range(100, 140))
    answer = prompt[5:35] + [7, 8, 9, 10, 11, 12]
    ids, curve = prompt + answer, CostCurve((1, 2, 4, 8), (1.0, 1.1, 1.4, 2.3))
    rates = replay.kind_rates([{"ids": ids, "n": len(answer), "sure": [True] * len(answer)}])
    trials, passes = rates["8+-gram"][0]
    assert trials > 10 and passes == trials - 1  # only the draft past the copy's end misses
    policy = replay.replay(ids, len(answer), [True] * len(answer), curve, replay.Lookup(curve))
    cut = replay.replay(ids, len(answer), [True] * len(answer), curve, None)
    assert 1.5 < policy <= cut
    # policies that believe a flat curve while the calls cost a steep one: each call is priced on the steep one
    steep = CostCurve((1, 2, 4, 8), (1.0, 2.0, 4.0, 8.0))
    believing = replay.replay(ids, len(answer), [True] * len(answer), steep, replay.Lookup(curve))
    assert believing < policy
