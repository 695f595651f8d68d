"""A trained draft head: a small recurrent block on the target's own final hidden state that guesses its next tokens.

Why: for open chat and code no earlier text repeats, so model-free drafters have nothing to copy, and SmolLM2-135M
has no smaller sibling to draft with. The target's final hidden state already encodes most of what it will say
next; a block of two linears (Medusa/EAGLE/ReDrafter's observation) trained to continue it, conditioned on the
token the target just chose, guesses the token after that. Each step:

    s <- s + W2 silu(W1 [rmsnorm(s) * n_in ; embed(token)])     token <- argmax(rmsnorm(s) * n_out @ E[V]^T)

starting from s = the hidden row behind the root's logits. E[V] are the target's own embedding rows for the
head's vocabulary V (the tokens its training answers used, a few thousand of 49k), so only W1, W2 and the two norm
weights are trained (export/draft_head_train.py, self-distilled from the model's own greedy answers). The head
is one step of draft_head.onnx, beside the target's graph, its linears quantized like the target's (round to
nearest; with edge kernels on a grid whose statistics are float16); a root outside V reads a zero embedding. The
weights file is .npz (no pickle), tied to its model by the tokenizer's sha256.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from edge.config import ModelConfig
from edge.errors import EdgeError
from edge.export.builder import IR_VERSION, OPSET, BuildOptions, DecoderBuilder, ExternalData

FILE = "draft_head.onnx"
DATA = "draft_head.onnx.data"


@dataclass
class DraftHeadWeights:
    fc1: np.ndarray  # (ffn, 2 * hidden)
    fc1_bias: np.ndarray
    fc2: np.ndarray  # (hidden, ffn)
    fc2_bias: np.ndarray
    norm_in: np.ndarray  # (hidden,)
    norm_out: np.ndarray
    vocab: np.ndarray  # (V,) target token ids the head can propose
    meta: dict[str, Any]  # depth, eps, hidden_size, vocab_size, tokenizer_sha256, how it was trained

    ARRAYS = ("fc1", "fc1_bias", "fc2", "fc2_bias", "norm_in", "norm_out", "vocab")

    def save(self, path: Path) -> None:
        """Written under a temporary name and renamed: never a half-written weights file."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, meta=np.frombuffer(json.dumps(self.meta).encode(), np.uint8),
                     **{k: getattr(self, k) for k in self.ARRAYS})
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> DraftHeadWeights:
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in cls.ARRAYS}
                meta = json.loads(z["meta"].tobytes().decode())
        except (OSError, KeyError, ValueError) as e:
            raise EdgeError(f"{path} is not a draft-head weights file ({e}); train one with "
                            f"`python -m edge.export.draft_head_train`") from e
        return cls(meta=meta, **arrays)

    def check(self, config: ModelConfig, tokenizer_json: str) -> None:
        """Refuse a head trained for another model: its guesses would be noise at best."""
        d, ffn = config.hidden_size, self.fc1.shape[0]
        shapes = {"fc1": (ffn, 2 * d), "fc2": (d, ffn), "norm_in": (d,), "norm_out": (d,)}
        wrong = [f"{k} {getattr(self, k).shape} != {s}" for k, s in shapes.items() if getattr(self, k).shape != s]
        if self.vocab.size == 0 or self.vocab.min() < 0 or self.vocab.max() >= config.vocab_size:
            wrong.append(f"token ids outside 0..{config.vocab_size - 1}")
        if self.meta.get("tokenizer_sha256") != tokenizer_sha256(tokenizer_json):
            wrong.append("it was trained with another tokenizer")
        if wrong:
            raise EdgeError(f"this draft head does not fit the model ({'; '.join(wrong)}); train one for it with "
                            f"`python -m edge.export.draft_head_train`")


def tokenizer_sha256(tokenizer_json: str) -> str:
    return hashlib.sha256(tokenizer_json.encode()).hexdigest()


