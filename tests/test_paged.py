"""The paged package layout: one layer graph, page-aligned layer data indexed in the manifest."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from edge.errors import ModelFormatError
from edge.export.builder import DATA_ALIGN, BuildOptions
from edge.export.paged import build_paged, export_paged
from edge.package import load_package
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


def test_quantized_or_mixed_layer_models_are_refused(tmp_path):
    _, imported = tiny_llama()
    with pytest.raises(ModelFormatError, match="float32"):
        build_paged(imported.config, imported.tensors, tmp_path, BuildOptions(quantizer=lambda name, w: None))
    imported.config.sliding_window, imported.config.sliding_window_pattern = 8, 2
    with pytest.raises(ModelFormatError, match="alike"):
        build_paged(imported.config, imported.tensors, tmp_path)
