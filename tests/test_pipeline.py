"""The export pipeline's calibrated methods: the package's graph computes exactly the quantized layers it reports."""

from __future__ import annotations

import numpy as np
import pytest

from edge.export import pipeline
from edge.model import Decoder
from edge.package import load_package
from tiny_models import max_rel_error, reference_logits, tiny_llama


@pytest.mark.parametrize("method, bits, kernels", [("spqr", 3, "stock"), ("decoupleq", 2, "stock"),
                                                    ("spqr", 3, "edge"), ("decoupleq", 2, "edge")])
def test_calibrated_package_follows_its_quantized_layers(tmp_path, monkeypatch, method, bits, kernels):
    """edge kernels: the fused gate/up op pairs rows itself, and an 8-bit head would stay in MatMulNBits' int8
    activations, so that variant takes a 4-bit embedding and checks every layer at float accuracy."""
    import torch

    from edge.export.quant import methods

    captured = {}
    original = methods.quantize_model

    def quantize_model(*args, **kwargs):  # keep what the pipeline quantized, to build the reference from it
        layers, record = original(*args, **kwargs)
        captured.update(layers)
        return layers, record

    monkeypatch.setattr(methods, "quantize_model", quantize_model)
    model, imported = tiny_llama(seed=1, hidden_size=128, intermediate_size=256)
    if kernels == "edge":
        from kernels_util import ensure_library
        ensure_library()
    emb_bits = 8 if method == "spqr" and kernels == "stock" else 4
    out = pipeline.export_model("tiny", tmp_path / "p", quant=method, bits=bits, model=imported, kernels=kernels,
                                embedding_bits=emb_bits, head="rtn",  # the calibrated head: tests/test_head.py
                                accuracy_level=0)  # fp32 compute: the graph terms themselves are checked exactly
    package = load_package(out)
    q = package.manifest["quantization"]
    assert q["method"] == method and q["bits"] == bits and q["calibration"]["split"] == "calibration"
    if kernels == "edge" and method == "spqr":  # SpQR's second level kept as such: a byte per scale and zero
        import onnx

        graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
        decoder = [n for n in graph.node if n.op_type == "QMatMul" and not n.name.startswith("lm_head")]
        assert decoder and all(len(n.input) > 9 and n.input[9].endswith("scale_stats") for n in decoder)
    assert 0 < q["storage_bits_per_weight"] < bits + 1.5
    from edge.export.quant.rtn import quantize_rtn

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in captured:
                p.copy_(torch.from_numpy(captured[name].dequantize()))
            elif name == "model.embed_tokens.weight":  # tied: embedding and head are RTN
                assert q["embedding"].startswith(f"rtn int{emb_bits}")
                p.copy_(torch.from_numpy(quantize_rtn(p.detach().numpy(), emb_bits, 32,
                                                      lattice=emb_bits == 8).dequantize()))
    ids = [int(t) for t in np.random.default_rng(0).integers(0, 96, 10)]
    logits = Decoder(package, context_length=32, threads=1).step(ids, logits_rows=list(range(10)))
    assert max_rel_error(logits, reference_logits(model, ids)) < 1e-4


