"""Prompts the target writes itself: its chat template up to the start of a user turn, then
sampled text until the turn ends (the Magpie recipe). Users' questions vary more than any
fixed list of templates, and a draft must agree with the target on what users ask."""

from __future__ import annotations

from typing import Callable

import torch

from localchat.engine.base import Message
from localchat.engine.runtime.executor_api import Chunk

TOP_K = 40  # sampled from the target's 40 most likely tokens at temperature 1


def user_turn_prefix(vocab, template: str | None) -> list[int]:
    """The tokens a rendered conversation has before the first user message's text: the
    longest common prefix of two one-message renderings."""
    a = vocab.tokenize_messages(template, [Message("user", "A")])
    b = vocab.tokenize_messages(template, [Message("user", "B")])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def self_prompts(executor, template: str | None, count: int, seed: int = 0,
                 max_tokens: int = 96, parallel: int = 16,
                 on_prompt: Callable[[], None] = lambda: None) -> list[str]:
    """`count` distinct user messages the target writes after its template's user-turn
    prefix (sampled, `parallel` at a time); turns cut off at max_tokens are dropped."""
    vocab = executor.vocab
    prefix = user_turn_prefix(vocab, template)
    generator = torch.Generator().manual_seed(seed)
    slots = {slot: list(prefix) for slot in range(parallel)}
    computed = dict.fromkeys(slots, 0)
    found: dict[str, None] = {}
    attempts = 0
    while len(found) < count and attempts < 4 * count:
        chunks = [Chunk(slot=s, tokens=t[computed[s]:], start=computed[s], n_logits=1,
                        block_table=[], write_from=computed[s], n_prompt=len(t))
                  for s, t in slots.items()]
        logits = torch.from_numpy(executor.forward(chunks))
        for row, chunk in enumerate(chunks):
            tokens = slots[chunk.slot]
            computed[chunk.slot] = len(tokens)
            token = _sample(logits[row], generator)
            written = len(tokens) - len(prefix)
            if vocab.is_end_of_generation(token) or written >= max_tokens:
                attempts += 1
                text = b"".join(vocab.detokenize(t) for t in tokens[len(prefix):])
                text = text.decode("utf-8", errors="replace").strip()
                if not vocab.is_end_of_generation(token) or len(text) < 8 or text in found:
                    pass  # cut off, too short or seen: not a prompt
                else:
                    found[text] = None
                    on_prompt()
                slots[chunk.slot], computed[chunk.slot] = list(prefix), 0
            else:
                tokens.append(token)
    return list(found)[:count]


def _sample(logits: torch.Tensor, generator: torch.Generator) -> int:
    top, ids = logits.float().topk(TOP_K)
    pick = torch.multinomial(torch.softmax(top, -1), 1, generator=generator)
    return int(ids[pick])
