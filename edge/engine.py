"""The public API: load a package, generate text, chat.

    engine = Engine("models/smollm2-int4")          # Engine() for the default model; a GGUF file or a Hugging
                                                    # Face folder is exported once into the cache (cached_export)
    for piece in engine.chat([{"role": "user", "content": "Hi!"}]):
        print(piece, end="", flush=True)

The engine remembers which tokens its KV cache holds. A new prompt that starts with them (the next turn of a chat,
a regenerated answer) only feeds the new suffix, so earlier turns are never read again.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from edge.chat_template import ChatTemplate
from edge.errors import ChatTemplateError, ContextOverflowError, EdgeError, EmptyPromptError
from edge.memory.usage import peak_rss_bytes
from edge.model import DEFAULT_PREFILL_CHUNK, Decoder
from edge.package import Package, load_package
from edge.prefix_store import MIN_SAVED, PrefixStore, common_prefix
from edge.sampling import Sampler, SamplingParams
from edge.speculative import SpeculativeStats, Speculator, make_speculator
from edge.stopping import StopStrings
from edge.tokenizer import Tokenizer

DEFAULT_CONTEXT = 2048


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    truncate: bool = False  # drop the oldest prompt tokens instead of refusing a prompt longer than the context
    # a chat that outgrows the context: "error" (ContextOverflowError) or "slide" (see Engine.chat); for a plain
    # prompt, "slide" is truncate
    on_full: str = "error"

    def __post_init__(self) -> None:
        """Refuse bad settings when they are given, not at the first token of a generator that runs later."""
        if not isinstance(self.max_tokens, numbers.Integral) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if self.on_full not in ("error", "slide"):
            raise ValueError(f"on_full must be 'error' or 'slide', got {self.on_full!r}")
        if isinstance(self.stop, str):  # one stop string, not its characters
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        _ = self.sampling  # SamplingParams checks temperature, top_k, top_p and seed

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens already in the KV cache from an earlier call
    prompt_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    finish_reason: str = ""  # "stop" (EOS or stop string), "length" (max_tokens) or "context" (cache full)
    extra: dict = field(default_factory=dict)
    speculative: SpeculativeStats | None = None  # drafted/accepted/timings when a speculator ran

    @property
    def prompt_tokens_per_second(self) -> float:
        fed = self.prompt_tokens - self.reused_tokens
        return fed / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generate_tokens_per_second(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0

    @staticmethod
    def peak_rss_bytes() -> int:
        return peak_rss_bytes()


class Engine:
    def __init__(self, model: str | Path | Package | None = None, device: str = "cpu",
                 context_length: int | None = None, threads: int | None = None, verify: bool = True,
                 speculator: Speculator | str | None = None, budget: int | str | None = None,
                 profile: str | None = None, prefix_slots: int = 0, kv_dtype: str | None = None):
        """`budget` (bytes, '2GiB' or a device profile name; `profile` names the device for a size) plans the run
        before anything is allocated: the KV cache, the prefill chunk and the draft model then come from the plan
        (`self.plan`), `context_length` caps the planned context, and a budget under the model's lower bound
        raises BudgetError naming both. `prefix_slots` > 0 keeps that many other conversations' cached prefixes
        (edge.prefix_store; CPU, no budget) for a server whose clients take turns. `kv_dtype` ("float32" or
        "float16"; None: the package's) keeps the KV cache in that type (Package.with_kv_dtype)."""
        if model is None:
            from edge.default_model import default_package, default_quant

            model = default_package(default_quant(device))
        elif not isinstance(model, Package):
            from edge.cached_export import resolve

            model = resolve(model, device)  # a GGUF file or a Hugging Face folder: exported once into the cache
        self.package = model if isinstance(model, Package) else load_package(model, verify=verify)
        if kv_dtype is not None:
            self.package = self.package.with_kv_dtype(kv_dtype)
        self.plan = self._make_plan(budget, profile, context_length, speculator, device)  # before any buffer
        self.prefill_chunk = self.plan.prefill_chunk if self.plan else DEFAULT_PREFILL_CHUNK
        if self.plan is not None:
            context_length = self.plan.context
            speculator = self._planned_speculator(speculator)
        special = self.package.special_tokens
        self.tokenizer = Tokenizer(self.package.tokenizer_path, bos_token_id=special.get("bos_token_id"),
                                   eos_token_ids=special.get("eos_token_ids", []),
                                   pad_token_id=special.get("pad_token_id"), add_bos=special.get("add_bos", False))
        self.template = self._chat_template()
        self.decoder = self._make_decoder(self._context(context_length), device, threads)
        self.tokens: list[int] = []  # exactly the tokens whose K/V are in the cache
        self.stats = GenerationStats()
        self.threads = threads
        # Speculative decoding (edge.speculative): a Speculator, or a name/path for make_speculator.
        draft_length = self.plan.draft_len if self.plan is not None and self.plan.speculative else None
        self.speculator = (make_speculator(speculator, self, draft_length) if isinstance(speculator, str)
                           else speculator)
        self.dropped_messages = 0  # messages the last chat() slid out of the window (on_full="slide")
        self.prefixes = self._prefix_store(prefix_slots)

    def _prefix_store(self, slots: int) -> PrefixStore | None:
        if slots <= 0:
            return None
        if self.plan is not None:
            raise EdgeError("saved conversation prefixes take memory outside the budget's plan: leave prefix_slots "
                            "at 0 (edge-serve --prefix-slots 0) when planning for a budget")
        if not self.decoder.cache.arrays:
            raise EdgeError("saved conversation prefixes are kept for a CPU cache only; leave prefix_slots at 0 on "
                            "a GPU (edge-serve --prefix-slots 0)")
        return PrefixStore(slots)

    def _make_decoder(self, context_length: int, device: str, threads: int | None):
        """A paged package (edge.export.paged) runs through PagedDecoder: with a plan, its pinned layers and
        streaming window (all layers pinned when the plan keeps the weights resident); without one, 2 slots."""
        rows = self.plan.max_rows if self.plan is not None else 64  # a plan sized the logits and verify buffers
        if not self.package.manifest.get("paging"):
            return Decoder(self.package, context_length=context_length, device=device, threads=threads,
                           max_rows=rows)
        from edge.paging import PagedDecoder

        window, pinned = 2, 0
        if self.plan is not None:
            plan = self.plan.result.plan
            window = plan.stream_window
            pinned = self.package.config.num_layers if plan.resident_layers is None else plan.resident_layers
        return PagedDecoder(self.package, context_length=context_length, device=device, threads=threads,
                            max_rows=rows, window=window, pinned=pinned, max_tokens=max(self.prefill_chunk, 64))

    def _make_plan(self, budget, profile, context_length, speculator, device: str):
        if budget is None and profile is None:
            return None
        from edge.cached_export import resolve
        from edge.memory.plan_runtime import plan_package
        from edge.speculative.factory import verify_rows

        draft = (load_package(resolve(speculator, device)) if isinstance(speculator, str)
                 and Path(speculator).exists() else None)

        return plan_package(self.package, budget if budget is not None else profile, profile=profile,
                            context=context_length, draft=draft,
                            free_draft_nodes=verify_rows(speculator) if draft is None else 0)

    def _planned_speculator(self, speculator):
        """A draft model the plan left out (it does not fit or does not pay) is replaced by prompt lookup,
        which needs no memory to speak of."""
        if isinstance(speculator, str) and Path(speculator).exists() and not self.plan.speculative:
            import warnings

            warnings.warn(f"the plan for {self.plan.source} runs without the draft model {speculator} "
                          "(it does not fit or is predicted slower); drafting with prompt lookup instead",
                          stacklevel=3)
            return "prompt-lookup"
        return speculator

    def _chat_template(self) -> ChatTemplate | None:
        if not self.package.chat_template:
            return None
        tok = self.tokenizer
        bos = tok.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None else None
        eos = tok.id_to_token(tok.eos_token_ids[0]) if tok.eos_token_ids else None
        return ChatTemplate(self.package.chat_template, bos_token=bos, eos_token=eos)

    def _context(self, asked: int | None) -> int:
        """The context to allocate: the one asked for, within what the model was trained for (said, not silent)."""
        if asked is None:
            return self._default_context()
        limit = self.package.config.max_context
        if asked > limit:
            import warnings

            warnings.warn(f"a context of {asked} tokens was asked for, but {self.package.root.name} takes at most "
                          f"{limit} (its trained context); allocating {limit}", stacklevel=3)
        return min(asked, limit)

    def _default_context(self) -> int:
        """The KV cache is allocated whole and its pages get touched, so the default is a planned size rather
        than the model's maximum (8192 tokens of SmolLM2 would be 377 MiB of fp32 cache)."""
        return min(self.package.config.max_context, DEFAULT_CONTEXT)

    @property
    def context_length(self) -> int:
        return self.decoder.cache.capacity

    # -- text in, text out --------------------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], config: GenerationConfig | None = None, **overrides) -> str:
        return "".join(self.stream(prompt, config, **overrides))

    def stream(self, prompt: str | Sequence[int], config: GenerationConfig | None = None,
               **overrides) -> Iterator[str]:
        """Yield the reply as it is generated, in pieces that are always valid UTF-8."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        yield from self._run(ids, replace(config or GenerationConfig(), **overrides))

    def chat(self, messages: list[dict], config: GenerationConfig | None = None, **overrides) -> Iterator[str]:
        """Stream the assistant's reply to a conversation, reusing the KV cache of the turns already seen.

        A conversation that outgrows the context (the planned one under a budget) is refused with
        ContextOverflowError by default (`on_full="error"`). With `on_full="slide"` the oldest messages are left
        out (a leading system message stays) until the prompt fills at most half the context, and
        `self.dropped_messages` says how many. What sliding costs: the cache keeps only the tokens before the first
        dropped message (the system prompt), so the kept turns are prefilled again, up to half the context of
        prefill (SmolLM2-135M int4 on 2 cores prefills ~1000 tokens in about a second). Freeing half the context
        makes that a cost paid once per half a context of new conversation, not once per turn.
        """
        if self.template is None:
            raise ChatTemplateError(f"{self.package.root} has no chat template (a base model); use generate() or "
                                    f"stream() with plain text (edge-run --raw)")
        config = replace(config or GenerationConfig(), **overrides)
        ids, self.dropped_messages = self._chat_ids(messages, config)
        yield from self._run(ids, config)

    def _encode_chat(self, messages: list[dict]) -> list[int]:
        text = self.template.render(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)  # the template writes its own BOS

    def _chat_ids(self, messages: list[dict], config: GenerationConfig) -> tuple[list[int], int]:
        """The prompt of a chat turn and how many messages were slid out of the window to make it fit."""
        ids, context = self._encode_chat(messages), self.context_length
        reserve = max(1, min(config.max_tokens, context // 2))  # room for the reply
        if config.on_full != "slide":
            if len(ids) < context or config.truncate:
                return ids, 0
            where = f" (planned for a budget of {self.plan.source})" if self.plan is not None else ""
            raise ContextOverflowError(
                f"the conversation has {len(ids)} tokens but the context holds {context}{where}; start a new "
                f"conversation (edge-run: /reset), raise the budget or context length, or let the window slide "
                f"over the oldest turns (on_full='slide', edge-run --on-full slide)")
        if len(ids) + reserve <= context:
            return ids, 0
        head = 1 if messages and messages[0].get("role") == "system" else 0
        best, dropped = ids, 0
        for drop in range(1, len(messages) - head):  # always keep the newest message
            kept = messages[:head] + messages[head + drop:]
            if kept[head].get("role") == "assistant" and drop < len(messages) - head - 1:
                continue  # templates expect a conversation to open with the user
            best, dropped = self._encode_chat(kept), drop
            if len(best) <= context // 2:
                break
        if len(best) >= context:
            raise ContextOverflowError(
                f"the newest message alone makes a prompt of {len(best)} tokens but the context holds {context}; "
                f"shorten it or raise the budget or context length")
        return best, dropped

    # -- the loop -----------------------------------------------------------------------------------------------
    def _run(self, ids: list[int], config: GenerationConfig) -> Iterator[str]:
        ids = self._fit_prompt(ids, config)
        if self.speculator is not None:
            self.speculator.prepare(self.decoder)  # a first use measures the cost curve: not part of any timing
        self.stats = stats = GenerationStats(prompt_tokens=len(ids))
        start = time.perf_counter()
        logits = self._feed_prompt(ids)
        stats.prompt_seconds = time.perf_counter() - start
        sampler, stops = Sampler(config.sampling), StopStrings(config.stop)
        detok = self.tokenizer.stream_decoder()
        eos = set(self.tokenizer.eos_token_ids)
        start = time.perf_counter()
        stats.finish_reason = "length"
        if self.speculator is not None:
            source = self.speculator.tokens(self.decoder, self.tokens, logits, config.sampling, config.max_tokens)
            stats.speculative = self.speculator.stats
        else:
            source = self._plain_tokens(logits, sampler)
        try:
            for token in source:
                if stats.generated_tokens >= config.max_tokens:
                    break
                if token in eos:
                    stats.finish_reason = "stop"
                    break
                stats.generated_tokens += 1
                piece = stops.push(detok.step(token))
                if piece:
                    yield piece
                if stops.stopped:
                    stats.finish_reason = "stop"
                    break
                if stats.generated_tokens == config.max_tokens:
                    break
            else:
                stats.finish_reason = "context"  # the source ran out: the cache is full
            if not stops.stopped and (rest := stops.flush()):
                yield rest
        finally:
            source.close()  # a speculative source cuts the cache back to what was emitted
            stats.generate_seconds = time.perf_counter() - start

    def _plain_tokens(self, logits, sampler: Sampler) -> Iterator[int]:
        """One target call per token; a token is fed only when the consumer asks for the next one. Greedy tokens
        come from the step's row top where the graph gives one (Decoder.top): the logits' argmax, without reading
        them back."""
        top = None  # the prompt's logits may come from elsewhere (a kept prefix): the first token reads them
        while True:
            token = int(top[0]) if top is not None and top[0] >= 0 else sampler(logits)
            yield token
            if len(self.tokens) >= self.context_length:
                return
            logits = self.decoder.step([token])[0]
            top = self.decoder.top[0] if sampler.params.greedy and self.decoder.top is not None else None
            self.tokens.append(token)

    def _fit_prompt(self, ids: list[int], config: GenerationConfig) -> list[int]:
        limit = self.context_length - 1  # room for at least one generated token
        if len(ids) <= limit:
            return ids
        if not (config.truncate or config.on_full == "slide"):
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the context holds {self.context_length}; shorten it, "
                f"load the model with a larger context_length (the model allows {self.package.config.max_context}), "
                f"or ask for truncation (truncate=True, edge-run --truncate)")
        keep = max(1, self.context_length - min(config.max_tokens, self.context_length // 2))
        return ids[-keep:]

    def _feed_prompt(self, ids: list[int]):
        """Reuse the cached prefix shared with `ids`, feed the rest; return the last prompt token's logits."""
        if not ids:
            raise EmptyPromptError("the prompt is empty: give some text (a raw prompt needs at least one token)")
        common = common_prefix(self.tokens, ids)
        if self.prefixes is not None:
            common = self._switch_prefix(ids, common)
        common = min(common, len(ids) - 1)  # the last prompt token is always fed: its logits start generation
        self.decoder.cache.trim(common)
        self.tokens = ids[:common]
        self.stats.reused_tokens = common
        logits = self.decoder.prefill(ids[common:], chunk=self.prefill_chunk)
        self.tokens = list(ids)
        return logits

    def _switch_prefix(self, ids: list[int], common: int) -> int:
        """Another conversation: save the live cache's prefix if the prompt would overwrite much of it, and restore
        a saved one that `ids` continues further. Returns how many of `ids` the cache now holds."""
        if len(self.tokens) - common >= MIN_SAVED:
            self.prefixes.save(self.tokens, self.decoder.cache)
        length, saved = self.prefixes.best(ids)
        if saved is None or length <= common:
            return common
        self.tokens = self.prefixes.restore(saved, self.decoder.cache)
        return length

    def reset(self) -> None:
        """Forget the cached conversation (and any saved ones)."""
        self.decoder.reset()
        self.tokens = []
        if self.prefixes is not None:
            self.prefixes = PrefixStore(self.prefixes.slots)
        if self.speculator is not None:
            self.speculator.reset()
