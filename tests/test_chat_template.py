"""Chat templates: byte-identical to transformers' apply_chat_template, sandboxed, clear errors."""

from __future__ import annotations

import pytest

from edge.chat_template import PLAIN_TEMPLATE, ChatTemplate
from edge.errors import ChatTemplateError

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, with émoji 😀 and 中文?"},
    ],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "  spaced\n\nlines  "},
    ],
]


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_smollm2_template_matches_transformers(smollm2, hf_gguf_tokenizer, messages, generation_prompt):
    template = ChatTemplate.for_model(smollm2.chat_template, bos_token="<|im_start|>", eos_token="<|im_end|>")
    expected = hf_gguf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    assert template.render(messages, add_generation_prompt=generation_prompt) == expected


def test_environment_features():
    source = (
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{{ m | tojson }}\n{% endfor %}"
        "{% generation %}{{ bos_token }}|{{ eos_token }}{% endgeneration %}"
        "{{ strftime_now('%Y') | length }}"
    )
    out = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(
        [{"role": "user", "content": "é <b>"}, {"role": "a", "content": "x"}, {"role": "b", "content": "never"}]
    )
    assert out == '{"role": "user", "content": "é <b>"}\n{"role": "a", "content": "x"}\n<s>|</s>4'


def test_raise_exception_becomes_chat_template_error():
    source = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('first message must be from the user') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="first message must be from the user"):
        ChatTemplate(source).render([{"role": "assistant", "content": "hi"}])


def test_syntax_error():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for m in messages %}{{ m }")


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__ }}",
        "{{ raise_exception.__globals__ }}",
        "{{ messages[0]['content'].__class__ }}",
    ],
)
def test_unsafe_attribute_access_is_blocked(source):
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate(source).render([{"role": "user", "content": "x"}])


def test_immutable_sandbox_blocks_mutation():
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{{ messages.append({'role': 'x'}) }}").render([{"role": "user", "content": "x"}])


def test_no_template_and_plain_fallback():
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.for_model(None)
    plain = ChatTemplate.for_model(None, fallback=True, bos_token="<bos>")
    assert plain.source == PLAIN_TEMPLATE
    msgs = [{"role": "user", "content": "The capital of France is"}]
    assert plain.render(msgs, add_generation_prompt=False) == "<bos>The capital of France is"


def test_bad_messages():
    template = ChatTemplate("{{ messages | length }}")
    with pytest.raises(ChatTemplateError, match="list of"):
        template.render("hello")
    with pytest.raises(ChatTemplateError, match="role"):
        template.render([{"content": "no role"}])
