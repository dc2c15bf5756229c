"""Conversations, chat controls and slash commands in the TUI, driven with Pilot against
the real bundled model and a real history database (in the test's LOCALCHAT_HOME)."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from helpers.pilot import chat_config
from rich.cells import cell_len
from textual.widgets import Label
from localchat.storage import ConversationStore
from localchat.tui.app import ChatApp
from localchat.tui.palette import ChatCommands
from localchat.tui.screens import ConfirmScreen, InfoScreen, TextInputScreen
from localchat.tui.sidebar import ConversationItem, Sidebar
from localchat.tui.widgets import GaugeBar, PromptInput

from helpers.pilot import GREEDY, chat, make_app, ready, send, stored, wait_until



def home() -> Path:
    return Path(os.environ["LOCALCHAT_HOME"])


def write_config(text: str) -> None:
    """config.toml in the test's LOCALCHAT_HOME."""
    home().mkdir(parents=True, exist_ok=True)
    (home() / "config.toml").write_text(text)


def sidebar_titles(app) -> list[str]:
    return [item.conversation.title for item in app.query(ConversationItem)]


async def test_messages_are_saved_and_conversations_switch_from_the_sidebar(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "What is the capital of France?")
        first = app.session.conversation
        msgs = stored(app)
        assert [(m.role, m.status) for m in msgs] == [("user", "complete"), ("assistant", "complete")]
        assert msgs[1].content == app.entries[1].content != ""
        assert msgs[1].stats["completion_tokens"] == app.entries[1].stats.completion_tokens
        assert first.title == "What is the capital of France?"
        assert app.session.store.get_conversation(first.id).params["max_tokens"] == 8

        await pilot.press("ctrl+n")
        assert app.entries == [] and app.session.conversation is None
        await chat(pilot, "Name a colour.")
        second = app.session.conversation
        assert second.id != first.id

        await pilot.press("ctrl+b")
        assert not app.query_one(Sidebar).has_class("hidden")
        assert sidebar_titles(app) == ["Name a colour.", "What is the capital of France?"]
        await pilot.press("down", "enter")  # open the older one
        await wait_until(pilot, lambda: app.session.conversation.id == first.id)
        assert [e.content for e in app.entries] == [m.content for m in msgs]
        assert app.query_one(PromptInput).has_focus
        await pilot.press("ctrl+b")
        assert app.query_one(Sidebar).has_class("hidden")


