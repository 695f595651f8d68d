"""llama.cpp's own prompt-lookup decoding on the speculative benchmark's prompts: the peer row for issue 4.

    python benchmarks/llamacpp_lookup.py [--tokens 96] [--reps 2] [--threads 2] [--pred-tokens 2 3 ... 10]

llama-cpp-python (an optional benchmark dependency, never a CI one) loads the default model's GGUF (Q4_1) with
2 threads. Each prompt of benchmarks/speculative.py, rendered by edge's chat template and tokenized by edge's
tokenizer (so llama.cpp sees exactly our prompt ids), runs greedy plain decoding and `LlamaPromptLookupDecoding`
with each draft length, interleaved prompt by prompt and rotated each rep so a noisy neighbour hits all alike.
edge's own decoding of the default package, plain and with `edge-run --draft auto`'s speculation, runs on the same
prompts in the same run. A second turn's first answer is each system's own greedy answer, as speculative.py does for
each target.
Writes benchmarks/results/speculative_llamacpp.md.

llama-cpp-python builds llama.cpp from source; build the wheel once (2-20 min on 2 cores, by machine) and reuse it:

    CMAKE_ARGS="-DGGML_CUDA=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
      -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF" CMAKE_BUILD_PARALLEL_LEVEL=2 \
      nice -n 19 pip wheel --no-cache-dir --no-deps -w ~/.cache/edge/wheels llama-cpp-python==0.3.36
    pip install ~/.cache/edge/wheels/llama_cpp_python-0.3.36-*.whl

On a CPU without AVX-VNNI or AVX-512 BF16 (`grep -o 'avx_vnni\|avx512_bf16' /proc/cpuinfo`), set that flag OFF.

speculative.py can add llama.cpp rows to its own table with `run(CATEGORIES, tokens)` (rows in its format).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # speculative.py is a script beside this one

LIBRARY_DEFAULT_PRED_TOKENS = 10  # LlamaPromptLookupDecoding(num_pred_tokens=10), max_ngram_size=2
SWEEP_PRED_TOKENS = tuple(range(2, 11))
TARGET = "llama.cpp Q4_1"
WHEEL_HINT = ("llama-cpp-python is not installed: build it once and install the cached wheel, see the docstring of "
              "benchmarks/llamacpp_lookup.py (pip install ~/.cache/edge/wheels/llama_cpp_python-*.whl)")

BUILD_NOTE = (
    "llama-cpp-python 0.3.36 (the newest on PyPI) builds with cmake 3.25 and GCC 12.2 in about 2 min on 2 cores of "
    "an AMD EPYC Zen 5 (10 min on the Intel Xeon of earlier sessions). On that Xeon a `-DGGML_NATIVE=ON` build "
    "crashed on the first matmul (SIGSEGV, a general-protection fault at `ldtilecfg` in `ggml_backend_amx_mul_mat`): "
    "-march=native turns on ggml's AMX backend there, and GCC drops the stores that fill the tile configuration on "
    "the stack before `_tile_loadconfig` (llama.cpp issue #20824, fix proposed in PR #26954). The wheel is therefore "
    "built with GGML_NATIVE=OFF and AVX, AVX2, FMA, F16C, BMI2, AVX-VNNI, AVX-512 (F/CD/VL/DQ/BW, VBMI, VNNI, BF16) "
    "on and AMX off, the instructions both machines have; it is cached in ~/.cache/edge/wheels (it needs AVX-512). "
    "The Xeon of session 17 exposes neither AVX-VNNI nor AVX-512 BF16: there the wheel was built with those two off "
    "(12 min).")

Turns = Sequence[tuple[str, str | None]]
Encoder = Callable[[list[dict]], list[int]]


def available() -> bool:
    """Whether llama-cpp-python can be imported (speculative.py skips the llama.cpp rows otherwise)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def _llama_cpp():
    # libgomp reads this when llama.cpp loads it. Its default (active) wait makes 2 threads spin at every barrier;
    # on 2 cores shared with other jobs that measured 4 tok/s against 47 tok/s passive (1 thread: 50 tok/s).
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    try:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding
    except ImportError as exc:
        raise ImportError(WHEEL_HINT) from exc
    return llama_cpp, LlamaDraftModel, LlamaPromptLookupDecoding


