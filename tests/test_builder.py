"""The exported decoder graph against transformers on the same (tiny, random) weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edge.export.pipeline import export_model
from edge.model import MASKED, Decoder
from edge.package import load_package
from tiny_models import max_rel_error, reference_logits, tiny_gemma3, tiny_llama

pytest.importorskip("transformers")


def make_decoder(tmp_path, imported, quant="fp32", context=64, tree=True, name="pkg", **build) -> Decoder:
    export_model("tiny", tmp_path / name, quant=quant, model=imported, tree_attention=tree, **build)
    return Decoder(load_package(tmp_path / name), context_length=context, threads=1)


@pytest.mark.parametrize("variant, build", [(dict(), {}), (dict(qkv_bias=True), {}), (dict(tie=False), {}),
                                            (dict(qkv_bias=True), dict(fuse_projections=False))],
                         ids=["llama", "qwen2", "untied", "qwen2-unfused"])
def test_fp32_logits_match_transformers_over_prompt_and_decode_steps(tmp_path, variant, build):
    model, imported = tiny_llama(**variant)
    decoder = make_decoder(tmp_path, imported, **build)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 96, 24)]
    ref = reference_logits(model, ids)
    prompt = decoder.step(ids[:16], logits_rows=list(range(16))).copy()
    assert max_rel_error(prompt, ref[:16]) < 1e-4
    for t in range(16, 24):
        assert max_rel_error(decoder.step([ids[t]])[0], ref[t]) < 1e-4


def test_cached_decoding_equals_recomputing_without_cache(tmp_path):
    _, imported = tiny_llama(seed=3)
    decoder = make_decoder(tmp_path, imported)
    ids = [int(t) for t in np.random.default_rng(2).integers(0, 96, 20)]
    cached = [decoder.prefill(ids[:5]).copy()] + [decoder.step([t])[0].copy() for t in ids[5:]]
    for n in range(5, 21):
        decoder.reset()
        full = decoder.step(ids[:n])[0]
        np.testing.assert_allclose(cached[n - 5], full, rtol=0, atol=1e-4 * np.abs(full).max())


def test_chunked_prefill_equals_one_shot(tmp_path):
    _, imported = tiny_llama(seed=4)
    decoder = make_decoder(tmp_path, imported)
    ids = list(range(3, 40))
    one = decoder.prefill(ids).copy()
    decoder.reset()
    np.testing.assert_allclose(decoder.prefill(ids, chunk=7), one, atol=1e-4 * np.abs(one).max())


def test_steps_of_changing_shapes_match_recomputing(tmp_path):
    """Decoder.step binds an input again only when its shape changes, and writes the values in place: steps whose
    size, logits rows, positions and tree bias change from one to the next must each give what recomputing the
    whole sequence in one step gives (a stale binding would read the previous step's shape or tokens)."""
    _, imported = tiny_llama(seed=6)
    decoder = make_decoder(tmp_path, imported)
    reference = Decoder(decoder.package, context_length=64, threads=1)
    rng = np.random.default_rng(6)
    history: list[int] = []
    for size, rows in [(4, None), (1, None), (1, None), (3, [0, 2]), (1, None), (2, [0, 1]), (1, None), (5, [4]),
                       (3, [0, 2]), (2, [0, 1]), (1, None), (18, None), (2, [0, 1]), (18, [17]), (1, None)]:
        new = [int(t) for t in rng.integers(0, 96, size)]
        past = len(history)
        explicit = size == 2  # a causal step given as explicit positions and bias
        bias = np.where(np.arange(past + size) <= past + np.arange(size)[:, None], 0.0, MASKED)[None, None]
        got = decoder.step(new, positions=list(range(past, past + size)) if explicit else None, logits_rows=rows,
                           attention_bias=bias.astype(np.float32) if explicit else None).copy()
        reference.reset()
        want = reference.step(history + new, logits_rows=[past + r for r in (rows or [size - 1])])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
        history += new


def test_a_step_of_a_shape_seen_before_binds_only_its_bias(tmp_path, monkeypatch):
    """Speculation changes the step's size from call to call: each small shape keeps its own binding, so a step of
    a shape seen before binds only the attention bias (whose shape grows with the past), and no output."""
    from onnxruntime.capi.onnxruntime_inference_collection import IOBinding

    _, imported = tiny_llama(seed=7)
    decoder = make_decoder(tmp_path, imported)
    decoder.step(list(range(4)))
    decoder.step([1])
    decoder.step([2, 3, 4], logits_rows=[0, 1, 2])
    bound: list[str] = []

    def recording(original):
        def bind(self, name, *args):
            bound.append(name)
            return original(self, name, *args)
        return bind

    for method in ("bind_cpu_input", "bind_output"):
        monkeypatch.setattr(IOBinding, method, recording(getattr(IOBinding, method)))
    decoder.step([5])
    decoder.step([6, 7, 8], logits_rows=[0, 1, 2])
    decoder.step([9])
    assert bound == ["attention_bias"] * 3


def test_inputs_reach_a_session_that_copies_them_at_binding():
    """On a GPU, onnxruntime copies an input when it is bound, so a buffer written in place after binding is never
    read again: there BoundInputs binds every input every step (session 24 found the GPU's tokens wrong from the
    first, with the shape-only rebinding that serves the CPU)."""
    from edge.model import STEP_INPUTS, BoundInputs

    class CopyingBinding:  # what a CUDA session's binding keeps: a copy taken at binding
        def __init__(self):
            self.seen: dict[str, np.ndarray] = {}

        def bind_cpu_input(self, name, array):
            self.seen[name] = np.array(array, copy=True)

    for in_place in (False, True):
        binding = CopyingBinding()
        inputs = BoundInputs([(binding, STEP_INPUTS)], 32, 4, True, "pkg", step_tokens=4, in_place=in_place)
        stale = []
        for past, tokens in [(0, [5, 6, 7]), (3, [8]), (4, [9]), (5, [10, 11, 12])]:
            inputs.write(past, np.asarray(tokens, np.int64), None, None, None)
            seen = binding.seen
            stale.append(seen["input_ids"].tolist() != [tokens] or seen["position_ids"][0, 0] != past
                         or int(seen["total_sequence_length"]) != past + len(tokens))
        assert any(stale) == in_place  # bound in place, a copying session keeps an earlier step's values


def test_binding_every_input_every_step_gives_the_same_logits(tmp_path):
    """The GPU's path (every per-step input bound every step) run on the CPU: bitwise the CPU path's logits over
    steps of changing shapes, tree biases and revisited shapes."""
    _, imported = tiny_llama(seed=8)
    decoder = make_decoder(tmp_path, imported)
    rebinding = Decoder(decoder.package, context_length=64, threads=1)
    rebinding.device = "gpu-like"  # read by the first step's bindings: in_place=False
    rng = np.random.default_rng(8)
    past = 0
    for size, rows in [(5, None), (1, None), (3, [0, 1, 2]), (1, None), (3, [0, 1, 2]), (2, [1]), (1, None)]:
        new = [int(t) for t in rng.integers(0, 96, size)]
        bias = None
        if size == 3:  # a tree: node 2 a sibling of node 1
            bias = np.full((1, 1, 3, past + 3), MASKED, np.float32)
            bias[..., :past] = 0.0
            for i, path in enumerate([[0], [0, 1], [0, 2]]):
                bias[0, 0, i, [past + j for j in path]] = 0.0
        positions = [past, past + 1, past + 1] if size == 3 else None
        want = decoder.step(new, positions, rows, bias).copy()
        got = rebinding.step(new, positions, rows, bias)
        assert np.array_equal(got, want), (size, past)
        past += size
    assert all(not b.inputs.in_place for b in rebinding._bindings.values())


def test_tree_step_equals_each_branch_decoded_alone(tmp_path):
    """A flattened two-branch tree verified in one call gives each node the logits of its own path."""
    model, imported = tiny_llama(seed=5)
    decoder = make_decoder(tmp_path, imported)
    prompt = [5, 17, 33, 2, 60]
    decoder.prefill(prompt)
    past = decoder.cache.length
    # nodes: 0=a (root), 1=b (child of a), 2=c (child of a), 3=d (child of c)
    tokens, parents = [11, 22, 33, 44], [-1, 0, 0, 2]
    depth = [0, 1, 1, 2]
    bias = np.full((1, 1, 4, past + 4), MASKED, np.float32)
    bias[..., :past] = 0
    for i in range(4):
        j = i
        while j >= 0:
            bias[0, 0, i, past + j] = 0
            j = parents[j]
    logits = decoder.step(tokens, positions=[past + d for d in depth], logits_rows=[0, 1, 2, 3],
                          attention_bias=bias).copy()
    paths = {0: [11], 1: [11, 22], 2: [11, 33], 3: [11, 33, 44]}
    for node, path in paths.items():
        ref = reference_logits(model, prompt + path)[-1]
        assert max_rel_error(logits[node], ref) < 1e-4, node


def test_int4_graph_matches_dequantized_weights(tmp_path):
    """MatMulNBits (accuracy level 4 quantizes activations to int8) stays close to the dequantized float model."""
    import torch

    from edge.export.quant.rtn import quantize_rtn

    model, imported = tiny_llama(seed=6)
    decoder = make_decoder(tmp_path, imported, quant="int4")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:  # every linear layer and the tied embedding, as the exporter quantizes them
                w = p.detach().numpy()
                p.copy_(torch.from_numpy(quantize_rtn(w, bits=4, block_size=32).dequantize()))
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 96, 12)]
    ours = decoder.step(ids, logits_rows=list(range(12)))
    assert max_rel_error(ours, reference_logits(model, ids)) < 2e-2


