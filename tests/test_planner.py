"""The planner: never over budget, monotone in budget, refuses with both bounds, and picks speculation when it pays."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from edge.config import ModelConfig
from edge.memory.budget import GiB, MiB, BudgetError, ModelSpec, Plan
from edge.memory.planner import (
    FP32_COST_POINTS, INT4_COST, INT4_COST_POINTS, CostCurve, expected_tokens, make_planner, plan_for, resolve_budget,
)
from edge.memory.profiles import ProfileError, load_profile

SMOLLM2 = ModelConfig("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64, max_context=8192, tie_word_embeddings=True)
LLAMA_3B = ModelConfig("llama", vocab_size=32000, hidden_size=3200, intermediate_size=8640, num_layers=26,
                       num_heads=32, num_kv_heads=32, head_dim=100, max_context=2048)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def model_specs(draw, max_layers: int = 40) -> ModelSpec:
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([32, 64, 128]))
    hidden = heads * head_dim
    config = ModelConfig("llama", vocab_size=draw(st.integers(1000, 160_000)), hidden_size=hidden,
                         intermediate_size=hidden * draw(st.integers(2, 4)),
                         num_layers=draw(st.integers(1, max_layers)),
                         num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                         max_context=draw(st.sampled_from([300, 2048, 8192, 32768])),
                         tie_word_embeddings=draw(st.booleans()))
    quant = draw(st.sampled_from(["int4", "fp32"]))
    return ModelSpec.from_config(config, quant)


@st.composite
def planners(draw):
    target = draw(model_specs())
    draft = draw(st.one_of(st.none(), model_specs(max_layers=4)))
    if draft is not None:
        assume(draft.weight_bytes < target.weight_bytes)
    return make_planner(target, draft=draft, alpha=draw(st.floats(0.0, 0.95)),
                        allow_paging=draw(st.booleans()), device=draw(st.sampled_from(
                            [None, "cpu-laptop-8gb", "laptop-rtx4060-8gb"])))


@SETTINGS
@given(planner=planners(), factor=st.floats(0.3, 20.0))
def test_never_over_budget_and_every_budget_above_the_bound_gets_a_plan(planner, factor):
    bound = planner.bounds().runs_at_all
    budget = int(bound * factor)
    if budget < bound:
        with pytest.raises(BudgetError):
            planner.plan(budget)
        return
    result = planner.plan(budget)
    assert result.memory.peak <= budget
    assert result.memory == planner.model.estimate(result.plan)
    assert result.plan.context >= planner.min_context


@SETTINGS
@given(planner=planners(), factors=st.lists(st.floats(1.0, 30.0), min_size=2, max_size=6))
def test_more_budget_never_gives_a_smaller_context(planner, factors):
    bound = planner.bounds().runs_at_all
    contexts = [planner.plan(int(bound * f)).plan.context for f in sorted(factors)]
    assert contexts == sorted(contexts)


def test_exact_lower_bound_fits_and_one_byte_less_is_refused():
    for quant in ("int4", "fp32"):
        planner = make_planner(ModelSpec.from_config(SMOLLM2, quant))
        bound = planner.bounds().runs_at_all
        result = planner.plan(bound)
        assert (result.plan.context, result.plan.prefill_chunk, result.plan.draft_len) == (256, 16, 0)
        assert result.memory.peak == bound
        with pytest.raises(BudgetError):
            planner.plan(bound - 1)


def speculative_planner(**options):
    """fp32 target with a small fp32 draft: the measured fp32 cost curve is flat enough for speculation to pay."""
    target = ModelSpec.from_config(LLAMA_3B, "fp32", name="llama-3b")
    draft = ModelSpec.from_config(SMOLLM2, "fp32", name="smollm2")
    return make_planner(target, draft=draft, alpha=0.8, **options)


def test_refusal_names_both_lower_bounds():
    planner = speculative_planner()
    bounds = planner.bounds()
    assert bounds.speculation_pays is not None and bounds.speculation_pays > bounds.runs_at_all
    with pytest.raises(BudgetError) as err:
        planner.plan(bounds.runs_at_all // 2)
    message = str(err.value)
    assert f"{bounds.runs_at_all:,} bytes" in message
    assert f"{bounds.speculation_pays:,} bytes" in message
    assert "llama-3b" in message


def test_refusal_without_speculation_says_why():
    planner = make_planner(ModelSpec.from_config(SMOLLM2, "int4"))
    with pytest.raises(BudgetError, match="no draft model given"):
        planner.plan("100MB")


def test_speculation_bound_is_where_speculation_starts_to_be_chosen():
    planner = speculative_planner(prompt_tokens=0)
    pays = planner.bounds().speculation_pays
    at_bound = planner.plan(pays, context=planner.min_context)
    assert at_bound.plan.speculative
    assert at_bound.decode_tokens_per_s > at_bound.plain_decode_tokens_per_s
    assert not planner.plan(pays - 1, context=planner.min_context).plan.speculative


def test_ample_budget_drafts_when_it_pays_and_not_when_it_does_not():
    fast = speculative_planner().plan(64 * GiB)
    assert fast.plan.speculative and fast.plan.context == 2048
    assert fast.tokens_per_step == pytest.approx(expected_tokens(0.8, fast.plan.draft_len, fast.plan.tree_width))
    # int4 on this CPU: verifying k tokens costs almost k decode steps (the measured curve), so no draft
    int4 = make_planner(ModelSpec.from_config(LLAMA_3B, "int4"), draft=ModelSpec.from_config(SMOLLM2, "int4"),
                        alpha=0.6)
    assert not int4.plan(64 * GiB).plan.speculative
    assert int4.bounds().speculation_pays is None


def test_context_cap_and_default_context():
    planner = make_planner(ModelSpec.from_config(SMOLLM2, "int4"))
    assert planner.plan(16 * GiB).plan.context == 8192
    assert planner.plan(16 * GiB, context=1000).plan.context == 1000
    assert planner.plan(16 * GiB, context=10).plan.context == 256  # never under the minimum context


def test_paging_is_a_last_resort_and_fits_a_3gb_model_in_a_quarter():
    config = ModelConfig("llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_layers=32,
                         num_heads=32, num_kv_heads=8, head_dim=128, max_context=4096)
    target = ModelSpec.from_config(config, "int4", weight_bytes=3 * GiB, name="synthetic")
    with pytest.raises(BudgetError, match="export it for weight paging"):
        plan_for(target, 3 * GiB // 4)
    paged = plan_for(target, 3 * GiB // 4, allow_paging=True)
    assert paged.plan.resident_layers is not None and paged.memory.peak <= 3 * GiB // 4
    more = plan_for(target, 2 * GiB, allow_paging=True)
    assert more.plan.resident_layers > paged.plan.resident_layers
    assert more.decode_tokens_per_s > paged.decode_tokens_per_s
    resident = plan_for(target, 8 * GiB, allow_paging=True)
    assert resident.plan.resident_layers is None and resident.plan.context == 4096


def test_profile_budget_sets_memory_and_speeds():
    """A model big enough to be bandwidth-bound decodes at the bandwidths' ratio; a small one on a GPU at the
    profile's dispatch floor (30 layers x 47 us: what an H200 measured, far below what its bandwidth allows)."""
    big = ModelSpec.from_config(LLAMA_3B, "int4")
    laptop, gpu = plan_for(big, "cpu-laptop-8gb"), plan_for(big, "laptop-rtx4060-8gb")
    assert laptop.budget == load_profile("cpu-laptop-8gb").memory_bytes
    ratio = load_profile("laptop-rtx4060-8gb").memory_bandwidth / load_profile("cpu-laptop-8gb").memory_bandwidth
    assert gpu.plain_decode_tokens_per_s / laptop.plain_decode_tokens_per_s == pytest.approx(ratio)
    assert gpu.memory.prepack == 0  # the device holds one copy of each weight
    assert gpu.memory.overhead == 400 * MiB
    small = plan_for(ModelSpec.from_config(SMOLLM2, "int4"), "laptop-rtx4060-8gb")
    floor = SMOLLM2.num_layers * load_profile("laptop-rtx4060-8gb").layer_dispatch_seconds
    assert small.plain_decode_tokens_per_s == pytest.approx(1 / floor)


