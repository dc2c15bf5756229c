"""ReplyParams' stored record: what a conversation keeps of its tools comes back as it was,
and a record this localchat did not write reads as the defaults."""

from __future__ import annotations

from localchat.chat.params import ReplyParams


def test_tools_off_and_allowed_come_back_from_the_record():
    params = ReplyParams(tools_off=("add",), tools_allowed=("get_weather", "add"))
    record = params.to_record()
    assert record["tools_off"] == ["add"] and record["tools_allowed"] == ["get_weather", "add"]
    back = ReplyParams.from_record(record, None, ReplyParams())
    assert back.tools_off == ("add",) and back.tools_allowed == ("get_weather", "add")
    assert "tools_off" not in ReplyParams().to_record()


def test_damaged_tool_lists_read_as_none():
    back = ReplyParams.from_record({"tools_off": "add", "tools_allowed": [1, "x"]}, None,
                                   ReplyParams())
    assert back.tools_off == () and back.tools_allowed == ("x",)