def test_graph_interface_and_external_data(tmp_path):
    _, imported = tiny_llama()
    export_model("tiny", tmp_path / "pkg", quant="int4", model=imported)
    graph = onnx.load(str(tmp_path / "pkg" / "model.onnx"), load_external_data=False)
    inputs = [i.name for i in graph.graph.input]
    assert inputs[:6] == ["input_ids", "position_ids", "seqlens_k", "total_sequence_length", "logits_index",
                          "attention_bias"]
    assert {n.op_type for n in graph.graph.node} >= {"GroupQueryAttention", "MatMulNBits", "GatherBlockQuantized",
                                                      "SkipSimplifiedLayerNormalization"}
    external = [t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and all(e.value == "model.onnx.data" for t in external for e in t.external_data
                            if e.key == "location")
    assert graph.ir_version <= 10


@pytest.mark.parametrize("kernels", ["stock", "edge"])
def test_gemma3_logits_match_transformers(tmp_path, kernels):
    """Gemma 3: sliding-window layers (window 8 < sequence), q/k norms, GELU, embedding scale, two rope bases. With
    edge's kernels every layer runs edge.Attention (separate normalised q, k, v, Gemma's query scale, the window),
    and a step over 30 tokens is bitwise 30 one-token steps."""
    if kernels == "edge":
        from edge.kernels import library_path

        if library_path() is None:
            pytest.skip("kernel library not built")
    model, imported = tiny_gemma3(tmp_path)
    decoder = make_decoder(tmp_path, imported, kernels=kernels)
    ops = {n.op_type for n in onnx.load(str(tmp_path / "pkg" / "model.onnx"), load_external_data=False).graph.node}
    assert ("Attention" in ops) == (kernels == "edge") and ("GroupQueryAttention" in ops) == (kernels == "stock")
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 96, 30)]
    ref = reference_logits(model, ids)
    assert max_rel_error(decoder.step(ids[:20], logits_rows=list(range(20))), ref[:20]) < 1e-4
    for t in range(20, 30):
        assert max_rel_error(decoder.step([ids[t]])[0], ref[t]) < 1e-4
    if kernels == "edge":
        decoder.reset()
        together = decoder.step(ids, logits_rows=list(range(30))).copy()
        decoder.reset()
        assert np.array_equal(np.stack([decoder.step([t])[0].copy() for t in ids]), together)