async def test_rename_delete_with_confirmation_and_search(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        store = app.session.store
        a = store.create_conversation("Dragons")
        store.add_message(a.id, "user", "tell me about wyverns")
        b = store.create_conversation("Cooking")
        store.add_message(b.id, "user", "how long to boil an egg")
        await pilot.press("ctrl+b")
        assert sidebar_titles(app) == ["Cooking", "Dragons"]

        await pilot.press("r")  # rename the highlighted (newest) one
        assert isinstance(app.screen, TextInputScreen)
        app.screen.query_one("#answer").value = "Eggs"
        await pilot.press("enter")
        await wait_until(pilot, lambda: store.get_conversation(b.id).title == "Eggs")
        await wait_until(pilot, lambda: sidebar_titles(app) == ["Eggs", "Dragons"])

        await pilot.press("d")
        assert isinstance(app.screen, ConfirmScreen)
        assert "y: delete" in " ".join(str(s.render()) for s in app.screen.query(".hint"))
        await pilot.press("n")  # cancelled: nothing deleted
        assert store.get_conversation(b.id) is not None
        await pilot.press("d")
        await pilot.press("enter")  # Enter presses the focused button: the safe one
        assert not isinstance(app.screen, ConfirmScreen)
        assert store.get_conversation(b.id) is not None
        await pilot.press("d")
        await pilot.press("y")
        await wait_until(pilot, lambda: store.get_conversation(b.id) is None)
        await wait_until(pilot, lambda: sidebar_titles(app) == ["Dragons"])

        app.query_one("#search").focus()
        await pilot.press("down")  # from the search box into the list
        assert app.focused is app.query_one("#conversations")
        app.query_one("#search").focus()
        await pilot.press(*"WYVERN")  # matches message text, and typing r/d/n here is text
        await wait_until(pilot, lambda: sidebar_titles(app) == ["Dragons"])
        await pilot.press("x")
        await wait_until(pilot, lambda: sidebar_titles(app) == [])
        assert store.get_conversation(a.id) is not None


async def test_continue_flag_reopens_the_last_conversation_with_its_settings(engine):
    store = ConversationStore.open()
    c = store.create_conversation("Old chat", model="default", system_prompt="Be terse.",
                                  params={"temperature": 0.0, "top_k": 7, "max_tokens": 5})
    store.add_message(c.id, "user", "Hello")
    reply = store.begin_reply(c.id)
    store.finish_reply(reply, "Hi th", status="interrupted")
    store.close()
    app = ChatApp(*chat_config(), engine=engine, continue_last=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert app.session.conversation.id == c.id
        assert [(e.role, e.content, e.status) for e in app.entries] == [
            ("user", "Hello", "complete"), ("assistant", "Hi th", "interrupted")]
        assert "interrupted" in str(app.entries[1].view.status.render())
        s = app.session.params
        assert (s.system, s.sampling.top_k, s.max_tokens) == ("Be terse.", 7, 5)
        assert app.session.history[0].content == "Be terse."
        await pilot.press("ctrl+g")  # continue the interrupted reply
        await wait_until(pilot, lambda: not app.generating and app.entries[1].status != "streaming")
        msgs = stored(app)
        assert len(msgs) == 2 and msgs[1].content.startswith("Hi th")
        assert len(msgs[1].content) > len("Hi th") and msgs[1].content == app.entries[1].content


async def test_continue_loads_the_conversations_model_context_and_draft_first(tmp_path):
    """--continue on a chat that ran another file, ctx 256 and the ngram draft loads those,
    with no "used model X; continues with Y" notice."""
    from helpers.tiny_models import write_random_model

    other = write_random_model(tmp_path / "other.gguf")
    store = ConversationStore.open()
    c = store.create_conversation("Old chat", model=str(other),
                                  params={"temperature": 0.0, "ctx_size": 256, "draft": "ngram"})
    store.add_message(c.id, "user", "Hello")
    store.close()
    app = ChatApp(*chat_config(threads=2), continue_last=True)  # loads its own engine
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.session.engine is not None
                         and app.query_one(GaugeBar).state == "ready")
        assert app.session.engine.info.path == str(other) and app.session.engine.info.n_ctx == 256
        assert (app.session.config.model, app.session.config.draft.record()) == (str(other), "ngram")
        assert not app.query(".notice")


async def test_regenerate_replaces_the_last_reply(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "Say one word.")
        old, old_view = stored(app)[1], app.entries[-1].view
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not app.generating and app.entries[-1].view is not old_view
                         and app.entries[-1].status == "complete")
        msgs = stored(app)
        assert [m.role for m in msgs] == ["user", "assistant"]
        assert msgs[1].created > old.created and msgs[1].content == app.entries[1].content
        assert not old_view.is_attached
        assert msgs[1].content and msgs[1].status == "complete"
        assert len(app.entries) == 2


async def test_edit_the_last_message_and_resend(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "What is the capital of France?")
        prompt = app.query_one(PromptInput)
        prompt.focus()
        await pilot.press("up")  # empty input: edit the last message
        assert prompt.text == "What is the capital of France?" and app.editing == 0
        assert "editing" in str(prompt.border_title)
        await pilot.press("escape")  # cancel: nothing changes
        assert app.editing is None and prompt.text == "" and len(stored(app)) == 2
        await pilot.press("up")
        prompt.text = "What is the capital of Italy?"
        await pilot.press("enter")
        await wait_until(pilot, lambda: not app.generating and len(app.entries) == 2
                         and app.entries[-1].status == "complete")
        msgs = stored(app)
        assert [(m.role, m.status) for m in msgs] == [("user", "complete"), ("assistant", "complete")]
        assert msgs[0].content == "What is the capital of Italy?" == app.entries[0].content
        assert msgs[1].content == app.entries[1].content != ""
        assert len(app.query(".message.user")) == 1  # the France message left the screen too


