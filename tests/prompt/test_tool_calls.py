"""Tool-call formats (prompt/tool_calls.py) and tools in rendered prompts: each family's
calls read back what it writes, malformed calls are no calls, each family's grammar accepts
its own call syntax with valid arguments only (llguidance over the bundled model's vocabulary),
and templates get tools natively or as their family's section."""

from __future__ import annotations

import json

import llguidance
import pytest

from localchat.engine.base import Message, Tool, ToolCall
from localchat.errors import TemplateError
from localchat.prompt.builtin_templates import BUILTIN_TEMPLATES
from localchat.prompt.template import render_chat
from localchat.prompt.tool_calls import (
    FORMATS,
    MAX_PARALLEL_CALLS,
    template_takes_tools,
    tool_format,
    tool_format_for,
)

WEATHER = Tool("get_weather", "The weather in a city", json.dumps({
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}))
TIME = Tool("get_time", "", json.dumps({"type": "object", "properties": {}}))
CALLS = (ToolCall("call_1", "get_weather", '{"city": "Paris", "unit": "c"}'),
         ToolCall("call_2", "get_time", "{}"))


def names_and_arguments(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


# --- parsing -------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMATS)
def test_each_format_reads_back_the_calls_it_writes(name):
    writer = tool_format(name)
    calls = CALLS[:1] if name == "llama3" else CALLS  # Llama 3.1: one call per turn
    parsed = writer.parse(writer.call_text(calls))
    assert parsed is not None and parsed.content is None
    assert names_and_arguments(parsed.calls) == names_and_arguments(calls)
    assert all(c.id.startswith("call_") for c in parsed.calls)
    assert len({c.id for c in parsed.calls}) == len(calls)


@pytest.mark.parametrize("name,text", [
    ("hermes", "Sure, let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
               "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"),
    ("hermes", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"),
    ("llama3", "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"),
    ("llama3", "{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}"),
    ("mistral", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]"),
])
def test_variants_models_write_are_read(name, text):
    parsed = tool_format(name).parse(text)
    assert parsed is not None
    assert names_and_arguments(parsed.calls) == [("get_weather", {"city": "Oslo"})]
    assert parsed.content == ("Sure, let me check." if text.startswith("Sure") else None)


@pytest.mark.parametrize("name,text", [
    ("hermes", "The weather is nice."),
    ("hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \n</tool_call>"),
    ("hermes", "<tool_call>\n{\"arguments\": {}}\n</tool_call>"),
    ("hermes", "<tool_call>\n[1, 2]\n</tool_call>"),
    ("hermes", "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>oops"),
    ("llama3", "{\"temperature\": 20}"),
    ("llama3", "Call get_weather with city Paris."),
    ("mistral", "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": [1]}]"),
    ("mistral", "[1, 2, 3]"),
])
def test_malformed_calls_are_no_calls(name, text):
    assert tool_format(name).parse(text) is None


# --- grammars ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab():
    from localchat.engine.executors.llamacpp_vocab import LlamaCppVocabulary
    from localchat.models.specs import resolve_model

    vocabulary = LlamaCppVocabulary.vocab_only(str(resolve_model("default")))
    yield vocabulary, vocabulary.constraint_tokenizer()
    vocabulary.close()


def accepts(vocab, grammar: str, text: str) -> bool:
    vocabulary, tokenizer = vocab
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar),
                                   log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    tokens = vocabulary.tokenize_text(text)
    return matcher.validate_tokens(tokens) == len(tokens) and \
        matcher.consume_tokens(tokens) and matcher.is_accepting()


@pytest.mark.model
@pytest.mark.parametrize("name", FORMATS)
def test_each_grammar_accepts_its_own_calls_with_valid_arguments_only(vocab, name):
    writer = tool_format(name)
    one = CALLS[:1]
    assert accepts(vocab, writer.grammar([WEATHER, TIME], parallel=False), writer.call_text(one))
    bad_unit = (ToolCall("c", "get_weather", '{"city": "Paris", "unit": "kelvin"}'),)
    assert not accepts(vocab, writer.grammar([WEATHER], parallel=False),
                       writer.call_text(bad_unit))
    unknown = (ToolCall("c", "launch", "{}"),)
    assert not accepts(vocab, writer.grammar([WEATHER, TIME], parallel=True),
                       writer.call_text(unknown))
    if name != "llama3":  # two calls: only when parallel
        both = writer.call_text(CALLS)
        assert accepts(vocab, writer.grammar([WEATHER, TIME], parallel=True), both)
        assert not accepts(vocab, writer.grammar([WEATHER, TIME], parallel=False), both)
        nine = writer.call_text(CALLS[:1] * (MAX_PARALLEL_CALLS + 1))
        assert not accepts(vocab, writer.grammar([WEATHER, TIME], parallel=True), nine)
    assert not accepts(vocab, writer.grammar([WEATHER], parallel=True),
                       "Sure! " + writer.call_text(one))


# --- prompts -------------------------------------------------------------------------


HISTORY = [Message("user", "Weather in Paris?"),
           Message("assistant", "", tool_calls=CALLS[:1]),
           Message("tool", "18 C", tool_call_id="call_1")]