def test_float_offsets_and_sparse_outliers_follow_the_dequantized_weights(tmp_path):
    """decoupleQ's float offsets and SpQR's CSR outliers, in stock ops, add exactly what dequantize() says."""
    import dataclasses

    import torch

    from edge.export.quant.outliers import SparseOutliers
    from edge.export.quant.rtn import quantize_rtn

    rng = np.random.default_rng(0)

    def quantize(name, w):
        if name == "model.embed_tokens":
            return None
        q = quantize_rtn(w, bits=4, block_size=32)
        mask = rng.random(w.shape) < 0.02
        mask[0, :3] = True  # several outliers in one row: the scatter must add, not overwrite
        delta = rng.normal(0, 0.5, w.shape).astype(np.float32)
        offsets = rng.normal(0, 0.01, q.scales.shape).astype(np.float32)
        return dataclasses.replace(q, offsets=offsets, outliers=SparseOutliers.from_dense(mask, delta))

    model, imported = tiny_llama(seed=8)
    layers = {}
    decoder = make_decoder(tmp_path, imported, accuracy_level=0,  # fp32 compute: the terms themselves are exact
                           quantizer=lambda name, w: layers.setdefault(name, quantize(name, w)))
    with torch.no_grad():
        for name, q in layers.items():
            if q is None:
                continue
            fused = name.endswith(("qkv_proj", "gate_up_proj"))
            parts = ("q_proj", "k_proj", "v_proj") if name.endswith("qkv_proj") else ("gate_proj", "up_proj")
            w = torch.from_numpy(q.dequantize())
            targets = [name.rsplit(".", 1)[0] + "." + part for part in parts] if fused else [name]
            for target in targets:
                param = model.get_parameter(target + ".weight")
                param.copy_(w[: param.shape[0]])
                w = w[param.shape[0]:]
    ids = [int(t) for t in np.random.default_rng(4).integers(0, 96, 10)]
    assert max_rel_error(decoder.step(ids, logits_rows=list(range(10))), reference_logits(model, ids)) < 1e-4


