"""Slash-command parsing and validation, code-block extraction, keymap parsing and the
Markdown/JSON exports: pure functions, no model."""

from __future__ import annotations

import json

import pytest

from localchat.chat.commands import Command, apply_set, export_args, parse_command, parse_set, unescape
from localchat.engine.base import SamplingParams
from localchat.errors import UsageError
from localchat.storage import ConversationStore
from localchat.storage.export import export_conversation, to_markdown
from localchat.tui.clipboard import code_blocks, last_code_block
from localchat.tui.keymap import load_keymap, parse_keymap


def test_parse_command():
    assert parse_command("hello") is None
    assert parse_command("//etc is a folder") is None and unescape("//etc") == "/etc"
    assert parse_command("/system  Be brief. ") == Command("system", "Be brief.")
    assert parse_command("/SET temp 0.7") == Command("set", "temp 0.7")
    assert parse_command("/?") == Command("help")
    with pytest.raises(UsageError, match="unknown command /nope"):
        parse_command("/nope")


@pytest.mark.parametrize("arg, expected", [
    ("temp 0.7", ("temperature", 0.7)), ("temperature 0", ("temperature", 0.0)),
    ("top_k 20", ("top_k", 20)), ("top-p 0.9", ("top_p", 0.9)), ("min_p 0.1", ("min_p", 0.1)),
    ("repeat_penalty 1.1", ("repeat_penalty", 1.1)), ("max_tokens 128", ("max_tokens", 128)),
    ("seed 7", ("seed", 7)), ("seed none", ("seed", None)), ("max_tokens off", ("max_tokens", None)),
])
def test_parse_set_accepts(arg, expected):
    assert parse_set(arg) == expected


@pytest.mark.parametrize("arg, needle", [
    ("temp", "usage"), ("temp 1 2", "usage"), ("warmth 1", "unknown parameter"),
    ("top_k 1.5", "whole number"), ("temp hot", "a number"), ("temp nan", "finite"),
    ("temp inf", "finite"), ("temp none", "a number"),
])
def test_parse_set_rejects(arg, needle):
    with pytest.raises(UsageError, match=needle):
        parse_set(arg)


def test_apply_set_validates_ranges_with_the_flag_rules():
    s = SamplingParams()
    assert apply_set(s, None, "temperature", 0.2)[0].temperature == 0.2
    assert apply_set(s, None, "max_tokens", 64) == (s, 64)
    for name, value, needle in [("temperature", -1.0, "temperature"), ("top_p", 0.0, "top-p"),
                                ("min_p", 2.0, "min-p"), ("repeat_penalty", 0.0, "repeat"),
                                ("seed", -3, "seed"), ("top_k", -1, "top-k"),
                                ("max_tokens", 0, "max_tokens")]:
        with pytest.raises(UsageError, match=needle):
            apply_set(s, None, name, value)


def test_export_args():
    assert export_args("") == ("md", None)
    assert export_args("json /tmp/x y.json") == ("json", "/tmp/x y.json")
    with pytest.raises(UsageError, match="md or json"):
        export_args("pdf")


def test_code_blocks():
    text = "a\n```python\nx = 1\n```\nb\n~~~\ny = 2\n~~~\n"
    assert code_blocks(text) == ["x = 1\n", "y = 2\n"]
    assert last_code_block("stopped mid-block:\n```sh\nls -l\n") == "ls -l\n"
    assert last_code_block("no code") is None


def test_keymap_parsing(tmp_path):
    assert parse_keymap({"keys": {"regenerate": "ctrl+r, f5", "help": ["f1", "f12"]}}) == \
        {"regenerate": "ctrl+r,f5", "help": "f1,f12"}
    with pytest.raises(ValueError, match="unknown action"):
        parse_keymap({"keys": {"launch": "f5"}})
    with pytest.raises(ValueError, match="key name"):
        parse_keymap({"keys": {"help": 5}})
    path = tmp_path / "config.toml"
    assert load_keymap(path)[1:] == ({}, None)  # no file: defaults, no complaint
    path.write_text("[keys\n")
    _, keymap, problem = load_keymap(path)
    assert keymap == {} and "default keys kept" in problem


def test_exports_are_complete_and_atomic(tmp_path):
    store = ConversationStore.open(tmp_path / "h.db")
    c = store.create_conversation("Paris", model="default", system_prompt="Be brief.",
                                  params={"temperature": 0})
    store.add_message(c.id, "user", "Capital of France?")
    r = store.begin_reply(c.id)
    store.finish_reply(r, "Paris, mostly", status="interrupted", stats={"completion_tokens": 3})
    conv, msgs = store.get_conversation(c.id), store.messages(c.id)
    md = to_markdown(conv, msgs)
    assert md.startswith("# Paris\n") and "## System\n\nBe brief." in md
    assert "## You\n\nCapital of France?" in md and "## Assistant (interrupted)\n\nParis, mostly" in md
    out = export_conversation(tmp_path / "out" / "c.json", conv, msgs, "json")
    data = json.loads(out.read_text())
    assert data["system_prompt"] == "Be brief." and data["params"] == {"temperature": 0}
    assert [(m["role"], m["status"]) for m in data["messages"]] == [
        ("user", "complete"), ("assistant", "interrupted")]
    assert data["messages"][1]["stats"] == {"completion_tokens": 3}
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["c.json"]  # no temp files left
    store.close()


@pytest.mark.parametrize("reply", [
    "Here:\n```python\ndef f():\n    return 1",  # cut inside a fence
    "Here:\n~~~~\ncode\n```\nstill code",  # a shorter, other fence does not close it
    "Done:\n```\nx = 1\n```",  # closed: left as it is
])
def test_markdown_export_closes_a_reply_left_inside_a_code_fence(tmp_path, reply):
    from markdown_it import MarkdownIt

    store = ConversationStore.open(tmp_path / "h.db")
    c = store.create_conversation("Code", model="default")
    store.add_message(c.id, "user", "Write f.")
    r = store.begin_reply(c.id)
    store.finish_reply(r, reply, status="interrupted")
    store.add_message(c.id, "user", "Thanks")
    md = to_markdown(store.get_conversation(c.id), store.messages(c.id))
    headings = [t.content for t in MarkdownIt("commonmark").parse(md) if t.type == "inline"
                and t.map and md.splitlines()[t.map[0]].startswith("## ")]
    # CommonMark sees every heading after the reply: its fence ends with it
    assert headings == ["You", "Assistant (interrupted)", "You"]
    assert md.count("```") + md.count("~~~~") == reply.count("```") + reply.count("~~~~") + \
        (reply != "Done:\n```\nx = 1\n```")
    store.close()
