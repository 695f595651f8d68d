"""The skip-layer self-draft (SWIFT/Kangaroo style): the target's own layers, some skipped, plus its head, as a draft.

The draft is a second graph in the package (draft_skip.onnx) over a subset of the layers. It references the bytes the
target's graph already wrote to model.onnx.data, so the package holds the weights once. Which layers to keep is
chosen by measurement, never by a fixed rule:

1. Calibration: a few windows of the calibration text (export/quant/calibration_text.py, never benchmark prompts),
   each continued greedily by the target. Speculative decoding drafts the target's own output, so agreement is
   scored on that continuation: a candidate "agrees" at a position when its argmax, teacher-forced on the same
   tokens with its own KV cache, equals the target's.
2. Candidates: Kangaroo's "first N layers + head" for a grid of N; each layer skipped alone (which ranks the layers by
   how little the output depends on them), then SWIFT-style subsets that skip the n least needed layers of that
   ranking for a grid of n.
3. Choice: the candidate with the best predicted speed-up: agreement a per token, draft cost f per token (its share of
   the weights read per token), and the target's measured cost v(S) of verifying S tokens give, at draft depth d,
   (1 - a^(d+1)) / (1 - a) tokens per v(d+1) + d f. The record (all candidates, the choice, the calibration text's
   sha256) goes into the manifest; the runtime's adaptive policy still switches the draft off where it loses.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edge.config import ModelConfig
from edge.errors import EdgeError, PackageError
from edge.export.builder import BuildOptions, DecoderBuilder, SharedExternalData
from edge.export.source import ImportedModel
from edge.package import Package, load_package, write_manifest

DRAFT_FILE = "draft_skip.onnx"
KEEP_RATIOS = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
DEFAULT_VERIFY = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.3, 16: 1.8}  # float32 on a 2-core CPU (shared/notes/peers.md)


@dataclass
class Candidate:
    family: str  # "prefix" (first N layers), "skip-one" (leave-one-out), "skip" (ranked subset), "given"
    layers: tuple[int, ...]
    agreement: float = 0.0
    cost: float = 1.0  # draft step / target step, by weights read per token
    depth: int = 0  # draft depth of the best predicted speed-up
    speedup: float = 0.0

    def record(self) -> dict[str, Any]:
        return {"family": self.family, "layers": list(self.layers), "agreement": round(self.agreement, 4),
                "cost": round(self.cost, 4), "depth": self.depth, "predicted_speedup": round(self.speedup, 3)}


# -- cost model ----------------------------------------------------------------------------------------------------
def layer_params(cfg: ModelConfig) -> int:
    """Weights one decoder layer reads per token (attention + MLP projections)."""
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return cfg.hidden_size * (2 * q + 2 * kv) + 3 * cfg.hidden_size * cfg.intermediate_size


def cost_fraction(cfg: ModelConfig, layers: Sequence[int]) -> float:
    """A draft step's cost relative to a target step: decoding reads every weight once per token, so the ratio of
    weights read (kept layers plus the output head) is what a memory-bound step's time scales with."""
    head = cfg.vocab_size * cfg.hidden_size
    per_layer = layer_params(cfg)
    return (head + len(layers) * per_layer) / (head + cfg.num_layers * per_layer)


def expected_speedup(agreement: float, cost: float, verify: Callable[[int], float],
                     max_depth: int = 8) -> tuple[int, float]:
    """(best depth >= 1, tokens per second relative to plain decoding) of a chain draft with per-token acceptance
    `agreement`; verify(S) is the cost of a target call over S tokens relative to S=1. Below 1: drafting loses at
    every depth (the runtime's adaptive policy then leaves it off), and the value says by how much."""
    a = min(agreement, 0.999)
    best = (0, 0.0)
    for d in range(1, max_depth + 1):
        tokens = (1 - a ** (d + 1)) / (1 - a)
        gain = tokens * verify(1) / (verify(d + 1) + d * cost * verify(1))
        if gain > best[1]:
            best = (d, gain)
    return best


