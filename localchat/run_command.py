"""`localchat run`: one prompt in, the reply out on stdout, for scripts and pipes.

stdout carries only the reply (or one JSON object with --json); stats go to stderr.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

from localchat.engine.base import Delta, Message, Request, Result, Stats
from localchat.errors import UsageError
from localchat.settings import ChatSettings
from localchat.units import human_bytes


def read_prompt(arg: str | None, stdin=None) -> str:
    """Piped stdin first, then the argument, joined by a newline (as `llm` does)."""
    stdin = stdin if stdin is not None else sys.stdin
    parts = []
    if arg == "-" or (stdin is not None and not stdin.isatty()):
        piped = stdin.read()
        if piped.strip():
            parts.append(piped.rstrip("\n"))
    if arg not in (None, "-"):
        parts.append(arg)
    prompt = "\n".join(parts)
    if not prompt.strip():
        raise UsageError("no prompt: give one as an argument or pipe it on stdin")
    return prompt


def format_stats(stats: Stats) -> str:
    """An aligned block like `ollama run --verbose`, for stderr."""
    rows = [
        ("time to first token", f"{stats.ttft_s * 1000:.0f} ms"),
        ("prompt eval count", f"{stats.prompt_tokens} token(s) ({stats.cached_tokens} cached)"),
        ("prompt eval rate", f"{stats.prefill_tok_s:.1f} tokens/s"),
        ("eval count", f"{stats.completion_tokens} token(s)"),
        ("eval rate", f"{stats.decode_tok_s:.1f} tokens/s"),
        ("total duration", f"{stats.elapsed_s:.2f} s"),
        ("kv cache", f"{human_bytes(stats.kv_cache_bytes)} of "
                     f"{human_bytes(stats.kv_cache_capacity_bytes)}"),
        ("context", f"{stats.context_tokens} of {stats.context_capacity} tokens"),
    ]
    return "\n".join(f"{name + ':':<22}{value}" for name, value in rows)


@contextmanager
def _ctrl_c_cancels(cancel: threading.Event) -> Iterator[None]:
    """First Ctrl+C stops the reply cleanly (finish_reason 'cancelled', exit 130, the
    text so far kept); a second one interrupts at once, as in llama.cpp."""

    def on_sigint(signum, frame) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def cmd_run(args: argparse.Namespace) -> int:
    settings = ChatSettings.from_args(args)
    prompt = read_prompt(args.prompt)
    engine = settings.load_engine()
    try:
        request = Request(
            messages=settings.system_messages() + [Message("user", prompt)],
            sampling=settings.sampling,
            max_tokens=settings.max_tokens,
        )
        cancel = threading.Event()
        result = None
        with _ctrl_c_cancels(cancel):
            for event in engine.generate(request, cancel):
                if isinstance(event, Delta) and not args.json and event.text:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
                elif isinstance(event, Result):
                    result = event
        assert result is not None
        if args.json:
            out = {"text": result.text, "finish_reason": result.finish_reason,
                   **result.stats.to_dict(), "model": engine.info.name,
                   "model_path": engine.info.path, "engine": engine.name}
            print(json.dumps(out, ensure_ascii=False))
        elif not result.text.endswith("\n"):
            print()
        if args.verbose:
            print(f"\n{format_stats(result.stats)}\nfinish reason:        {result.finish_reason}",
                  file=sys.stderr)
        return 130 if result.finish_reason == "cancelled" else 0
    finally:
        engine.close()