def test_rope_frequency_scaling():
    """Llama 3 scaling from HF config keys, and GGUF's precomputed freq_factors, both applied to the base table."""
    import dataclasses

    from edge.export.builder import rope_inv_freq

    _, imported = tiny_llama()
    cfg = imported.config
    base = rope_inv_freq(cfg, cfg.rope_theta)
    factors = np.linspace(1.0, 8.0, base.size)
    scaled = rope_inv_freq(dataclasses.replace(cfg, rope_scaling={"freq_factors": factors.tolist()}), cfg.rope_theta)
    np.testing.assert_allclose(scaled, base / factors)
    llama3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=16)
    ours = rope_inv_freq(dataclasses.replace(cfg, rope_scaling=llama3), cfg.rope_theta)
    import torch
    import transformers

    hf = transformers.LlamaConfig(head_dim=cfg.head_dim, hidden_size=cfg.hidden_size,
                                  num_attention_heads=cfg.num_heads, rope_theta=cfg.rope_theta, rope_scaling=llama3,
                                  max_position_embeddings=128)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, torch.device("cpu"))
    np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-5)


def test_edge_kernels_package_matches_dequantized_weights_and_is_batch_invariant(tmp_path):
    """--kernels edge: every quantized linear and the tied head run edge.QMatMul, attention runs edge.Attention, and
    logits follow the dequantized weights. Both ops are batch-invariant, so a step over 12 tokens gives each row bit
    for bit what 12 one-token steps give (with GroupQueryAttention: ~1e-7 relative apart)."""
    import torch

    from edge.export.quant.rtn import quantize_rtn
    from edge.kernels import library_path

    if library_path() is None:
        pytest.skip("kernel library not built")
    model, imported = tiny_llama(seed=6)
    # the table's own head (a calibrated one: tests/test_head.py)
    decoder = make_decoder(tmp_path, imported, quant="int4", kernels="edge", head="rtn")
    graph = onnx.load(str(tmp_path / "pkg" / "model.onnx"), load_external_data=False)
    ops = {n.op_type for n in graph.graph.node}
    assert "MatMulNBits" not in ops and "GroupQueryAttention" not in ops and "Attention" in ops
    assert load_package(tmp_path / "pkg").custom_ops == ["edge"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2:
                p.copy_(torch.from_numpy(quantize_rtn(p.detach().numpy(), bits=4, block_size=32).dequantize()))
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 96, 12)]
    together = decoder.step(ids, logits_rows=list(range(12))).copy()
    assert max_rel_error(together, reference_logits(model, ids)) < 1e-4
    # the head's row tops: each row's argmax and maximum, as numpy finds them in the logits
    np.testing.assert_array_equal(decoder.top[:, 0], together.argmax(1))
    np.testing.assert_array_equal(decoder.top[:, 1], together.max(1))
    decoder.reset()
    one_by_one = np.stack([decoder.step([t])[0].copy() for t in ids])
    assert np.array_equal(one_by_one, together)


