"""The trained draft head: its weights file, its graph against a numpy reference, training on a tiny model, and
speculation with it emitting exactly plain greedy output."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from edge.engine import Engine
from edge.errors import EdgeError
from edge.export.builder import BuildOptions
from edge.export.draft_head import FILE, DraftHeadWeights, build_draft_head, tokenizer_sha256
from edge.export.pipeline import export_model
from edge.model import Decoder
from edge.package import load_package
from edge.session import create_session
from edge.speculative import make_speculator
from edge.speculative.draft_head import DraftHead
from tiny_models import VOCAB, tiny_llama

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGE_CACHE", str(tmp_path / "cache"))


def random_weights(imported, vocab: np.ndarray, ffn: int = 48, seed: int = 0) -> DraftHeadWeights:
    rng = np.random.default_rng(seed)
    d = imported.config.hidden_size

    def normal(*shape, scale=0.3, dtype=np.float16):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    return DraftHeadWeights(
        normal(ffn, 2 * d), normal(ffn, scale=0.1), normal(d, ffn), normal(d, scale=0.1),
        1 + normal(d, scale=0.2, dtype=np.float32), 1 + normal(d, scale=0.2, dtype=np.float32),
        vocab.astype(np.int32),
        {"depth": 3, "eps": 1e-5, "tokenizer_sha256": tokenizer_sha256(imported.tokenizer_json)})


def reference_step(w: DraftHeadWeights, emb: np.ndarray, state: np.ndarray, token: int, snap=lambda w: w):
    """The head's step in float64 numpy: the math export/draft_head.py documents (snap: the linears' rounding)."""
    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + w.meta["eps"]) * g

    f = lambda a: a.astype(np.float64)  # noqa: E731
    e = f(emb[token]) if token in set(w.vocab.tolist()) else np.zeros(emb.shape[1])
    z = f(snap(f(w.fc1))) @ np.concatenate([rms(state, f(w.norm_in)), e]) + f(w.fc1_bias)
    state = state + f(snap(f(w.fc2))) @ (z / (1 + np.exp(-z))) + f(w.fc2_bias)
    logits = f(snap(f(emb[w.vocab]))) @ rms(state, f(w.norm_out))
    p = np.exp(logits - logits.max())
    return int(w.vocab[logits.argmax()]), p.max() / p.sum(), state


def test_the_graph_computes_the_documented_step(tmp_path):
    _, imported = tiny_llama(seed=3)
    vocab = np.arange(5, VOCAB, 2)
    w = random_weights(imported, vocab)
    build_draft_head(imported.config, imported.tensors, w, tmp_path, BuildOptions())
    session = create_session(tmp_path / FILE, "cpu", 1)
    emb = imported.tensors["model.embed_tokens.weight"]
    rng = np.random.default_rng(1)
    for token in (7, 8, 41):  # 8 is outside the head's vocabulary: the zero embedding row
        state = rng.standard_normal(imported.config.hidden_size)
        got_token, got_conf, got_state = session.run(None, {"state": state[None].astype(np.float32),
                                                            "token": np.array([token])})
        want_token, want_conf, want_state = reference_step(w, emb, state, token)
        assert int(got_token[0]) == want_token
        assert got_conf[0] == pytest.approx(want_conf, rel=1e-4)
        np.testing.assert_allclose(got_state[0], want_state, rtol=1e-4, atol=1e-4)


def test_with_edge_kernels_the_head_keeps_float16_statistics(tmp_path):
    """float16_grid puts each linear on a 4-bit grid whose step and minimum are float16 values: the builder then
    stores them as float16 (scale, min) pairs, and the graph computes exactly the snapped weights."""
    from edge.export.draft_head import float16_grid
    from edge.export.pipeline import rtn_quantizer

    _, imported = tiny_llama(seed=3)
    w = random_weights(imported, np.arange(5, VOCAB, 2), ffn=64)
    options = BuildOptions(quantizer=rtn_quantizer(4, 32, float_zero=True), kernels="edge", accuracy_level=0)
    build_draft_head(imported.config, imported.tensors, w, tmp_path, options)
    import onnx

    stats = {i.name: i.data_type for i in onnx.load(tmp_path / FILE, load_external_data=False).graph.initializer}
    for layer in ("fc1", "fc2", "out"):
        assert stats[f"draft.{layer}.scales"] == onnx.TensorProto.FLOAT16 and f"draft.{layer}.mins" in stats, stats
    session = create_session(tmp_path / FILE, "cpu", 1, ["edge"])
    emb = imported.tensors["model.embed_tokens.weight"]
    state = np.random.default_rng(2).standard_normal(imported.config.hidden_size)
    got_token, got_conf, got_state = session.run(None, {"state": state[None].astype(np.float32),
                                                        "token": np.array([7])})
    want_token, want_conf, want_state = reference_step(w, emb, state, 7, snap=float16_grid)
    assert int(got_token[0]) == want_token
    np.testing.assert_allclose(got_state[0], want_state, rtol=1e-4, atol=1e-4)


def test_training_rows_leave_the_targets_path_out():
    """A chain step whose input token is not what the target would have chosen gets no label: at run time the head
    only ever continues the target's own choices."""
    from edge.export.draft_head_train import samples

    z = torch.arange(10)
    choice = torch.cat([z[1:], torch.tensor([-1])])
    choice[4] = 99  # after token 4 the target would say 99; the text says 5
    h = torch.zeros(10, 2)
    hs, xs, ts = samples([(z, h[1:], 1, choice)], depth=3, vocab_size=100)
    assert xs[:, 0].tolist() == [2, 3, 4, 5, 6]  # the roots
    assert ts[0].tolist() == [3, 4, 99]  # root 2: its third guess must be the target's 99
    assert ts[1].tolist() == [4, 99, 100]  # root 3: after 99 the text went on with 5, off the path
    assert ts[2].tolist() == [99, 100, 100]
    assert ts[3].tolist() == [6, 7, 8]  # root 5: the text is back on a path the target chose