def snap_to_gguf_grids(model, imported, embedding_bits: int = 8) -> None:
    """Put every linear weight on a Q4_1 grid (float16 scale and min, as the format stores them) and the embedding
    on a Q8_0 grid (Q4_0-like for embedding_bits=4; per row, blocks of 32), in both the transformers model and the
    ImportedModel, as a GGUF source's weights are."""
    import torch

    def q4_1(w):
        n, k = w.shape
        b = w.reshape(n, k // 32, 32)
        lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
        d, m = ((hi - lo) / 15).astype(np.float16).astype(np.float32), lo.astype(np.float16).astype(np.float32)
        return (np.clip(np.round((b - m) / d), 0, 15).astype(np.float32) * d + m).reshape(n, k)

    def q8_0(w):
        n, k = w.shape
        b = w.reshape(n, k // 32, 32)
        d = np.abs(b).max(-1, keepdims=True) / (127 if embedding_bits == 8 else 7)
        return (d * np.round(b / d)).reshape(n, k).astype(np.float32)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and name in imported.tensors:
                snapped = (q8_0 if "embed_tokens" in name else q4_1)(p.detach().numpy())
                p.copy_(torch.from_numpy(snapped))
                imported.tensors[name] = snapped


@pytest.mark.parametrize("kernels", ["stock", "edge"])
def test_int4_float_zeros_is_lossless_on_a_gguf_grid_source(tmp_path, kernels):
    """A Q4_1/Q8_0 source comes through exactly: stock ops (8-bit head in MatMulNBits at accuracy_level 0) and edge
    kernels (an 8-bit edge.QMatMul head, float16 scale and min in the linears)."""
    embedding_bits = 8
    if kernels == "edge":
        from kernels_util import ensure_library

        ensure_library()
    model, imported = tiny_llama(seed=2, hidden_size=64, intermediate_size=96)
    snap_to_gguf_grids(model, imported, embedding_bits)
    ids = [int(t) for t in np.random.default_rng(1).integers(0, 96, 12)]
    ref = reference_logits(model, ids)
    errors = {}
    for zeros in ("float", "integer"):
        emb = embedding_bits if zeros == "float" else None
        out = pipeline.export_model("tiny", tmp_path / zeros, quant="int4", model=imported, zeros=zeros,
                                    kernels=kernels, accuracy_level=0, embedding_bits=emb)
        package = load_package(out)
        q = package.manifest["quantization"]
        assert q["embedding"] == f"GatherBlockQuantized int{emb or 4}"
        # codes + fp16 scale + 4-bit zero per 32, and for float zeros an fp16 offset per 32
        assert q["storage_bits_per_weight"] == pytest.approx(4 + 20 / 32 + (16 / 32 if zeros == "float" else 0))
        logits = Decoder(package, context_length=32, threads=1).step(ids, logits_rows=list(range(len(ids))))
        errors[zeros] = max_rel_error(logits, ref)
        if kernels == "edge" and zeros == "float":  # Q4_1's own numbers: codes + float16 scale and min per 32
            assert q["zero_points"] == "float16 scale and min (edge.QMatMul)"
            assert q["runtime_bits_per_weight"] == pytest.approx(5.0)
    assert errors["float"] < 1e-4  # the 4-bit package is the source model
    assert errors["integer"] > 100 * errors["float"]


def test_zero_point_options_are_checked(tmp_path):
    from edge.export.quant import QuantizationError

    _, imported = tiny_llama(seed=3)
    with pytest.raises(QuantizationError, match="zero points"):
        pipeline.export_model("tiny", tmp_path / "a", quant="int4", model=imported, zeros="fractional")
    with pytest.raises(QuantizationError, match="fp32"):
        pipeline.export_model("tiny", tmp_path / "b", quant="fp32", model=imported, zeros="float")
    with pytest.raises(QuantizationError, match="embedding_bits"):
        pipeline.export_model("tiny", tmp_path / "c", quant="int4", model=imported, embedding_bits=6)
    with pytest.raises(QuantizationError, match="spqr"):
        pipeline.export_model("tiny", tmp_path / "d", quant="int4", model=imported, stat_bits=8)
    with pytest.raises(QuantizationError, match="2 to 8 bits"):
        pipeline.export_model("tiny", tmp_path / "e", quant="spqr", model=imported, stat_bits=9)


def test_edge_kernel_exports_fuse_the_mlp_gate_and_say_so(tmp_path):
    """--kernels edge: one edge.QMatMul (activation=1) per MLP instead of Split, Sigmoid and Mul, recorded in the
    manifest for the memory model; the same int4 weights give the stock graph's logits (float activations in both)."""
    import onnx

    from edge.memory.budget import ModelSpec

    model, imported = tiny_llama(seed=4, hidden_size=64, intermediate_size=96)
    edge = pipeline.export_model("tiny", tmp_path / "edge", quant="int4", model=imported, kernels="edge",
                                 head="rtn")  # the table's head, as the stock graph's
    stock = pipeline.export_model("tiny", tmp_path / "stock", quant="int4", model=imported, accuracy_level=0)
    ops = [n.op_type for n in onnx.load(str(edge / "model.onnx"), load_external_data=False).graph.node]
    assert "Split" not in ops and "Sigmoid" not in ops and "Mul" not in ops
    assert ModelSpec.from_package(edge).fused_mlp and not ModelSpec.from_package(stock).fused_mlp
    assert ModelSpec.from_package(edge).pre_projections and not ModelSpec.from_package(stock).pre_projections
    from edge.engine import Engine

    ids = [1, 5, 9, 14, 3]
    fused, plain = (Engine(p, threads=1).decoder.prefill(ids) for p in (edge, stock))
    assert max_rel_error(fused, plain) < 1e-4


def test_a_float16_kv_cache_is_declared_allocated_and_counted(tmp_path):
    """kv_dtype float16 (--kernels edge): past and present in half in the graph and in the runtime's cache, logits
    within half's rounding of the float32 cache's, 2 bytes an element in the memory model; refused where it cannot
    run (onnxruntime's GroupQueryAttention, a GPU) and where a manifest names a type this edge does not know."""
    import json

    import onnx
    from onnx import TensorProto

    from edge.engine import Engine
    from edge.errors import PackageError
    from edge.export.quant import QuantizationError
    from edge.memory.budget import MemoryModel, ModelSpec, Plan

    _, imported = tiny_llama(seed=5)
    half, full = (pipeline.export_model("tiny", tmp_path / kv, quant="int4", model=imported, kernels="edge",
                                        head="rtn", kv_dtype=kv) for kv in ("float16", "float32"))
    assert load_package(half).kv_dtype == "float16" and load_package(full).kv_dtype == "float32"
    graph = onnx.load(str(half / "model.onnx"), load_external_data=False).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    assert types["past_key.0"] == types["present_value.1"] == TensorProto.FLOAT16
    assert types["logits"] == TensorProto.FLOAT
    engines = [Engine(p, threads=1) for p in (half, full)]
    ids = [1, 5, 9, 14, 3, 27, 8, 60, 2, 11]
    logits = [e.decoder.prefill(ids).copy() for e in engines]
    assert engines[0].decoder.cache.arrays[0].dtype == np.float16
    assert engines[0].decoder.cache.nbytes * 2 == engines[1].decoder.cache.nbytes
    assert 0 < max_rel_error(logits[0], logits[1]) < 1e-2  # rounded, not garbled
    plan = Plan(context=256)
    kv = [MemoryModel(ModelSpec.from_package(p)).estimate(plan).kv_target for p in (half, full)]
    assert kv[0] * 2 == kv[1]

    with pytest.raises(QuantizationError, match="needs --kernels edge"):
        pipeline.export_model("tiny", tmp_path / "stock", quant="int4", model=imported, kv_dtype="float16")
    with pytest.raises(QuantizationError, match="unknown KV cache type"):
        pipeline.export_model("tiny", tmp_path / "bf16", quant="int4", model=imported, kernels="edge",
                              kv_dtype="bfloat16")
    with pytest.raises(PackageError, match="CPU only"):
        Decoder(load_package(half), context_length=32, device="cuda")
    manifest = json.loads((half / "manifest.json").read_text())
    manifest["graph"]["kv_dtype"] = "int8"
    (half / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="'int8' KV cache"):
        load_package(half)


def test_a_package_runs_with_the_other_kv_cache_type(tmp_path, capsys):
    """Package.with_kv_dtype: the graph's past and present are retyped as it loads, over the same weights, so a
    float32 package run with a half cache computes exactly what the float16 export of the model computes (and the
    other way round), the folder is left as it was, the memory model counts the chosen type, and packages whose
    attention cannot take another cache type are refused with what to do."""
    import hashlib

    from edge.engine import Engine
    from edge.errors import PackageError
    from edge.memory.budget import MemoryModel, ModelSpec, Plan
    from edge.package import Package

    _, imported = tiny_llama(seed=5)
    half, full = (load_package(pipeline.export_model("tiny", tmp_path / kv, quant="int4", model=imported,
                                                     kernels="edge", head="rtn", kv_dtype=kv))
                  for kv in ("float16", "float32"))
    before = {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(full.root.iterdir())}

    def decode(package: Package) -> tuple[np.ndarray, np.dtype]:
        decoder = Decoder(package, context_length=32)
        rows = [decoder.prefill([1, 5, 9, 14, 3, 27]).copy()]
        rows += [decoder.step([t])[0].copy() for t in (8, 60)]
        rows.append(decoder.step([2, 11, 40], logits_rows=[0, 1, 2]).copy())  # a verify-sized step
        return np.concatenate([r.reshape(-1) for r in rows]), decoder.cache.arrays[0].dtype

    as_half, as_full = full.with_kv_dtype("float16"), half.with_kv_dtype("float32")
    assert (as_half.kv_dtype, as_half.graph_kv_dtype, as_full.kv_dtype) == ("float16", "float32", "float32")
    for view, native in ((as_half, half), (as_full, full)):
        (got, got_type), (want, want_type) = decode(view), decode(native)
        assert got_type == want_type == np.dtype(view.kv_dtype)
        np.testing.assert_array_equal(got, want)  # bit for bit the export's own graph
    assert before == {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(full.root.iterdir())}
    assert full.with_kv_dtype("float32") is full and full.kv_dtype == "float32"

    plan = Plan(context=256)
    kv = [MemoryModel(ModelSpec.from_manifest(p.manifest)).estimate(plan).kv_target for p in (as_half, full)]
    assert kv[0] * 2 == kv[1]
    engine = Engine(full, threads=1, kv_dtype="float16", context_length=64)
    assert engine.package.kv_dtype == "float16" and engine.decoder.cache.arrays[0].dtype == np.float16
    from edge.apps import run as run_cli

    argv = [str(full.root), "t1 t2", "--raw", "-n", "2", "--context", "32", "--stats", "--kv-dtype", "float16"]
    assert run_cli.main(argv) == 0 and "KV cache float16" in capsys.readouterr().err

    with pytest.raises(PackageError, match="unknown KV cache type 'bfloat16'"):
        full.with_kv_dtype("bfloat16")
    stock = load_package(pipeline.export_model("tiny", tmp_path / "stock", quant="int4", model=imported))
    with pytest.raises(PackageError, match="--kernels edge"):
        stock.with_kv_dtype("float16")
    paged = Package(full.root, {**full.manifest, "paging": {"layers": []}})
    with pytest.raises(PackageError, match="pages its layers"):
        paged.with_kv_dtype("float16")
    with pytest.raises(PackageError, match="--kv-dtype float32"):
        Decoder(as_half, context_length=32, device="cuda")
