"""The memory model: each term against the buffers the runtime allocates, and the package facts it reads."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge.config import ModelConfig
from edge.errors import EdgeError
from edge.memory.budget import (
    GiB, INT_PREPACK_RATIO, MiB, RUNTIME_OVERHEAD_BYTES, BudgetError, MemoryModel, ModelSpec, Plan, activation_bytes,
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
    steps = [activation_bytes(SMOLLM2, 256, 2048), activation_bytes(SMOLLM2, plan.nodes, 2048),
             activation_bytes(DRAFT, 256, 2048), activation_bytes(DRAFT, 1, 2048)]
    assert model.estimate(plan).activations == max(steps)
    assert activation_bytes(SMOLLM2, 512, 2048) == 2 * activation_bytes(SMOLLM2, 256, 2048)
    # ORT's tiled attention keeps no score matrix; a kernel that does adds num_heads x S x L float32
    assert activation_bytes(SMOLLM2, 8, 4096) == activation_bytes(SMOLLM2, 8, 2048)
    scores = activation_bytes(SMOLLM2, 8, 4096, full_scores=True) - activation_bytes(SMOLLM2, 8, 4096)
    assert scores == np.empty((SMOLLM2.num_heads, 8, 4096), np.float32).nbytes
    full = MemoryModel(ModelSpec.from_config(SMOLLM2), full_scores=True).estimate(Plan(context=4096, prefill_chunk=64))
    assert full.activations == activation_bytes(SMOLLM2, 64, 4096, full_scores=True)


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
    assert paged.weights_target == layout.embedding_bytes + layout.head_bytes + 2 * layout.layer_bytes
    assert paged.prepack == layout.head_prepack_bytes + 2 * layout.layer_prepack_bytes
    assert model.disk_bytes_per_pass(Plan(context=256, resident_layers=0)) == 30 * layout.layer_bytes
    assert model.disk_bytes_per_pass(Plan(context=256, resident_layers=28)) == 2 * layout.layer_bytes
    assert model.disk_bytes_per_pass(Plan(context=256)) == 0
    assert model.estimate(Plan(context=256, resident_layers=29)).weights_target == full.weights_target
    assert paged.peak < full.peak


def test_peak_adds_weights_prepack_and_buffers():
    spec = ModelSpec.from_config(SMOLLM2, "int4")
    est = MemoryModel(spec).estimate(Plan(context=256, prefill_chunk=16))
    assert est.load_peak == RUNTIME_OVERHEAD_BYTES + spec.weight_bytes + spec.layout.prepack_bytes
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
    assert est.weights_draft == draft.weight_bytes
    assert est.prepack == target.layout.prepack_bytes + draft.layout.prepack_bytes
    assert est.load_peak == RUNTIME_OVERHEAD_BYTES + target.weight_bytes + draft.weight_bytes + est.prepack


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
    """The constant is the measured import RSS plus one session; a fresh measurement stays near it."""
    measured = measure_import_overhead()
    assert 0.5 * RUNTIME_OVERHEAD_BYTES < measured < 1.5 * RUNTIME_OVERHEAD_BYTES


MEASURE_ONE_STEP = """
import json, sys
import numpy as np, onnxruntime as ort, psutil, tokenizers
pkg, L, S = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
so = ort.SessionOptions(); so.intra_op_num_threads = 2
session = ort.InferenceSession(pkg + '/model.onnx', so, providers=['CPUExecutionProvider'])
cfg = json.load(open(pkg + '/manifest.json'))['config']
feeds = {'input_ids': np.arange(S, dtype=np.int64)[None] + 100, 'position_ids': np.arange(S, dtype=np.int64)[None],
         'seqlens_k': np.array([S - 1], np.int32), 'total_sequence_length': np.array(S, np.int32),
         'logits_index': np.array([S - 1], np.int64)}
if 'attention_bias' in {i.name for i in session.get_inputs()}:
    bias = np.full((1, 1, S, S), -np.inf, np.float32); bias[0, 0][np.tril_indices(S)] = 0
    feeds['attention_bias'] = bias
for i in range(cfg['num_layers']):
    for kind in ('key', 'value'):  # filled, so every page of the caches is resident as in a full context
        feeds[f'past_{kind}.{i}'] = np.ones((1, cfg['num_kv_heads'], L, cfg['head_dim']), np.float32)
session.run(['logits'], feeds)
print(psutil.Process().memory_info().rss)
"""


@pytest.mark.slow
def test_prediction_is_within_10_percent_of_measured_rss():
    """One 16-token step of the real default package (int4) with 256-token caches, run by ORT in a fresh process."""
    import subprocess
    import sys

    from edge.default_model import default_package

    package = default_package("int4")
    spec = ModelSpec.from_package(package)
    assert spec.quant == "int4"
    assert estimate_layout(spec.config, "int4").total == pytest.approx(spec.weight_bytes, rel=0.02)
    out = subprocess.run([sys.executable, "-c", MEASURE_ONE_STEP, str(package), "256", "16"], capture_output=True,
                         text=True, check=True, timeout=300)
    measured = int(out.stdout.strip().splitlines()[-1])
    estimate = MemoryModel(spec).estimate(Plan(context=256, prefill_chunk=16))
    predicted = estimate.peak - estimate.tokenizer  # this process loads no tokenizer
    assert predicted == pytest.approx(measured, rel=0.10)
