"""Request.assistant_prefix (continuing a stopped reply) on both engines: the prompt
ends with the prefix after the generation prompt, and only the continuation comes back."""

from __future__ import annotations

import pytest

from localchat.engine.base import Message, Request, SamplingParams
from localchat.errors import UsageError

GREEDY = SamplingParams(temperature=0.0)
QUESTION = [Message("user", "What is the capital of France?")]
PREFIX = "The capital of France is"


def _check_prefix(engine) -> None:
    plain = engine.complete(Request(messages=QUESTION, sampling=GREEDY, max_tokens=8))
    cont = engine.complete(Request(messages=QUESTION, sampling=GREEDY, max_tokens=8,
                                   assistant_prefix=PREFIX))
    # the prompt grew by exactly the prefix's tokens ...
    assert cont.stats.prompt_tokens == plain.stats.prompt_tokens + len(engine.tokenize_text(PREFIX))
    # ... and the model carried on from it instead of starting over
    assert not cont.text.lstrip().startswith("The capital")
    assert "Paris" in cont.text


def test_llamacpp_engine_continues_from_an_assistant_prefix(engine):
    _check_prefix(engine)


def test_torch_engine_continues_from_an_assistant_prefix(torch_engine):
    _check_prefix(torch_engine)


def test_prefix_needs_messages_not_raw_tokens():
    with pytest.raises(UsageError, match="assistant prefix"):
        Request(prompt_tokens=[1, 2, 3], assistant_prefix="x")
