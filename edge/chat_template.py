"""Render a model's own Jinja chat template, exactly as transformers' `apply_chat_template` does, but sandboxed.

Chat templates come from model files, so they are untrusted code: they run in Jinja's immutable sandbox, and any
attempt to reach unsafe attributes (`__class__`, `__globals__`, ...) stops rendering with a ChatTemplateError
instead of silently printing nothing. The environment matches transformers' (trim_blocks, lstrip_blocks,
loopcontrols, a non-HTML-escaping `tojson`, `raise_exception`, `strftime_now`, the `{% generation %}` tag) so
prompts are byte-identical to what the model was trained on.

Base models ship no template; `ChatTemplate.for_model` then raises, unless the caller opts into PLAIN_TEMPLATE,
a documented fallback that just joins the message contents (what a base model continues naturally).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from edge.errors import ChatTemplateError

# Fallback for models without a template: message contents separated by blank lines, no role markup and no
# generation prompt, so a base model simply continues the text.
PLAIN_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}{{ message['content'] }}{% if not loop.last %}\n\n{% endif %}{% endfor %}"
)


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; rendering keeps the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, but unsafe attribute access is an error rather than an empty Undefined."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__} object is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> _StrictSandbox:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference."""

    def __init__(self, source: str, *, bos_token: str | None = None, eos_token: str | None = None, **variables: Any):
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"the chat template does not parse (line {exc.lineno}: {exc.message})") from exc
        self.source = source
        self._variables = {"bos_token": bos_token or "", "eos_token": eos_token or "", **variables}

    @classmethod
    def for_model(
        cls, source: str | None, *, fallback: bool = False, bos_token: str | None = None, eos_token: str | None = None
    ) -> "ChatTemplate":
        """The model's template; without one, PLAIN_TEMPLATE if `fallback`, else a ChatTemplateError."""
        if not source:
            if not fallback:
                raise ChatTemplateError(
                    "this model has no chat template (it is probably a base model, not instruction-tuned); "
                    "send plain text instead, or use the plain fallback template"
                )
            source = PLAIN_TEMPLATE
        return cls(source, bos_token=bos_token, eos_token=eos_token)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (dicts with 'role' and 'content'), ready to tokenize without BOS."""
        _check_messages(messages)
        context = {
            **self._variables,
            **kwargs,
            "messages": [dict(m) for m in messages],
            "tools": tools,
            "documents": documents,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return self._template.render(**context)
        except SecurityError as exc:
            raise ChatTemplateError(f"the chat template tried something unsafe and was stopped: {exc}") from exc
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed: {exc}") from exc
        except Exception as exc:  # a template bug (TypeError, KeyError, ...) on these messages
            reason = f"{type(exc).__name__}: {exc}"
            raise ChatTemplateError(f"the chat template failed on these messages ({reason})") from exc


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ChatTemplateError(f"message {i} must be a dict with a 'role' (and usually 'content'), got {m!r:.80}")