def test_a_gpu_loads_the_graph_without_row_tops(tmp_path):
    """edge.QMatMul computes output 2 on the CPU only: create_session drops it for a GPU, and the graph left runs."""
    from edge.kernels import library_path, register
    from edge.kernels.graph import TOP
    from edge.session import without_row_tops

    if library_path() is None:
        pytest.skip("kernel library not built")
    _, imported = tiny_llama(seed=6)
    export_model("tiny", tmp_path / "pkg", quant="int4", model=imported, kernels="edge", head="rtn")
    graph = tmp_path / "pkg" / "model.onnx"
    assert TOP in [o.name for o in onnx.load(str(graph), load_external_data=False).graph.output]
    stripped = onnx.load_from_string(without_row_tops(str(graph)))
    assert TOP not in [o.name for o in stripped.graph.output]
    assert all(TOP not in n.output and not any(a.name == "top" for a in n.attribute) for n in stripped.graph.node)
    assert without_row_tops(stripped.SerializeToString()) is None
    options = ort.SessionOptions()
    register(options)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(graph.parent))
    session = ort.InferenceSession(stripped.SerializeToString(), options, providers=["CPUExecutionProvider"])
    assert TOP not in [o.name for o in session.get_outputs()]


def test_edge_kernels_accuracy_level_reaches_the_graph(tmp_path):
    """--kernels edge is exact by default (no int8 activations); --accuracy-level 4 puts int8 activations on every
    QMatMul and the logits stay close to the exact package's."""
    from edge.kernels import kernel_isa, library_path

    if library_path() is None:
        pytest.skip("kernel library not built")
    _, imported = tiny_llama(seed=7)
    ids = [int(t) for t in np.random.default_rng(4).integers(0, 96, 10)]
    logits, levels = {}, {}
    for level in (None, 4):
        build = {} if level is None else {"accuracy_level": level}
        decoder = make_decoder(tmp_path, imported, quant="int4", kernels="edge", name=f"acc{level}", **build)
        graph = onnx.load(str(tmp_path / f"acc{level}" / "model.onnx"), load_external_data=False)
        levels[level] = {a.i for n in graph.graph.node if n.op_type == "QMatMul"
                         for a in n.attribute if a.name == "accuracy_level"}
        logits[level] = decoder.step(ids, logits_rows=list(range(10))).copy()
        decoder.reset()
        one_by_one = np.stack([decoder.step([t])[0].copy() for t in ids])
        assert np.array_equal(one_by_one, logits[level])  # int8 activations too: rounded per row, the same way
    assert levels == {None: set(), 4: {4}}
    assert max_rel_error(logits[4], logits[None]) < 5e-2
    if kernel_isa(4, 4) != "portable":  # the integer kernels honour it; the portable one ignores it
        assert max_rel_error(logits[4], logits[None]) > 0


def test_float16_statistics_compared_in_chunks_decide_as_the_whole_matrix(monkeypatch):
    """float16_statistics checks STATS_CHUNK_ROWS rows at a time (its float32 copies stay small): a Q4_1-like weight
    keeps its float16 (scale, min) pair, and one row that float16 cannot hold, in the last partial chunk, refuses it,
    as the whole matrix at once does."""
    import dataclasses

    import edge.export.builder as builder
    from edge.export.quant.qlinear import QuantizedLinear

    rng = np.random.default_rng(4)
    scales = rng.uniform(0.01, 0.05, (203, 3)).astype(np.float16).astype(np.float32)
    mins = rng.uniform(-0.5, 0.0, (203, 3)).astype(np.float16).astype(np.float32)
    codes = rng.integers(0, 16, (203, 96)).astype(np.uint8)
    q = QuantizedLinear(codes=codes, scales=scales, zeros=np.zeros((203, 3), np.uint8), bits=4, block_size=32,
                        offsets=mins)  # W = code * scale + min, as Q4_1 stores it
    broken_scales = scales.copy()
    broken_scales[200, 0] += 1e-6  # off the float16 grid, in the last chunk
    qb = dataclasses.replace(q, scales=broken_scales)
    whole = [builder.float16_statistics(x) for x in (q, qb)]
    monkeypatch.setattr(builder, "STATS_CHUNK_ROWS", 16)
    chunked = [builder.float16_statistics(x) for x in (q, qb)]
    assert whole[0] is not None and whole[1] is None
    assert chunked[1] is None and set(chunked[0]) == {"scales", "mins"}
    assert all(np.array_equal(chunked[0][k], whole[0][k]) for k in whole[0])