@dataclass
class Counted:
    """One llama.cpp generation: its tokens, decode speed and, with a drafter, how its target calls went."""

    ids: list[int]
    seconds: float  # from the first generated token to the last (prefill and first sample excluded)
    verify_calls: int = 0  # target calls after the prompt, each over the last token plus its draft
    drafted: int = 0

    @property
    def tps(self) -> float:
        """Decode tok/s over the n-1 tokens after the first (llama.cpp yields the first right after prefill)."""
        return (len(self.ids) - 1) / self.seconds if len(self.ids) > 1 and self.seconds > 0 else 0.0

    @property
    def per_call(self) -> float:
        return (len(self.ids) - 1) / self.verify_calls if self.verify_calls else 1.0

    @property
    def mean_rows(self) -> float:
        """Tokens per verify call: the last accepted token plus its draft."""
        return (self.verify_calls + self.drafted) / self.verify_calls if self.verify_calls else 1.0

    def modelled(self, curve: Callable[[float], float]) -> float:
        """Speed over plain decoding that llama.cpp's own step-cost curve predicts from this run's verify calls
        (verify cost only): the neighbours' load moves it far less than the measured ratio."""
        return self.per_call * curve(1) / curve(self.mean_rows) if self.verify_calls else 1.0

    @property
    def acceptance(self) -> float | None:
        if not self.drafted:
            return None
        accepted = max(0, len(self.ids) - 1 - self.verify_calls)  # each verify call yields accepted + 1 tokens
        return min(1.0, accepted / self.drafted)


