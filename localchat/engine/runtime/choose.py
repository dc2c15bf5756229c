"""A step's new tokens from its logits: the rows a constraint governs masked to what its
grammar allows (drafted positions included), drafts verified by the acceptance rule, the
other rows sampled together."""

from __future__ import annotations

import numpy as np

from localchat.engine.runtime.decided import fit_width
from localchat.engine.runtime.guide import step_masks
from localchat.engine.runtime.sampler import Row, argmax, distributions, penalized, sample
from localchat.engine.runtime.scheduler import ScheduledChunk
from localchat.engine.runtime.sequence import Sequence
from localchat.engine.runtime.speculative.rule import accept_drafts, accept_greedy

FROM_DRAFT = True  # queued as (token, FROM_DRAFT) for tokens a draft proposed and the target kept


def constraint_masks(chunks: list[ScheduledChunk]) -> dict[int, np.ndarray]:
    """logits row -> the tokens allowed there (the tokenizer's width), for the rows a
    constraint governs."""
    guided, row = [], 0
    for chunk in chunks:
        if not chunk.samples:
            continue
        guide = chunk.seq.guide
        if guide is not None:
            guided.append((guide, row, chunk.drafts[:guide.valid_prefix(chunk.drafts)]))
        row += 1 + len(chunk.drafts)
    if not guided:
        return {}
    return step_masks(guided, row, guided[0][0].vocab_size)


def choose_tokens(chunks: list[ScheduledChunk], logits: np.ndarray,
                  masks: dict[int, np.ndarray]) -> dict[int, list]:
    """Per sampling sequence, its new tokens: kept drafts (as (token, FROM_DRAFT)), then
    the token the target chose. Plain rows are sampled together; a constrained row only
    among the tokens its grammar allows there (masks: row -> allowed)."""
    out: dict[int, list] = {}
    masks = {r: fit_width(m, logits.shape[-1]) for r, m in masks.items()}
    plain_rows, plain_seqs = [], []
    row = 0
    for chunk in chunks:
        if not chunk.samples:
            continue
        seq, n = chunk.seq, 1 + len(chunk.drafts)
        if chunk.drafts:
            allowed = [masks.get(r) for r in range(row, row + n)]
            kept, token = verify(seq, chunk, logits[row:row + n], allowed)
            out[seq.seq_id] = [(d, FROM_DRAFT) for d in chunk.drafts[:kept]] + [token]
        else:
            plain_rows.append(row)
            plain_seqs.append(seq)
        row += n
    if plain_seqs:
        rows = [Row(s.params, s.completion if s.params.repeat_penalty != 1.0 else (),
                    s.generator, masks.get(r)) for s, r in zip(plain_seqs, plain_rows)]
        plain = logits if len(plain_rows) == logits.shape[0] else logits[plain_rows]
        for seq, token in zip(plain_seqs, sample(plain, rows)):
            out[seq.seq_id] = [token]
    return out


def verify(seq: Sequence, chunk: ScheduledChunk, logits: np.ndarray,
           allowed: list[np.ndarray | None]) -> tuple[int, int]:
    """(drafts kept, the token after them) under the acceptance rule."""
    drafts, sp = chunk.drafts, seq.params
    rows = [Row(sp, seq.completion + drafts[:i], seq.generator, allowed[i])
            for i in range(len(drafts) + 1)]
    if sp.temperature == 0:
        return accept_greedy(argmax(penalized(logits, rows)), drafts)
    return accept_drafts(distributions(logits, rows), chunk.q, drafts, seq.generator)
