"""The prompts a target writes itself (distill --prompts self), on the real bundled model: they
start where its template opens a user turn, every token is one the target proposed there,
and a seed repeats them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from localchat.engine.base import Message
from localchat.engine.executors.llamacpp import LlamaCppExecutor
from localchat.engine.runtime.executor_api import Chunk
from localchat.models.files import validate_model_file
from localchat.models.specs import resolve_model
from localchat.engine.choice import default_threads
from quantize.self_prompts import TOP_K, self_prompts, user_turn_prefix

pytestmark = pytest.mark.model  # loads the bundled model


@pytest.fixture(scope="module")
def target():
    facts = validate_model_file(Path(resolve_model("default")))
    executor = LlamaCppExecutor(facts, n_ctx=1024, threads=default_threads(), parallel=4)
    yield executor, facts.chat_template
    executor.close()


def test_the_prefix_is_the_template_up_to_the_user_s_text(target):
    executor, template = target
    prefix = user_turn_prefix(executor.vocab, template)
    rendered = executor.vocab.tokenize_messages(template, [Message("user", "hello there")])
    assert rendered[:len(prefix)] == prefix
    text = b"".join(executor.vocab.detokenize(t) for t in rendered[len(prefix):]).decode()
    assert text.startswith("hello there"), text  # ChatML: "<|im_start|>user\n" ends the prefix


def test_self_prompts_are_the_target_s_own_user_turns_and_repeat_with_a_seed(target):
    executor, template = target
    few = {"parallel": 2, "max_tokens": 64}  # 2 prompts: 1.3 s a call on one core, not 4.5-9
    prompts = self_prompts(executor, template, 2, seed=1, **few)
    assert len(prompts) == 2 and len(set(prompts)) == 2
    assert self_prompts(executor, template, 2, seed=1, **few) == prompts
    assert self_prompts(executor, template, 2, seed=2, **few) != prompts
    prefix = user_turn_prefix(executor.vocab, template)
    for prompt in prompts:
        tokens = prefix + executor.vocab.tokenize_text(prompt)
        logits = torch.from_numpy(executor.forward([Chunk(
            slot=0, tokens=tokens, start=0, n_logits=len(tokens), block_table=[], write_from=0,
            n_prompt=len(tokens))]))
        candidates = logits[len(prefix) - 1:-1].topk(TOP_K).indices
        written = torch.tensor(tokens[len(prefix):])[:, None]
        share = float((candidates == written).any(-1).float().mean())
        assert share > 0.9, (prompt, share)  # re-tokenizing the text may split a word otherwise
