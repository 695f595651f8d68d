"""The memory model: each term against the buffers the runtime allocates, and the package facts it reads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.config import ModelConfig
from edge.errors import EdgeError
from edge.memory.budget import (
    FRESH_INSTALL_FILE_BYTES, GiB, INT_PREPACK_RATIO, KiB, L2_CACHE_BYTES, MiB, RUNTIME_OVERHEAD_BYTES,
    STEP_FIXED_BYTES, BudgetError, MemoryModel, ModelSpec, Plan, activation_bytes, attention_scratch_bytes,
    estimate_layout, format_bytes, matmul_nbits_bytes, measure_import_overhead, parse_size,
)

SMOLLM2 = ModelConfig("llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                      num_kv_heads=3, head_dim=64, max_context=8192, tie_word_embeddings=True)
DRAFT = ModelConfig("llama", vocab_size=49152, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=64, max_context=8192, tie_word_embeddings=True)


@st.composite
def configs(draw) -> ModelConfig:
    kv_heads = draw(st.integers(1, 4))
    heads = kv_heads * draw(st.integers(1, 4))
    head_dim = draw(st.sampled_from([16, 32, 64]))
    return ModelConfig("llama", vocab_size=draw(st.integers(8, 2000)), hidden_size=heads * head_dim,
                       intermediate_size=draw(st.integers(8, 600)), num_layers=draw(st.integers(1, 6)),
                       num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, max_context=4096,
                       tie_word_embeddings=draw(st.booleans()))


def numpy_kv(config: ModelConfig, context: int) -> int:
    """Bytes of the runtime's KV cache: two float32 (1, kv_heads, L, head_dim) arrays per layer."""
    shape = (1, config.num_kv_heads, context, config.head_dim)
    return sum(np.zeros(shape, np.float32).nbytes + np.zeros(shape, np.float32).nbytes
               for _ in range(config.num_layers))


@settings(max_examples=40, deadline=None)
@given(target=configs(), draft=configs(), context=st.integers(1, 300), draft_len=st.integers(0, 5),
       width=st.integers(1, 3))
def test_kv_logits_and_tree_terms_equal_numpy_buffers(target, draft, context, draft_len, width):
    model = MemoryModel(ModelSpec.from_config(target), ModelSpec.from_config(draft))
    plan = Plan(context=context, prefill_chunk=16, draft_len=draft_len, tree_width=width)
    est = model.estimate(plan)
    nodes = 1 + draft_len * width
    assert est.kv_target == numpy_kv(target, context)
    logits = np.empty((nodes, target.vocab_size), np.float32).nbytes
    if draft_len:
        assert est.kv_draft == numpy_kv(draft, context)
        logits += np.empty((1, draft.vocab_size), np.float32).nbytes
        bias = np.empty((1, 1, nodes, context), np.float32).nbytes + np.empty((1, nodes), np.int64).nbytes
        assert est.tree_buffers == bias
    else:
        assert est.kv_draft == 0 and est.tree_buffers == 0 and est.weights_draft == 0
    assert est.logits == logits


