"""The memory model of generation: how many bytes each buffer of a plan takes, and the peak they reach together.

The planner needs a prediction it can trust before anything is allocated, so every term here is computed from the
shapes the runtime allocates, never from a measurement of a previous run. The exceptions have no shape and are
measured constants: the runtime's own resident set (what it imports, and its first session;
`measure_import_overhead` re-measures it), the fixed cost of a step (STEP_FIXED_BYTES) and the share of int weights
that ORT's prepack keeps a second copy of.

Terms, for a target model (and an optional draft) and a `Plan`:
- weights: the package's graph plus external data, as stored (int4 MatMulNBits or edge.QMatMul, or fp32); with
  paging only the pinned layers, the streaming window and the non-layer weights are resident. A paged package's
  embedding table is gathered through a memory map and never resident (`WeightLayout.embedding_resident`).
- KV cache: per layer two float32 buffers (1, num_kv_heads, L, head_dim), for the target and for the draft.
- logits: float32 (rows, vocab), rows = the tree's node count for the target (1 without a draft) and 1 for the draft.
- tree buffers: the verification step's attention bias (1, 1, w, L) float32 and position ids (1, w) int64, for a
  draft model's tree or a model-free drafter's (`Plan.draft_model`).
- activations: the largest single step (a prefill chunk, a verification step or a decode step of either model), in
  ORT's arena, plus the step's fixed cost and attention's tiles; see `activation_bytes`.
- overhead: the runtime's resident set.
- tokenizer: the target's loaded tokenizer, per vocabulary entry (packages only: a bare config has none).
- prepack: what ORT's prepack keeps after a session is created; it is not transient. Measured with RSS and
  /proc/self/smaps (onnxruntime 1.31.1, CPU, 2 threads) after creating a session and running one 16-token step with
  filled 256-token caches: an fp32 package holds only its tied embedding table twice (the Gemm packs a copy, the
  Gather reads the memory-mapped original); an int4 package ends 0.72 of its MatMulNBits bytes (the tied table
  included) above weights, buffers and runtime on SmolLM2-135M, hence INT_PREPACK_RATIO; edge.QMatMul prepacks
  nothing. `prepack_fraction` scales the term (1 by default; 0 for a CUDA device, which receives one copy).
- load peak: session creation, before any buffer: what the sessions hold, and for a paged float package with a tied
  table the table ORT reads before packing it (`WeightLayout.load_transient_bytes`), which can be the whole peak.

Each term against a fresh process's RSS (benchmarks/results/memory.terms.md, `python benchmarks/memory.py --terms`;
tests/test_budget.py and tests/test_paging.py assert them within 10%): SmolLM2-135M int4 session +4.1%, with 2048-token
caches +6.8%, step activations -2.3..+8.4% (S = 1..512); fp32 -0.5%, +0.4%, -2.6..+8.3%; paged (2 slots or all 30
layers pinned) fp32 +2.2% / +1.2%, int4 on edge.QMatMul +7.4% / +4.7%. Gemma 3 270M int4 on edge.QMatMul: paged +2.8%
/ +2.6%, resident with 2048-token caches +8.6% (peaks; not in the benchmark, which exports SmolLM2 only).

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

import numpy as np

from edge.config import ModelConfig
from edge.errors import EdgeError

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
FLOAT32 = 4
INT64 = 8
NBITS_BLOCK = 32  # MatMulNBits block size used by the exporter: one float32 scale and one zero point per 32 weights

# Measured on this project's CI machine (x86-64, Python 3.11, onnxruntime 1.31.1, numpy 2.4, tokenizers 0.23.3, onnx
# 1.23): what the runtime imports (edge.engine and edge.paging pull in numpy, onnxruntime, tokenizers, jinja2 and
# psutil; load_package imports onnx to check a graph's external-data paths) raised RSS from 13.2 to 67.3 MiB in a
# fresh process, and creating and running one small CPU session with 2 intra-op threads made it 75.1 MiB (three
# runs, +-0.1 MiB; a second session adds under 1 MiB). Rounded up to 76 MiB; `measure_import_overhead()` re-measures
# it. (Before onnx and edge's own modules were counted this was 60 MiB, and a paged int4 SmolLM2-135M, whose
# weights are small, was predicted 9-13% under its measured peak.)
IMPORT_BYTES = 68 * MiB  # the imports alone (67.3 MiB measured)
SESSION_RUNTIME_BYTES = 8 * MiB  # the first session's thread pool, allocator and environment (7.8 MiB measured)
# Right after `pip install` the same imports measured 93.6 MiB, not 75.3: 35.5 MiB anonymous either way, and 58.2
# against 39.9 MiB of file-backed library pages (freshly written files sit in the page cache in large folios, and a
# fault maps a whole folio). Dropping the page cache brings it back to 75.3. Not added to the prediction: it is
# reclaimable memory of a state that passes, and the budget tests' tolerance covers it.
FRESH_INSTALL_FILE_BYTES = 20 * MiB
RUNTIME_OVERHEAD_BYTES = IMPORT_BYTES + SESSION_RUNTIME_BYTES

# Resident bytes of a loaded tokenizer per vocabulary entry: edge.tokenizer.Tokenizer on SmolLM2's tokenizer.json
# (49,152-entry byte-level BPE with its merges, tokenizers 0.23.3) raised RSS by 39.2 MiB in a fresh process (32.4 MiB
# for tokenizers.Tokenizer.from_file alone). Not proportional to the file's size: the same vocabulary pretty-printed
# (3.5 MB instead of 1.6 MB) costs the same. Counted once per process (a draft shares the target's tokenizer).
# Since session 33 the tokenizer hands the parse's freed heap back (edge.memory.usage.release_free_heap): 14 MiB
# stay for SmolLM2 (Gemma 3, 262,144 entries: ~95 of ~290 MB). The term keeps the load's transient, an upper bound.
TOKENIZER_BYTES_PER_ENTRY = 840

# Extra resident bytes per MatMulNBits byte after ORT's prepack (SmolLM2-135M int4, accuracy_level 4: 59.9 MiB for
# 82.2 MiB; see the module docstring), rounded up.
INT_PREPACK_RATIO = 0.75

# RSS a step adds per byte of its largest live set of intermediates (see `activation_bytes`): ORT's BFC arena serves
# each tensor from the best-fitting free chunk, and chunks freed by one op seldom coalesce into the differently sized
# ones the next op asks for, so a step's arena ends up touching about twice its live set.
ARENA_GROWTH = 2

# What a step costs whatever its shape (onnxruntime 1.31.1, CPU): measured as the RSS the first step adds on the real
# SmolLM2-135M packages with every other buffer already written (tests/test_budget.py re-measures it). Almost all of it
# is file-backed: the code of the kernels the step runs (MatMulNBits, MLAS's SGEMM, GroupQueryAttention, ...), first
# touched by the first step; only ~0.14 MiB is anonymous (execution frame, the arena's first region, attention's
# workspace). Which code that is depends on the CPU, since MLAS picks its kernels by instruction set: on an AMD EPYC
# (Zen 3 and Zen 5) 1.88 MiB at S=1, the same within 0.1 MiB for int4 and fp32; on an Intel Xeon with AVX-512 VNNI
# (2026-11-25) int4 1.55-1.86 MiB and fp32 2.54-2.80 MiB over S = 1..512. It also depends on the page cache: right
# after the libraries are installed the kernel may map them in large folios at import, which makes the imports up to
# FRESH_INSTALL_FILE_BYTES larger and this part as small as 0.36 MiB. The constant is the largest seen, rounded up:
# a budget planned with it is never short, and over-predicting by ~1 MiB costs a plan nothing that matters.
STEP_FIXED_BYTES = 3 * MiB

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
    # False in a paged package: the runtime gathers rows through a memory map and the table never becomes resident
    # (a tied float head's Gemm holds its packed copy, counted in head_prepack_bytes; a low-bit head has its own copy)
    embedding_resident: bool = True
    # bytes onnxruntime reads while creating the sessions and drops once it has packed them: a paged package's tied
    # float table, which only the head's Gemm holds as an initializer (its packed copy is head_prepack_bytes)
    load_transient_bytes: int = 0
    # rotary cos/sin caches, part of head_bytes: max_context rows in the external data, memory-mapped, so a run
    # touches only the rows of the positions it uses (a paged package embeds them in its layer graph: all resident)
    rope_bytes: int = 0

    @property
    def resident_embedding_bytes(self) -> int:
        return self.embedding_bytes if self.embedding_resident else 0

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
            load_transient_bytes=int(self.load_transient_bytes * share),
            rope_bytes=int(self.rope_bytes * share),
        )


# Bytes of one group's statistics in edge.QMatMul: float32 scale and uint8 zero point; float16 scale and min (a Q4_1
# source); float16 scale and uint8 zero point (a calibrated head, export/quant/head.py)
STATS_F32_ZERO, STATS_F16_MIN, STATS_F16_ZERO = FLOAT32 + 1, 4, 3


def qmatmul_bytes(n_out: int, k_in: int, bits: int = 4, group: int = NBITS_BLOCK,
                  stat_bytes: int = STATS_F32_ZERO) -> int:
    """Bytes of one edge.QMatMul weight (kernels/pack.py): codes and `stat_bytes` per group, columns padded to tiles
    of 8."""
    n_pad, groups = -(-n_out // 8) * 8, -(-k_in // group)
    return n_pad * groups * group * bits // 8 + n_pad * groups * stat_bytes


def estimate_layout(config: ModelConfig, quant: str, kernels: str = "stock", paged: bool = False,
                    float16_stats: bool = False, embedding_bits: int | None = None,
                    calibrated_head: bool = False) -> WeightLayout:
    """Weight bytes the exporter writes for `config` in `quant`, tensor by tensor.

    In an integer format the linear layers (fused q/k/v, o, fused gate/up, down, an untied lm_head) are MatMulNBits and
    the embedding table is GatherBlockQuantized in the same layout; a tied lm_head reads that table (float: a Gemm on
    the float table). Used when only a config is known, and to split a package's real byte count into layers and the
    rest. It leaves out the external-data file's alignment padding (under 1% for SmolLM2-135M: the int4 package's
    89,193,957 bytes are estimated as 88.4 MB). calibrated_head: the head's own 4-bit weights with float16 scales
    (export/quant/head.py).
    """
    bits = _quant_bits(quant)
    h, inter = config.hidden_size, config.intermediate_size
    q_width, kv_width = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    linears = [(q_width, h), (kv_width, h), (kv_width, h), (h, q_width), (inter, h), (inter, h), (h, inter)]

    edge = bool(bits) and kernels == "edge"

    def linear_bytes(n_out: int, k_in: int, stat_bytes: int = STATS_F32_ZERO) -> int:
        if not bits:
            return n_out * k_in * FLOAT_BYTES[quant]
        return qmatmul_bytes(n_out, k_in, bits, stat_bytes=stat_bytes) if edge else matmul_nbits_bytes(n_out, k_in, bits)

    # float16_stats: the decoder's edge.QMatMul layers hold a float16 scale and min per group (a Q4_1 source; the
    # head, re-quantized from the embedding table, keeps float32 statistics unless calibrated)
    layer_linear = sum(linear_bytes(n, k, STATS_F16_MIN if float16_stats else STATS_F32_ZERO) for n, k in linears)
    head_stats = STATS_F16_ZERO if calibrated_head else STATS_F32_ZERO
    norms = (4 if config.architecture == "gemma3" else 2) * h + (2 * config.head_dim if config.qk_norm else 0)
    bias = (q_width + 2 * kv_width) if config.qkv_bias else 0
    # the table is always in the gather's layout (float, or MatMulNBits' for GatherBlockQuantized), at its own
    # width (embedding_bits: 8 keeps a Q8_0 table exactly)
    table_bits = embedding_bits or bits
    embedding = matmul_nbits_bytes(config.vocab_size, h, table_bits) if bits else linear_bytes(config.vocab_size, h)
    tied = config.tie_word_embeddings
    # a tied head reads the table itself, except edge.QMatMul, which needs its own copy in its layout
    head_linear = 0
    if not tied:
        head_linear = linear_bytes(config.vocab_size, h, head_stats)
    elif edge:
        head_linear = qmatmul_bytes(config.vocab_size, h, 4 if calibrated_head else table_bits, stat_bytes=head_stats)
    # Prepack: in an integer package every MatMulNBits weight (a tied lm_head reads the table itself once ORT drops
    # the no-op Reshape, as its optimized graph shows); in a float one MLAS packs MatMul weights in place of the
    # originals, but a tied table is packed for the Gemm and kept for the Gather.
    if edge:  # edge.QMatMul reads its packed inputs as they are: no prepack (kernels/README.md)
        layer_prepack = head_prepack = 0
    elif bits:
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
        embedding_resident=not paged,
        load_transient_bytes=embedding if paged and tied and not bits else 0,
        rope_bytes=0 if paged else rope,
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
    kernels: str = "stock"  # "edge": low-bit linears run edge.QMatMul (no prepack, a tied head has its own table)
    paged: bool = False  # a paged package (export/paged.py): layers can stream from disk, the table is memory-mapped
    int8_activations: bool = False  # quantized matmuls round their input to int8 (accuracy_level 4): a step's copy
    fused_mlp: bool = False  # act(gate) * up inside edge.QMatMul (its activation attribute): fewer live buffers
    pre_projections: bool = False  # o_proj, down_proj inside the edge.QMatMul after them (pre_K): more live per token
    float16_stats: bool = False  # edge.QMatMul layers with float16 (scale, min) per group (estimate_layout)
    embedding_bits: int | None = None  # the table's width when it differs from the linears' (8: a Q8_0 table)
    calibrated_head: bool = False  # the head's own GPTQ weights, float16 scales (estimate_layout)
    kv_bytes: int = FLOAT32  # bytes of one KV cache element: 2 for a package exported with kv_dtype float16

    @property
    def edge_attention(self) -> bool:
        """Attention runs edge.Attention (kernels/): every layer of an edge-kernels export."""
        return self.kernels == "edge"


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
        # the exporter's default: MatMulNBits at accuracy_level 4 for integer weights
        return cls(name=name, config=config, quant=quant, layout=layout, int8_activations=quant not in FLOAT_BYTES)

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
        graph = manifest.get("graph") if isinstance(manifest.get("graph"), dict) else {}
        # a draft head's graph is loaded only by the drafter that uses it (~8 MB for SmolLM2's): not the model's
        head = graph.get("draft_head", {}).get("file") if isinstance(graph.get("draft_head"), dict) else None
        weights = sum(size for file, size in sizes.items()
                      if file.endswith((".onnx", ".onnx.data")) and not (head and file.startswith(head)))
        if weights <= 0:
            raise BudgetError("the package manifest lists no .onnx or .onnx.data file: re-export the package")
        quant = _manifest_quant(manifest.get("quantization", manifest.get("quant"))) or _infer_quant(config, weights)
        name = name or manifest.get("name") or "model"
        kernels = "edge" if "edge" in graph.get("custom_ops", []) else "stock"
        paged = bool(manifest.get("paging"))
        record = manifest.get("quantization")
        float16_stats = isinstance(record, dict) and str(record.get("zero_points", "")).startswith("float16")
        embedding_bits = 8 if isinstance(record, dict) and "int8" in str(record.get("embedding", "")) else None
        calibrated_head = isinstance(record, dict) and isinstance(record.get("head"), dict)
        layout = estimate_layout(config, quant, kernels, paged, float16_stats, embedding_bits, calibrated_head)
        layout = _paged_layout(layout, manifest["paging"], weights) if paged else layout.scaled_to(weights)
        return cls(name=name, config=config, quant=quant, layout=layout, kernels=kernels, paged=paged,
                   has_tokenizer=any(file.endswith("tokenizer.json") for file in sizes),
                   int8_activations=_int8_activations(manifest, quant, kernels),
                   fused_mlp=bool(graph.get("fused_mlp", False)),
                   pre_projections=bool(graph.get("pre_projections", False)), float16_stats=float16_stats,
                   embedding_bits=embedding_bits, calibrated_head=calibrated_head,
                   kv_bytes=2 if graph.get("kv_dtype") == "float16" else FLOAT32)

    @classmethod
    def from_package(cls, path: str | Path) -> "ModelSpec":
        """A package folder on disk (reads its manifest.json)."""
        manifest_path = Path(path) / "manifest.json"
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise BudgetError(f"cannot read {manifest_path}: {exc}; pass an edge package folder") from exc
        return cls.from_manifest(manifest, name=Path(path).name)


def _paged_layout(estimate: WeightLayout, paging: dict[str, Any], total: int) -> WeightLayout:
    """A paged package's layout from its paging index, exactly: the layer stride, the embedding table's entries, and
    the rest (head, norms, the layer graphs with their rotary caches) as head bytes. Its weights are graph inputs, so
    only the head's tied float table is prepacked (the estimate says which)."""
    try:
        layer = int(paging["layer_bytes"])
        emb = paging["embedding"]
        parts = [emb[k] for k in ("qweight", "scales", "zero_points")] if "qweight" in emb else [emb]
        table = sum(math.prod(e["shape"]) * np.dtype(e["dtype"]).itemsize for e in parts)
    except (KeyError, TypeError, ValueError) as exc:
        raise BudgetError(f"the manifest's paging section is incomplete ({exc!r}): re-export the package") from exc
    head = total - estimate.num_layers * layer - table
    if head < 0:
        raise BudgetError("the manifest's paging section does not match its file sizes: re-export the package")
    transient = table if estimate.load_transient_bytes else 0
    return replace(estimate, layer_bytes=layer, embedding_bytes=table, head_bytes=head, layer_prepack_bytes=0,
                   head_prepack_bytes=table if estimate.head_prepack_bytes else 0, load_transient_bytes=transient)