def test_on_a_gpu_verifying_several_tokens_is_cheap():
    """The GPU's own cost curve (an 8-token step 1.43x a 1-token one, against 3.06x for int4 on the CPU), and under
    the dispatch floor an S-token step costs just what a 1-token step does: a draft model pays sooner there."""
    target, draft = ModelSpec.from_config(LLAMA_3B, "int4"), ModelSpec.from_config(SMOLLM2, "int4")
    gpu, cpu = (make_planner(target, draft=draft, alpha=0.7, device=device)
                for device in ("laptop-rtx4060-8gb", "cpu-laptop-8gb"))
    plan = gpu.plan(8 * GiB).plan
    step = gpu.speed.target_step
    assert step(gpu.model, plan, 8) / step(gpu.model, plan, 1) == pytest.approx(1.43)
    assert gpu.speed.draft_step(gpu.model, 4) == gpu.speed.draft_step(gpu.model, 1)  # SmolLM2: at the floor
    assert gpu.speed.draft_step(gpu.model, 1) == pytest.approx(SMOLLM2.num_layers * gpu.speed.layer_dispatch)
    assert plan.speculative and not cpu.plan(8 * GiB).plan.speculative  # int4 on the CPU: 3x for 8 tokens


def test_resolve_budget():
    assert resolve_budget("2GiB") == (2 * GiB, None)
    assert resolve_budget(12345) == (12345, None)
    size, profile = resolve_budget("jetson-orin-8gb")
    assert profile.name == "jetson-orin-8gb" and size == profile.memory_bytes
    with pytest.raises(ProfileError, match="cpu-laptop-8gb"):
        resolve_budget("my-phone")


