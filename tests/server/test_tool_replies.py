"""Replies read as tool calls (server/tool_replies.py, responses.py), without a model: under
`auto`, text that is no valid call is content (never a 500); a stream sends text before the
call marker as content at once, holds the call and sends it as delta.tool_calls; the
streamed result equals the whole one."""

from __future__ import annotations

import json

import pytest

from localchat.engine.base import Result, Stats, ToolCall
from localchat.prompt.tool_calls import tool_format
from localchat.server.responses import Reply
from localchat.server.tool_fields import ToolUse
from localchat.server.tool_replies import ToolStream

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def whole(text: str, name: str = "hermes") -> dict:
    return Reply(True, "m", ToolUse((), name, parallel=True)).body(
        Result(text, "stop", Stats()))["choices"][0]


def streamed(pieces: list[str], name: str = "hermes", **use) -> tuple[list[str], list, bool]:
    """Content pieces sent while streaming; the delta.tool_calls; whether it was calls."""
    stream = ToolStream(ToolUse((), name, **{"parallel": True, **use}))
    sent, deltas = [], []
    for piece in pieces:
        text, more = stream.feed(piece)
        sent.append(text)
        deltas += more
    rest, more, called = stream.finish()
    return [s for s in sent + [rest] if s], deltas + more, called


def assembled(deltas: list[dict]) -> list[tuple[str, dict]]:
    """The calls deltas add up to, as OpenAI clients assemble them (by index)."""
    calls: dict[int, dict] = {}
    for d in deltas:
        call = calls.setdefault(d["index"], {"name": "", "arguments": ""})
        if "id" in d:
            assert d["id"].startswith("call_") and d["type"] == "function" and not call["name"]
        call["name"] += d["function"].get("name", "")
        call["arguments"] += d["function"]["arguments"]
    return [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())]


@pytest.mark.parametrize("text", [
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": ",  # cut short
    "<tool_call>\nnot json at all\n</tool_call>",
    "I would call <tool_call> but I won't.",
    "Plain text.",
])
def test_garbage_under_auto_is_content(text):
    choice = whole(text)
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": text}
    sent, deltas, called = streamed([text[i:i + 3] for i in range(0, len(text), 3)])
    assert "".join(sent) == text and deltas == [] and not called


def test_a_call_is_tool_calls_whole_and_streamed():
    text = "Let me look.\n" + CALL
    choice = whole(text)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    sent, deltas, called = streamed([text[i:i + 2] for i in range(0, len(text), 2)])
    assert "".join(sent) == "Let me look.\n"  # everything before the marker, nothing after
    assert called and assembled(deltas) == [("get_weather", {"city": "Oslo"})]


def test_text_that_may_begin_the_marker_is_held_only_until_it_cannot():
    stream = ToolStream(ToolUse((), "hermes"))
    assert stream.feed("a <tool") == ("a ", [])
    assert stream.feed("s are here") == ("<tools are here", [])
    assert stream.finish() == ("", [], False)


def test_llama3_calls_only_at_the_start():
    call = '{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    assert whole(call, "llama3")["finish_reason"] == "tool_calls"
    sent, deltas, called = streamed(["{\"na", call[4:]], "llama3")
    assert sent == [] and called and assembled(deltas) == [("get_weather", {"city": "Oslo"})]
    sent, deltas, called = streamed(["The answer: ", call], "llama3")
    assert "".join(sent) == "The answer: " + call and deltas == [] and not called


def test_stream_chunks_are_openai_shaped():
    reply = Reply(True, "m", ToolUse((), "hermes"))
    _, deltas, called = streamed([CALL])
    chunks = reply.pieces("", deltas)
    first, second = (c["choices"][0]["delta"]["tool_calls"][0] for c in chunks)
    assert first == {"index": 0, "id": first["id"], "type": "function",
                     "function": {"name": "get_weather", "arguments": ""}}
    assert second == {"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}
    finish = reply.chunk(finish=Result(CALL, "stop", Stats()), called=called)
    assert finish["choices"][0]["finish_reason"] == "tool_calls"


ARGUMENTS = [{"city": "O{s}l\"o", "tags": ["a]", {"b": "}"}], "n": 3}, {}]


@pytest.mark.parametrize("name", ["hermes", "mistral", "llama3"])
@pytest.mark.parametrize("size", [1, 2, 7])
def test_forced_calls_stream_their_arguments_as_they_are_written(name, size):
    writer = tool_format(name)
    calls = tuple(ToolCall(f"c{i}", f"tool_{i}", json.dumps(a)) for i, a in enumerate(ARGUMENTS))
    calls = calls[:1] if name == "llama3" else calls
    text = writer.call_text(calls)
    sent, deltas, called = streamed([text[i:i + size] for i in range(0, len(text), size)],
                                    name, required=True)
    assert sent == [] and called
    assert assembled(deltas) == [(c.name, json.loads(c.arguments)) for c in calls]
    pieces = [d for d in deltas if "id" not in d and d["index"] == 0]
    assert len(pieces) > 1 or size > 7  # the arguments came in pieces, not at the end
    cut = streamed([text[:len(text) // 2]], name, required=True)
    assert not cut[2]  # cut short (max_tokens): not "tool_calls"


def test_without_parallel_tool_calls_only_the_first_call_is_returned():
    two = CALL + "\n" + CALL.replace("Oslo", "Rome")
    for parallel, cities in ((True, ["Oslo", "Rome"]), (False, ["Oslo"])):
        parsed = ToolUse((), "hermes", parallel=parallel).read(two)
        assert [json.loads(c.arguments)["city"] for c in parsed.calls] == cities


def test_content_already_streamed_is_never_read_as_a_call_too():
    """Mistral's marker may be a control token the text lacks: a bare call array is a
    call whole, but streamed it has gone out as content and stays content."""
    text = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    assert whole(text, "mistral")["finish_reason"] == "tool_calls"
    sent, deltas, called = streamed([text[:5], text[5:]], "mistral")
    assert "".join(sent) == text and deltas == [] and not called


@pytest.mark.parametrize("after", ["It is 18 degrees in Oslo.", CALL])
def test_a_repeated_tool_result_is_left_out_whole_and_streamed(after):
    """The tool round trip once answered `<tool_response>\\n{"temperature": 18, ...`: the
    bundled model repeats the result's markup (the user turn Hermes puts it in)."""
    text = '<tool_response>\n{"temperature": 18}\n</tool_response>\n' + after
    choice = whole(text)
    sent, deltas, called = streamed([text[i:i + 4] for i in range(0, len(text), 4)])
    if after == CALL:
        assert choice["finish_reason"] == "tool_calls" and called
        assert assembled(deltas) == [("get_weather", {"city": "Oslo"})]
        assert not (choice["message"]["content"] or "").strip() and not "".join(sent).strip()
    else:
        assert choice["message"]["content"] == after and "".join(sent) == after
        assert not called and deltas == []