async def test_escape_saves_the_partial_reply_as_interrupted_and_continue_extends_it(engine):
    app = make_app(engine, max_tokens=400)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "Write a very long story about a dragon.")
        gauges = app.query_one(GaugeBar)
        await wait_until(pilot, lambda: gauges.stats is not None and gauges.stats.completion_tokens >= 3)
        await pilot.press("escape")
        await wait_until(pilot, lambda: not app.generating and app.entries[-1].status == "interrupted")
        msg = stored(app)[1]
        assert msg.status == "interrupted" and msg.content == app.entries[1].content != ""
        partial = msg.content
        await send(pilot, "/set max_tokens 6")
        await send(pilot, "/continue")
        await wait_until(pilot, lambda: not app.generating and app.entries[-1].status == "complete")
        msg = stored(app)[1]
        assert len(stored(app)) == 2
        assert msg.content.startswith(partial) and len(msg.content) > len(partial)
        assert msg.stats["completion_tokens"] <= 6


async def test_slash_commands_set_validate_and_report_one_line_errors(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        prompt = app.query_one(PromptInput)
        await send(pilot, "/set temp 1.5")
        assert app.session.params.sampling.temperature == 1.5
        for bad, needle in [("/set temp -1", "temperature"), ("/set top_p 2", "top-p"),
                            ("/set top_k x", "whole number"), ("/set bogus 1", "unknown parameter"),
                            ("/set max_tokens 0", "max_tokens"), ("/frobnicate", "unknown command")]:
            await send(pilot, bad)
            assert needle in app.last_error and "\n" not in app.last_error
            assert prompt.text == bad  # what was typed is back in the input
            prompt.text = ""
        assert app.session.params.sampling.temperature == 1.5 and app.entries == []
        await send(pilot, "/set temp 0")
        await send(pilot, "/set seed 42")
        await send(pilot, "/system Answer in one word.")
        assert app.session.params.system == "Answer in one word." and app.session.params.sampling.seed == 42
        await chat(pilot, "Capital of France?")
        conv = app.session.store.get_conversation(app.session.conversation.id)
        assert conv.system_prompt == "Answer in one word." and conv.params["seed"] == 42
        await send(pilot, "/set top_k 12")  # saved with the conversation from now on
        assert app.session.store.get_conversation(app.session.conversation.id).params["top_k"] == 12
        await send(pilot, "//etc is a folder")  # // sends a message starting with /
        await wait_until(pilot, lambda: not app.generating and len(app.entries) == 4)
        assert app.entries[2].content == "/etc is a folder"


async def test_export_stats_copy_help_and_clear(engine):
    app = make_app(engine, max_tokens=40)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "/export")
        assert "nothing to export" in app.last_error
        await chat(pilot, "Write a one-line Python hello world in a code block.")
        reply = app.entries[1].content
        await send(pilot, "/export md")
        md = app.last_export.read_text()
        assert app.last_export.suffix == ".md" and reply.strip() in md and "## You" in md
        assert "- model: SmolLM2-135M-Instruct Q4_1 (`default`)" in md  # not only `default`
        out = home() / "chat.json"
        await send(pilot, f"/export json {out}")
        data = json.loads(out.read_text())
        assert [m["content"] for m in data["messages"]] == [e.content for e in app.entries]
        assert data["messages"][1]["stats"]["completion_tokens"] > 0

        await send(pilot, "/stats")
        assert isinstance(app.screen, InfoScreen)
        body = app.screen.body
        assert "prompt_tokens" in body and "decode_tok_s" in body and "finish_reason" in body
        await pilot.press("escape")
        assert not isinstance(app.screen, InfoScreen)

        await send(pilot, "/copy")
        clip = home() / "clipboard.txt"
        assert clip.read_text() == reply == app.clipboard
        if "```" in reply:
            await send(pilot, "/copy code")
            assert clip.read_text() in reply and "```" not in clip.read_text()
        await pilot.press("f1")
        assert isinstance(app.screen, InfoScreen) and "/regen" in app.screen.body
        await pilot.press("escape")

        old = app.session.conversation.id
        await send(pilot, "/clear")
        assert app.entries == [] and app.session.conversation is None
        assert len(app.session.store.messages(old)) == 2  # the old one stays in the history


