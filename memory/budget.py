"""The memory model of generation: how many bytes each buffer of a plan takes, and the peak they reach together.

The planner needs a prediction it can trust before anything is allocated, so every term here is computed from the
shapes the runtime allocates, never from a measurement of a previous run. Two exceptions have no shape and are
measured constants: the runtime's own resident set (Python, numpy, onnxruntime, tokenizers; `measure_import_overhead`
re-measures it) and the share of int weights that ORT's prepack keeps a second copy of.

Terms, for a target model (and an optional draft) and a `Plan`:
- weights: the package's graph plus external data, as stored (int4 MatMulNBits or fp32); with paging only the pinned
  layers, the streaming window and the non-layer weights are resident.
- KV cache: per layer two float32 buffers (1, num_kv_heads, L, head_dim), for the target and for the draft.
- logits: float32 (rows, vocab), rows = the tree's node count for the target (1 without a draft) and 1 for the draft.
- tree buffers: the verification step's attention bias (1, 1, w, L) float32 and position ids (1, w) int64.
- activations: the largest single step (a prefill chunk, a verification step or a decode step of either model), in
  ORT's arena; see `activation_bytes`.
- overhead: the runtime's resident set.
- tokenizer: the target's loaded tokenizer, per vocabulary entry (packages only: a bare config has none).
- prepack: what ORT's prepack keeps after a session is created; it is not transient. Measured with RSS and
  /proc/self/smaps (onnxruntime 1.31.1, CPU, 2 threads) after creating a session and running one 16-token step with
  filled 256-token caches: an fp32 package holds only its tied embedding table twice (the Gemm packs a copy, the
  Gather reads the memory-mapped original); an int4 package ends 0.72 of its MatMulNBits bytes (the tied table
  included) above weights, buffers and runtime on SmolLM2-135M, hence INT_PREPACK_RATIO. Predicted against measured
  peak RSS: SmolLM2-135M int4 219.3 / 217.1 MiB (+1.0%, the calibration point), fp32 695.4 / 709.8 MiB (-2.0%);
  Gemma 3 270M (not used for calibration) int4 422.1 / 395.8 MiB (+6.6%), fp32 1797.9 / 1754.9 MiB (+2.4%).
  `prepack_fraction` scales the term (1 by default; 0 for a CUDA device, which receives one copy).

RSS counts a buffer's pages only once they are written: compare against a measurement at a full context (or after
filling the caches), since the KV terms are the committed size.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from edge.config import ModelConfig
from edge.errors import EdgeError

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
FLOAT32 = 4
INT64 = 8
NBITS_BLOCK = 32  # MatMulNBits block size used by the exporter: one float32 scale and one zero point per 32 weights

# Measured on this project's CI machine (x86-64, Python 3.11, onnxruntime 1.31.1, numpy 2.4, tokenizers 0.23.3):
# `import numpy, onnxruntime, tokenizers` in a fresh process raised RSS from 13.2 to 49.8 MiB (three runs, +-0.2 MiB),
# and creating and running one small CPU session with 2 intra-op threads added 8.8 MiB (68.6 MiB in all with onnx
# imported, which the runtime does not import). Rounded up to 60 MiB; `measure_import_overhead()` re-measures it.
RUNTIME_OVERHEAD_BYTES = 60 * MiB

# Resident bytes of a loaded tokenizer per vocabulary entry: edge.tokenizer.Tokenizer on SmolLM2's tokenizer.json
# (49,152-entry byte-level BPE with its merges, tokenizers 0.23.3) raised RSS by 39.2 MiB in a fresh process (32.4 MiB
# for tokenizers.Tokenizer.from_file alone). Not proportional to the file's size: the same vocabulary pretty-printed
# (3.5 MB instead of 1.6 MB) costs the same. Counted once per process (a draft shares the target's tokenizer).
TOKENIZER_BYTES_PER_ENTRY = 840

# Extra resident bytes per MatMulNBits byte after ORT's prepack (SmolLM2-135M int4, accuracy_level 4: 59.9 MiB for
# 82.2 MiB; see the module docstring), rounded up.
INT_PREPACK_RATIO = 0.75

# onnxruntime's BFC arena extends itself by doubling, so its footprint is up to twice the live intermediate tensors.
ARENA_GROWTH = 2

# Bytes per weight of the float formats a package may store.
FLOAT_BYTES = {"fp32": 4, "fp16": 2}

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
    "k": KiB, "m": MiB, "g": GiB, "t": TiB,  # bare letters read as binary units, like `free` and docker do
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


class BudgetError(EdgeError):
    """A memory budget is malformed or too small for the model."""


def parse_size(size: str | int | float) -> int:
    """Bytes in a size such as 2GiB, 512MB, 1.5 GB or 1048576 (decimal KB/MB/GB, binary KiB/MiB/GiB and K/M/G)."""
    if isinstance(size, bool):
        raise BudgetError(f"a memory size must be a number of bytes or a string like '2GiB', not {size!r}")
    if isinstance(size, (int, float)):
        value, unit = float(size), ""
    else:
        match = _SIZE_RE.match(str(size))
        if not match or match.group(2).lower() not in _SIZE_UNITS:
            raise BudgetError(
                f"cannot read memory size {size!r}: write a number with an optional unit, e.g. '2GiB', '512MB', "
                f"'1.5GB' or '1073741824' (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
        value, unit = float(match.group(1)), match.group(2).lower()
    if not math.isfinite(value) or value <= 0:
        raise BudgetError(f"a memory size must be positive, got {size!r}")
    return int(value * _SIZE_UNITS[unit])


def format_bytes(n: int | float) -> str:
    """A size for people: 1.50 GiB, 312.0 MiB, 512 B."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def matmul_nbits_bytes(n_out: int, k_in: int, bits: int = 4, block: int = NBITS_BLOCK) -> int:
    """Bytes of one MatMulNBits weight: the packed blob, a float32 scale per block and packed uint8 zero points."""
    blocks = -(-k_in // block)
    blob = n_out * blocks * (block * bits // 8)
    scales = n_out * blocks * FLOAT32
    zero_points = n_out * -(-blocks * bits // 8)
    return blob + scales + zero_points


def _quant_bits(quant: str) -> int | None:
    """Bits of an integer format ("int4" -> 4), None for a float format."""
    if quant in FLOAT_BYTES:
        return None
    match = re.fullmatch(r"int(2|4|8)", quant)
    if not match:
        raise BudgetError(f"unknown weight format {quant!r}: use one of int2, int4, int8, fp16, fp32")
    return int(match.group(1))


@dataclass(frozen=True)
class WeightLayout:
    """Where a package's weight bytes sit: what paging can move to disk and what ORT prepacks."""

    num_layers: int
    layer_bytes: int  # one decoder layer
    embedding_bytes: int  # token embedding table (a Gather reads one row per token)
    head_bytes: int  # lm_head, final norm and the graph itself
    layer_prepack_bytes: int  # bytes of one layer that ORT's prepack holds a second copy of
    head_prepack_bytes: int
    embedding_is_head: bool = False  # tied: the lm_head reads the whole table every step

    @property
    def total(self) -> int:
        return self.num_layers * self.layer_bytes + self.embedding_bytes + self.head_bytes

    @property
    def prepack_bytes(self) -> int:
        return self.num_layers * self.layer_prepack_bytes + self.head_prepack_bytes

    def scaled_to(self, total: int) -> "WeightLayout":
        """The same proportions, summing exactly to a package's real byte count."""
        estimate = self.total
        if estimate <= 0:
            raise BudgetError("cannot size a model with no weights")
        share = total / estimate
        layer = int(self.layer_bytes * share)
        embedding = int(self.embedding_bytes * share)
        return replace(
            self,
            layer_bytes=layer,
            embedding_bytes=embedding,
            head_bytes=total - self.num_layers * layer - embedding,
            layer_prepack_bytes=min(layer, int(self.layer_prepack_bytes * share)),
            head_prepack_bytes=int(self.head_prepack_bytes * share),
        )


def estimate_layout(config: ModelConfig, quant: str) -> WeightLayout:
    """Weight bytes the exporter writes for `config` in `quant`, tensor by tensor.

    In an integer format the linear layers (fused q/k/v, o, fused gate/up, down, an untied lm_head) are MatMulNBits and
    the embedding table is GatherBlockQuantized in the same layout; a tied lm_head reads that table (float: a Gemm on
    the float table). Used when only a config is known, and to split a package's real byte count into layers and the
    rest. It leaves out the external-data file's alignment padding (under 1% for SmolLM2-135M: the int4 package's
    89,193,957 bytes are estimated as 88.4 MB).
    """
    bits = _quant_bits(quant)
    h, inter = config.hidden_size, config.intermediate_size
    q_width, kv_width = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    linears = [(q_width, h), (kv_width, h), (kv_width, h), (h, q_width), (inter, h), (inter, h), (h, inter)]

    def linear_bytes(n_out: int, k_in: int) -> int:
        return matmul_nbits_bytes(n_out, k_in, bits) if bits else n_out * k_in * FLOAT_BYTES[quant]

    layer_linear = sum(linear_bytes(n, k) for n, k in linears)
    norms = (4 if config.architecture == "gemma3" else 2) * h + (2 * config.head_dim if config.qk_norm else 0)
    bias = (q_width + 2 * kv_width) if config.qkv_bias else 0
    embedding = linear_bytes(config.vocab_size, h)
    tied = config.tie_word_embeddings
    head_linear = 0 if tied else linear_bytes(config.vocab_size, h)
    # Prepack: in an integer package every MatMulNBits weight (a tied lm_head reads the table itself once ORT drops
    # the no-op Reshape, as its optimized graph shows); in a float one MLAS packs MatMul weights in place of the
    # originals, but a tied table is packed for the Gemm and kept for the Gather.
    if bits:
        layer_prepack = round(layer_linear * INT_PREPACK_RATIO)
        head_prepack = round((embedding if tied else head_linear) * INT_PREPACK_RATIO)
    else:
        layer_prepack, head_prepack = 0, embedding if tied else 0
    # rotary cos and sin caches (max_context, head_dim / 2) float32, one pair per rope base (Gemma 3 has two)
    rope_bases = 2 if config.rope_local_theta and config.sliding_window else 1
    rope = rope_bases * 2 * config.max_context * (config.head_dim // 2) * FLOAT32
    return WeightLayout(
        num_layers=config.num_layers,
        layer_bytes=layer_linear + (norms + bias) * FLOAT32,
        embedding_bytes=embedding,
        head_bytes=head_linear + h * FLOAT32 + rope,
        layer_prepack_bytes=layer_prepack,
        head_prepack_bytes=head_prepack,
        embedding_is_head=tied,
    )


def _file_sizes(files: Any) -> dict[str, int]:
    """{name: bytes} from a manifest's file list, whichever of the usual shapes it has."""
    if isinstance(files, dict):
        items = files.items()
    elif isinstance(files, list):
        items = [(f.get("path") or f.get("name"), f) for f in files]
    else:
        raise BudgetError("the manifest's 'files' must map file names to byte sizes")
    sizes = {}
    for name, entry in items:
        size = entry.get("bytes", entry.get("size")) if isinstance(entry, dict) else entry
        if not isinstance(name, str) or not isinstance(size, int):
            raise BudgetError(f"the manifest's file entry {name!r} has no byte size: re-export the package")
        sizes[name] = size
    return sizes


@dataclass(frozen=True)
class ModelSpec:
    """What the memory model needs to know about one package: its shapes and how many weight bytes it stores."""

    name: str
    config: ModelConfig
    quant: str
    layout: WeightLayout
    has_tokenizer: bool = False  # a package with a tokenizer file: the runtime loads it (see TOKENIZER_BYTES_PER_ENTRY)

    @property
    def tokenizer_bytes(self) -> int:
        return self.config.vocab_size * TOKENIZER_BYTES_PER_ENTRY if self.has_tokenizer else 0

    @property
    def weight_bytes(self) -> int:
        return self.layout.total

    @property
    def bytes_read_per_token(self) -> int:
        """Weight bytes a decode step streams from memory: all of them, but only one row of an untied embedding."""
        if self.layout.embedding_is_head:
            return self.weight_bytes
        return self.weight_bytes - self.layout.embedding_bytes + self.config.hidden_size * FLOAT32

    @classmethod
    def from_config(cls, config: ModelConfig, quant: str = "int4", weight_bytes: int | None = None,
                    name: str = "model") -> "ModelSpec":
        """A model known only by its config; `weight_bytes` (e.g. a synthetic package's size) overrides the estimate."""
        layout = estimate_layout(config, quant)
        if weight_bytes is not None:
            layout = layout.scaled_to(int(weight_bytes))
        return cls(name=name, config=config, quant=quant, layout=layout)

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], name: str | None = None) -> "ModelSpec":
        """A package from its manifest: `config`, the byte size of every file, and the weight format if recorded."""
        if "config" not in manifest or "files" not in manifest:
            raise BudgetError("the package manifest has no 'config' or 'files': re-export the package with edge-export")
        config = manifest["config"]
        if not isinstance(config, ModelConfig):
            try:
                config = ModelConfig.from_dict(config)
            except (TypeError, ValueError) as exc:
                raise BudgetError(f"the manifest's config is not a model config ({exc}): re-export the package") from exc
        sizes = _file_sizes(manifest["files"])
        weights = sum(size for file, size in sizes.items() if file.endswith((".onnx", ".onnx.data")))
        if weights <= 0:
            raise BudgetError("the package manifest lists no .onnx or .onnx.data file: re-export the package")
        quant = _manifest_quant(manifest.get("quantization", manifest.get("quant"))) or _infer_quant(config, weights)
        name = name or manifest.get("name") or "model"
        return cls(name=name, config=config, quant=quant, layout=estimate_layout(config, quant).scaled_to(weights),
                   has_tokenizer=any(file.endswith("tokenizer.json") for file in sizes))

    @classmethod
    def from_package(cls, path: str | Path) -> "ModelSpec":
        """A package folder on disk (reads its manifest.json)."""
        manifest_path = Path(path) / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise BudgetError(f"cannot read {manifest_path}: {exc}; pass an edge package folder") from exc
        return cls.from_manifest(manifest, name=Path(path).name)


def _manifest_quant(entry: Any) -> str | None:
    """The weight format a manifest records: "int4", or the exporter's {"method": ..., "bits": 4, ...} table."""
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("bits"), int):
        bits = entry["bits"]
        if bits in (32, 16):
            return f"fp{bits}"
        return f"int{4 if bits == 3 else bits}"  # 3-bit codes are stored in 4-bit slots
    raise BudgetError(f"the manifest's quantization entry {entry!r} has no 'bits': re-export the package")


def _infer_quant(config: ModelConfig, weight_bytes: int) -> str:
    """int4 or fp32, whichever estimate the stored byte count is closer to (for manifests that do not say)."""
    int4, fp32 = estimate_layout(config, "int4").total, estimate_layout(config, "fp32").total
    return "int4" if abs(math.log(weight_bytes / int4)) < abs(math.log(weight_bytes / fp32)) else "fp32"


@dataclass(frozen=True)
class Plan:
    """The choices that fix every buffer's size.

    A draft of `draft_len` levels with `tree_width` candidates per level verifies `nodes` = 1 + draft_len * tree_width
    tokens in one target step (a chain is width 1: k drafted tokens, k + 1 rows). `resident_layers` None keeps all
    weights in memory; a number pins that many layers and streams the others from disk through `stream_window` slots.
    The KV buffers hold `context` tokens, so the runtime must stop (or slide) `nodes` tokens before the end.
    """

    context: int
    prefill_chunk: int = 512
    draft_len: int = 0
    tree_width: int = 1
    resident_layers: int | None = None
    stream_window: int = 2

    def __post_init__(self) -> None:
        if self.context < 1 or self.prefill_chunk < 1 or self.draft_len < 0 or self.tree_width < 1:
            raise ValueError(f"invalid plan {self}")
        if self.resident_layers is not None and (self.resident_layers < 0 or self.stream_window < 1):
            raise ValueError(f"invalid paging window in plan {self}")

    @property
    def speculative(self) -> bool:
        return self.draft_len > 0

    @property
    def nodes(self) -> int:
        return 1 + self.draft_len * self.tree_width


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted bytes per term; `peak` is the larger of session creation and generation."""

    weights_target: int
    weights_draft: int
    kv_target: int
    kv_draft: int
    logits: int
    tree_buffers: int
    activations: int
    overhead: int
    prepack: int  # ORT's packed second copy of weights, target and draft
    load_peak: int
    run_peak: int
    tokenizer: int = 0  # the target's loaded tokenizer (runtime, not weights); part of both peaks

    @property
    def peak(self) -> int:
        return max(self.load_peak, self.run_peak)

    @property
    def generation_bytes(self) -> int:
        """Everything but weights and the runtime: what a plan, rather than the model, costs."""
        return self.kv_target + self.kv_draft + self.logits + self.tree_buffers + self.activations

    def terms(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"peak": self.peak}

    def table(self) -> str:
        """The terms one per line, for edge-profile and error messages."""
        return "\n".join(f"  {name:<15}{format_bytes(value):>12}" for name, value in self.terms().items())


def kv_cache_bytes(config: ModelConfig, context: int, dtype_bytes: int = FLOAT32) -> int:
    """Two (1, num_kv_heads, context, head_dim) buffers per layer."""
    return config.kv_bytes_per_token(dtype_bytes) * context


def logits_bytes(rows: int, vocab_size: int) -> int:
    return rows * vocab_size * FLOAT32


def tree_buffer_bytes(nodes: int, context: int) -> int:
    """Attention bias (1, 1, nodes, context) float32 and position ids (1, nodes) int64 of a verification step."""
    return nodes * context * FLOAT32 + nodes * INT64


def activation_bytes(config: ModelConfig, tokens: int, context: int, full_scores: bool = False) -> int:
    """Intermediate tensors of one step over `tokens` new tokens attending to `context` positions.

    The live tensors of a step are about tokens x (4 hidden + 3 intermediate + q/k/v widths) float32; ORT's CPU arena
    grows in powers of two, so it holds up to ARENA_GROWTH times that. onnxruntime 1.31's GroupQueryAttention tiles
    attention (flash style), so there is no (num_heads, tokens, context) score buffer unless `full_scores` asks for
    one (a kernel that materialises scores). Measured peak RSS added by one step, arena on, 2 threads, caches full
    (P = L - S): SmolLM2-135M int4 S=512 32.5 MiB at L=2048 and 32.6 at L=8192 (30.8 predicted), S=128 11.5 (7.7);
    Gemma 3 270M int4 S=512, L=2048 50.9 (40.0).
    """
    per_token = (config.hidden_size * 4 + 3 * config.intermediate_size
                 + (config.num_heads + 2 * config.num_kv_heads) * config.head_dim)
    scores = config.num_heads * tokens * context if full_scores else 0
    return (ARENA_GROWTH * tokens * per_token + scores) * FLOAT32


class MemoryModel:
    """Predicts each term of a plan for a target package and an optional draft package."""

    def __init__(self, target: ModelSpec, draft: ModelSpec | None = None, *,
                 overhead_bytes: int = RUNTIME_OVERHEAD_BYTES, prepack_fraction: float | None = None,
                 full_scores: bool = False):
        self.target = target
        self.full_scores = full_scores  # True for an attention kernel that materialises (heads, S, L) scores
        self.draft = draft
        self.overhead_bytes = overhead_bytes
        self.prepack_fraction = 1.0 if prepack_fraction is None else prepack_fraction

    @classmethod
    def from_manifests(cls, target: dict[str, Any], draft: dict[str, Any] | None = None,
                       **options: Any) -> "MemoryModel":
        return cls(ModelSpec.from_manifest(target), ModelSpec.from_manifest(draft) if draft else None, **options)

    def _paged(self, plan: Plan) -> bool:
        return plan.resident_layers is not None and plan.resident_layers < self.target.config.num_layers

    def weights_target(self, plan: Plan) -> int:
        layout = self.target.layout
        if not self._paged(plan):
            return layout.total
        return layout.embedding_bytes + layout.head_bytes + self._resident_layers(plan) * layout.layer_bytes

    def disk_bytes_per_pass(self, plan: Plan) -> int:
        """Weight bytes read from disk for every forward pass of the target (0 when all layers are resident)."""
        if not self._paged(plan):
            return 0
        return (self.target.config.num_layers - plan.resident_layers) * self.target.layout.layer_bytes

    def _resident_layers(self, plan: Plan) -> int:
        layers = self.target.config.num_layers
        if not self._paged(plan):
            return layers
        return plan.resident_layers + min(plan.stream_window, layers - plan.resident_layers)

    def prepack(self, spec: ModelSpec, resident_layers: int | None = None) -> int:
        """Packed copies ORT holds for one model's resident sessions."""
        layout = spec.layout
        layers = layout.num_layers if resident_layers is None else resident_layers
        return int((layers * layout.layer_prepack_bytes + layout.head_prepack_bytes) * self.prepack_fraction)

    def _activations(self, plan: Plan) -> int:
        L, chunk, full = plan.context, min(plan.prefill_chunk, plan.context), self.full_scores
        configs = [self.target.config] + ([self.draft.config] if plan.speculative else [])
        tokens = [chunk, plan.nodes, 1]
        return max(activation_bytes(c, s, L, full) for c in configs for s in tokens)

    def estimate(self, plan: Plan) -> MemoryEstimate:
        if plan.speculative and self.draft is None:
            raise ValueError("a speculative plan needs a draft model")
        draft = self.draft if plan.speculative else None
        weights_t = self.weights_target(plan)
        weights_d = draft.weight_bytes if draft else 0
        kv_t = kv_cache_bytes(self.target.config, plan.context)
        kv_d = kv_cache_bytes(draft.config, plan.context) if draft else 0
        logits = logits_bytes(plan.nodes, self.target.config.vocab_size)
        logits += logits_bytes(1, draft.config.vocab_size) if draft else 0
        tree = tree_buffer_bytes(plan.nodes, plan.context) if draft else 0
        activations = self._activations(plan)
        prepack = self.prepack(self.target, self._resident_layers(plan)) + (self.prepack(draft) if draft else 0)
        # Sessions are created before any buffer is allocated, so generation always holds the larger peak; the load
        # peak is kept apart because it is what a runtime without buffers (or edge-profile's first phase) sees.
        tokenizer = self.target.tokenizer_bytes
        load_peak = self.overhead_bytes + tokenizer + weights_t + weights_d + prepack
        run_peak = load_peak + kv_t + kv_d + logits + tree + activations
        return MemoryEstimate(
            weights_target=weights_t, weights_draft=weights_d, kv_target=kv_t, kv_draft=kv_d, logits=logits,
            tree_buffers=tree, activations=activations, overhead=self.overhead_bytes,
            prepack=prepack, load_peak=load_peak, run_peak=run_peak, tokenizer=tokenizer)


def measure_import_overhead() -> int:
    """RSS in bytes of a fresh Python process after importing numpy, onnxruntime and tokenizers (needs psutil)."""
    code = ("import psutil, numpy, onnxruntime, tokenizers; "
            "print(psutil.Process().memory_info().rss)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return int(result.stdout.strip())