def float16_grid(w: np.ndarray, bits: int = 4, block: int = 32) -> np.ndarray:
    """w rounded to nearest on a grid of 2**bits levels per block whose step and minimum are float16 values, as
    float32. The builder then stores the head's statistics as a float16 (scale, min) pair, 4 bytes per block
    instead of 8 (float32 scale and zero): 17% fewer bytes for a graph whose weights are out of cache at every
    first guess (a step costs ~0.5 ms cold, 0.16 ms warm; measured 8% faster cold than with float32 statistics).
    A layer with a constant block or a ragged end is left as it is (the builder keeps float32 statistics)."""
    n, k = w.shape
    if k % block:
        return w
    blocks = w.reshape(n, k // block, block).astype(np.float32)
    lo, hi = blocks.min(-1, keepdims=True), blocks.max(-1, keepdims=True)
    top = (1 << bits) - 1
    step = ((hi - lo) / top).astype(np.float16).astype(np.float32)
    low = lo.astype(np.float16).astype(np.float32)
    if not (np.isfinite(step).all() and (step > 0).all()):
        return w
    codes = np.clip(np.rint((blocks - low) / step), 0, top)
    return (codes.astype(np.float32) * step + low).reshape(n, k)


def build_draft_head(config: ModelConfig, tensors, weights: DraftHeadWeights, out_dir: Path,
                     options: BuildOptions) -> list[str]:
    """Write draft_head.onnx (+ data): one step of the head. Inputs: state (1, hidden), the target's hidden row for
    the first step, and token (1,); outputs the next token (1,), the head's top probability for it (1,), which the
    runtime uses to judge how far to trust it, and the new state. One step per call, so the runtime stops as soon
    as the head is unsure instead of paying for guesses it will not verify."""
    cfg, eps = config, float(weights.meta["eps"])
    data = ExternalData(Path(out_dir) / DATA)
    try:
        b = DecoderBuilder(cfg, tensors, data, options)
        g = b.g
        vocab = weights.vocab.astype(np.int64)
        emb = np.asarray(tensors["model.embed_tokens.weight"], np.float32)
        out_rows = np.asarray(tensors["lm_head.weight"] if not cfg.tie_word_embeddings else emb, np.float32)[vocab]
        table = np.concatenate([emb[vocab] * cfg.embedding_scale, np.zeros((1, emb.shape[1]), np.float32)])
        remap = np.full(cfg.vocab_size, len(vocab), np.int64)  # outside the head's vocabulary: the zero row
        remap[vocab] = np.arange(len(vocab))

        def norm(x: str, name: str, w: np.ndarray) -> str:
            return g.node("SimplifiedLayerNormalization", [x, b.weight(name, w.astype(np.float32))], epsilon=eps,
                          axis=-1)[0]

        index = g.node("Gather", [b.const("draft.remap", remap), "token"], axis=0)[0]
        e = g.node("Cast", [g.node("Gather", [b.weight("draft.embed", table.astype(np.float16)), index],
                                   axis=0)[0]], to=TensorProto.FLOAT)[0]
        u = g.node("Concat", [norm("state", "draft.norm_in", weights.norm_in), e], axis=-1)[0]
        snap = float16_grid if options.kernels == "edge" and options.quantizer is not None else (lambda w: w)
        z = b.linear(u, "draft.fc1", snap(weights.fc1.astype(np.float32)), weights.fc1_bias.astype(np.float32))
        a = g.node("Mul", [z, g.node("Sigmoid", [z])[0]])[0]
        state = g.node("Add", ["state", b.linear(a, "draft.fc2", snap(weights.fc2.astype(np.float32)),
                                                 weights.fc2_bias.astype(np.float32))], outputs=["next_state"])[0]
        logits = b.linear(norm(state, "draft.norm_out", weights.norm_out), "draft.out", snap(out_rows))
        best = g.node("ArgMax", [logits], axis=-1, keepdims=0)[0]
        g.node("Gather", [b.const("draft.vocab", vocab), best], axis=0, outputs=["next_token"])
        top = g.node("ReduceMax", [logits, b.const("draft.axis", [-1])], keepdims=1)[0]
        total = g.node("ReduceSum", [g.node("Exp", [g.node("Sub", [logits, top])[0]])[0],
                                     b.const("draft.axis_sum", [-1])], keepdims=0)[0]
        g.node("Reciprocal", [total], outputs=["confidence"])
        f32 = TensorProto.FLOAT
        inputs = [helper.make_tensor_value_info("state", f32, [1, cfg.hidden_size]),
                  helper.make_tensor_value_info("token", TensorProto.INT64, [1])]
        outputs = [helper.make_tensor_value_info("next_token", TensorProto.INT64, [1]),
                   helper.make_tensor_value_info("confidence", f32, [1]),
                   helper.make_tensor_value_info("next_state", f32, [1, cfg.hidden_size])]
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        if options.kernels == "edge":
            opsets.append(helper.make_opsetid("edge", 1))
        model = helper.make_model(helper.make_graph(g.nodes, "edge_draft_head", inputs, outputs, g.initializers),
                                  opset_imports=opsets, producer_name="edge", ir_version=IR_VERSION)
    finally:
        data.close()
    onnx.save_model(model, Path(out_dir) / FILE)
    return [FILE, DATA]


def manifest_entry(weights: DraftHeadWeights) -> dict[str, Any]:
    return {"file": FILE, "depth": int(weights.meta["depth"]), "vocabulary": int(weights.vocab.size),
            "trained": weights.meta.get("trained", {})}
