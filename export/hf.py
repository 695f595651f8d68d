"""Import a Hugging Face model folder (config.json + *.safetensors + tokenizer files) into edge's ImportedModel.

Only safetensors are read (never pickle). The files are memory-mapped and each tensor is converted to float32 on
first access; bfloat16, which numpy lacks, is widened bit-wise. Gemma stores its RMSNorm weights as w in
`x * (1 + w)`, so 1 is added here to hand the builder the effective multiplier like every other architecture.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edge.config import ModelConfig
from edge.errors import ModelFormatError
from edge.export.source import ImportedModel, LazyTensors, SpecialTokens

# HF model_type -> edge architecture
HF_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gemma3_text": "gemma3"}

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


def load_hf(folder: str | os.PathLike[str]) -> ImportedModel:
    """Read a transformers model folder of a supported architecture."""
    folder = Path(folder)
    raw = _read_json(folder / "config.json", required=True)
    model_type = raw.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise ModelFormatError(
            f"{folder}: model_type {model_type!r} is not supported; edge imports {sorted(HF_MODEL_TYPES)}"
        )
    config = _config(raw, model_type)
    tensors = _tensors(folder, config)
    tokenizer_json = _read_text(folder / "tokenizer.json")
    tok_config = _read_json(folder / "tokenizer_config.json") or {}
    return ImportedModel(
        config=config,
        tensors=tensors,
        tokenizer_json=tokenizer_json,
        special_tokens=_special_tokens(folder, raw, tok_config, tokenizer_json),
        chat_template=_chat_template(folder, tok_config),
        source={"format": "hf", "path": str(folder.resolve()), "model_type": model_type,
                "name": raw.get("_name_or_path") or folder.name},
    )


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ModelFormatError(f"{path.parent}: {path.name} is missing; a model folder needs config.json, "
                               "*.safetensors and tokenizer.json")
    return path.read_text(encoding="utf-8")


def _read_json(path: Path, required: bool = False) -> dict[str, Any] | None:
    if not path.is_file() and not required:
        return None
    try:
        return json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ModelFormatError(f"{path}: not valid JSON ({exc})") from exc


def _rope(raw: dict[str, Any], layer_type: str) -> dict[str, Any]:
    """transformers 5 nests rope settings in rope_parameters (per layer type for Gemma 3); older configs don't."""
    params = raw.get("rope_parameters") or {}
    if layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    return dict(params)


