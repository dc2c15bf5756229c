"""One reply's generated token ids and its draft stats, for speculation tests."""

from __future__ import annotations

from localchat.engine.base import Message, Request, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def reply_tokens(engine, prompt: str, n: int, sampling: SamplingParams = GREEDY
                 ) -> tuple[list[int], dict | None]:
    """(the reply's token ids, Stats.draft) for one user message, at most n tokens."""
    tokens, last = [], None
    for event in engine.generate(Request(messages=[Message("user", prompt)], sampling=sampling,
                                         max_tokens=n)):
        tokens += getattr(event, "token_ids", ())
        last = event
    return tokens, last.stats.draft