def test_plan_from_a_manifest_dict():
    int4_bytes = ModelSpec.from_config(SMOLLM2, "int4").weight_bytes
    manifest = {"name": "smollm2", "config": SMOLLM2.to_dict(), "quantization": {"method": "rtn", "bits": 4},
                "files": {"model.onnx": {"bytes": 300_000}, "model.onnx.data": {"bytes": int4_bytes}}}
    result = plan_for(manifest, "1GiB")
    assert result.memory.weights_target == int4_bytes + 300_000
    assert "context" in result.describe() and "peak" in result.describe()


def test_cost_curve_interpolates_measured_points_and_extends_the_last_slope():
    for tokens, cost in INT4_COST_POINTS.items():
        assert INT4_COST(tokens) == pytest.approx(cost)
    assert INT4_COST(3) == pytest.approx((1.64 + 2.89) / 2)
    assert INT4_COST(32) == pytest.approx(4.16 + 16 * (4.16 - 3.06) / 8)
    fp32 = CostCurve.of(FP32_COST_POINTS)
    assert fp32(12) == pytest.approx((1.31 + 1.78) / 2)
    with pytest.raises(ValueError):
        CostCurve.of({2: 1.5})
    with pytest.raises(ValueError):
        CostCurve.of({1: 1.0, 4: 0.5})


@given(alpha=st.floats(0.0, 0.99), k=st.integers(0, 15))
def test_chain_acceptance_matches_the_closed_form(alpha, k):
    assert expected_tokens(alpha, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))
    assert expected_tokens(alpha, k, 3) >= expected_tokens(alpha, k)


def test_custom_cost_curve_changes_the_choice():
    target = ModelSpec.from_config(LLAMA_3B, "int4")
    draft = ModelSpec.from_config(SMOLLM2, "int4")
    flat = {1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.05}
    result = make_planner(target, draft=draft, alpha=0.7, cost_curve=flat).plan(64 * GiB)
    assert result.plan.speculative and result.plan.nodes > 4


def test_bad_alpha_is_refused():
    with pytest.raises(BudgetError, match="alpha"):
        make_planner(ModelSpec.from_config(SMOLLM2), alpha=1.0)


def test_plan_rejects_invalid_fields():
    with pytest.raises(ValueError):
        Plan(context=0)
    with pytest.raises(ValueError):
        Plan(context=256, resident_layers=-1)


def test_a_model_free_drafters_tree_is_reserved_after_the_context():
    """Token recycling verifies trees without a draft model: the plan reserves its logits rows, tree bias and
    activations (as much of the tree as fits once the context is chosen), and the runtime caps the tree at it."""
    from edge.memory.budget import logits_bytes, tree_buffer_bytes

    target = ModelSpec.from_config(SMOLLM2, "int4")
    plain = plan_for(target, "1GiB", context=2048)
    free = plan_for(target, "1GiB", context=2048, free_draft_nodes=25)
    assert not plain.plan.speculative and free.plan.nodes == 25 and not free.plan.uses_draft_model
    assert free.plan.context == plain.plan.context and free.memory.weights_draft == free.memory.kv_draft == 0
    assert free.memory.logits == logits_bytes(25, SMOLLM2.vocab_size)
    assert free.memory.tree_buffers == tree_buffer_bytes(25, 2048)
    assert free.memory.peak <= free.budget and free.memory.peak > plain.memory.peak
    assert "model-free drafting, up to 25 nodes" in free.describe()
    # a budget that fits the context but not the whole tree keeps the context and shrinks the tree
    tight = plain.memory.peak + logits_bytes(6, SMOLLM2.vocab_size) + tree_buffer_bytes(6, 2048) + (1 << 20)
    squeezed = plan_for(target, tight, context=2048, free_draft_nodes=25)
    assert squeezed.plan.context == 2048 and 1 < squeezed.plan.nodes < 25 and squeezed.memory.peak <= tight


def test_runtime_plan_exposes_the_node_cap(tmp_path):
    from edge.memory.plan_runtime import plan_package
    from edge.package import Package

    manifest = {"name": "m", "config": SMOLLM2.to_dict(), "quantization": {"method": "rtn", "bits": 4},
                "files": {"model.onnx": {"bytes": 400_000}, "model.onnx.data": {"bytes": 90_000_000}}}
    plan = plan_package(Package(tmp_path, manifest), "1GiB", context=1024, free_draft_nodes=25)
    assert plan.max_rows == 25 and not plan.speculative  # the engine's "draft model kept" stays False
    assert plan_package(Package(tmp_path, manifest), "1GiB", context=1024).max_rows == 1
