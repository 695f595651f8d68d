"""Sequential calibration: a numpy forward pass of a Llama-style decoder that quantizes as it goes.

For each decoder layer in turn, the inputs of its linear layers are collected over the calibration tokens as
H = X^T X, the layer's linears are quantized with those Hessians (q/k/v share one, gate/up share one), and the layer's
output is recomputed with the *quantized* weights before it feeds the next layer, so later layers calibrate on the
activations they will really see (GPTQ's sequential scheme, done sub-layer by sub-layer).

Llama conventions (see export/source.py): Hugging Face tensor names, weights (out, in), rotary in the half-split
layout, RMSNorm with the effective multiplier, SiLU-gated MLP, grouped-query attention.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edge.export.builder import rope_inv_freq
from edge.export.quant import QuantizationError
from edge.export.quant.hessian import HessianAccumulator
from edge.export.quant.qlinear import QuantizedLinear
from edge.export.source import ImportedModel

# (tensor name, float weight (out, in), Hessian (in, in)) -> quantized layer, or None to keep the layer in float
LinearQuantizer = Callable[[str, np.ndarray, np.ndarray], QuantizedLinear | None]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    return (x / np.sqrt(var + eps) * weight).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) through tanh, which cannot overflow (exp(-x) does for large negative x, and is slower)."""
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