async def test_ctrl_n_from_the_conversation_list_puts_the_focus_in_the_input(engine):
    app = make_app(engine, max_tokens=4)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "Hello")
        first = app.session.conversation.id
        await pilot.press("ctrl+b", "ctrl+n")
        await pilot.pause()
        assert isinstance(app.focused, PromptInput)
        assert app.query_one(GaugeBar).stats is None  # not the last chat's ctx and rates
        await pilot.press(*"Hi", "enter")  # typed into the new chat, not the list
        await wait_until(pilot, lambda: not app.generating and len(app.entries) == 2)
        assert app.entries[0].content == "Hi" and app.session.conversation.id != first


async def test_the_system_prompt_is_shown_and_an_empty_chat_says_what_to_do(engine):
    app = ChatApp(*chat_config(sampling=GREEDY, max_tokens=4, system="Be brief."), engine=engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        line = app.query_one("#system-line")
        assert line.display and "System: Be brief." in str(line.render())
        assert "Enter sends" in app.query_one(PromptInput).placeholder
        await send(pilot, "/system Answer in [b]French[/b].")  # shown as typed, not as markup
        assert "System: Answer in [b]French[/b]." in str(line.render())
        await send(pilot, "/system")
        await pilot.pause()
        assert not line.display


async def test_attach_shows_tokens_then_goes_with_the_next_message(engine, tmp_path):
    code = tmp_path / "add.py"
    code.write_text("def add(a, b):\n    return a + b\n")
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\x00\x01")
    (tmp_path / "big.txt").write_text("word " * 3000)
    app = make_app(engine, max_tokens=4)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, f"/attach {tmp_path / 'blob.bin'}")
        assert "binary file" in app.last_error and not app.attachments
        await send(pilot, f"/attach {tmp_path / 'big.txt'}")
        assert "cannot fit in the 1024-token context" in app.last_error
        await send(pilot, f"/attach {code}")
        notice = str(app.query(".notice").last().render())
        assert "add.py" in notice and "tokens of the 1024-token context" in notice
        assert "⚠" not in notice  # a note, not a warning
        await chat(pilot, "What does it do?")
        sent = app.entries[0].content
        assert sent.startswith("File add.py:\n```\ndef add(a, b):") and sent.endswith("What does it do?")
        assert stored(app)[0].content == sent and not app.attachments  # kept as text


async def test_f1_help_rows_keep_commands_with_a_bar_in_one_row(engine):
    from textual.widgets._markdown import MarkdownTable

    app = make_app(engine)
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        await pilot.pause()
        rows = [[cell.plain for cell in row] for table in app.screen.query(MarkdownTable)
                for row in table._rows]
        export = next(row for row in rows if row[0].startswith("/export"))
        assert export == ["/export [md|json] [PATH]",
                          "write this conversation (the branch on screen) to a file"]


async def test_copy_without_code_block_is_an_error(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, "/copy")
        assert "no reply" in app.last_error
        app.session.entries.clear()
        await chat(pilot, "Say hi.")
        app.session.entries[-1].content = "no code here"
        await pilot.press("f3")
        assert "no code block" in app.last_error


async def test_command_palette_provider_runs_chat_actions(engine):
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "Say one word.")
        old_view = app.entries[-1].view
        provider = ChatCommands(app.screen)
        hits = [h async for h in provider.search("regenerate")]
        assert hits and hits[0].text == "Regenerate reply"
        await hits[0].command()
        await wait_until(pilot, lambda: not app.generating and app.entries[-1].view is not old_view
                         and app.entries[-1].status == "complete")
        titles = [h.text async for h in provider.discover()]
        assert {"Continue reply", "Export as JSON", "Copy last code block", "Help"} <= set(titles)


async def test_corrupt_database_starts_without_history_and_sets_it_aside(engine):
    db = home() / "history.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    garbage = b"\x00garbage" * 4096
    db.write_bytes(garbage)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert app.session.store is None and app.store_problem.kind == "corrupt"
        notices = [str(n.render()) for n in app.query(".notice")]
        assert any("damaged" in n for n in notices), notices
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # not now: the file stays as it is, the chat still works
        assert db.read_bytes() == garbage
        await chat(pilot, "Hi")
        assert app.entries[-1].content
        app.conversations.answer_set_aside(True)  # what "Set aside" does
        aside = [p for p in home().iterdir() if p.name.startswith("history.db.corrupt-")]
        assert len(aside) == 1 and aside[0].read_bytes() == garbage
        assert app.session.store is not None and app.session.store.integrity_check() == "ok"
        await chat(pilot, "Hello again")
        assert [m.content for m in stored(app)][0] == "Hello again"