@dataclass
class LlamaCpp:
    """One plain and one lookup llama.cpp context over the same GGUF, so the plain one keeps llama.cpp's plain
    settings (logits of the last row only) while the lookup one gets the all-rows logits its drafter needs."""

    gguf: Path
    threads: int = 2
    context: int = 1024  # the lookup context keeps all-rows logits: n_ctx x 49152 floats
    eos: frozenset[int] = frozenset()
    _plain: object = field(init=False, repr=False)
    _lookup: object = field(init=False, repr=False)

    def __post_init__(self):
        llama_cpp, draft_base, lookup = _llama_cpp()
        common = dict(model_path=str(self.gguf), n_ctx=self.context, n_threads=self.threads,
                      n_threads_batch=self.threads, verbose=False, seed=0)
        self._plain = llama_cpp.Llama(**common)
        self._lookup = llama_cpp.Llama(**common, draft_model=lookup(num_pred_tokens=LIBRARY_DEFAULT_PRED_TOKENS))
        self.eos = frozenset(self.eos) | {self._plain.token_eos()}
        self.version = llama_cpp.__version__

        class Counting(draft_base):
            """LlamaPromptLookupDecoding that counts its calls: each is followed by one target call."""

            def __init__(self, inner):
                self.inner, self.calls, self.drafted = inner, 0, 0

            def __call__(self, input_ids, /, **kwargs):
                draft = self.inner(input_ids, **kwargs)
                self.calls += 1
                self.drafted += len(draft)
                return draft

        self._counting, self._lookup_class = Counting, lookup

    def generate(self, ids: list[int], new_tokens: int, pred_tokens: int | None = None,
                 sampling: dict | None = None) -> Counted:
        """Greedy decoding of `ids` from an empty cache; `pred_tokens` turns on prompt lookup with that draft length.
        sampling: llama.cpp's sampler settings (temp, top_k, top_p, ...) instead of greedy, every other sampler off."""
        if pred_tokens is None:
            llm, drafter = self._plain, None
        else:
            llm = self._lookup
            drafter = llm.draft_model = self._counting(self._lookup_class(num_pred_tokens=pred_tokens))
        llm.reset()  # no prefix reuse across runs: every run prefills its whole prompt
        out: list[int] = []
        start = None
        settings = dict(temp=0.0, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0)
        gen = llm.generate(ids, **{**settings, **(sampling or {})}, reset=True)
        try:
            for token in gen:
                if start is None:
                    start = time.perf_counter()
                if token in self.eos:
                    break
                out.append(int(token))
                if len(out) >= new_tokens:
                    break
        finally:
            gen.close()
        seconds = time.perf_counter() - start if start is not None else 0.0
        if drafter is None:
            return Counted(out, seconds)
        return Counted(out, seconds, drafter.calls, drafter.drafted)

    def top2_gap(self, ids: list[int], plain_ids: list[int], position: int) -> float:
        """Top-2 logit gap of plain decoding (prompt prefill, then one token per step) before generated token
        `position`: how near a tie the token was that the multi-token verify step flipped."""
        llm = self._plain
        llm.reset()
        llm.eval(ids)
        for t in plain_ids[:position]:
            llm.eval([t])
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))
        top = np.sort(logits)[-2:]
        llm.reset()
        return float(top[1] - top[0])

    def step_costs(self, ids: list[int], sizes: Sequence[int], repeats: int = 7) -> dict[int, float]:
        """Seconds of one verify call over k tokens after the prompt `ids`, on the lookup context (all-rows logits,
        as llama-cpp-python verifies drafts): medians of `repeats` rounds, the sizes interleaved in each round."""
        llm = self._lookup
        llm.reset()
        llm.eval(ids)
        base, times = llm.n_tokens, {k: [] for k in sizes}
        filler = (ids * (max(sizes) // len(ids) + 1))[: max(sizes)]
        for _ in range(repeats):
            for k in sizes:
                start = time.perf_counter()
                llm.eval(filler[:k])  # eval first drops cache entries past n_tokens, so each call starts at base
                times[k].append(time.perf_counter() - start)
                llm.n_tokens = base
        llm.reset()
        return {k: statistics.median(v) for k, v in times.items()}

    def tokenize(self, text: str) -> list[int]:
        return self._plain.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def edge_encoder(package=None) -> tuple[Encoder, Callable[[list[int]], str], frozenset[int]]:
    """Render messages with edge's chat template and tokenize with edge's tokenizer (the engine's own prompt ids),
    without loading an ONNX session; also the detokenizer and EOS ids."""
    from edge.chat_template import ChatTemplate
    from edge.default_model import default_package
    from edge.package import load_package
    from edge.tokenizer import Tokenizer

    pkg = package or load_package(default_package("int4"), verify=False)
    special = pkg.special_tokens
    tok = Tokenizer(pkg.tokenizer_path, bos_token_id=special.get("bos_token_id"),
                    eos_token_ids=special.get("eos_token_ids", []), pad_token_id=special.get("pad_token_id"),
                    add_bos=special.get("add_bos", False))
    bos = tok.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None else None
    eos = tok.id_to_token(tok.eos_token_ids[0]) if tok.eos_token_ids else None
    template = ChatTemplate(pkg.chat_template, bos_token=bos, eos_token=eos)

    def encode(messages: list[dict]) -> list[int]:
        return tok.encode(template.render(messages, add_generation_prompt=True), add_special_tokens=False)

    return encode, tok.decode, frozenset(tok.eos_token_ids)


def as_messages(turns: Turns | list[dict], answer: Callable[[list[dict]], str]) -> list[dict]:
    """speculative.py's turns ((role, content) with None for "the model's own answer") as chat messages."""
    messages: list[dict] = []
    for turn in turns:
        role, content = (turn["role"], turn["content"]) if isinstance(turn, dict) else turn
        if content is None:
            content = answer(messages)
        messages.append({"role": role, "content": content})
    return messages


def geomean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def measure(prompts_by_category: dict[str, list], new_tokens: int, *, threads: int = 2, reps: int = 1,
            pred_tokens: Sequence[int] = (LIBRARY_DEFAULT_PRED_TOKENS,), extra: dict | None = None,
            gguf: Path | None = None, log=sys.stderr) -> tuple[list[dict], list[tuple], dict]:
    """All runs, interleaved per prompt: rows in speculative.py's format, near-ties where lookup output differed
    from plain output, and facts about the run. `extra` maps a name to a callable (turns, new_tokens) -> tok/s
    measured in the same rotation (edge's own plain decoding in main())."""
    from edge.default_model import default_gguf

    encode, decode, eos = edge_encoder()
    llm = LlamaCpp(Path(gguf or default_gguf()), threads=threads, eos=eos)
    facts = {"llama_cpp_version": llm.version, "prompt_ids_match": True,
             "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    llm.generate(encode([{"role": "user", "content": "Hello"}]), 8)  # warm up both contexts
    llm.generate(encode([{"role": "user", "content": "Hello"}]), 8, pred_tokens=LIBRARY_DEFAULT_PRED_TOKENS)
    curve = cost_curve(llm, encode, prompts_by_category, max(pred_tokens) + 1)
    facts["curve"] = {k: curve(k) for k in range(1, max(pred_tokens) + 2)}
    print("llama.cpp verify cost relative to 1 token: "
          + ", ".join(f"{k}: {v:.2f}x" for k, v in facts["curve"].items()), file=log)
    variants: list[int | None] = [None, *pred_tokens]
    rows, ties = [], []
    for category, prompts in prompts_by_category.items():
        for turns in prompts:
            messages = as_messages(turns, lambda m: decode(llm.generate(encode(m), new_tokens).ids))
            ids = encode(messages)
            text = decode(ids, skip_special_tokens=False)
            facts["prompt_ids_match"] &= llm.tokenize(text) == ids
            runs: dict = {v: [] for v in variants}
            others: dict = {name: [] for name in (extra or {})}
            order = [*variants, *others]
            for rep in range(reps):
                for v in order[rep % len(order):] + order[: rep % len(order)]:
                    if v in others:
                        others[v].append(extra[v](turns, new_tokens))
                    else:
                        runs[v].append(llm.generate(ids, new_tokens, v))
            plain = runs[None][0]
            plain_tps = statistics.median(r.tps for r in runs[None])
            for v in variants:
                first = runs[v][0]
                tps = statistics.median(r.tps for r in runs[v])
                same = all(r.ids == plain.ids for r in runs[v])
                name = "plain" if v is None else f"prompt-lookup n={v}"
                rows.append({"target": TARGET, "category": category, "variant": name, "tps": tps,
                             "ratio": tps / plain_tps, "same": same, "accept": first.acceptance,
                             "per_call": first.per_call, "modelled": first.modelled(curve),
                             "drafted": first.drafted})
                if not same:
                    other = next(r for r in runs[v] if r.ids != plain.ids)
                    pos = first_difference(plain.ids, other.ids)
                    ties.append((TARGET, category, name, pos, llm.top2_gap(ids, plain.ids, pos)))
                print(f"{TARGET} {category:20s} {name:22s} {tps:6.1f} tok/s x{tps / plain_tps:.2f} same={same} "
                      f"per_call={first.per_call:.2f} model x{first.modelled(curve):.2f}", file=log)
            for name, values in others.items():
                tps = statistics.median(values)
                rows.append({"target": name, "category": category, "variant": "plain", "tps": tps,
                             "ratio": 1.0, "same": True, "accept": None, "per_call": 1.0, "modelled": 1.0,
                             "drafted": 0, "llama_plain_tps": plain_tps})
                print(f"{name} {category:20s} plain {tps:6.1f} tok/s (llama.cpp plain {plain_tps:.1f})", file=log)
    return rows, ties, facts


def cost_curve(llm: LlamaCpp, encode: Encoder, prompts_by_category: dict[str, list], largest: int,
               past: int = 200) -> Callable[[float], float]:
    """llama.cpp's verify cost over k tokens relative to 1 token after a `past`-token prompt made of the
    benchmark's own texts, interpolated linearly between the measured sizes 1..largest."""
    texts = [t["content"] if isinstance(t, dict) else t[1] for ps in prompts_by_category.values() for turns in ps
             for t in turns]
    ids = encode([{"role": "user", "content": " ".join(x for x in texts if x)}])[:past]
    sizes = list(range(1, largest + 1))
    costs = llm.step_costs(ids, sizes)
    relative = np.array([costs[k] / costs[1] for k in sizes])
    return lambda k: float(np.interp(k, sizes, relative))


def run(prompts_by_category: dict[str, list], new_tokens: int, *, threads: int = 2, reps: int = 1,
        pred_tokens: Sequence[int] = (LIBRARY_DEFAULT_PRED_TOKENS,)) -> list[dict]:
    """llama.cpp rows for benchmarks/speculative.py's table: plain greedy and prompt lookup (each draft length in
    `pred_tokens`) per prompt, in its row format ("modelled" from llama.cpp's own verify-cost curve).
    `prompts_by_category` is speculative.CATEGORIES or a subset of it; None assistant turns are filled with
    llama.cpp's own greedy answer."""
    rows, _, _ = measure(prompts_by_category, new_tokens, threads=threads, reps=reps, pred_tokens=pred_tokens)
    return rows


def edge_decoding(threads: int, speculator: str | None = None) -> Callable[[Turns, int], float]:
    """edge's greedy decoding of the default package (int4 on edge's kernels where they are built), plain or with a
    speculator ("auto": edge-run --draft auto), as a callable for `measure(extra=...)`: tok/s as speculative.py counts
    it."""
    from edge.default_model import default_package, default_quant
    from edge.engine import Engine
    from speculative import messages_for

    engine = Engine(default_package(default_quant()), threads=threads, speculator=speculator)
    engine.generate("Hello", max_tokens=8)  # warm up (and a speculator's cost curve)
    filled: dict[int, list[dict]] = {}

    def decode_tps(turns: Turns, new_tokens: int) -> float:
        key = id(turns)
        if key not in filled:
            filled[key] = messages_for(engine, turns, new_tokens)
        engine.reset()
        "".join(engine.chat(filled[key], max_tokens=new_tokens))
        return engine.stats.generate_tokens_per_second

    return decode_tps


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}"


def report(rows: list[dict], ties: list[tuple], facts: dict, args, load: tuple, seconds: float) -> str:
    lookup = [r for r in rows if r["target"] == TARGET]
    ours = [r for r in rows if r["target"] != TARGET]
    categories = list(dict.fromkeys(r["category"] for r in lookup))
    by = {(r["category"], r["variant"]): [] for r in lookup}
    for r in lookup:
        by[(r["category"], r["variant"])].append(r)
    ks = args.pred_tokens
    overall = {k: geomean(r["ratio"] for r in lookup if r["variant"] == f"prompt-lookup n={k}") for k in ks}
    best = max(overall, key=overall.get)
    lines = ["# llama.cpp prompt-lookup decoding on the speculative benchmark's prompts", "",
             f"- Machine: {machine()}; shared with other agents. Load average (1/5/15 min) at start "
             f"{load[0][0]:.2f}/{load[0][1]:.2f}/{load[0][2]:.2f}, at end {load[1][0]:.2f}/{load[1][1]:.2f}/"
             f"{load[1][2]:.2f}. Compare ratios (measured back to back), not absolute tok/s.",
             f"- llama-cpp-python {facts['llama_cpp_version']} built from source (CPU, OpenMP; its "
             f"instruction sets: see Build below), the default "
             f"model's GGUF (SmolLM2-135M-Instruct Q4_1), {args.threads} threads (OMP_WAIT_POLICY="
             f"{facts['omp_wait_policy']}), greedy (temp 0, no penalties), "
             f"{args.tokens} new tokens at most (EOS stops), {args.reps} interleaved rep(s), {seconds / 60:.1f} min.",
             f"- Prompts: benchmarks/speculative.py's CATEGORIES, rendered by edge's chat template and tokenized by "
             f"edge's tokenizer, fed to llama.cpp as token ids (llama.cpp's own tokenization of the rendered text "
             f"gives the same ids: {facts['prompt_ids_match']}). A second turn's first answer is each system's own "
             f"greedy answer.",
             f"- Command: `{' '.join(['python', *sys.argv])}`", "",
             "## Prompt lookup vs plain (geometric mean of the per-prompt tok/s ratio)", "",
             "| category | " + " | ".join(f"n={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for c in categories:
        cells = [geomean(r["ratio"] for r in by[(c, f"prompt-lookup n={k}")]) for k in ks]
        lines.append(f"| {c} | " + " | ".join(f"{x:.2f}" for x in cells) + " |")
    lines.append("| all | " + " | ".join(f"{overall[k]:.2f}" for k in ks) + " |")
    modelled = {k: geomean(r["modelled"] for r in lookup if r["variant"] == f"prompt-lookup n={k}") for k in ks}
    lines += ["", "Predicted from llama.cpp's own verify-cost curve and each run's tokens per target call "
              "(\"x model\", verify cost only, far less sensitive to the neighbours' load):", "",
              "| category | " + " | ".join(f"n={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for c in categories:
        cells = [geomean(r["modelled"] for r in by[(c, f"prompt-lookup n={k}")]) for k in ks]
        lines.append(f"| {c} | " + " | ".join(f"{x:.2f}" for x in cells) + " |")
    lines.append("| all | " + " | ".join(f"{modelled[k]:.2f}" for k in ks) + " |")
    lines += ["", "llama.cpp's cost of a verify call over k tokens relative to 1 token (200-token past, lookup "
              "context): " + ", ".join(f"k={k}: {v:.2f}x" for k, v in facts["curve"].items()) + "."]
    lines += ["", f"Best draft length over all prompts (measured): n={best}; by the model: "
              f"n={max(modelled, key=modelled.get)}; the library default is "
              f"n={LIBRARY_DEFAULT_PRED_TOKENS} (max_ngram_size 2).", "",
              "## Plain, default and best draft length per category", "",
              "| category | variant | tok/s | x plain | x model | tokens/target call | acceptance | identical |",
              "|---|---|---|---|---|---|---|---|"]
    for c in categories:
        for name in dict.fromkeys(["plain", f"prompt-lookup n={LIBRARY_DEFAULT_PRED_TOKENS}",
                                   f"prompt-lookup n={best}", f"prompt-lookup n={max(modelled, key=modelled.get)}"]):
            rs = by.get((c, name), [])
            if not rs:
                continue
            acc = [r["accept"] for r in rs if r["accept"] is not None]
            lines.append(f"| {c} | {name} | {statistics.mean(r['tps'] for r in rs):.1f} | "
                         f"{geomean(r['ratio'] for r in rs):.2f} | {geomean(r['modelled'] for r in rs):.2f} | "
                         f"{statistics.mean(r['per_call'] for r in rs):.2f} | "
                         f"{statistics.mean(acc) if acc else float('nan'):.2f} | "
                         f"{sum(r['same'] for r in rs)}/{len(rs)} |")
    same_all = {k: sum(r["same"] for r in lookup if r["variant"] == f"prompt-lookup n={k}") for k in ks}
    n_prompts = sum(1 for r in lookup if r["variant"] == "plain")
    lines += ["", "Identical to plain greedy output, per draft length (prompts): "
              + ", ".join(f"n={k}: {same_all[k]}/{n_prompts}" for k in ks) + ".", "",
              "Where lookup output differed: first differing generated token and llama.cpp's top-2 logit gap "
              "there in plain decoding (one token per step):", ""]
    lines += [f"- {c} / {name}: token {pos}, top-2 gap {gap:.4f}" for _, c, name, pos, gap in ties] or ["None."]
    if ours:
        names = list(dict.fromkeys(r["target"] for r in ours))
        lines += ["", "## edge against llama.cpp's plain decoding (same prompts, same run, interleaved)", "",
                  "| category | llama.cpp Q4_1 plain tok/s | " + " | ".join(f"{n} tok/s | {n} / llama.cpp plain"
                                                                    for n in names) + " |",
                  "|---|---|" + "---|---|" * len(names)]
        for c in [*categories, "all"]:
            cells = []
            for n in names:
                rs = [r for r in ours if r["target"] == n and c in (r["category"], "all")]
                cells.append(f"{statistics.mean(r['tps'] for r in rs):.1f} | "
                             f"{geomean(r['tps'] / r['llama_plain_tps'] for r in rs):.2f}")
            rs = [r for r in ours if r["target"] == names[0] and c in (r["category"], "all")]
            lines.append(f"| {c} | {statistics.mean(r['llama_plain_tps'] for r in rs):.1f} | " + " | ".join(cells)
                         + " |")
        lines += ["", "llama.cpp tok/s counts the tokens after the first over the time after the first (prefill "
                  "excluded); edge's is engine.stats.generate_tokens_per_second (also after prefill), as "
                  "speculative.py reports it. edge runs the default package; \"edge auto\" is `edge-run --draft auto` "
                  "(prompt lookup, then the draft head), greedy; speculative.py checks its output against plain."]
    lines += ["", "## Build", "", BUILD_NOTE]
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile creates 0600
    os.replace(tmp.name, path)


def main() -> None:
    from speculative import CATEGORIES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pred-tokens", type=int, nargs="+", default=list(SWEEP_PRED_TOKENS))
    ap.add_argument("--categories", nargs="+", choices=list(CATEGORIES), default=list(CATEGORIES))
    ap.add_argument("--no-edge", action="store_true", help="skip edge's own decoding (plain and auto)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "speculative_llamacpp.md"))
    args = ap.parse_args()
    if not available():
        sys.exit(WHEEL_HINT)
    load_start, start = os.getloadavg(), time.perf_counter()
    extra = None if args.no_edge else {"edge plain": edge_decoding(args.threads),
                                         "edge auto": edge_decoding(args.threads, "auto")}
    rows, ties, facts = measure({c: CATEGORIES[c] for c in args.categories}, args.tokens, threads=args.threads,
                                reps=args.reps, pred_tokens=args.pred_tokens, extra=extra)
    text = report(rows, ties, facts, args, (load_start, os.getloadavg()), time.perf_counter() - start)
    write_atomic(Path(args.out), text)
    print(text)


if __name__ == "__main__":
    main()