class LlamaCalibrator:
    """Holds the running hidden states (sequences, tokens, hidden) and walks the layers once."""

    architecture = "llama"

    def __init__(
        self, model: ImportedModel, tokens: np.ndarray, quantize: LinearQuantizer, batch: int = 8, hessians: bool = True
    ):
        cfg = model.config
        if cfg.architecture != self.architecture:
            raise QuantizationError(
                f"calibrated quantization supports Llama-style models, not {cfg.architecture!r}; use --quant int4"
            )
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
            raise QuantizationError(f"calibration tokens must be (sequences, length) ids below {cfg.vocab_size}")
        self.cfg, self.t, self.quantize, self.batch = cfg, model.tensors, quantize, batch
        self.hessians = hessians  # False: a plain reference forward (quantize gets h=None), e.g. for evaluation
        self.results: dict[str, QuantizedLinear] = {}
        self.hidden = (self.t["model.embed_tokens.weight"][tokens] * cfg.embedding_scale).astype(np.float32)
        self.cos, self.sin = self.rope(cfg.rope_theta, tokens.shape[1])

    def rope(self, base: float, length: int, is_global: bool = True) -> tuple[np.ndarray, np.ndarray]:
        angles = np.outer(np.arange(length), rope_inv_freq(self.cfg, base, is_global))
        return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def _quantized(self, names: list[str], x: np.ndarray) -> list[np.ndarray]:
        """Quantize the weights `names` that all read input x; return the weights to propagate with."""
        h = None
        if self.hessians:
            acc = HessianAccumulator(x.shape[-1])
            for s in range(0, x.shape[0], self.batch):
                acc.add(x[s : s + self.batch])
            h = acc.mean()
        weights = []
        for name in names:
            w = np.asarray(self.t[name], dtype=np.float32)
            q = self.quantize(name, w, h)
            if q is not None:
                self.results[name] = q
                w = q.dequantize()
            weights.append(w)
        return weights

    def _bias(self, name: str) -> np.ndarray | float:
        return self.t[name] if self.cfg.qkv_bias and name in self.t else 0.0

    def rotate(self, x: np.ndarray) -> np.ndarray:
        """Half-split rotary on (seq, tokens, heads, head_dim)."""
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        cos, sin = self.cos[None, :, None, :], self.sin[None, :, None, :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int | None = None) -> np.ndarray:
        """Causal grouped-query attention (a query sees the `window` latest keys when given); the query heads sharing a
        KV head are stacked along the token axis so each product is one contiguous batched GEMM (numpy falls back to
        slow loops on strided operands)."""
        cfg = self.cfg
        s, n = q.shape[:2]
        kv, rep, d = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
        q = self.rotate(q.reshape(s, n, cfg.num_heads, d))
        k = self.rotate(k.reshape(s, n, kv, d))
        v = v.reshape(s, n, kv, d)
        scale = cfg.query_scale or d**-0.5
        causal = np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)
        if window is not None:
            causal += np.tril(np.full((n, n), -np.inf, dtype=np.float32), -window)
        out = np.empty((s, n, kv, rep, d), dtype=np.float32)
        for b in range(0, s, self.batch):
            m = min(self.batch, s - b)
            qb = np.ascontiguousarray(q[b : b + m].reshape(m, n, kv, rep, d).transpose(0, 2, 3, 1, 4))
            kt = np.ascontiguousarray(k[b : b + m].transpose(0, 2, 3, 1))  # (m, kv, d, n)
            vb = np.ascontiguousarray(v[b : b + m].transpose(0, 2, 1, 3))  # (m, kv, n, d)
            scores = (qb.reshape(m, kv, rep * n, d) @ kt).reshape(m, kv, rep, n, n)
            scores *= scale
            scores += causal
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            ctx = (scores.reshape(m, kv, rep * n, n) @ vb).reshape(m, kv, rep, n, d)
            out[b : b + m] = ctx.transpose(0, 3, 1, 2, 4)
        return out.reshape(s, n, cfg.num_heads * d)

    def layer(self, i: int) -> None:
        cfg, p = self.cfg, f"model.layers.{i}."
        x = rms_norm(self.hidden, self.t[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        names = [p + f"self_attn.{m}_proj.weight" for m in "qkv"]
        wq, wk, wv = self._quantized(names, x)
        q = x @ wq.T + self._bias(p + "self_attn.q_proj.bias")
        k = x @ wk.T + self._bias(p + "self_attn.k_proj.bias")
        v = x @ wv.T + self._bias(p + "self_attn.v_proj.bias")
        attn = self.attention(q, k, v)
        (wo,) = self._quantized([p + "self_attn.o_proj.weight"], attn)
        self.hidden += attn @ wo.T
        x = rms_norm(self.hidden, self.t[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        wg, wu = self._quantized([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], x)
        act = (silu(x @ wg.T) * (x @ wu.T)).astype(np.float32)
        (wd,) = self._quantized([p + "mlp.down_proj.weight"], act)
        self.hidden += act @ wd.T

    def head(self) -> np.ndarray:
        """The output projection (the tied embedding when there is no lm_head); returns its (quantized) weight."""
        x = rms_norm(self.hidden, self.t["model.norm.weight"], self.cfg.rms_norm_eps)
        name = "lm_head.weight" if "lm_head.weight" in self.t else "model.embed_tokens.weight"
        (w,) = self._quantized([name], x)
        return w


class Gemma3Calibrator(LlamaCalibrator):
    """Gemma 3's layer: q/k normalised per head, norms after attention and around the MLP, GELU-tanh gate, and the
    sliding layers attending a window of keys with their own rope base."""

    architecture = "gemma3"

    def layer(self, i: int) -> None:
        cfg, p = self.cfg, f"model.layers.{i}."
        local = cfg.is_sliding_layer(i)
        base = cfg.rope_local_theta if local and cfg.rope_local_theta else cfg.rope_theta
        self.cos, self.sin = self.rope(base, self.hidden.shape[1], is_global=base == cfg.rope_theta)
        x = rms_norm(self.hidden, self.t[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        wq, wk, wv = self._quantized([p + f"self_attn.{m}_proj.weight" for m in "qkv"], x)
        q, k = (self.head_norm(x @ w.T, self.t[p + f"self_attn.{m}_norm.weight"]) for w, m in ((wq, "q"), (wk, "k")))
        attn = self.attention(q, k, x @ wv.T, cfg.sliding_window if local else None)
        (wo,) = self._quantized([p + "self_attn.o_proj.weight"], attn)
        self.hidden += rms_norm(attn @ wo.T, self.t[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
        x = rms_norm(self.hidden, self.t[p + "pre_feedforward_layernorm.weight"], cfg.rms_norm_eps)
        wg, wu = self._quantized([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], x)
        act = (gelu_tanh(x @ wg.T) * (x @ wu.T)).astype(np.float32)
        (wd,) = self._quantized([p + "mlp.down_proj.weight"], act)
        self.hidden += rms_norm(act @ wd.T, self.t[p + "post_feedforward_layernorm.weight"], cfg.rms_norm_eps)

    def head_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        d = self.cfg.head_dim
        return rms_norm(x.reshape(*x.shape[:-1], -1, d), weight, self.cfg.rms_norm_eps).reshape(x.shape)


CALIBRATORS = {c.architecture: c for c in (LlamaCalibrator, Gemma3Calibrator)}


def calibrate_and_quantize(
    model: ImportedModel,
    tokens: np.ndarray,
    quantize: LinearQuantizer,
    include_head: bool = False,
    progress: Callable[[int], None] = lambda n: None,
    batch: int = 8,
) -> dict[str, QuantizedLinear]:
    """Quantize every linear layer of a Llama-style model, calibrated sequentially; returns {tensor name: layer}."""
    cal = LlamaCalibrator(model, tokens, quantize, batch)
    for i in range(model.config.num_layers):
        cal.layer(i)
        progress(1)
    if include_head:
        cal.head()
    return cal.results
