"""Render a model's untrusted chat template in the sandbox, split into template text (tokenized
with special tokens) and message content (plain text), so a typed `<|im_start|>` never
becomes a control token."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from localchat.prompt.builtin_templates import BUILTIN_TEMPLATES, MAX_TEMPLATE_CHARS
from localchat.prompt.sandbox import (
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_TIME_LIMIT_S,
    RenderLimits,
    compile_template,
)
from localchat.message import Message, Tool
from localchat.prompt.tool_calls import (
    has_tool_turns,
    template_takes_tools,
    tool_format,
    tool_format_for,
)
from localchat.errors import TemplateError

# Text that looks like a control token in some model family.
_CONTROL_LIKE = (
    "<|", "|>", "<｜", "｜>", "<s>", "</s>", "[INST]", "[/INST]", "<<SYS>>",
    "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
)


@dataclass(frozen=True)
class Segment:
    """A run of prompt text; trusted text may contain special tokens, untrusted never."""

    text: str
    trusted: bool


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    segments: tuple[Segment, ...]


# --- splitting trusted template text from untrusted message text ---------------------


def _split(rendered: str, sentinels: list[str], contents: list[str]) -> list[Segment] | None:
    """Cut the sentinel render at each sentinel; None unless each occurs exactly once
    (an empty content has none: templates may leave it out)."""
    spots = []
    for i, sentinel in enumerate(sentinels):
        if not sentinel:
            continue
        if rendered.count(sentinel) != 1:
            return None
        spots.append((rendered.index(sentinel), i))
    segments, cursor = [], 0
    for position, i in sorted(spots):
        segments += [Segment(rendered[cursor:position], True), Segment(contents[i], False)]
        cursor = position + len(sentinels[i])
    segments.append(Segment(rendered[cursor:], True))
    return segments


def _merge(segments: Iterable[Segment]) -> tuple[Segment, ...]:
    merged: list[Segment] = []
    for seg in segments:
        if not seg.text:
            continue
        if merged and merged[-1].trusted == seg.trusted:
            merged[-1] = Segment(merged[-1].text + seg.text, seg.trusted)
        else:
            merged.append(seg)
    return tuple(merged)


def looks_like_control_token(text: str) -> bool:
    return any(marker in text for marker in _CONTROL_LIKE)


def _message_dict(message: Message, content: str) -> dict[str, Any]:
    """A message as Hugging Face templates read it (tool calls' arguments as objects)."""
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments_value()}}
                             for c in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _refuse_control_tokens_in_tools(tools: Sequence[Tool], messages: Sequence[Message]) -> None:
    """Tools and calls a template renders itself land in its trusted text: refuse any
    that would type a control token there."""
    texts = [t.name + t.description + t.parameters for t in tools]
    texts += [c.name + c.arguments for m in messages for c in m.tool_calls]
    if any(looks_like_control_token(t) for t in texts):
        raise TemplateError("a tool definition or tool call holds text that looks like a "
                            "control token; refused")


def render_chat(
    template: str | None,
    messages: Sequence[Message],
    *,
    tools: Sequence[Tool] = (),
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
) -> RenderedPrompt:
    """Render messages with the model's chat template (ChatML when it has none); the segments
    marking where contents land are used only if they reproduce the real render exactly.
    tools: rendered by the template if it takes `tools`, else as its family's tools section
    (tool_calls.py), as are past calls and tool results. Raises TemplateError for unsafe,
    broken or too costly templates."""
    source = template or BUILTIN_TEMPLATES["chatml"]  # no (or an empty) template: ChatML
    native = template_takes_tools(source)
    if (tools or has_tool_turns(messages)) and not native:
        messages, tools = tool_format(tool_format_for(source)).inline(messages, tools), ()
    _refuse_control_tokens_in_tools(tools, messages)
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"chat template rejected: longer than {MAX_TEMPLATE_CHARS} characters")
    limits = RenderLimits(time_limit_s, max_output_chars)
    compiled = limits.run(lambda: compile_template(source))

    def context(contents: Sequence[str]) -> dict[str, Any]:
        return {
            "messages": [_message_dict(m, c) for m, c in zip(messages, contents)],
            **({"tools": [t.as_dict() for t in tools]} if tools else {}),
            "bos_token": bos_token,
            "eos_token": eos_token,
            "add_generation_prompt": add_generation_prompt,
        }

    contents = [m.content for m in messages]
    nonce = secrets.token_hex(6)
    sentinels = [f"\ue000Msg{nonce}:{i}\ue001" if c else "" for i, c in enumerate(contents)]
    with_sentinels = limits.render(compiled, context(sentinels))
    real = limits.render(compiled, context(contents))

    for candidate in (contents, [c.strip() for c in contents]):
        segments = _split(with_sentinels, sentinels, candidate)
        if segments is not None and "".join(s.text for s in segments) == real:
            return RenderedPrompt(real, _merge(segments))
    if any(looks_like_control_token(c) for c in contents):
        raise TemplateError(
            "the model's chat template transforms message text; "
            "cannot keep typed control tokens as plain text"
        )
    return RenderedPrompt(real, _merge([Segment(real, True)]))