def _int8_activations(manifest: dict[str, Any], quant: str, kernels: str) -> bool:
    """Whether the package's quantized matmuls run at accuracy_level 4 (int8 activations): as recorded in its graph
    or quantization entry, else the exporter's default (4 for MatMulNBits, 0 for edge.QMatMul)."""
    if quant in FLOAT_BYTES:
        return False
    graph = manifest.get("graph") if isinstance(manifest.get("graph"), dict) else {}
    quantization = manifest.get("quantization") if isinstance(manifest.get("quantization"), dict) else {}
    level = graph.get("accuracy_level", quantization.get("accuracy_level", 0 if kernels == "edge" else 4))
    return level == 4


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
    tokens in one target step (a chain is width 1: k drafted tokens, k + 1 rows). `draft_model` False: the tree comes
    from a model-free drafter (prompt lookup, token recycling), so only the target's verification buffers are
    needed, and `nodes` is the most the drafter may propose (the runtime's node cap). `resident_layers` None keeps all
    weights in memory; a number pins that many layers and streams the others from disk through `stream_window` slots.
    The KV buffers hold `context` tokens, so the runtime must stop (or slide) `nodes` tokens before the end.
    """

    context: int
    prefill_chunk: int = 512
    draft_len: int = 0
    tree_width: int = 1
    resident_layers: int | None = None
    stream_window: int = 2
    draft_model: bool = True

    def __post_init__(self) -> None:
        if self.context < 1 or self.prefill_chunk < 1 or self.draft_len < 0 or self.tree_width < 1:
            raise ValueError(f"invalid plan {self}")
        if self.resident_layers is not None and (self.resident_layers < 0 or self.stream_window < 1):
            raise ValueError(f"invalid paging window in plan {self}")

    @property
    def speculative(self) -> bool:
        return self.draft_len > 0

    @property
    def uses_draft_model(self) -> bool:
        return self.speculative and self.draft_model

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


# GroupQueryAttention's tiled attention (onnxruntime 1.31, CPU) sizes its tiles to the L2 cache: kv blocks of
# L2 / (32 * head_dim) rows, query blocks of at most 2 * head_dim rows. The L2 size is read from the OS; 2 MiB (a
# large L2 per core, so larger tiles) where it cannot be.
def _l2_cache_bytes(default: int = 2 * MiB) -> int:
    from pathlib import Path

    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip().upper()
                return int(size[:-1]) * (MiB if size.endswith("M") else KiB) if size[-1] in "KM" else int(size)
        except (OSError, ValueError):
            break
    return default


L2_CACHE_BYTES = _l2_cache_bytes()
DEFAULT_THREADS = 2


def attention_scratch_bytes(config: ModelConfig, tokens: int, context: int, threads: int = DEFAULT_THREADS,
                            l2_bytes: int = L2_CACHE_BYTES) -> int:
    """GroupQueryAttention's per-thread tile buffers: running max and sum per query row, one (q_block, kv_block)
    score tile and one (q_block, head_dim) output tile. It grows with the step's tokens up to 2 * head_dim query rows
    and then stays: what makes a mid-sized step (S=16..128) cost more per token than a long prefill chunk."""
    d = config.head_dim
    kv_block = max(1, min(l2_bytes // (FLOAT32 * 4 * 2 * d), context))
    q_block = min(tokens, 2 * d)
    return threads * q_block * (2 + kv_block + d) * FLOAT32


def activation_bytes(config: ModelConfig, tokens: int, context: int, full_scores: bool = False,
                     threads: int = DEFAULT_THREADS, int8_activations: bool = False,
                     edge_attention: bool = False, fused_mlp: bool = False, pre_projections: bool = False) -> int:
    """RSS one step over `tokens` new tokens attending to `context` positions adds: STEP_FIXED_BYTES plus the arena.

    Per token: ARENA_GROWTH x the MLP's peak live set, hidden + 4 intermediate float32 (the residual stream, the
    fused gate/up output and the two halves Split makes of it: the largest live set of a step, larger than
    attention's); GroupQueryAttention's own copies of q, k and v (unpacked and rotated, 2 x (heads + 2 kv heads) x
    head_dim float32: 1920 per token for SmolLM2-135M, against 1970 measured on the op alone); and with
    `int8_activations` (MatMulNBits' accuracy_level 4, or edge.QMatMul's) ARENA_GROWTH x the int8 copy of the widest
    matmul input, intermediate bytes plus a float32 scale per 32. It grows linearly with S, not in powers of two:
    the arena's regions double, but RSS counts only the pages a step writes. onnxruntime 1.31's
    GroupQueryAttention tiles attention, so there is no (num_heads, tokens, context) score buffer unless
    `full_scores` asks for one (a kernel that materialises scores); its tiles are `attention_scratch_bytes`.
    Without STEP_FIXED_BYTES and the tiles this term was 5-30% under for prefill chunks and almost all of a decode
    step's real cost.

    Measured RSS added by one step (a fresh process per S, caches written, P = L - S, 2 threads; the slopes, 57.1 and
    53.1 KB per token for int4 and fp32, are what separates the int8 copy), against this prediction: SmolLM2-135M
    int4 (MatMulNBits, level 4) S=1 1.9 MiB (+3.8%), S=16 3.0 (-0.3%), S=64 6.7 (-4.7%), S=128 10.5 (+3.4%), S=256
    17.7 (+6.2%), S=512 32.0 (+8.3%); fp32 S=1 2.0 (+0.3%), S=16 3.0 (-1.2%), S=64 6.1 (+0.9%), S=128 10.0 (+4.2%),
    S=256 17.1 (+4.9%), S=512 30.4 (+8.4%). The same at L=8192 and with 1 thread. Gemma 3 270M int4 S=512, L=2048
    50.9 (45.8, -10%): its extra norms (q/k norms, post-attention and post-MLP norms) are not counted (an open gap).
    `edge_attention` (edge.Attention) makes no copies and no tiles: one row of scores per thread. SmolLM2-135M on
    edge's kernels (level 4), arena (anonymous) part measured against predicted: S=16 0.75 MiB (0.89), S=64 3.2
    (3.5), S=128 4.8 (7.0), S=256 9.9 (14.0), S=512 21.0 (28.0): over, on the safe side, for S >= 128, where its
    arena grows ~41 KB per token instead of ~52. `fused_mlp` (the gated activation inside edge.QMatMul) leaves
    hidden + 2 intermediate live (the op's output, and the down projection's copy of it): measured S=16 0.47 MiB
    (0.52), S=64 1.36 (2.09), S=128 3.45 (4.17), S=256 5.5 (8.3), S=512 11.6 (16.7), ~24 KB per token.
    `pre_projections` (kernels/graph.py: fuse_pre_projections) keeps the gated output live into the next layer's
    q/k/v node, beside that node's outputs: measured (session 37, whole step against the same graph without the
    pass, arena part) S=16 +0.08 MiB, S=128 +1.0 MiB, S=512 +0.0; counted as the q/k/v row more per token.
    """
    mlp = config.hidden_size + (2 if fused_mlp else 4) * config.intermediate_size
    if pre_projections:
        mlp += (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    attention_copies = 0 if edge_attention else 2 * (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    per_token = (ARENA_GROWTH * mlp + attention_copies) * FLOAT32
    if int8_activations:
        per_token += ARENA_GROWTH * config.intermediate_size * (1 + FLOAT32 / NBITS_BLOCK)
    scores = config.num_heads * tokens * context * FLOAT32 if full_scores else 0
    if edge_attention:
        scratch = threads * (context + config.head_dim) * FLOAT32
    else:
        scratch = 0 if full_scores else attention_scratch_bytes(config, tokens, context, threads)
    return STEP_FIXED_BYTES + int(tokens * per_token) + scores + scratch


def untouched_rope_bytes(spec: ModelSpec, context: int) -> int:
    """Rows of the rotary caches past `context`: memory-mapped and never read, so never resident."""
    return int(spec.layout.rope_bytes * max(0.0, 1 - context / spec.config.max_context))


def resident_weights(spec: ModelSpec, context: int) -> int:
    """A resident model's weight bytes that a run at `context` makes resident."""
    layout = spec.layout
    return layout.total - layout.embedding_bytes + layout.resident_embedding_bytes - untouched_rope_bytes(spec, context)


