"""From sampled token ids to the engine interface's events, the same for every engine: UTF-8
across token boundaries, stop strings, end-of-generation, cancellation, the token budget
and stats."""

from __future__ import annotations

import codecs
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from localchat.engine.base import Delta, Event, Request, Result, Stats
from localchat.engine.runtime.stops import StopMatcher
from localchat.errors import ContextOverflowError


def check_prompt_fits(n_prompt: int, n_ctx: int, n_ctx_train: int) -> None:
    if n_prompt >= n_ctx:
        raise ContextOverflowError(
            f"the prompt is {n_prompt} tokens but the context window is {n_ctx} tokens "
            f"(load the model with a larger context, up to {n_ctx_train})")


@dataclass
class EngineHooks:
    """What the stream needs from the engine."""

    detokenize: Callable[[int], bytes]
    is_end_of_generation: Callable[[int], bool]
    prompt_evaluated: Callable[[], int]  # prompt tokens actually computed (asked at token 1)
    memory: Callable[[], dict]  # kv_cache_bytes, kv_cache_capacity_bytes, context_tokens, ...


def stream_events(
    request: Request,
    prompt: list[int],
    tokens: Iterator[int],
    hooks: EngineHooks,
    budget: int,
    cancel: threading.Event,
    t_start: float,
) -> Iterator[Event]:
    """Yield a Delta per token, then one Result. `budget`: most tokens to generate."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    stops = StopMatcher(request.stop)
    text: list[str] = []
    completion: list[int] = []
    t_prefill = time.perf_counter()
    t_first = t_last = 0.0
    evaluated = 0
    finish = "length"

    def stats() -> Stats:
        first = t_first or time.perf_counter()
        prefill_s, decode_s = first - t_prefill, t_last - first
        decoded = max(0, len(completion) - 1)  # tokens produced after the first one
        return Stats(
            prompt_tokens=len(prompt),
            cached_tokens=max(0, len(prompt) - evaluated),
            completion_tokens=len(completion),
            ttft_s=first - t_start,
            prefill_tok_s=evaluated / prefill_s if prefill_s > 0 else 0.0,
            decode_tok_s=decoded / decode_s if decoded and decode_s > 0 else 0.0,
            elapsed_s=time.perf_counter() - t_start,
            **hooks.memory(),
        )

    try:
        for item in tokens:
            token, drafted = item if isinstance(item, tuple) else (item, False)
            now = time.perf_counter()
            if not t_first:
                t_first, evaluated = now, hooks.prompt_evaluated()
            t_last = now
            if hooks.is_end_of_generation(token):
                finish = "stop"
                break
            completion.append(token)
            visible = stops.feed(decoder.decode(hooks.detokenize(token)))
            text.append(visible)
            yield Delta(text=visible, token_ids=(token,), stats=stats(), from_draft=drafted)
            if stops.stopped:
                finish = "stop"
                break
            if cancel.is_set():
                finish = "cancelled"
                break
            if len(completion) >= budget:
                break
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()
    if finish == "length" and cancel.is_set() and len(completion) < budget:
        finish = "cancelled"  # the tokens stopped coming because of the cancel
    if not stops.stopped:
        # Bytes still pending are the start of a character the cut (max_tokens, cancel) left
        # unfinished: dropped, never shown as U+FFFD (invalid bytes were replaced already).
        tail = stops.flush()
        if tail:
            text.append(tail)
            yield Delta(text=tail, token_ids=(), stats=stats())
    yield Result(text="".join(text), finish_reason=finish, stats=stats())
