"""A conversation's branch on screen as Markdown or JSON, written atomically (never a
half-written file); a message with other versions says which one it is."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from localchat.atomic import atomic_write_text
from localchat.storage.conversations import Conversation, StoredMessage
from localchat.storage.reply_status import reply_label

FORMATS = ("md", "json")
_ROLE_HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant"}


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def close_open_fences(text: str) -> str:
    """The text with a closing fence added when it ends inside a fenced code block
    (CommonMark: the same character, at least as long, nothing after it)."""
    open_fence = None
    for line in text.splitlines():
        match = _FENCE.match(line)
        if not match:
            continue
        fence, rest = match.groups()
        if open_fence is None:
            if not (fence[0] == "`" and "`" in rest):  # a backtick fence's info has no backtick
                open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not rest.strip():
            open_fence = None
    if open_fence is None:
        return text
    return text + ("" if text.endswith("\n") else "\n") + open_fence


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def to_markdown(conv: Conversation, messages: list[StoredMessage],
                model_name: str | None = None) -> str:
    """model_name: the loaded model's readable name, shown before the stored spec."""
    model = f"{model_name} (`{conv.model}`)" if model_name else f"`{conv.model or '?'}`"
    lines = [f"# {conv.title}", "",
             f"- model: {model}",
             f"- created: {_when(conv.created)}",
             f"- parameters: `{json.dumps(conv.params, sort_keys=True)}`"]
    if conv.system_prompt:
        lines += ["", "## System", "", close_open_fences(conv.system_prompt)]
    for m in messages:
        heading = _ROLE_HEADINGS.get(m.role, m.role)
        label = reply_label(m.status, m.finish_reason)
        if label:
            heading += f" ({label})"
        if m.version[1] > 1:
            heading += f" (version {m.version[0]} of {m.version[1]})"
        lines += ["", f"## {heading}", ""]
        for call in m.tool_calls:
            lines += [f"> tool call: `{call.get('name')}({call.get('arguments', '')})` → "
                      f"{_call_outcome(call)}", ">", *[f"> {line}" for line in
                                                        str(call.get("result", "")).splitlines()],
                      ""]
        lines.append(close_open_fences(m.content))
    return "\n".join(lines).rstrip("\n") + "\n"


def _call_outcome(call: dict) -> str:
    return ("refused" if not call.get("approved", True)
            else "error" if call.get("error") else "result")


def to_json(conv: Conversation, messages: list[StoredMessage],
            model_name: str | None = None) -> str:
    data = {
        "id": conv.id, "title": conv.title, "created": conv.created, "updated": conv.updated,
        "model": conv.model, "model_name": model_name, "system_prompt": conv.system_prompt, "params": conv.params,
        "messages": [{"role": m.role, "content": m.content, "status": m.status,
                      "finish_reason": m.finish_reason,
                      "model": m.model, "params": m.params, "stats": m.stats,
                      "created": m.created, "version": m.version[0], "versions": m.version[1],
                      **({"tool_calls": list(m.tool_calls)} if m.tool_calls else {})}
                     for m in messages],
    }
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"


def default_export_path(folder: Path, conv: Conversation, fmt: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", conv.title).strip("-").lower()[:40] or "chat"
    return folder / f"{conv.id:04d}-{slug}.{fmt}"


def export_conversation(path: Path, conv: Conversation, messages: list[StoredMessage],
                        fmt: str, model_name: str | None = None) -> Path:
    if fmt not in FORMATS:
        raise ValueError(f"export format is md or json, not {fmt!r}")
    render = to_markdown if fmt == "md" else to_json
    text = render(conv, messages, model_name)
    atomic_write_text(path, text)
    return path
