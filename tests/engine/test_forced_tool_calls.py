"""Forced tool calls in the runtime on both executors (the bundled model): a named call's
grammar yields a reply the family's parser reads, its arguments valid (jsonschema) against
the tool's parameters, batched with a free request; greedy replies equal across executors."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from localchat.engine.base import Message, Request, SamplingParams, Tool
from localchat.engine.constraint import Constraint
from localchat.prompt.tool_calls import tool_format

SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 16},
                         "days": {"type": "integer", "minimum": 1, "maximum": 7},
                         "unit": {"enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "days", "unit"], "additionalProperties": False}
FORECAST = Tool("get_forecast", "The weather forecast for a city", json.dumps(SCHEMA))
OTHER = Tool("get_time", "The time in a city", '{"type": "object", "properties": {}}')


def forced(question: str) -> Request:
    writer = tool_format("hermes")  # the bundled SmolLM2 is ChatML
    return Request(messages=[Message("user", question)], tools=(FORECAST, OTHER),
                   sampling=SamplingParams(temperature=0.0), max_tokens=120,
                   constraint=Constraint("lark", writer.grammar([FORECAST], parallel=False)))


def check(result) -> dict:
    assert result.finish_reason == "stop", result.text
    parsed = tool_format("hermes").parse(result.text)
    assert parsed is not None and parsed.content is None, result.text
    [call] = parsed.calls
    assert call.name == "get_forecast"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, SCHEMA)
    return arguments


def run_batched(engine) -> list:
    requests = [forced("Will it rain in Oslo this week?"),
                Request(messages=[Message("user", "Tell me a joke.")], max_tokens=20),
                forced("Forecast for Lyon, three days, in fahrenheit.")]
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(engine.complete, requests))


@pytest.mark.slow
def test_forced_calls_on_llama_cpp(engine):
    results = run_batched(engine)
    check(results[0]), check(results[2])
    assert engine.info.tool_format == "hermes"


@pytest.mark.slow
def test_forced_calls_on_torch_equal_llama_cpps(torch_engine, engine):
    ours, theirs = run_batched(torch_engine), run_batched(engine)
    for i in (0, 2):
        assert check(ours[i]) == check(theirs[i])
