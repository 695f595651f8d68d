"""The paged package layout: one layer graph, page-aligned layer data indexed in the manifest."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edge.errors import ModelFormatError
from edge.export.builder import DATA_ALIGN, BuildOptions
from edge.export.paged import build_paged, export_paged
from edge.package import load_package
from kernels_util import ensure_library
from tiny_models import tiny_llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    _, imported = tiny_llama(seed=1, num_hidden_layers=4)
    return imported, load_package(export_paged(imported, tmp_path_factory.mktemp("paged") / "pkg"))


def read_tensor(package, layer: int, name: str) -> np.ndarray:
    paging = package.manifest["paging"]
    t = next(t for t in paging["tensors"] if t["name"] == name)
    data = np.fromfile(package.root / paging["layer_data"], np.uint8)
    start = paging["layer_offsets"][layer] + t["offset"]
    return data[start:start + t["bytes"]].view(t["dtype"]).reshape(t["shape"])


def test_layer_data_holds_each_layers_weights_at_its_indexed_place(exported):
    imported, package = exported
    for layer in (0, 3):
        p = f"model.layers.{layer}"
        qkv = np.concatenate([imported.tensors[f"{p}.self_attn.{n}_proj.weight"] for n in "qkv"]).T
        np.testing.assert_array_equal(read_tensor(package, layer, "self_attn.qkv_proj.weight_t"), qkv)
        np.testing.assert_array_equal(read_tensor(package, layer, "mlp.down_proj.weight_t"),
                                      imported.tensors[f"{p}.mlp.down_proj.weight"].T)
        np.testing.assert_array_equal(read_tensor(package, layer, "input_layernorm.weight"),
                                      imported.tensors[f"{p}.input_layernorm.weight"])


def test_layout_is_page_aligned_and_uniform(exported):
    _, package = exported
    paging = package.manifest["paging"]
    offsets = paging["layer_offsets"]
    assert len(offsets) == 4 and all(o % DATA_ALIGN == 0 for o in offsets)
    assert all(t["offset"] % DATA_ALIGN == 0 for t in paging["tensors"])
    assert np.diff(offsets).tolist() == [paging["layer_bytes"]] * 3
    assert package.manifest["files"][paging["layer_data"]]["bytes"] == 4 * paging["layer_bytes"]


def test_layer_graph_takes_the_weights_as_inputs(exported):
    _, package = exported
    graph = onnx.load(str(package.root / package.manifest["paging"]["layer_graph"])).graph
    inputs = {i.name for i in graph.input}
    assert {t["name"] for t in package.manifest["paging"]["tensors"]} <= inputs
    assert {"hidden", "past_key", "past_value", "attention_bias"} <= inputs
    assert {o.name for o in graph.output} == {"hidden_out", "present_key", "present_value"}
    assert all(i.name.startswith("rope.") for i in graph.initializer if i.dims)  # no layer weight is a constant


def test_stock_quantized_or_mixed_layer_models_are_refused(tmp_path):
    _, imported = tiny_llama()
    with pytest.raises(ModelFormatError, match="kernels='edge'"):
        build_paged(imported.config, imported.tensors, tmp_path, BuildOptions(quantizer=lambda name, w: None))
    with pytest.raises(ModelFormatError, match="kernels='edge'"):
        export_paged(imported, tmp_path / "stock", quant="int4")
    imported.config.architecture = "falcon"
    with pytest.raises(ModelFormatError, match="supports llama, gemma3"):
        build_paged(imported.config, imported.tensors, tmp_path)


def test_a_model_with_sliding_and_global_layers_gets_a_graph_for_each(tmp_path):
    _, imported = tiny_llama(num_hidden_layers=4)
    imported.config.sliding_window, imported.config.sliding_window_pattern = 8, 2  # layers 0 and 2 slide
    paging = build_paged(imported.config, imported.tensors, tmp_path)
    assert paging["sliding_layers"] == [0, 2]

    def window(graph_file: str) -> int | None:
        gqa = next(n for n in onnx.load(str(tmp_path / graph_file)).graph.node if n.op_type == "GroupQueryAttention")
        return next((a.i for a in gqa.attribute if a.name == "local_window_size"), None)

    assert window(paging["sliding_layer_graph"]) == 8 and window(paging["layer_graph"]) is None


@pytest.fixture(scope="module")
def exported_int4(tmp_path_factory):
    ensure_library()  # edge.QMatMul's CPU library, built in place if the install did not
    _, imported = tiny_llama(seed=1, num_hidden_layers=3)
    root = tmp_path_factory.mktemp("paged-int4") / "pkg"
    return imported, load_package(export_paged(imported, root, quant="int4", kernels="edge"))


def test_int4_layers_feed_edge_qmatmul_its_packed_weights_as_inputs(exported_int4):
    from edge.kernels.library import DOMAIN, OP_TYPE

    imported, package = exported_int4
    paging = package.manifest["paging"]
    graph = onnx.load(str(package.root / paging["layer_graph"])).graph
    qmatmuls = [n for n in graph.node if n.op_type == OP_TYPE and n.domain == DOMAIN]
    assert len(qmatmuls) == 3  # qkv, gate_up with o_proj inside (its pre-projection), down
    inputs = {i.name for i in graph.input}
    assert all(name in inputs for n in qmatmuls for name in n.input[1:] if name)
    dtypes = {t["name"]: t["dtype"] for t in paging["tensors"]}
    assert dtypes["mlp.down_proj.codes"] == "uint8" and dtypes["mlp.down_proj.scales"] == "float32"
    assert dtypes["mlp.down_proj.zeros"] == "uint8" and dtypes["input_layernorm.weight"] == "float32"
    assert package.custom_ops == ["edge"] and package.manifest["quantization"]["bits"] == 4
    n, k = imported.tensors["model.layers.0.mlp.down_proj.weight"].shape
    codes = next(t for t in paging["tensors"] if t["name"] == "mlp.down_proj.codes")
    assert codes["bytes"] == n * k // 2  # 4 bits a weight


def test_int4_embedding_table_is_stored_for_the_runtime_not_the_head_graph(exported_int4):
    imported, package = exported_int4
    emb = package.manifest["paging"]["embedding"]
    assert emb["format"] == "matmulnbits" and emb["bits"] == 4 and emb["shape"] == [96, 64]
    head = onnx.load(str(package.root / package.manifest["graph"]["file"]), load_external_data=False).graph
    assert not any(i.name.startswith("model.embed_tokens") for i in head.initializer)
    assert any(n.op_type == "QMatMul" and n.name == "lm_head.qmatmul" for n in head.node)  # tied head: own copy


def test_int4_activations_follow_export_models_default_and_the_asked_level(exported_int4, tmp_path):
    """edge.QMatMul keeps x in float (accuracy_level 0) unless asked, as export_model does, so the paged package
    computes what the resident one does."""
    imported, package = exported_int4
    assert package.manifest["graph"]["accuracy_level"] == 0

    def levels(pkg) -> set[int]:
        graph = onnx.load(str(pkg.root / pkg.manifest["paging"]["layer_graph"])).graph
        return {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
                for n in graph.node if n.op_type == "QMatMul"}

    assert levels(package) == {0}
    fast = load_package(export_paged(imported, tmp_path / "fast", quant="int4", kernels="edge", accuracy_level=4))
    assert levels(fast) == {4} and fast.manifest["quantization"]["accuracy_level"] == 4
