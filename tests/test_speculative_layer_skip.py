"""The skip-layer self-draft: the subset graph, its place in the package, the layer choice, and exact greedy output."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import onnx
import pytest

from edge.engine import Engine
from edge.errors import EdgeError, PackageError
from edge.export.builder import BuildOptions, DecoderBuilder, SharedExternalData
from edge.export.pipeline import export_model
from edge.export.self_draft import (DRAFT_FILE, Candidate, SubsetWriter, add_skip_draft, cost_fraction,
                                    expected_speedup, package_build_options)
from edge.model import Decoder
from edge.package import file_entry, load_package
from edge.speculative import LayerSkipDraft, Speculator, make_speculator
from tiny_models import max_rel_error, reference_logits, tiny_llama

pytest.importorskip("transformers")
SMALL_CALIBRATION = dict(sequences=2, prompt_len=12, new_tokens=12)
PROMPTS = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 3, 2], [1, 2, 3, 1, 2, 3, 1, 2], [40, 41, 42, 43, 44, 45],
           [11, 22, 11, 22, 11, 60, 61, 11, 22], [77, 12, 77, 12, 50]]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Cost curves of the throwaway tiny packages go to a temporary cache, not ~/.cache/edge."""
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 4-layer random Llama (transformers reference and import) with eos off, exported fp32 and int4."""
    model, imported = tiny_llama(seed=11, initializer_range=0.3, num_hidden_layers=4)
    imported.special_tokens = dataclasses.replace(imported.special_tokens, eos_token_ids=[])
    root = tmp_path_factory.mktemp("skip")
    packages = {q: export_model("tiny", root / q, quant=q, model=imported) for q in ("fp32", "int4")}
    return model, imported, packages


@pytest.fixture(scope="module")
def with_draft(tiny, tmp_path_factory):
    """The fp32 package with a self-draft keeping layers 0, 1 and 3, added after export."""
    import shutil

    _, imported, packages = tiny
    folder = tmp_path_factory.mktemp("with-draft") / "fp32"
    shutil.copytree(packages["fp32"], folder)
    add_skip_draft(folder, imported, layers=[0, 1, 3], threads=1, verify=lambda s: 1.0 + 0.05 * (s - 1),
                   calibration=SMALL_CALIBRATION)
    return folder


def subset_decoder(package_dir, imported, layers, name=".subset.onnx") -> Decoder:
    package = load_package(package_dir)
    SubsetWriter(package, imported.tensors, package_build_options(package)).write(layers, name)
    return Decoder(package.graph_view(name, len(layers)), context_length=64, threads=1)


def test_subset_with_all_layers_equals_the_full_model(tiny, tmp_path):
    _, imported, packages = tiny
    full = Decoder(load_package(packages["fp32"]), context_length=64, threads=1)
    every = subset_decoder(packages["fp32"], imported, [0, 1, 2, 3], name=".all.onnx")
    ids = [int(t) for t in np.random.default_rng(3).integers(0, 96, 20)]
    a = full.step(ids, logits_rows=list(range(20))).copy()
    b = every.step(ids, logits_rows=list(range(20)))
    np.testing.assert_array_equal(a, b)
    (packages["fp32"] / ".all.onnx").unlink()


def test_subset_equals_transformers_with_those_layers_removed(tiny):
    """Skipping layer 2 must wire layer 1's output into layer 3's input norm, exactly as deleting the layer does."""
    import torch

    model, imported, packages = tiny
    reduced = copy.deepcopy(model)
    reduced.model.layers = torch.nn.ModuleList([reduced.model.layers[i] for i in (0, 1, 3)])
    for i, layer in enumerate(reduced.model.layers):
        layer.self_attn.layer_idx = i
    reduced.config.num_hidden_layers = 3
    ids = [int(t) for t in np.random.default_rng(4).integers(0, 96, 16)]
    ref = reference_logits(reduced, ids)
    decoder = subset_decoder(packages["fp32"], imported, [0, 1, 3], name=".sub.onnx")
    ours = decoder.step(ids[:12], logits_rows=list(range(12))).copy()
    assert max_rel_error(ours, ref[:12]) < 1e-4
    for t in range(12, 16):  # and its own KV cache decodes on from there
        assert max_rel_error(decoder.step([ids[t]])[0], ref[t]) < 1e-4
    assert max_rel_error(ours, reference_logits(model, ids)[:12]) > 1e-2  # the skip really changed something
    (packages["fp32"] / ".sub.onnx").unlink()


def test_draft_graph_references_the_targets_weights_and_adds_none(with_draft, tiny):
    package = load_package(with_draft)
    assert package.self_draft["layers"] == [0, 1, 3]
    assert sorted(package.manifest["files"]) == [DRAFT_FILE, "model.onnx", "model.onnx.data", "tokenizer.json"]
    target = onnx.load(str(package.graph_path), load_external_data=False)
    draft = onnx.load(str(with_draft / DRAFT_FILE), load_external_data=False)
    where = {t.name: [(e.key, e.value) for e in t.external_data] for t in target.graph.initializer}
    external = [t for t in draft.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and all([(e.key, e.value) for e in t.external_data] == where[t.name] for t in external)
    assert (with_draft / DRAFT_FILE).stat().st_size < package.graph_path.stat().st_size
    assert [i.name for i in draft.graph.input if i.name.startswith("past_key")] == [f"past_key.{i}" for i in range(3)]


def test_shared_weights_refuse_a_tensor_the_file_does_not_hold(tiny):
    _, imported, packages = tiny
    package = load_package(packages["fp32"])
    shared = SharedExternalData.from_graph(package.graph_path)
    with pytest.raises(ValueError, match="not in the shared weights file"):
        shared.tensor("no.such.weight", np.zeros(3, np.float32))
    name = "model.norm.weight"
    with pytest.raises(ValueError, match="same options"):
        shared.tensor(name, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="ascending"):
        DecoderBuilder(package.config, imported.tensors, shared, BuildOptions(layers=(2, 1))).build()


def test_load_checks_the_draft_graph_like_the_model(with_draft, tmp_path):
    import shutil

    folder = tmp_path / "pkg"
    shutil.copytree(with_draft, folder)
    draft = onnx.load(str(folder / DRAFT_FILE), load_external_data=False)
    for t in draft.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"
    onnx.save_model(draft, folder / DRAFT_FILE)
    with pytest.raises(PackageError, match="sha256|bytes"):  # the files table covers the draft graph
        load_package(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][DRAFT_FILE] = file_entry(folder / DRAFT_FILE)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="outside the model folder"):
        load_package(folder)
    del manifest["files"][DRAFT_FILE]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match="no size and sha256"):
        load_package(folder)


def test_a_package_without_a_self_draft_says_how_to_add_one(tiny):
    _, _, packages = tiny
    engine = Engine(packages["fp32"], context_length=64, threads=1)
    for spec in ("skip", "lookup+skip"):
        with pytest.raises(PackageError, match="--self-draft skip"):
            make_speculator(spec, engine)


def test_adding_a_draft_needs_the_same_model(tiny, tmp_path):
    _, imported, packages = tiny
    _, other = tiny_llama(seed=11, initializer_range=0.3, num_hidden_layers=3)
    with pytest.raises(PackageError, match="not exported from this model"):
        add_skip_draft(packages["fp32"], other, layers=[0])
    with pytest.raises(EdgeError, match="skip at least one layer"):
        add_skip_draft(packages["fp32"], imported, layers=[0, 1, 2, 3])
    with pytest.raises(EdgeError, match="distinct indices"):
        add_skip_draft(packages["fp32"], imported, layers=[1, 1])


def test_speedup_model():
    flat = lambda s: 1.0  # noqa: E731 - verifying is free: only drafting costs
    depth, gain = expected_speedup(0.0, 0.3, flat)
    assert depth == 1 and gain == pytest.approx(1 / 1.3)  # nothing accepted: each draft token is pure cost
    depth, gain = expected_speedup(0.9, 0.1, flat)
    assert depth >= 3 and gain > 2
    assert expected_speedup(0.9, 0.1, lambda s: float(s))[1] < gain  # a linear verify cost eats the gain
    from edge.config import ModelConfig

    cfg = ModelConfig(architecture="llama", vocab_size=1000, hidden_size=64, intermediate_size=128, num_layers=4,
                      num_heads=4, num_kv_heads=2, head_dim=16, max_context=64)
    assert cost_fraction(cfg, [0, 1, 2, 3]) == 1.0
    assert 0 < cost_fraction(cfg, [0]) < cost_fraction(cfg, [0, 2]) < 1


def test_layers_are_chosen_by_measurement(tiny, tmp_path):
    """The selection measures both families and keeps the candidate with the best predicted speed-up."""
    import shutil

    _, imported, packages = tiny
    folder = tmp_path / "int4"
    shutil.copytree(packages["int4"], folder)
    record = add_skip_draft(folder, imported, threads=1, verify=lambda s: 1.0, calibration=SMALL_CALIBRATION)
    families = {c["family"] for c in record["candidates"]}
    assert {"prefix", "skip-one"} <= families
    best = max(c["predicted_speedup"] for c in record["candidates"])
    assert record["chosen"]["predicted_speedup"] == best
    assert record["layers"] == record["chosen"]["layers"] and len(record["layers"]) < 4
    assert record["calibration"]["split"] == "calibration"
    assert not list(folder.glob(".*"))  # no candidate graph or temporary file left behind
    package = load_package(folder)  # sha256 and external data of both graphs check out
    assert Decoder(package.skip_draft(), context_length=32, threads=1).step([1, 2, 3]).shape == (1, 96)


@pytest.mark.parametrize("kind", ["skip-fixed", "lookup+skip"])
def test_greedy_speculation_with_the_skip_draft_is_plain_greedy(with_draft, kind):
    engine = Engine(with_draft, context_length=96, threads=1)
    accepted = 0
    for prompt in PROMPTS:
        engine.speculator = None
        expected = engine.generate(prompt, max_tokens=24)
        engine.speculator = (Speculator([LayerSkipDraft(engine.package, 96, threads=1)], draft_length=3)
                             if kind == "skip-fixed" else make_speculator(kind, engine, draft_length=3))
        assert engine.generate(prompt, max_tokens=24) == expected
        accepted += engine.stats.speculative.by_drafter.get("layer-skip", [0, 0, 0])[2]
    assert accepted > 0  # the draft was used and right at least sometimes


def test_a_self_draft_measured_to_lose_is_never_drafted_with(with_draft):
    """The adaptive policy leaves a drafter whose measured speed-up is below 1 off, probes included (each probe
    would pay the draft's catch-up prefill); a fixed draft length still uses it."""
    engine = Engine(with_draft, context_length=96, threads=1)
    expected = engine.generate(PROMPTS[0], max_tokens=40)
    for length, drafted in ((None, False), (3, True)):
        draft = LayerSkipDraft(engine.package, 96, threads=1)
        draft.predicted_speedup = 0.9
        engine.speculator = Speculator([draft], draft_length=length, threads=1)
        assert engine.generate(PROMPTS[0], max_tokens=40) == expected
        assert (engine.stats.speculative.drafted > 0) == drafted


def test_candidate_record_rounds():
    c = Candidate("prefix", (0, 1), 0.123456, 0.5, 2, 1.23456)
    assert c.record() == {"family": "prefix", "layers": [0, 1], "agreement": 0.1235, "cost": 0.5, "depth": 2,
                          "predicted_speedup": 1.235}


def test_export_cli_adds_a_self_draft(tiny, tmp_path, capsys):
    from edge.apps import export as export_cli

    model, imported, _ = tiny
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(imported.tokenizer_json)
    out = tmp_path / "pkg"
    assert export_cli.main([str(folder), "-o", str(out), "--quant", "fp32", "--self-draft", "skip",
                            "--draft-layers", "0,2"]) == 0
    assert "self-draft: given keeps 2/4 layers [0, 2]" in capsys.readouterr().out
    assert load_package(out).self_draft["layers"] == [0, 2]
    assert export_cli.main([str(folder), "-o", str(out), "--self-draft", "skip", "--draft-layers", "0,9"]) == 2
    assert "layers must be distinct" in capsys.readouterr().err
    assert export_cli.main([str(folder), "-o", str(tmp_path / "x"), "--quant", "spqr", "--self-draft", "skip"]) == 2
    assert "fp32 and int4" in capsys.readouterr().err


REAL_PROMPTS = ["What is the capital of France?", "Write a Python function that reverses a string.",
                "Summarise in one sentence: The Amazon rainforest covers much of the Amazon basin of South America."]


@pytest.mark.slow
def test_real_fp32_greedy_with_the_skip_draft_is_plain_greedy(tmp_path):
    """SmolLM2 fp32 with a self-draft (layers given, so no selection run): identical ids on a handful of prompts."""
    from edge.default_model import default_gguf, default_package
    from edge.export.load import load_model
    from edge.export.self_draft import linked_copy

    try:
        source, fp32 = default_gguf(), default_package("fp32")
    except Exception as exc:  # no network and no cache
        pytest.skip(f"default model unavailable: {exc}")
    folder = linked_copy(fp32, tmp_path / "fp32-skip")
    keep = [i for i in range(30) if i not in (6, 11, 16, 21, 26)]
    add_skip_draft(folder, load_model(source), layers=keep, threads=2, verify=lambda s: 1.0,
                   calibration=dict(sequences=1, prompt_len=16, new_tokens=8))
    engine = Engine(folder, threads=2, context_length=256)
    expected = []
    for prompt in REAL_PROMPTS:
        expected.append(("".join(engine.chat([{"role": "user", "content": prompt}], max_tokens=16)),
                         list(engine.tokens)))
        engine.reset()
    engine.speculator = Speculator([LayerSkipDraft(engine.package, 256, threads=2)], draft_length=3)
    accepted = 0
    for prompt, want in zip(REAL_PROMPTS, expected):
        got = "".join(engine.chat([{"role": "user", "content": prompt}], max_tokens=16)), list(engine.tokens)
        assert got == want
        accepted += engine.stats.speculative.accepted
        engine.reset()
    assert accepted > 0