def test_weights_round_trip_and_refuse_another_model(tmp_path):
    _, imported = tiny_llama(seed=3)
    w = random_weights(imported, np.arange(10, 40))
    w.save(tmp_path / "head.npz")
    assert not list(tmp_path.glob(".*"))  # written under a temporary name, renamed
    back = DraftHeadWeights.load(tmp_path / "head.npz")
    back.check(imported.config, imported.tokenizer_json)
    for name in DraftHeadWeights.ARRAYS:
        np.testing.assert_array_equal(getattr(back, name), getattr(w, name))
    with pytest.raises(EdgeError, match="another tokenizer"):
        back.check(imported.config, imported.tokenizer_json + " ")
    wide = dataclasses.replace(back, vocab=np.array([0, VOCAB]))
    with pytest.raises(EdgeError, match="token ids outside"):
        wide.check(imported.config, imported.tokenizer_json)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(EdgeError, match="not a draft-head weights file"):
        DraftHeadWeights.load(tmp_path / "bad.npz")
    np.savez(tmp_path / "pickled.npz", fc1=np.array([object()], dtype=object))
    with pytest.raises(EdgeError, match="not a draft-head weights file"):  # object arrays need pickle: refused
        DraftHeadWeights.load(tmp_path / "pickled.npz")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A head trained on the tiny model's own greedy continuations, and packages with it."""
    from edge.export.draft_head_train import features, train

    model, imported = tiny_llama(seed=7, initializer_range=0.1)  # answers that settle into runs: learnable
    imported.special_tokens = dataclasses.replace(imported.special_tokens, eos_token_ids=[])
    rng = np.random.default_rng(0)
    rows = []
    with torch.no_grad():
        for _ in range(48):
            ids = rng.integers(0, VOCAB - 1, 6).tolist()
            out = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                                 attention_mask=torch.ones(1, 6, dtype=torch.long))[0].tolist()
            rows.append({"ids": ids, "answer": out[len(ids):]})
    weights, report = train(model, features(model, rows), VOCAB, depth=3, ffn=128, vocab=VOCAB, epochs=60, lr=3e-3)
    weights.meta["tokenizer_sha256"] = tokenizer_sha256(imported.tokenizer_json)
    root = tmp_path_factory.mktemp("head")
    weights.save(root / "head.npz")
    fp32 = export_model("tiny", root / "fp32", quant="fp32", model=imported, draft_head=root / "head.npz")
    int4 = export_model("tiny", root / "int4", quant="int4", model=imported, draft_head=root / "head.npz")
    bare = export_model("tiny", root / "bare", quant="fp32", model=imported)
    return model, report, fp32, int4, bare


def test_training_learns_the_models_continuations(trained):
    _, report, *_ = trained
    # a random guess over the tiny vocabulary is right 1% of the time
    assert report["train_chain_accuracy"][0] > 0.8, report
    assert report["held_out_chain_accuracy"][0] > 0.3, report


