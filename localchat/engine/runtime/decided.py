"""Logits rows a constraint decides: where the grammar allows one token only (a forced JSON
key, `": "`, a closing bracket), that token is chosen whatever the logits say, so the
executor is not asked for the row (on a CPU each logits row costs the output layer's
matmul); an all-zero row stands in for it, which the mask turns into that one token."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def decided_rows(chunks: Sequence, masks: dict[int, np.ndarray]) -> list[tuple[int, ...]]:
    """Per scheduled chunk, the offsets of its logits rows (0 = its first) whose mask
    allows exactly one token."""
    out, row = [], 0
    for chunk in chunks:
        if not chunk.samples:
            out.append(())
            continue
        n = 1 + len(chunk.drafts)
        out.append(tuple(i for i in range(n) if row + i in masks and
                         int(masks[row + i].sum()) == 1))
        row += n
    return out


def with_decided_rows(logits: np.ndarray, decided: list[tuple[int, ...]],
                      chunks: Sequence) -> np.ndarray:
    """The executor's rows with an all-zero row put back where each decided row belongs
    (the rows chunk by chunk, as if every row had been computed)."""
    if not any(decided):
        return logits
    parts, src = [], 0
    zero = np.zeros((1, logits.shape[-1]), dtype=logits.dtype)
    for chunk, skip in zip(chunks, decided):
        if not chunk.samples:
            continue
        for i in range(1 + len(chunk.drafts)):
            if i in skip:
                parts.append(zero)
            else:
                parts.append(logits[src:src + 1])
                src += 1
    return np.concatenate(parts)


def fit_width(mask: np.ndarray, width: int) -> np.ndarray:
    """A mask at the tokenizer's width made as wide as the logits (tokens past the
    tokenizer's vocabulary: never allowed)."""
    if mask.shape[0] == width:
        return mask
    if mask.shape[0] > width:
        return mask[:width]
    return np.concatenate([mask, np.zeros(width - mask.shape[0], dtype=mask.dtype)])
