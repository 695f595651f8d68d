"""The public API: load a package, generate text, chat.

    engine = Engine("models/smollm2-int4")          # or Engine() for the default model
    for piece in engine.chat([{"role": "user", "content": "Hi!"}]):
        print(piece, end="", flush=True)

The engine remembers which tokens its KV cache holds. A new prompt that starts with them (the next turn of a chat,
a regenerated answer) only feeds the new suffix, so earlier turns are never read again.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from edge.chat_template import ChatTemplate
from edge.errors import ChatTemplateError, ContextOverflowError
from edge.model import DEFAULT_PREFILL_CHUNK, Decoder
from edge.package import Package, load_package
from edge.sampling import Sampler, SamplingParams
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

    @property
    def prompt_tokens_per_second(self) -> float:
        fed = self.prompt_tokens - self.reused_tokens
        return fed / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generate_tokens_per_second(self) -> float:
        return self.generated_tokens / self.generate_seconds if self.generate_seconds else 0.0

    @staticmethod
    def peak_rss_bytes() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Engine:
    def __init__(self, model: str | Path | Package | None = None, device: str = "cpu",
                 context_length: int | None = None, threads: int | None = None, verify: bool = True):
        if model is None:
            from edge.default_model import default_package

            model = default_package()
        self.package = model if isinstance(model, Package) else load_package(model, verify=verify)
        special = self.package.special_tokens
        self.tokenizer = Tokenizer(self.package.tokenizer_path, bos_token_id=special.get("bos_token_id"),
                                   eos_token_ids=special.get("eos_token_ids", []),
                                   pad_token_id=special.get("pad_token_id"), add_bos=special.get("add_bos", False))
        self.template = self._chat_template()
        self.decoder = Decoder(self.package, context_length=context_length or self._default_context(),
                               device=device, threads=threads)
        self.tokens: list[int] = []  # exactly the tokens whose K/V are in the cache
        self.stats = GenerationStats()

    def _chat_template(self) -> ChatTemplate | None:
        if not self.package.chat_template:
            return None
        tok = self.tokenizer
        bos = tok.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None else None
        eos = tok.id_to_token(tok.eos_token_ids[0]) if tok.eos_token_ids else None
        return ChatTemplate(self.package.chat_template, bos_token=bos, eos_token=eos)

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
        """Stream the assistant's reply to a conversation, reusing the KV cache of the turns already seen."""
        if self.template is None:
            raise ChatTemplateError(f"{self.package.root} has no chat template (a base model); use generate() or "
                                    f"stream() with plain text (edge-run --raw)")
        text = self.template.render(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)  # the template writes its own BOS
        yield from self._run(ids, replace(config or GenerationConfig(), **overrides))

    # -- the loop -----------------------------------------------------------------------------------------------
    def _run(self, ids: list[int], config: GenerationConfig) -> Iterator[str]:
        ids = self._fit_prompt(ids, config)
        self.stats = stats = GenerationStats(prompt_tokens=len(ids))
        start = time.perf_counter()
        logits = self._feed_prompt(ids)
        stats.prompt_seconds = time.perf_counter() - start
        sampler, stops = Sampler(config.sampling), StopStrings(config.stop)
        detok = self.tokenizer.stream_decoder()
        eos = set(self.tokenizer.eos_token_ids)
        start = time.perf_counter()
        stats.finish_reason = "length"
        try:
            while stats.generated_tokens < config.max_tokens:
                token = sampler(logits)
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
                if len(self.tokens) >= self.context_length:
                    stats.finish_reason = "context"
                    break
                logits = self.decoder.step([token])[0]
                self.tokens.append(token)
            if not stops.stopped and (rest := stops.flush()):
                yield rest
        finally:
            stats.generate_seconds = time.perf_counter() - start

    def _fit_prompt(self, ids: list[int], config: GenerationConfig) -> list[int]:
        limit = self.context_length - 1  # room for at least one generated token
        if len(ids) <= limit:
            return ids
        if not config.truncate:
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the context holds {self.context_length}; shorten it, "
                f"load the model with a larger context_length (the model allows {self.package.config.max_context}), "
                f"or ask for truncation (truncate=True, edge-run --truncate)")
        keep = max(1, self.context_length - min(config.max_tokens, self.context_length // 2))
        return ids[-keep:]

    def _feed_prompt(self, ids: list[int]):
        """Reuse the cached prefix shared with `ids`, feed the rest; return the last prompt token's logits."""
        if not ids:
            raise ValueError("the prompt is empty")
        common = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # the last prompt token is always fed: its logits start generation
        self.decoder.cache.trim(common)
        self.tokens = ids[:common]
        self.stats.reused_tokens = common
        logits = self.decoder.prefill(ids[common:], chunk=DEFAULT_PREFILL_CHUNK)
        self.tokens = list(ids)
        return logits

    def reset(self) -> None:
        """Forget the cached conversation."""
        self.decoder.reset()
        self.tokens = []