async def test_corrupt_database_set_aside_from_the_dialog(engine):
    db = home() / "history.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"not sqlite" * 1000)
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.press("y")
        await wait_until(pilot, lambda: app.session.store is not None)
        assert any(p.name.startswith("history.db.corrupt-") for p in home().iterdir())


async def test_locked_database_starts_without_history_and_says_so(engine):
    db = home() / "history.db"
    ConversationStore.open(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        app = make_app(engine, db_busy_timeout_ms=200)
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            assert app.session.store is None and app.store_problem.kind == "locked"
            notices = [str(n.render()) for n in app.query(".notice")]
            assert any("locked" in n and "history is off" in n for n in notices), notices
            await chat(pilot, "Hi")  # chatting still works, in memory
            assert app.entries[-1].content
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert db.is_file()


async def test_keys_rebound_by_action_name_in_config_toml(engine):
    write_config('[keys]\nregenerate = "f5"\ntoggle_theme = "f9"\n')
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await chat(pilot, "Say one word.")
        old_view = app.entries[-1].view
        await pilot.press("f5")
        await wait_until(pilot, lambda: not app.generating and app.entries[-1].view is not old_view
                         and app.entries[-1].status == "complete")
        theme = app.theme
        await pilot.press("f9")
        assert app.theme != theme


async def test_bad_keymap_is_reported_and_defaults_kept(engine):
    write_config('[keys]\nfly = "f5"\n')
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        notices = [str(n.render()) for n in app.query(".notice")]
        assert any("unknown action 'fly'" in n for n in notices), notices
        theme = app.theme
        await pilot.press("ctrl+t")
        assert app.theme != theme


async def test_a_fork_keeps_its_mark_in_the_sidebar_and_an_attachment_is_not_the_title(
        engine, tmp_path):
    code = tmp_path / "fib.py"
    code.write_text("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n")
    app = make_app(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, f"/attach {code}")
        await chat(pilot, "What is the capital of France, and what does this file do?")
        assert app.session.conversation.title.startswith("What is the capital of France")
        await send(pilot, "/fork")
        await wait_until(pilot, lambda: app.session.conversation.title.endswith("(fork)"))
        await pilot.press("ctrl+b")
        await pilot.pause()
        items = list(app.query(ConversationItem))
        shown = [str(item.query_one(Label).render()) for item in items]
        # each title fits its row (the row cuts what does not), and the fork's mark shows
        assert all(cell_len(text) <= item.size.width for text, item in zip(shown, items))
        assert len(shown) == 2 and shown[0] != shown[1]  # the fork and its original
        assert shown[0].endswith("(fork)") and "…" in shown[0]


async def test_json_command_constrains_this_conversations_replies_and_is_stored(engine, tmp_path):
    """/json SCHEMA_FILE: the next replies validate against the schema, the gauge says json,
    the conversation keeps it when reopened; /json off frees them; a new chat has none."""
    import json

    import jsonschema

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    (tmp_path / "city.json").write_text(json.dumps(schema))
    app = make_app(engine, max_tokens=40)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await send(pilot, f"/json {tmp_path / 'city.json'}")
        assert app.session.params.constraint is not None and app.query_one(GaugeBar).constrained
        assert "json" in str(app.query_one(GaugeBar).render())
        await chat(pilot, "Which city is the capital of France?")
        reply = app.entries[-1]
        jsonschema.validate(json.loads(reply.content), schema)
        assert reply.finish_reason == "stop"
        cid = app.session.conversation.id
        assert app.session.store.get_conversation(cid).params["constraint"]["kind"] == "json_schema"
        await app.conversations.new()
        assert app.session.params.constraint is None and not app.query_one(GaugeBar).constrained
        assert await app.open_conversation(cid)
        assert app.session.params.constraint is not None and app.query_one(GaugeBar).constrained
        await send(pilot, "/json off")
        assert app.session.params.constraint is None
        await send(pilot, "/json /no/such/schema.json")
        assert "cannot read it" in app.last_error