def test_matmul_nbits_bytes_match_the_operator_layout():
    """B (N, blocks, 16) uint8, scales (N, blocks) float32, zero points packed two per byte (N, ceil(blocks/2))."""
    for n, k in [(64, 64), (1536, 576), (10, 200), (7, 33)]:
        blocks = -(-k // 32)
        arrays = [np.zeros((n, blocks, 16), np.uint8), np.zeros((n, blocks), np.float32),
                  np.zeros((n, -(-blocks // 2)), np.uint8)]
        assert matmul_nbits_bytes(n, k) == sum(a.nbytes for a in arrays)
    # 4 bits + a float32 scale and a 4-bit zero point per 32 weights
    assert matmul_nbits_bytes(4096, 4096) == 4096 * 4096 * (0.5 + 4 / 32 + 0.5 / 32)


def test_activations_are_the_largest_step():
    model = MemoryModel(ModelSpec.from_config(SMOLLM2), ModelSpec.from_config(DRAFT))
    plan = Plan(context=2048, prefill_chunk=256, draft_len=4, tree_width=2)
    int8 = dict(int8_activations=True)  # int4 packages run MatMulNBits at accuracy_level 4 by default
    steps = [activation_bytes(SMOLLM2, 256, 2048, **int8), activation_bytes(SMOLLM2, plan.nodes, 2048, **int8),
             activation_bytes(DRAFT, 256, 2048, **int8), activation_bytes(DRAFT, 1, 2048, **int8)]
    assert model.estimate(plan).activations == max(steps)
    # past 2 * head_dim tokens the attention tiles stop growing: the rest is linear in S on top of a fixed cost
    fixed = STEP_FIXED_BYTES + attention_scratch_bytes(SMOLLM2, 256, 2048)
    assert activation_bytes(SMOLLM2, 512, 2048) - fixed == 2 * (activation_bytes(SMOLLM2, 256, 2048) - fixed)
    # ORT's tiled attention keeps no score matrix; its tiles stop at L2-sized kv blocks, so past that L is free
    assert activation_bytes(SMOLLM2, 8, 4096) == activation_bytes(SMOLLM2, 8, 2048)
    # a kernel that materialises scores adds num_heads x S x L float32 instead of the tiles
    scores = activation_bytes(SMOLLM2, 8, 4096, full_scores=True) - activation_bytes(SMOLLM2, 8, 4096)
    tiles = attention_scratch_bytes(SMOLLM2, 8, 4096)
    assert scores == np.empty((SMOLLM2.num_heads, 8, 4096), np.float32).nbytes - tiles
    kv_block = L2_CACHE_BYTES // (4 * 4 * 2 * 64)  # 1024 rows at 2 MiB of L2
    assert tiles == 2 * np.empty((8, 2 + kv_block + 64), np.float32).nbytes  # 2 threads
    full = MemoryModel(ModelSpec.from_config(SMOLLM2), full_scores=True).estimate(Plan(context=4096, prefill_chunk=64))
    assert full.activations == activation_bytes(SMOLLM2, 64, 4096, full_scores=True, int8_activations=True)


def test_int8_activation_copies_follow_the_packages_accuracy_level():
    """MatMulNBits (accuracy_level 4 by default) and edge.QMatMul at level 4 round a step's input to int8: the widest
    one, intermediate bytes and a float32 scale per 32, held in the arena like the float tensors."""
    extra = activation_bytes(SMOLLM2, 100, 2048, int8_activations=True) - activation_bytes(SMOLLM2, 100, 2048)
    assert extra == 2 * 100 * 1536 * (1 + 4 / 32)
    stock = manifest(SMOLLM2, 1, 90_000_000, {"method": "rtn", "bits": 4})
    assert ModelSpec.from_manifest(stock).int8_activations and not ModelSpec.from_manifest(
        manifest(SMOLLM2, 1, 5, {"method": "fp32", "bits": 32})).int8_activations
    edge = dict(stock, graph={"custom_ops": ["edge"]})
    assert not ModelSpec.from_manifest(edge).int8_activations  # edge.QMatMul keeps x in float unless asked
    assert ModelSpec.from_manifest(dict(edge, graph={"custom_ops": ["edge"], "accuracy_level": 4})).int8_activations
    assert not ModelSpec.from_manifest(dict(stock, quantization={"method": "rtn", "bits": 4, "accuracy_level": 0})
                                       ).int8_activations


def test_int4_weights_are_about_a_sixth_of_fp32():
    int4, fp32 = estimate_layout(SMOLLM2, "int4"), estimate_layout(SMOLLM2, "fp32")
    # linear layers: 0.640625 bytes per weight against 4
    assert (int4.layer_bytes - 2 * 576 * 4) / (fp32.layer_bytes - 2 * 576 * 4) == pytest.approx(0.640625 / 4)
    assert int4.total < fp32.total / 5


def manifest(config: ModelConfig, graph: int, data: int, quantization=None) -> dict:
    files = {"model.onnx": {"bytes": graph, "sha256": "0" * 64}, "model.onnx.data": {"bytes": data, "sha256": "1"},
             "tokenizer.json": {"bytes": 3_500_000, "sha256": "2"}}
    m = {"name": "m", "config": config.to_dict(), "files": files}
    if quantization is not None:
        m["quantization"] = quantization
    return m


def test_model_spec_from_manifest_counts_graph_and_external_data_only():
    spec = ModelSpec.from_manifest(manifest(SMOLLM2, 400_000, 90_000_000, {"method": "rtn", "bits": 4}))
    assert spec.weight_bytes == 90_400_000  # not the tokenizer
    assert spec.quant == "int4"
    layout = spec.layout
    assert layout.num_layers * layout.layer_bytes + layout.embedding_bytes + layout.head_bytes == 90_400_000
    assert ModelSpec.from_manifest(manifest(SMOLLM2, 1, 5, {"method": "fp32", "bits": 32})).quant == "fp32"


def test_weight_format_is_inferred_when_the_manifest_does_not_say():
    int4 = estimate_layout(SMOLLM2, "int4").total
    fp32 = estimate_layout(SMOLLM2, "fp32").total
    assert ModelSpec.from_manifest(manifest(SMOLLM2, 10_000, int4)).quant == "int4"
    assert ModelSpec.from_manifest(manifest(SMOLLM2, 10_000, fp32)).quant == "fp32"


def test_file_list_form_of_manifest_is_accepted():
    m = {"config": SMOLLM2.to_dict(), "files": [{"path": "model.onnx", "size": 10}, {"path": "model.onnx.data",
                                                                                     "size": 1000}]}
    assert ModelSpec.from_manifest(m, name="x").weight_bytes == 1010


@pytest.mark.parametrize("bad", [{"files": {}}, {"config": SMOLLM2.to_dict(), "files": {"tokenizer.json": 5}},
                                 {"config": SMOLLM2.to_dict(), "files": {"model.onnx": {"sha256": "0"}}}])
def test_broken_manifests_raise_a_budget_error(bad):
    with pytest.raises(BudgetError, match="re-export"):
        ModelSpec.from_manifest(bad)


def test_package_folder_without_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(BudgetError, match="manifest.json"):
        ModelSpec.from_package(tmp_path)


def test_paging_keeps_only_the_window_resident_and_reads_the_rest_from_disk():
    spec = ModelSpec.from_config(SMOLLM2, "int4")
    model, layout = MemoryModel(spec), spec.layout
    full = model.estimate(Plan(context=256))
    paged = model.estimate(Plan(context=256, resident_layers=0))
    untouched_rope = layout.rope_bytes * (8192 - 256) // 8192
    assert paged.weights_target == layout.embedding_bytes + layout.head_bytes - untouched_rope + 2 * layout.layer_bytes
    assert paged.prepack == layout.head_prepack_bytes + 2 * layout.layer_prepack_bytes
    assert model.disk_bytes_per_pass(Plan(context=256, resident_layers=0)) == 30 * layout.layer_bytes
    assert model.disk_bytes_per_pass(Plan(context=256, resident_layers=28)) == 2 * layout.layer_bytes
    assert model.disk_bytes_per_pass(Plan(context=256)) == 0
    assert model.estimate(Plan(context=256, resident_layers=29)).weights_target == full.weights_target
    assert paged.peak < full.peak


def test_peak_adds_weights_prepack_and_buffers():
    spec = ModelSpec.from_config(SMOLLM2, "int4")
    est = MemoryModel(spec).estimate(Plan(context=256, prefill_chunk=16))
    assert est.load_peak == RUNTIME_OVERHEAD_BYTES + est.weights_target + spec.layout.prepack_bytes
    assert est.run_peak == est.load_peak + est.kv_target + est.logits + est.activations
    assert est.peak == est.run_peak
    no_prepack = MemoryModel(spec, prepack_fraction=0.0).estimate(Plan(context=256, prefill_chunk=16))
    assert no_prepack.peak == est.peak - spec.layout.prepack_bytes and no_prepack.prepack == 0


def test_prepack_copies_match_what_ort_keeps():
    """int: every MatMulNBits weight, the tied table included; fp32: only a tied table (Gemm keeps its own copy)."""
    int4 = estimate_layout(SMOLLM2, "int4")
    linear = int4.layer_bytes - 2 * 576 * 4  # a layer's MatMulNBits bytes (not its two norms)
    assert int4.prepack_bytes == pytest.approx(INT_PREPACK_RATIO * (30 * linear + int4.embedding_bytes), abs=31)
    fp32 = estimate_layout(SMOLLM2, "fp32")
    assert fp32.prepack_bytes == fp32.embedding_bytes == 49152 * 576 * 4
    untied = estimate_layout(ModelConfig(**{**SMOLLM2.to_dict(), "tie_word_embeddings": False}), "fp32")
    assert untied.prepack_bytes == 0


def test_draft_weights_and_prepack():
    target, draft = ModelSpec.from_config(SMOLLM2, "int4"), ModelSpec.from_config(DRAFT, "int4")
    est = MemoryModel(target, draft).estimate(Plan(context=512, draft_len=3))
    rope = 2 * 8192 * 32 * 4 * (1 - 512 / 8192)  # rotary rows past the context are never read
    assert est.weights_draft == draft.weight_bytes - rope and est.weights_target == target.weight_bytes - rope
    assert est.prepack == target.layout.prepack_bytes + draft.layout.prepack_bytes
    assert est.load_peak == RUNTIME_OVERHEAD_BYTES + est.weights_target + est.weights_draft + est.prepack


def test_speculative_plan_needs_a_draft():
    with pytest.raises(ValueError, match="draft"):
        MemoryModel(ModelSpec.from_config(SMOLLM2)).estimate(Plan(context=256, draft_len=2))


def test_generation_bytes_exclude_weights():
    est = MemoryModel(ModelSpec.from_config(SMOLLM2)).estimate(Plan(context=1024))
    assert est.generation_bytes == est.kv_target + est.logits + est.activations
    assert "kv_target" in est.table() and est.terms()["peak"] == est.peak


@pytest.mark.parametrize("text,expected", [
    ("2GiB", 2 * GiB), ("512MB", 512_000_000), ("1.5 GB", 1_500_000_000), ("300MiB", 300 * MiB),
    ("1048576", 1 << 20), (4096, 4096), ("2g", 2 * GiB), (" 64 kib ", 64 * 1024), ("0.5GiB", GiB // 2),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["abc", "-1GB", "0", "2XB", "GiB", "", True, float("nan")])
def test_parse_size_rejects_nonsense(bad):
    with pytest.raises(BudgetError):
        parse_size(bad)


def test_budget_error_is_an_edge_error():
    assert issubclass(BudgetError, EdgeError)


def test_format_bytes():
    assert format_bytes(3 * GiB // 2) == "1.50 GiB"
    assert format_bytes(300 * MiB) == "300.0 MiB"
    assert format_bytes(512) == "512 B"


def test_runtime_overhead_constant_is_current():
    """The constant is the measured import RSS plus one session; a fresh measurement stays near it, or above it by
    at most the file pages that a freshly installed environment maps in large folios (75.3 vs 93.6 MiB here)."""
    measured = measure_import_overhead()
    assert 0.9 * RUNTIME_OVERHEAD_BYTES < measured < 1.05 * RUNTIME_OVERHEAD_BYTES + FRESH_INSTALL_FILE_BYTES


MEASURE_ONE_STEP = """
import sys
import numpy as np, onnx, onnxruntime as ort, psutil, tokenizers
import edge.engine, edge.paging  # the runtime's imports, as RUNTIME_OVERHEAD_BYTES counts them
from edge.model import Decoder
from edge.package import load_package
pkg, L, S = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# the runtime's own decoder: caches bound as past and present at once (in place), allocated once at L tokens
decoder = Decoder(load_package(pkg, verify=False), context_length=L, threads=2)
for array in decoder.cache.arrays:
    array.fill(1.0)  # every page of the caches resident, as in a full context
decoder.step(np.arange(S) + 100)
print(psutil.Process().memory_info().rss)
"""


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["int4", "int4-edge"])
def test_prediction_is_within_10_percent_of_measured_rss(quant):
    """One 16-token step of the real default package (int4, on stock ops and on edge's kernels) with 256-token
    caches, run by edge's Decoder (caches in place, as the runtime runs it) in a fresh process. (Plain
    session.run with numpy caches costs ~17 MiB more: onnxruntime then allocates present outputs of its own.)"""
    import subprocess
    import sys

    from edge.default_model import default_package

    package = default_package(quant)
    spec = ModelSpec.from_package(package)
    assert spec.quant == "int4"
    estimate = estimate_layout(spec.config, "int4", kernels=spec.kernels, float16_stats=spec.float16_stats,
                               embedding_bits=spec.embedding_bits, calibrated_head=spec.calibrated_head)
    assert estimate.total == pytest.approx(spec.weight_bytes, rel=0.02)
    out = subprocess.run([sys.executable, "-c", MEASURE_ONE_STEP, str(package), "256", "16"], capture_output=True,
                         text=True, check=True, timeout=300)
    measured = int(out.stdout.strip().splitlines()[-1])
    estimate = MemoryModel(spec).estimate(Plan(context=256, prefill_chunk=16))
    predicted = estimate.peak - estimate.tokenizer  # this process loads no tokenizer
    assert predicted == pytest.approx(measured, rel=0.10)


STEP_SIZES = (1, 16, 128, 512)


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["int4", "int4-edge", "fp32"])
def test_each_term_is_within_10_percent_of_measured(quant):
    """The real default package run by edge's Decoder (IOBinding, KV in place) in a fresh process: RSS after the
    session is created (weights, prepack and runtime), after the KV cache and a logits row are written (session and
    buffers together: the caches may reuse heap pages that session creation freed), and what each step of S tokens
    adds (the activation term)."""
    from edge.default_model import default_package
    from edge.memory.usage import measure_resident

    package = default_package(quant)
    spec = ModelSpec.from_package(package)
    context = 2048  # the caches reuse ~10 MiB of heap that session creation freed: a fixed, conservative error
    measured = measure_resident(package, context, list(STEP_SIZES))
    # the runtime's overhead as this environment's page cache has it (see FRESH_INSTALL_FILE_BYTES): what is checked
    # here is the package's terms, and test_runtime_overhead_constant_is_current checks the constant
    est = MemoryModel(spec, overhead_bytes=measure_import_overhead()).estimate(
        Plan(context=context, prefill_chunk=max(STEP_SIZES)))
    load = est.load_peak - est.tokenizer  # the probe loads no tokenizer
    assert load == pytest.approx(measured["session"], rel=0.10)
    row = est.logits  # one row of the target's logits, the probe's whole use of the logits buffer
    assert load + est.kv_target + row == pytest.approx(measured["buffers"], rel=0.10)
    # weights the sessions left untouched (edge.QMatMul's, memory-mapped) are read in by the first step
    in_sessions = est.load_peak - est.overhead - est.tokenizer - est.weights_draft - est.prepack
    untouched = est.weights_target - in_sessions
    for tokens, step, anon in zip(STEP_SIZES, measured["steps"], measured["steps_anon"]):
        predicted = activation_bytes(spec.config, tokens, context, int8_activations=spec.int8_activations,
                                     edge_attention=spec.edge_attention, fused_mlp=spec.fused_mlp,
                                     pre_projections=spec.pre_projections)
        # the arena's share (anonymous memory) within 10%, with half a MiB of slack for the small steps (S <= 16,
        # whose share is 0.1-1.3 MiB); the kernels' code pages that the first step touches: at most STEP_FIXED_BYTES.
        # edge's kernels: never under, at most 50% over (their arena use per token falls from ~52 KB at S <= 64 to
        # ~41 KB at S >= 128, which the stock ops' growth factor does not model; the planner keeps the margin)
        arena = predicted - STEP_FIXED_BYTES
        if spec.kernels == "edge":
            assert anon - 512 * KiB <= arena <= 1.5 * anon + 512 * KiB, f"{quant} S={tokens}: {arena} vs {anon}"
        else:
            assert arena == pytest.approx(anon, rel=0.10, abs=512 * KiB), f"{quant} S={tokens}: {arena} vs {anon}"
        assert abs(step - anon - untouched) < 1.1 * STEP_FIXED_BYTES + 0.1 * untouched  # RSS over 'buffers'


def paged_manifest(config: ModelConfig, layer: int, head: int, table: list[dict], quantization: dict,
                   custom_ops=()) -> dict:
    """A paged package's manifest: `layer` bytes per layer, `head` bytes of head and graphs, the table's entries."""
    table_bytes = sum(int(np.prod(e["shape"])) * np.dtype(e["dtype"]).itemsize for e in table)
    m = manifest(config, 10_000, head - 10_000 + table_bytes, quantization)
    m["files"] |= {"layers.onnx.data": {"bytes": config.num_layers * layer, "sha256": "4"}}
    m["graph"] = {"file": "model.onnx", "custom_ops": list(custom_ops)}
    embedding = table[0] if len(table) == 1 else {"format": "matmulnbits", "qweight": table[0], "scales": table[1],
                                                  "zero_points": table[2]}
    m["paging"] = {"layer_graph": "layer.onnx", "layer_data": "layers.onnx.data", "layer_bytes": layer,
                   "embedding": embedding}
    return m


FLOAT_TABLE = [{"file": "model.onnx.data", "offset": 0, "shape": [49152, 576], "dtype": "float32"}]
INT4_TABLE = [{"shape": [49152, 18, 16], "dtype": "uint8"}, {"shape": [49152, 18], "dtype": "float32"},
              {"shape": [49152, 9], "dtype": "uint8"}]


def test_a_paged_package_counts_its_tied_table_once():
    """The runtime gathers embedding rows through a memory map; the only resident copy of a tied float table is the
    head Gemm's packed one (the prepack term). The layout comes from the paging index, exactly."""
    paged = ModelSpec.from_manifest(paged_manifest(SMOLLM2, 5_000_000, 2_000_000, FLOAT_TABLE,
                                                   {"method": "fp32", "bits": 32}))
    table = 49152 * 576 * 4
    layout = paged.layout
    assert paged.paged and not layout.embedding_resident and layout.embedding_bytes == table
    assert layout.layer_bytes == 5_000_000 and layout.head_bytes == 2_000_000 and layout.head_prepack_bytes == table
    assert layout.load_transient_bytes == table and layout.layer_prepack_bytes == 0
    for plan, layers in ((Plan(context=256), 30), (Plan(context=256, resident_layers=0), 2)):
        est = MemoryModel(paged).estimate(plan)
        assert est.weights_target + est.prepack == 2_000_000 + table + layers * 5_000_000
    # the sessions read the table and pack it: twice the table at load, once after
    est = MemoryModel(paged).estimate(Plan(context=256, resident_layers=0))
    assert est.load_peak == est.overhead + est.tokenizer + 2_000_000 + 2 * table


def test_edge_kernel_packages_have_no_prepack_and_a_tied_head_copy():
    """edge.QMatMul reads its packed inputs as they are; a tied head needs its own copy in QMatMul's layout."""
    edge, stock = estimate_layout(SMOLLM2, "int4", kernels="edge"), estimate_layout(SMOLLM2, "int4")
    assert edge.prepack_bytes == 0 and stock.prepack_bytes > 0
    assert edge.embedding_bytes == stock.embedding_bytes == matmul_nbits_bytes(49152, 576)
    assert edge.head_bytes - stock.head_bytes == 49152 * 18 * (16 + 5)  # codes, scale and zero per 32 weights
    spec = ModelSpec.from_manifest(paged_manifest(SMOLLM2, 2_400_000, 19_000_000, INT4_TABLE,
                                                  {"method": "rtn", "bits": 4}, custom_ops=["edge"]))
    assert spec.kernels == "edge" and spec.layout.prepack_bytes == 0 and spec.layout.load_transient_bytes == 0
    assert spec.layout.embedding_bytes == matmul_nbits_bytes(49152, 576)
    est = MemoryModel(spec, weights_at_load=False).estimate(Plan(context=256, resident_layers=0))
    assert est.weights_target == 19_000_000 + 2 * 2_400_000  # the int4 table stays on disk
    assert est.load_peak == est.overhead + est.tokenizer  # QMatMul's weights are first touched by the first step
    # copied into 2 MB pages as the sessions are made: the head graph's are resident from then on
    copied = MemoryModel(spec, weights_at_load=True).estimate(Plan(context=256, resident_layers=0))
    assert copied.load_peak == est.load_peak + spec.layout.head_bytes and copied.run_peak == est.run_peak


def test_rotary_rows_past_the_context_are_never_touched():
    """The cos/sin caches hold max_context rows in memory-mapped external data; a run reads the first `context`."""
    spec = ModelSpec.from_config(SMOLLM2, "int4")
    rope = 2 * 8192 * 32 * 4
    assert spec.layout.rope_bytes == rope
    model = MemoryModel(spec)
    full, quarter = model.estimate(Plan(context=8192)), model.estimate(Plan(context=2048))
    assert full.weights_target == spec.layout.total
    assert full.weights_target - quarter.weights_target == rope * 3 // 4