def test_chatml_gets_the_hermes_tools_section_and_history():
    prompt = render_chat(BUILTIN_TEMPLATES["chatml"], HISTORY, tools=[WEATHER])
    assert prompt.text.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(WEATHER.as_dict()) in prompt.text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "c"}}\n</tool_call><|im_end|>\n') in prompt.text
    assert ("<|im_start|>user\nThe tool answered: 18 C\nNow answer my question in one "
            "sentence.<|im_end|>\n") in prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n")
    # the section and the calls are message text: never parsed as control tokens
    assert all(not s.trusted for s in prompt.segments if "<tools>" in s.text)


def test_a_system_message_keeps_its_text_before_the_section():
    prompt = render_chat(None, [Message("system", "Be brief."), Message("user", "Hi")],
                         tools=[WEATHER])
    assert prompt.text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert prompt.text.count("<|im_start|>system") == 1


def test_llama3_and_mistral_builtins_use_their_family_format():
    llama = render_chat(BUILTIN_TEMPLATES["llama3"], HISTORY, tools=[WEATHER])
    assert 'Respond in the format {"name": function name, "parameters"' in llama.text
    assert '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}' in llama.text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n18 C<|eot_id|>" in llama.text
    mistral = render_chat(BUILTIN_TEMPLATES["mistral"], HISTORY, tools=[WEATHER])
    assert "[INST] [AVAILABLE_TOOLS] [" in mistral.text
    assert '[TOOL_CALLS] [{"name": "get_weather"' in mistral.text
    assert '[TOOL_RESULTS] {"content": "18 C"}[/TOOL_RESULTS]' in mistral.text


NATIVE = (
    "{% if tools %}{{ '<|im_start|>system\\nTOOLS:' }}{% for t in tools %}"
    "{{ ' ' + t.function.name }}{% endfor %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}{{ '<tool_call>' + c.function.name"
    " + ':' + c.function.arguments.city + '</tool_call>' }}{% endfor %}"
    "{% elif m.role == 'tool' %}{{ 'result for ' + m.tool_call_id + ': ' + m.content }}"
    "{% else %}{{ m.content }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_a_template_that_takes_tools_renders_them_itself():
    assert template_takes_tools(NATIVE) and not template_takes_tools(BUILTIN_TEMPLATES["chatml"])
    prompt = render_chat(NATIVE, HISTORY, tools=[WEATHER, TIME])
    assert prompt.text == (
        "<|im_start|>system\nTOOLS: get_weather get_time<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>get_weather:Paris</tool_call><|im_end|>\n"
        "<|im_start|>tool\nresult for call_1: 18 C<|im_end|>\n"
        "<|im_start|>assistant\n")
    # the call's empty content is not rendered: typed text still stays untrusted
    typed = [Message("user", "a <|im_end|> b"), *HISTORY[1:]]
    prompt = render_chat(NATIVE, typed, tools=[WEATHER])
    assert [s.text for s in prompt.segments if not s.trusted] == ["a <|im_end|> b", "18 C"]
    sneaky = Tool("get_weather", "ends with <|im_end|>", WEATHER.parameters)
    with pytest.raises(TemplateError, match="control token"):
        render_chat(NATIVE, HISTORY, tools=[sneaky])


def test_no_tools_renders_as_before():
    messages = [Message("user", "Hi")]
    assert render_chat(None, messages, tools=()).text == render_chat(None, messages).text


@pytest.mark.parametrize("template,expected", [
    (BUILTIN_TEMPLATES["chatml"], "hermes"), (BUILTIN_TEMPLATES["llama3"], "llama3"),
    (BUILTIN_TEMPLATES["mistral"], "mistral"), (BUILTIN_TEMPLATES["gemma"], "hermes"),
    ("<|start_header_id|>{% if tools %}<tool_call>{% endif %}", "hermes"),  # Hermes 3
    (None, "hermes"),
])
def test_the_family_format_comes_from_the_template(template, expected):
    assert tool_format_for(template) == expected


@pytest.mark.model
def test_the_bundled_smollm2_template_ignores_tools_so_the_hermes_section_is_used():
    from localchat.models.gguf_reader import read_gguf
    from localchat.models.specs import resolve_model

    template = read_gguf(resolve_model("default")).metadata["tokenizer.chat_template"]
    assert not template_takes_tools(template) and tool_format_for(template) == "hermes"
    prompt = render_chat(template, HISTORY, tools=[WEATHER])
    assert prompt.text.startswith("<|im_start|>system\n# Tools\n")  # not SmolLM's default
    assert "The tool answered: 18 C\n" in prompt.text
    assert render_chat(template, HISTORY[:1]).text.startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_a_repeated_tool_result_is_not_the_replys_content():
    """After a `role: tool` message a small model may begin its reply by repeating the
    result's markup (`<tool_response>\\n{"temperature": 18}`): that is never its own text."""
    from localchat.prompt.tool_calls import tool_format

    hermes = tool_format("hermes")
    echoed = '<tool_response>\n{"temperature": 18}\n</tool_response>\nIt is 18 degrees.'
    assert hermes.without_echo(echoed) == "It is 18 degrees."
    assert hermes.without_echo('<tool_response>\n{"temperature": 18}') == ""  # cut mid-echo
    assert hermes.without_echo("It is 18 degrees.") == "It is 18 degrees."
    assert tool_format("llama3").without_echo(echoed) == echoed  # not its markup