def default_verify(tokens: int) -> float:
    sizes = sorted(DEFAULT_VERIFY)
    return float(np.interp(tokens, sizes, [DEFAULT_VERIFY[s] for s in sizes]))


# -- building graphs -----------------------------------------------------------------------------------------------
def linked_copy(package_dir: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """A copy of a package folder made of hard links where the filesystem allows (no second copy of the weights on
    disk), to add a self-draft to without touching the original: adding one replaces files, never writes into them."""
    src, dest = Path(package_dir), Path(dest)
    if dest.exists():
        raise PackageError(f"{dest} already exists; choose another folder")
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("."):
            try:
                os.link(f, tmp / f.name)
            except OSError:  # another filesystem
                shutil.copy2(f, tmp / f.name)
    os.replace(tmp, dest)
    return dest


def package_build_options(package: Package) -> BuildOptions:
    """The options the package's graph was built with, as far as the manifest records them: the draft graph must
    re-create the same tensors to reference them (fp32 and RTN int4; calibrated methods need their calibration)."""
    from edge.export.pipeline import build_options

    quant = package.manifest.get("quantization", {})
    method = quant.get("method")
    rtn4 = (method == "rtn" and quant.get("bits") == 4 and quant.get("block_size") == 32
            and quant.get("zero_points", "uint8") == "uint8" and "head" not in quant
            and quant.get("embedding", "GatherBlockQuantized") in ("GatherBlockQuantized", "GatherBlockQuantized int4"))
    if method != "fp32" and not rtn4:
        raise EdgeError(f"{package.root} holds {method} weights ({quant}); a skip-layer self-draft can be added to "
                        f"fp32 and default int4 (RTN, uint8 zero points, --head rtn) packages only, whose tensors it "
                        f"re-creates to share them")
    name = "fp32" if method == "fp32" else "int4"
    options, _ = build_options(name, package.tree_attention)
    return dataclasses.replace(options, kernels="edge" if "edge" in package.custom_ops else "stock",
                               kv_dtype=package.kv_dtype)


def memoized(quantizer):
    """The quantizer, each layer quantized once however many candidate graphs are built."""
    if quantizer is None:
        return None
    cache: dict[str, Any] = {}

    def quantize(name: str, w: np.ndarray):
        if name not in cache:
            cache[name] = quantizer(name, w)
        return cache[name]

    return quantize


class SubsetWriter:
    """Writes graphs over subsets of the layers into the package folder, sharing the target's weights file."""

    def __init__(self, package: Package, tensors, options: BuildOptions):
        self.package, self.tensors = package, tensors
        self.options = dataclasses.replace(options, quantizer=memoized(options.quantizer))
        self.shared = SharedExternalData.from_graph(package.graph_path)

    def write(self, layers: Sequence[int], file: str) -> Path:
        """Build the graph over `layers` and save it as `file` (a temporary name first, renamed into place)."""
        options = dataclasses.replace(self.options, layers=tuple(layers))
        model = DecoderBuilder(self.package.config, self.tensors, self.shared, options).build()
        path = self.package.root / file
        tmp = path.with_name(f".{path.name}.tmp")
        onnx.save_model(model, tmp)
        os.replace(tmp, path)
        return path


# -- measuring -----------------------------------------------------------------------------------------------------
def greedy_continuations(package: Package, prompts: np.ndarray, new_tokens: int,
                         threads: int | None) -> np.ndarray:
    """Each prompt followed by the target's own greedy continuation: the text a drafter has to predict."""
    from edge.model import Decoder

    decoder = Decoder(package, context_length=prompts.shape[1] + new_tokens, threads=threads)
    out = []
    for prompt in prompts:
        decoder.reset()
        ids = [int(t) for t in prompt]
        logits = decoder.prefill(ids)
        for _ in range(new_tokens):
            ids.append(int(np.argmax(logits)))
            logits = decoder.step([ids[-1]])[0]
        out.append(ids)
    return np.asarray(out, dtype=np.int64)


def teacher_forced_argmax(package: Package, sequences: np.ndarray, threads: int | None,
                          rows: int = 64) -> np.ndarray:
    """The argmax after every prefix of each sequence, fed `rows` tokens per step from an empty cache."""
    from edge.model import Decoder

    decoder = Decoder(package, context_length=sequences.shape[1], threads=threads, max_rows=rows)
    out = np.empty(sequences.shape, dtype=np.int64)
    for n, seq in enumerate(sequences):
        decoder.reset()
        for s in range(0, len(seq), rows):
            chunk = seq[s:s + rows]
            out[n, s:s + len(chunk)] = decoder.step(chunk, logits_rows=list(range(len(chunk)))).argmax(axis=-1)
    return out


class Calibration:
    """Calibration windows, the target's continuation of each, and the target's predictions over it."""

    def __init__(self, package: Package, sequences: int = 4, prompt_len: int = 48, new_tokens: int = 64,
                 threads: int | None = None):
        from edge.export.quant.calibration_text import token_sequences
        from edge.tokenizer import Tokenizer

        encode = Tokenizer(package.tokenizer_path).encode
        prompts, self.meta = token_sequences(lambda text: encode(text, add_special_tokens=False), "calibration",
                                             sequences, prompt_len)
        self.threads = threads
        self.sequences = greedy_continuations(package, prompts, new_tokens, threads)
        self.scored = slice(prompt_len - 1, prompt_len - 1 + new_tokens)  # predictions of the continuation
        self.target = teacher_forced_argmax(package, self.sequences, threads)[:, self.scored]
        self.meta.update({"continuation_tokens": new_tokens})

    def agreement(self, draft: Package) -> float:
        predicted = teacher_forced_argmax(draft, self.sequences, self.threads)[:, self.scored]
        return float((predicted == self.target).mean())


def select_layers(package: Package, writer: SubsetWriter, calibration: Calibration,
                  verify: Callable[[int], float] = default_verify, max_depth: int = 8,
                  progress: Callable[[str], None] = lambda s: None) -> tuple[Candidate, list[Candidate]]:
    """Measure the candidate families (module docstring) and return the best one and all that were measured."""
    cfg = package.config
    n_layers = cfg.num_layers
    if n_layers < 2:
        raise EdgeError(f"{package.root} has {n_layers} layer; a skip-layer draft needs at least 2")
    tmp = f".candidate-{os.getpid()}.onnx"
    measured: dict[tuple[int, ...], Candidate] = {}

    def measure(family: str, layers: Sequence[int]) -> Candidate:
        layers = tuple(layers)
        if layers not in measured:
            writer.write(layers, tmp)
            c = Candidate(family, layers, calibration.agreement(package.graph_view(tmp, len(layers))),
                          cost_fraction(cfg, layers))
            c.depth, c.speedup = expected_speedup(c.agreement, c.cost, verify, max_depth)
            measured[layers] = c
            progress(f"{family} {len(layers)}/{n_layers} layers: agreement {c.agreement:.3f}, cost {c.cost:.2f}, "
                     f"predicted x{c.speedup:.2f} at depth {c.depth}")
        return measured[layers]

    try:
        keep_counts = sorted({min(max(round(n_layers * r), 1), n_layers - 1) for r in KEEP_RATIOS})
        for n in keep_counts:
            measure("prefix", range(n))
        alone = [measure("skip-one", [j for j in range(n_layers) if j != i]) for i in range(n_layers)]
        ranking = [i for _, i in sorted(((-c.agreement, i) for i, c in enumerate(alone)))]  # least needed first
        for n in keep_counts:
            measure("skip", sorted(ranking[n_layers - n:]))
    finally:
        (package.root / tmp).unlink(missing_ok=True)
    candidates = list(measured.values())
    return max(candidates, key=lambda c: (c.speedup, c.agreement, -c.cost)), candidates


# -- the package step ------------------------------------------------------------------------------------------------
def add_skip_draft(package_dir: str | os.PathLike, model: ImportedModel, layers: Sequence[int] | None = None,
                   threads: int | None = None, verify: Callable[[int], float] | None = None,
                   calibration: dict[str, int] | None = None,
                   progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Add draft_skip.onnx to the package exported from `model`, choosing its layers by measurement unless `layers`
    is given; returns the record written to the manifest's graph.self_draft."""
    package = load_package(package_dir, verify=False)
    if _canonical(model.config) != _canonical(package.config):
        raise PackageError(f"{package.root} was not exported from this model (their configurations differ); pass "
                           f"the GGUF or Hugging Face model the package was exported from")
    if layers is not None:
        layers = check_layers(package.config, layers)
    writer = SubsetWriter(package, model.tensors, package_build_options(package))
    if verify is None:
        verify = measured_verify_cost(package, threads)
    calib = Calibration(package, threads=threads, **(calibration or {}))
    if layers is None:
        chosen, candidates = select_layers(package, writer, calib, verify, progress=progress)
    else:
        chosen = candidates_for_given(package, writer, calib, layers, verify)
        candidates = [chosen]
    writer.write(chosen.layers, DRAFT_FILE)
    record = {"file": DRAFT_FILE, "layers": list(chosen.layers), "chosen": chosen.record(),
              "candidates": [c.record() for c in candidates], "calibration": calib.meta,
              "verify_cost": {str(s): round(verify(s), 3) for s in (1, 2, 4, 8)}}
    manifest = dict(package.manifest)
    manifest["graph"] = dict(manifest["graph"], self_draft=record)
    write_manifest(package.root, {k: v for k, v in manifest.items() if k != "files"})
    return record


def check_layers(cfg: ModelConfig, layers: Sequence[int]) -> list[int]:
    """A user's layer list: distinct indices of existing layers, at least one skipped."""
    kept = sorted(set(int(i) for i in layers))
    if not kept or kept[0] < 0 or kept[-1] >= cfg.num_layers or len(kept) != len(list(layers)):
        raise EdgeError(f"the self-draft's layers must be distinct indices in 0..{cfg.num_layers - 1}, got "
                        f"{list(layers)}")
    if len(kept) == cfg.num_layers:
        raise EdgeError("the self-draft must skip at least one layer, or it costs as much as the model")
    return kept


def _canonical(config: ModelConfig) -> str:
    return json.dumps(config.to_dict(), sort_keys=True)


def candidates_for_given(package: Package, writer: SubsetWriter, calibration: Calibration, layers: Sequence[int],
                         verify: Callable[[int], float]) -> Candidate:
    """Measure a subset the caller chose, for the record."""
    tmp = f".candidate-{os.getpid()}.onnx"
    try:
        writer.write(layers, tmp)
        c = Candidate("given", tuple(layers), calibration.agreement(package.graph_view(tmp, len(layers))),
                      cost_fraction(package.config, layers))
    finally:
        (package.root / tmp).unlink(missing_ok=True)
    c.depth, c.speedup = expected_speedup(c.agreement, c.cost, verify)
    return c


def measured_verify_cost(package: Package, threads: int | None) -> Callable[[int], float]:
    """The target's cost of verifying S tokens relative to 1, measured here (the runtime measures its own)."""
    from edge.model import Decoder
    from edge.speculative.adaptive import CostCurve

    decoder = Decoder(package, context_length=min(package.config.max_context, 256), threads=threads)
    curve = CostCurve.measure(decoder, sizes=(1, 2, 4, 8), past=min(128, decoder.context_length - 16), repeats=3)
    return lambda s: curve(s) / curve(1)
