"""Structured output through a real `localchat serve` and the official `openai` client:
response_format json_schema (strict) and json_object on chat and completions, streamed and
not, replies checked with jsonschema; a bad schema, an unsupported shape (functions, echo)
or a model we do not serve is refused with the OpenAI error naming it."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from helpers.schemas import SCHEMAS
from helpers.server import bundled_server, openai_client

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from bundled_server(tmp_path_factory.mktemp("structured-server"))


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def schema_format(name: str) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name][1], "strict": True}}


@pytest.mark.parametrize("name", ["person", "defs"])
def test_chat_json_schema_not_streamed(client, server, name):
    reply = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": SCHEMAS[name][0]}],
        temperature=0, max_tokens=150, response_format=schema_format(name))
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name][1])


def test_chat_json_schema_streamed_matches_not_streamed(client, server):
    kwargs = dict(model="default", temperature=0, max_tokens=150,
                  messages=[{"role": "user", "content": SCHEMAS["nullable"][0]}],
                  response_format=schema_format("nullable"))
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS["nullable"][1])


def test_completions_json_schema_and_chat_json_object(client, server):
    reply = client.completions.create(model=server.model, prompt="The sky, as JSON:",
                                      temperature=0, max_tokens=60,
                                      extra_body={"response_format": schema_format("enum")})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].text), SCHEMAS["enum"][1])
    reply = client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Describe a cat."}],
        temperature=0, max_tokens=200, response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_text_format_changes_nothing(client, server):
    kwargs = dict(model=server.model, messages=[{"role": "user", "content": "Say hi"}],
                  temperature=0, max_tokens=8)
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    text = client.chat.completions.create(response_format={"type": "text"}, **kwargs)
    assert text.choices[0].message.content == plain


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "strange"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/none"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"echo": True}, "echo"),
])
def test_unusable_formats_and_unsupported_shapes_are_400(client, server, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, max_tokens=8,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       extra_body=fields)
    error = info.value.body
    assert error["param"] == param and "\n" not in error["message"], error


NEVER_ENDS = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}},
                              "required": ["next"]}}, "$ref": "#/$defs/n"}
CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}


@pytest.mark.parametrize("fields,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": NEVER_ENDS}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": CYCLE}}},
     "response_format"),
    ({"grammar": 'root ::= a\na ::= "x" a'}, "grammar"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_constraints_no_finite_text_meets_are_400_before_decoding(client, server, fields, param,
                                                                  stream):
    """They were a 500 after 2.7 s (an endless forced string), or for the cycle a 200 with
    empty content and finish_reason "stop"."""
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=server.model, max_tokens=60, stream=stream,
                                       messages=[{"role": "user", "content": "Hi"}],
                                       extra_body=fields)
    error = info.value.body
    assert error["param"] == param and "no finite text" in error["message"], error


TAGS = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                         "age": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                  "maxItems": 3}},
        "required": ["name", "age", "tags"]}


def test_the_reported_schema_never_fails_with_default_drafting(client, server):
    """1-5 of these 8 requests were a 500 ("the constraint refused a token") with drafting
    on, as `serve` has it by default."""
    for prompt in ("Invent a person.", "Describe the sea.", "Tell me about cats.", "Who are you?",
                   "Write a poem.", "List tags.", "Give me JSON.", "Describe a city."):
        choice = client.chat.completions.create(
            model=server.model, max_tokens=60, temperature=0,
            messages=[{"role": "user", "content": prompt}],
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": TAGS}},
        ).choices[0]
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), TAGS)


def test_a_model_we_do_not_serve_is_404(client, server):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", max_tokens=4,
                                       messages=[{"role": "user", "content": "Hi"}])
    assert info.value.body["code"] == "model_not_found"
    ok = client.chat.completions.create(model="default", max_tokens=2,
                                        messages=[{"role": "user", "content": "Hi"}])
    assert ok.choices[0].message.content is not None