def test_package_features_are_the_packages_own_rows_and_choices(trained):
    from edge.export.draft_head_train import features, package_features

    model, _, fp32, _, _ = trained
    rows = [{"ids": [3, 14, 15, 9], "answer": [26, 5, 35, 8, 9, 7]}, {"ids": [40, 41], "answer": [42, 43, 44]}]
    for (z, h, p, choice), (z2, h2, p2, choice2) in zip(features(model, rows), package_features(fp32, rows)):
        assert z.tolist() == z2.tolist() and p == p2
        np.testing.assert_allclose(h2.numpy(), h.numpy(), rtol=1e-4, atol=1e-4)
        with torch.no_grad():
            want = model(input_ids=z[None]).logits[0].argmax(-1)
        assert choice2.tolist() == want.tolist()
        assert choice[:-1].tolist() == z[1:].tolist()  # the float model's "choice" is the text itself


def test_the_hidden_output_is_the_final_normed_state(trained):
    model, _, fp32, _, _ = trained
    ids = [3, 14, 15, 9, 26, 5]
    decoder = Decoder(load_package(fp32), context_length=32, threads=1)
    decoder.step(ids)
    with torch.no_grad():
        want = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1].numpy()
    np.testing.assert_allclose(decoder.hidden[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", ["head", "lookup+head", "auto"])  # auto: lookup+head on a CPU
def test_speculation_with_the_head_emits_exactly_plain_greedy(trained, spec):
    _, _, package, _, _ = trained
    plain = Engine(package, context_length=96, threads=1)
    engine = Engine(package, context_length=96, threads=1)
    engine.speculator = make_speculator(spec, engine, draft_length=3)
    assert any(isinstance(d, DraftHead) for d in engine.speculator.drafters)
    accepted = 0
    for prompt in ([3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 3, 2], [40, 41, 42, 43, 44, 45], [77, 12, 77, 12, 50]):
        expected = plain.tokenizer.encode(plain.generate(prompt, max_tokens=24), add_special_tokens=False)
        engine.reset()
        got = engine.tokenizer.encode(engine.generate(prompt, max_tokens=24), add_special_tokens=False)
        assert got == expected, prompt
        assert engine.tokens == prompt + expected[:-1]
        accepted += engine.stats.speculative.accepted
    assert accepted > 10  # the head's guesses were verified and kept, not just proposed


def test_auto_takes_recycling_over_the_head_on_a_gpu(trained, monkeypatch):
    """On a GPU a verify row is nearly free and a head step costs a dispatch-bound share of a target step."""
    _, _, package, _, _ = trained
    engine = Engine(package, context_length=96, threads=1)
    assert [d.name for d in make_speculator("auto", engine).drafters] == ["prompt-lookup", "head"]
    monkeypatch.setattr(engine.decoder, "device", "cuda")  # only the choice reads it here
    assert [d.name for d in make_speculator("auto", engine).drafters] == ["prompt-lookup", "recycling"]


def test_a_quantized_head_still_guesses(trained):
    """On int4 the head's linears are quantized like the model's (stock int4 is not batch-invariant, so only the
    fp32 package is held to identical output; the default int4-edge package is, in test_speculative_real)."""
    _, _, _, int4, _ = trained
    engine = Engine(int4, context_length=96, threads=1)
    engine.speculator = make_speculator("head", engine, draft_length=3)
    engine.generate([3, 14, 15, 9, 26], max_tokens=24)
    stats = engine.stats.speculative
    assert stats.drafted > 0 and stats.accepted > 0


def test_a_package_without_a_head_says_how_to_get_one(trained):
    *_, bare = trained
    engine = Engine(bare, context_length=96, threads=1)
    for spec in ("head", "lookup+head"):
        with pytest.raises(EdgeError, match="--draft-head"):
            make_speculator(spec, engine)
    assert [d.name for d in make_speculator("auto", engine).drafters] == ["prompt-lookup", "recycling"]


def test_the_heads_graph_is_checked_like_the_models(trained, tmp_path):
    import json
    import shutil

    _, _, fp32, _, _ = trained
    copy = tmp_path / "pkg"
    shutil.copytree(fp32, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["files"][FILE]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgeError, match="draft head"):
        load_package(copy)


def test_the_memory_model_leaves_the_head_out_of_the_models_weights(trained):
    """Only the drafter that uses the head loads its graph: the model's resident weights are the same without it."""
    from edge.memory.budget import ModelSpec

    _, _, with_head, _, bare = trained
    assert ModelSpec.from_package(with_head).weight_bytes == ModelSpec.from_package(bare).weight_bytes
