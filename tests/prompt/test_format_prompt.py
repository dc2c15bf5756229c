"""A JSON constraint is said in the prompt too (prompt/format_prompt.py): the system turn gets
the line, unless a message already asks; on the bundled model that is what keeps `--json-object`
from answering `{}`."""

from __future__ import annotations

import json

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.constraint import Constraint
from localchat.prompt.format_prompt import OBJECT, with_format_instruction

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


def test_the_line_goes_into_the_system_turn_unless_already_asked():
    user = Message("user", "Describe a cat.")
    assert with_format_instruction([user], "json_object", "") == (Message("system", OBJECT), user)
    system = Message("system", "Be terse.")
    assert with_format_instruction([system, user], "json_object", "")[0].content == \
        f"Be terse.\n\n{OBJECT}"
    asked = Message("user", "Describe a cat as JSON.")
    assert with_format_instruction([asked], "json_object", "") == (asked,)
    text = json.dumps(SCHEMA)
    first = with_format_instruction([user], "json_schema", text)[0].content
    assert first.startswith("Answer with one JSON value that matches this JSON Schema:")
    assert json.loads(first.split("\n", 1)[1]) == SCHEMA
    assert with_format_instruction([Message("user", first)], "json_schema", text) == \
        (Message("user", first),)  # the schema is there already
    assert with_format_instruction([user], "lark", 'start: "x"') == (user,)  # grammars: not ours


def test_json_object_replies_say_something_with_the_line_and_nothing_without(engine):
    def reply(format_prompt: bool) -> dict:
        result = engine.complete(Request(
            messages=[Message("user", "Tell me about Paris.")], sampling=SamplingParams(temperature=0),
            max_tokens=60, constraint=Constraint.json_object(), format_prompt=format_prompt))
        return json.loads(result.text)

    assert reply(False) == {}  # the model was never told what to put in it
    said = reply(True)
    assert said and all(isinstance(k, str) and k.strip() for k in said)
