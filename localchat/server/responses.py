"""The OpenAI response objects, streamed (SSE chunks) or whole, from engine events; a finished
request also carries llama.cpp-server-style `timings` (plus ttft_ms) from the engine's Stats."""

from __future__ import annotations

import json
import secrets
import time

from localchat.engine.base import Result, Stats
from localchat.server.tool_fields import ToolUse
from localchat.server.tool_replies import call_dicts

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: dict) -> bytes:
    """One server-sent event: `data: {json}` and a blank line."""
    return b"data: " + json.dumps(payload, ensure_ascii=False,
                                  separators=(",", ":")).encode() + b"\n\n"


def finish_reason(result: Result) -> str:
    # "cancelled" happens only when the client is gone (or the server is stopping), so
    # no connected client should ever read it; if one does, the reply did stop.
    return "stop" if result.finish_reason == "cancelled" else result.finish_reason


def usage(stats: Stats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens,
            "completion_tokens": stats.completion_tokens,
            "total_tokens": stats.prompt_tokens + stats.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached_tokens}}


def timings(stats: Stats) -> dict:
    evaluated = stats.prompt_tokens - stats.cached_tokens
    prompt_ms = evaluated / stats.prefill_tok_s * 1000 if stats.prefill_tok_s > 0 else 0.0
    decode_ms = max(0.0, stats.elapsed_s - stats.ttft_s) * 1000
    decoded = max(0, stats.completion_tokens - 1)  # tokens after the first one
    return {
        "cache_n": stats.cached_tokens,
        "prompt_n": evaluated,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / evaluated, 3) if evaluated else 0.0,
        "prompt_per_second": round(stats.prefill_tok_s, 3),
        "predicted_n": stats.completion_tokens,
        "predicted_ms": round(decode_ms, 3),
        "predicted_per_token_ms": round(1000 / stats.decode_tok_s, 3)
        if stats.decode_tok_s > 0 else 0.0,
        "predicted_per_second": round(stats.decode_tok_s, 3),
        "decoded_n": decoded,
        "ttft_ms": round(stats.ttft_s * 1000, 3),
    }


class Reply:
    """The objects of one response: a chat completion or a text completion."""

    def __init__(self, chat: bool, model: str, tools: ToolUse | None = None) -> None:
        """tools: the tools a reply may call, read in their format (None: none offered)."""
        self.chat = chat
        self.model = model
        self.tools = tools
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices}

    def body(self, result: Result) -> dict:
        """The whole (non-streamed) response."""
        choice = {"index": 0, "finish_reason": finish_reason(result), "logprobs": None}
        parsed = self.tools.read(result.text) if self.tools is not None else None
        if parsed is not None:
            choice["message"] = {"role": "assistant", "content": parsed.content,
                                 "tool_calls": call_dicts(parsed.calls)}
            choice["finish_reason"] = "tool_calls"
        elif self.chat:
            text = self.tools.writer.without_echo(result.text) if self.tools else result.text
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = result.text
        return {**self._envelope("chat.completion" if self.chat else "text_completion",
                                 [choice]),
                "usage": usage(result.stats), "timings": timings(result.stats)}

    def chunk(self, text: str | None = None, finish: Result | None = None,
              role: bool = False, called: bool = False) -> dict:
        """One streamed chunk: the role (chat, first), a piece of text, or the finish
        ("tool_calls" if the reply was `called`)."""
        reason = ("tool_calls" if called else finish_reason(finish)) if finish else None
        choice: dict = {"index": 0, "finish_reason": reason, "logprobs": None}
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        out = self._envelope("chat.completion.chunk" if self.chat else "text_completion",
                             [choice])
        if finish is not None:
            out["timings"] = timings(finish.stats)
        return out

    def pieces(self, text: str, deltas: list[dict]) -> list[dict]:
        """Chunks for streamed content (if any) and then each delta.tool_calls piece."""
        chunks = [self.chunk(text=text)] if text else []
        return chunks + [self._envelope("chat.completion.chunk", [
            {"index": 0, "finish_reason": None, "logprobs": None,
             "delta": {"tool_calls": [delta]}}]) for delta in deltas]

    def usage_chunk(self, result: Result) -> dict:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return {**self._envelope("chat.completion.chunk" if self.chat else "text_completion",
                                 []), "usage": usage(result.stats)}
