"""MCP tools in the chat, with Pilot, the bundled model and the real test server
(tests/helpers/mcp_server.py over stdio): a call waits on its approval card; y runs it,
n refuses it and the refusal is fed back, a runs it and every later call to that tool in
this conversation, Esc stops the reply; each call is shown, stored and shown again when
the conversation reopens; /tools lists, switches off and forces."""

from __future__ import annotations

import json
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import jsonschema
import pytest

from helpers.pilot import make_app, ready, send, stored, wait_until
from localchat.tui.chat_tools import ApprovalScreen

pytestmark = pytest.mark.model

SERVER = Path(__file__).resolve().parents[1] / "helpers" / "mcp_server.py"


@pytest.fixture
def mcp_file(tmp_path) -> str:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"test": {"command": sys.executable,
                                                        "args": [str(SERVER)]}}}))
    return str(path)


@asynccontextmanager
async def chat_with_tools(engine, mcp_file: str):
    """The chat on engine with the test server's tools, once the model and the tools are up."""
    app = make_app(engine, max_tokens=48, mcp=mcp_file)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await wait_until(pilot, lambda: app.tools.started.is_set(), timeout=90)
        yield app, pilot


async def ask_and_answer(pilot, prompt: str, key: str | None):
    """Send prompt; press key on the approval card (None: expect no card); the reply."""
    app = pilot.app
    await send(pilot, prompt)
    if key is not None:
        await wait_until(pilot, lambda: isinstance(app.screen, ApprovalScreen))
        await pilot.press(key)
    await wait_until(pilot, lambda: not app.generating, timeout=120)
    return app.session.entries[-1]


async def test_approved_call_runs_is_shown_stored_and_reopened(engine, mcp_file):
    async with chat_with_tools(engine, mcp_file) as (app, pilot):
        await send(pilot, "/tools get_weather")
        reply = await ask_and_answer(pilot, "What is the weather in Oslo?", "y")
        [call] = reply.calls
        assert call.name == "get_weather" and call.approved and not call.error
        jsonschema.validate(json.loads(call.arguments), {
            "type": "object", "properties": {"city": {"type": "string"}},
            "required": ["city"], "additionalProperties": False})
        assert json.loads(call.result)["temperature"] == 18
        assert reply.status == "complete" and reply.content.strip()
        view = app.query_one("#chat").views[reply.key]
        assert "tool get_weather(" in str(view.query_one(".tool-call").title)
        assert stored(app)[-1].tool_calls[0]["result"] == call.result
        # the next prompt holds the call and its result
        roles = [m.role for m in app.session.history]
        assert roles == ["user", "assistant", "tool", "assistant"]
        cid = app.session.conversation.id
        await app.action_new_conversation()
        assert await app.open_conversation(cid)
        await pilot.pause()
        reopened = app.session.entries[-1]
        assert reopened.calls == [call]
        assert app.query_one("#chat").views[reopened.key].query(".tool-call")


async def test_refused_call_is_fed_back_and_always_stops_asking(engine, mcp_file):
    async with chat_with_tools(engine, mcp_file) as (app, pilot):
        await send(pilot, "/tools add")
        refused = await ask_and_answer(pilot, "What is 2 plus 3?", "n")
        [call] = refused.calls
        assert not call.approved and call.result == "the user did not allow add to run"
        await send(pilot, "/tools add")
        always = await ask_and_answer(pilot, "What is 4 plus 5?", "a")
        assert always.calls[0].approved and not always.calls[0].error
        await send(pilot, "/tools add")
        again = await ask_and_answer(pilot, "What is 6 plus 7?", None)  # no card this time
        assert again.calls[0].approved and again.calls[0].name == "add"
        args = json.loads(again.calls[0].arguments)
        assert again.calls[0].result == str(args["a"] + args["b"])
        await send(pilot, "/tools off add")
        await send(pilot, "/tools")
        assert "add (off, runs without asking)" in app.tools.listing(app.session.params)
        # both are kept with the conversation: reopened, add is still off and trusted
        stored_params = app.session.store.get_conversation(app.session.conversation.id).params
        assert stored_params["tools_off"] == ["add"] and stored_params["tools_allowed"] == ["add"]


async def test_escape_on_the_card_stops_the_reply(engine, mcp_file):
    async with chat_with_tools(engine, mcp_file) as (app, pilot):
        await send(pilot, "/tools required")
        reply = await ask_and_answer(pilot, "What is the weather in Oslo?", "escape")
        assert reply.calls and not reply.calls[0].approved
        assert reply.finish_reason == "cancelled" and not app.generating
        assert not isinstance(app.screen, ApprovalScreen)


async def test_a_crashing_tool_is_an_error_result_and_the_chat_goes_on(engine, mcp_file):
    async with chat_with_tools(engine, mcp_file) as (app, pilot):
        await send(pilot, "/tools crash")
        reply = await ask_and_answer(pilot, "Crash the server.", "y")
        [call] = reply.calls
        assert call.approved and call.error and "\n" not in call.result
        assert reply.status == "complete"
        after = await ask_and_answer(pilot, "Say hello.", None)
        assert after.status == "complete" and after.content.strip()


async def test_a_bad_mcp_file_is_a_note_and_the_chat_goes_on(engine, tmp_path):
    bad = tmp_path / "mcp.json"
    bad.write_text("{not json")
    app = make_app(engine, mcp=str(bad))
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.tools is None and "not valid JSON" in app.tools_problem
        await send(pilot, "/tools")
        await pilot.pause()
        assert "no MCP servers" in app.last_error
