"""A tool's result as the text fed back to the model. A result is data, not instructions:
it goes into a `tool` message, whose text the template renderer keeps as plain text (control
tokens typed in it are never special), and it is capped so one call cannot fill the context.
Images, audio and binary resources are described, not pasted."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

MAX_RESULT_BYTES = 16 * 1024  # of text fed back; the rest is cut, with a note


@dataclass(frozen=True)
class ToolOutcome:
    """What a call gave: the text the model reads, and whether it is an error."""

    text: str
    error: bool = False


def outcome_of(result) -> ToolOutcome:
    """An MCP CallToolResult as text: text blocks joined, other blocks described."""
    parts = [_block_text(block) for block in getattr(result, "content", None) or []]
    text = "\n".join(p for p in parts if p)
    if not text and getattr(result, "structured_content", None) is not None:
        import json

        text = json.dumps(result.structured_content, ensure_ascii=False)
    return ToolOutcome(capped(text), bool(getattr(result, "is_error", False)))


def _block_text(block) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_decoded_size(block.data):,} bytes, not shown]"
    if kind == "resource":
        resource = block.resource
        if getattr(resource, "text", None) is not None:
            return resource.text
        return (f"[binary resource {resource.uri}: {resource.mime_type or 'unknown type'}, "
                f"{_decoded_size(getattr(resource, 'blob', '')):,} bytes, not shown]")
    if kind == "resource_link":
        return f"[resource: {block.uri}]"
    return f"[{kind or 'unknown'} content, not shown]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def capped(text: str, limit: int = MAX_RESULT_BYTES) -> str:
    """At most `limit` UTF-8 bytes of text, cut on a character, with a note of the size."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    kept = raw[:limit].decode("utf-8", errors="ignore")
    return f"{kept}\n[result cut: {limit:,} of {len(raw):,} bytes shown]"