class MemoryModel:
    """Predicts each term of a plan for a target package and an optional draft package."""

    def __init__(self, target: ModelSpec, draft: ModelSpec | None = None, *,
                 overhead_bytes: int = RUNTIME_OVERHEAD_BYTES, prepack_fraction: float | None = None,
                 full_scores: bool = False, threads: int = DEFAULT_THREADS, weights_at_load: bool | None = None):
        self.target = target
        # edge.QMatMul packages: whether the CPU kernels copy the linears' weights into 2 MB pages as the session is
        # created (resident from then on) or read onnxruntime's memory map from the first step; None: as this
        # machine does (edge.kernels.library.huge_pages_enabled). Either way the run peak holds them.
        if weights_at_load is None:
            from edge.kernels.library import huge_pages_enabled

            weights_at_load = huge_pages_enabled()
        self.weights_at_load = weights_at_load
        self.threads = threads  # onnxruntime intra-op threads: attention keeps one set of tiles per thread
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
            return resident_weights(self.target, plan.context)
        head = layout.head_bytes - untouched_rope_bytes(self.target, plan.context)
        return layout.resident_embedding_bytes + head + self._resident_layers(plan) * layout.layer_bytes

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
        specs = [self.target] + ([self.draft] if plan.uses_draft_model else [])
        tokens = [chunk, plan.nodes, 1]
        return max(activation_bytes(m.config, s, L, full, self.threads, m.int8_activations, m.edge_attention,
                                    m.fused_mlp, m.pre_projections)
                   for m in specs for s in tokens)

    def estimate(self, plan: Plan) -> MemoryEstimate:
        if plan.uses_draft_model and self.draft is None:
            raise ValueError("a speculative plan with a draft model needs a draft model (or draft_model=False)")
        draft = self.draft if plan.uses_draft_model else None
        weights_t = self.weights_target(plan)
        weights_d = resident_weights(draft, plan.context) if draft else 0
        kv_t = kv_cache_bytes(self.target.config, plan.context, self.target.kv_bytes)
        kv_d = kv_cache_bytes(draft.config, plan.context, draft.kv_bytes) if draft else 0
        logits = logits_bytes(plan.nodes, self.target.config.vocab_size)
        logits += logits_bytes(1, draft.config.vocab_size) if draft else 0
        tree = tree_buffer_bytes(plan.nodes, plan.context) if plan.speculative else 0
        activations = self._activations(plan)
        prepack = self.prepack(self.target, self._resident_layers(plan)) + (self.prepack(draft) if draft else 0)
        # Sessions are created before any buffer is allocated; the load peak is kept apart because it is what a
        # runtime without buffers (or edge-profile's first phase) sees, and because a paged float package's load
        # briefly holds its tied table twice (read, then packed), which can outweigh a small streaming plan.
        tokenizer = self.target.tokenizer_bytes
        resident = self.overhead_bytes + tokenizer + weights_d + prepack
        # A paged package's sessions hold only the head: pinned layers and the window's slots are read after them.
        # edge.QMatMul packages whose kernels read the memory map hold only the embedding table
        # (GatherBlockQuantized's) and the rotary caches: onnxruntime memory-maps the external data and, with nothing
        # to prepack, first touches the linears' weights in the first step (measured: SmolLM2-135M int4 on edge's
        # kernels, 94.5 MiB after session creation, 75.1 MiB predicted without those two; 20.4 MB apart, which they
        # are to the byte). Copied into 2 MB pages (weights_at_load), they are all resident at once.
        layout = self.target.layout
        if self.target.kernels == "edge" and not self.weights_at_load:
            in_sessions = layout.resident_embedding_bytes + layout.rope_bytes
        elif self.target.paged:
            in_sessions = layout.head_bytes + layout.resident_embedding_bytes
        else:
            in_sessions = weights_t
        load_peak = resident + in_sessions + layout.load_transient_bytes
        run_peak = resident + weights_t + kv_t + kv_d + logits + tree + activations
        return MemoryEstimate(
            weights_target=weights_t, weights_draft=weights_d, kv_target=kv_t, kv_draft=kv_d, logits=logits,
            tree_buffers=tree, activations=activations, overhead=self.overhead_bytes,
            prepack=prepack, load_peak=load_peak, run_peak=run_peak, tokenizer=tokenizer)


_MEASURE_OVERHEAD = """
import numpy as np, onnx, onnxruntime as ort, psutil
import edge.engine, edge.paging
from onnx import TensorProto, helper
graph = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g',
                          [helper.make_tensor_value_info('x', TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info('y', TensorProto.FLOAT, [4])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 21)], ir_version=10)
options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(model.SerializeToString(), options, providers=['CPUExecutionProvider'])
session.run(None, {'x': np.ones(4, np.float32)})
print(psutil.Process().memory_info().rss)
"""


def measure_import_overhead() -> int:
    """RSS in bytes of a fresh Python process after importing what the runtime imports and running one small
    session (needs psutil): what RUNTIME_OVERHEAD_BYTES stands for."""
    code = _MEASURE_OVERHEAD
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return int(result.stdout.strip())
