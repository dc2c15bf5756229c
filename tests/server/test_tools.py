"""OpenAI tools through a real `localchat serve` (bundled SmolLM2, ChatML: the Hermes
`<tool_call>` format) and the official `openai` client: with tool_choice `required` or a
named function every call parses and validates (jsonschema) against the tool's parameters,
streamed and not; a tool round trip is answered; bad tool fields are 400s naming them."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from helpers.server import bundled_server, openai_client

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process

NAME = {"type": "string", "maxLength": 16}
TOOLS = {
    "get_weather": ("What is the weather in Paris?", {
        "type": "object",
        "properties": {"city": NAME, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}),
    "book_flight": ("Book me a flight from Paris to Rome for two people.", {
        "type": "object",
        "properties": {
            "route": {"type": "object",
                      "properties": {"from": NAME, "to": NAME},
                      "required": ["from", "to"], "additionalProperties": False},
            "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["route", "passengers"], "additionalProperties": False}),
    "add_numbers": ("Add 2, 3 and 5.", {
        "type": "object",
        "properties": {"numbers": {"type": "array", "minItems": 2, "maxItems": 5,
                                   "items": {"type": "integer", "minimum": 0,
                                             "maximum": 100}}},
        "required": ["numbers"], "additionalProperties": False}),
    "set_alarm": ("Wake me at 7:30.", {
        "type": "object",
        "properties": {"time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                       "label": {"anyOf": [NAME, {"type": "null"}]}},
        "required": ["time", "label"], "additionalProperties": False}),
}


def tool_list(names=TOOLS) -> list[dict]:
    return [{"type": "function",
             "function": {"name": n, "description": f"{n.replace('_', ' ')}",
                          "parameters": TOOLS[n][1]}} for n in names]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from bundled_server(tmp_path_factory.mktemp("tools-server"), ctx=2048)


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def check_calls(calls, allowed) -> None:
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments),
                            TOOLS[call.function.name][1])


def streamed_calls(chunks) -> tuple[list[dict], str | None, str]:
    """Assemble delta.tool_calls as OpenAI clients do: by index, arguments appended."""
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = delta.id or call["id"]
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    return [calls[i] for i in sorted(calls)], finish, content


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TOOLS))
def test_required_calls_parse_and_validate(client, server, name):
    reply = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": TOOLS[name][0]}],
        tools=tool_list(), tool_choice="required", parallel_tool_calls=False,
        temperature=0, max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1  # parallel_tool_calls=false: exactly one
    check_calls(choice.message.tool_calls, TOOLS)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TOOLS))
def test_named_calls_streamed_match_not_streamed(client, server, name):
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": TOOLS[name][0]}],
                  tools=tool_list(), temperature=0, max_tokens=200,
                  tool_choice={"type": "function", "function": {"name": name}})
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    check_calls(whole.message.tool_calls, {name})
    calls, finish, content = streamed_calls(client.chat.completions.create(stream=True,
                                                                           **kwargs))
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)


def test_a_tool_round_trip_is_answered(client, server):
    """The assistant's call (content null) and the tool's result render into the prompt
    (it grows by them) and the model answers in text."""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    turns = question + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather",
                          "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees and sunny"}]
    kwargs = dict(model=server.model, tools=tool_list(["get_weather"]), tool_choice="none",
                  temperature=0, max_tokens=30)
    before = client.chat.completions.create(messages=question, **kwargs)
    after = client.chat.completions.create(messages=turns, **kwargs)
    assert after.choices[0].finish_reason in ("stop", "length")
    assert after.choices[0].message.content and not after.choices[0].message.tool_calls
    assert after.usage.prompt_tokens > before.usage.prompt_tokens + 20


def test_tools_reach_the_prompt_and_none_leaves_them_out(client, server):
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "Hi"}],
                  temperature=0, max_tokens=1)
    plain = client.chat.completions.create(**kwargs).usage.prompt_tokens
    offered = client.chat.completions.create(tools=tool_list(), **kwargs).usage.prompt_tokens
    none = client.chat.completions.create(tools=tool_list(), tool_choice="none",
                                          **kwargs).usage.prompt_tokens
    auto_alone = client.chat.completions.create(tool_choice="auto", **kwargs).usage
    assert none == plain == auto_alone.prompt_tokens < offered


@pytest.mark.parametrize("fields,param", [
    ({"tools": [{"type": "function", "function": {"name": "f",
                                                  "parameters": {"type": "strange"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"$ref": "#/$defs/none"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "two words"}}]},
     "tools[0].function.name"),
    ({"tools": tool_list(["get_weather"]),
      "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": tool_list(["get_weather"]), "parallel_tool_calls": "yes"},
     "parallel_tool_calls"),
    ({"tools": tool_list(["get_weather"]), "response_format": {"type": "json_object"}},
     "response_format"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"messages": [{"role": "tool", "content": "18 C"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_tool_fields_are_400_naming_them(client, server, fields, param):
    body = {"messages": [{"role": "user", "content": "Hi"}], **fields}
    messages = body.pop("messages")
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, max_tokens=8, messages=messages,
                                       extra_body=body)
    error = info.value.body
    assert error["param"] == param and "\n" not in error["message"], error


def test_tools_on_text_completions_are_400(client, server):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=server.model, prompt="Hi", max_tokens=4,
                                  extra_body={"tools": tool_list(["get_weather"])})
    assert info.value.body["param"] == "tools"


@pytest.mark.slow
def test_parallel_required_calls_all_validate_and_end(client, server):
    """parallel_tool_calls=true: one to eight calls, each valid; the grammar bounds them,
    so even a model that repeats itself ends with tool_calls, not at max_tokens."""
    reply = client.chat.completions.create(
        model=server.model, tools=tool_list(), tool_choice="required",
        messages=[{"role": "user", "content": "What is the weather in Paris and in Rome?"}],
        parallel_tool_calls=True, temperature=0, max_tokens=600)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert 1 <= len(choice.message.tool_calls) <= 8
    check_calls(choice.message.tool_calls, TOOLS)