def _rope_scaling(rope: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any] | None:
    scaling = raw.get("rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
    kind = scaling.get("rope_type") or scaling.get("type")
    if not kind or kind == "default":
        return None
    return {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": kind}


def _config(raw: dict[str, Any], model_type: str) -> ModelConfig:
    try:
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        arch = HF_MODEL_TYPES[model_type]
        full = _rope(raw, "full_attention")
        config = ModelConfig(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            max_context=int(raw["max_position_embeddings"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(full.get("rope_theta", raw.get("rope_theta", 10000.0))),
            rope_scaling=_rope_scaling(full, raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", model_type == "gemma3_text")),
            qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
        )
    except KeyError as exc:
        raise ModelFormatError(f"config.json lacks {exc.args[0]!r}, which edge needs") from exc
    if model_type == "mistral" and raw.get("sliding_window"):
        config.extra["sliding_window"] = int(raw["sliding_window"])  # Mistral v0.1 only; all layers
    if arch == "gemma3":
        _gemma3_config(config, raw)
    return config


def _gemma3_config(config: ModelConfig, raw: dict[str, Any]) -> None:
    config.hidden_act = "gelu_tanh"
    config.embedding_scale = config.hidden_size**0.5
    config.qk_norm = True
    config.sliding_window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if layer_types and "full_attention" in layer_types:
        config.sliding_window_pattern = layer_types.index("full_attention") + 1
    else:
        pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern")
        config.sliding_window_pattern = int(pattern or 6)
    local = _rope(raw, "sliding_attention")
    config.rope_local_theta = float(local.get("rope_theta", raw.get("rope_local_base_freq", 10000.0)))
    scalar = raw.get("query_pre_attn_scalar")
    if scalar and float(scalar) != config.head_dim:
        config.query_scale = float(scalar) ** -0.5


def _tensors(folder: Path, config: ModelConfig) -> LazyTensors:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{folder}: no *.safetensors files (edge never loads pickled .bin weights)")
    gemma = config.architecture == "gemma3"
    loaders: dict[str, Callable[[], np.ndarray]] = {}
    for file in files:
        for name, (offset, dtype, shape) in _safetensors_index(file).items():
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue
            add_one = gemma and name.endswith("norm.weight")
            loaders[name] = _loader(file, offset, dtype, shape, add_one)
    if "model.embed_tokens.weight" not in loaders:
        raise ModelFormatError(f"{folder}: model.embed_tokens.weight is missing from the safetensors files")
    if "lm_head.weight" not in loaders:
        config.tie_word_embeddings = True
    return LazyTensors(loaders)


def _safetensors_index(file: Path) -> dict[str, tuple[int, str, tuple[int, ...]]]:
    """name -> (absolute byte offset, dtype, shape), from the file's JSON header."""
    try:
        with open(file, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_len))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{file}: not a readable safetensors file ({exc})") from exc
    size = file.stat().st_size
    base = 8 + header_len
    index = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if info["dtype"] not in _SAFETENSORS_DTYPES or base + end > size:
            raise ModelFormatError(f"{file}: tensor {name} has dtype {info['dtype']} or lies past the end of the file")
        index[name] = (base + start, info["dtype"], tuple(info["shape"]))
    return index


def _loader(file: Path, offset: int, dtype: str, shape: tuple[int, ...], add_one: bool) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        count = int(np.prod(shape)) if shape else 1
        raw = np.memmap(file, dtype=_SAFETENSORS_DTYPES[dtype], mode="r", offset=offset, shape=(count,))
        if dtype == "BF16":
            array = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            array = np.array(raw, dtype=np.float32)
        array = array.reshape(shape)
        return array + np.float32(1.0) if add_one else array

    return load


def _token_id(tokenizer_json: dict[str, Any], token: Any) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    if not token:
        return None
    for added in tokenizer_json.get("added_tokens", []):
        if added.get("content") == token:
            return int(added["id"])
    vocab = tokenizer_json.get("model", {}).get("vocab")
    return vocab.get(token) if isinstance(vocab, dict) else None


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _special_tokens(folder: Path, raw: dict, tok_config: dict, tokenizer_json: str) -> SpecialTokens:
    doc = json.loads(tokenizer_json)
    generation = _read_json(folder / "generation_config.json") or {}
    bos = _token_id(doc, tok_config.get("bos_token"))
    if bos is None:
        bos = next(iter(_ids(generation.get("bos_token_id")) or _ids(raw.get("bos_token_id"))), None)
    eos_ids: list[int] = []
    for candidate in [_token_id(doc, tok_config.get("eos_token"))] + _ids(generation.get("eos_token_id")) + _ids(
        raw.get("eos_token_id")
    ):
        if candidate is not None and candidate not in eos_ids:
            eos_ids.append(candidate)
    add_bos = tok_config.get("add_bos_token")
    if add_bos is None:
        add_bos = bos is not None and _post_processor_adds(doc, bos)
    pad = _token_id(doc, tok_config.get("pad_token"))
    return SpecialTokens(bos_token_id=bos, eos_token_ids=eos_ids, pad_token_id=pad, add_bos=bool(add_bos))


def _post_processor_adds(doc: dict[str, Any], bos: int) -> bool:
    """Whether tokenizer.json's own post-processor prepends BOS (Llama 3 and Gemma files say so only there)."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_str(json.dumps(doc)).encode("a", add_special_tokens=True).ids
    return bool(ids) and ids[0] == bos


def _chat_template(folder: Path, tok_config: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template or None
