"""decided.py: which logits rows a grammar decides, and the executor's rows put back in
place with zero rows for those, across a step's chunks (prefill chunks have no rows)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from localchat.engine.runtime.decided import decided_rows, fit_width, with_decided_rows
from localchat.engine.runtime.sampler import Row, argmax, penalized
from localchat.engine.base import SamplingParams


def chunk(samples: bool, drafts: int = 0):
    return SimpleNamespace(samples=samples, drafts=[0] * drafts)


def only(token: int, vocab: int = 6) -> np.ndarray:
    mask = np.zeros(vocab, dtype=bool)
    mask[token] = True
    return mask


def test_rows_put_back_in_step_order():
    # a prefill chunk (no rows), a guided chunk with 2 drafts (rows 0-2), a free one (row 3)
    chunks = [chunk(False), chunk(True, 2), chunk(True)]
    two = np.zeros(6, dtype=bool)
    two[[1, 2]] = True
    masks = {0: only(4), 1: two, 2: only(5)}
    decided = decided_rows(chunks, masks)
    assert decided == [(), (0, 2), ()]
    computed = np.arange(12, dtype=np.float32).reshape(2, 6) + 1  # rows 1 and 3
    full = with_decided_rows(computed, decided, chunks)
    assert full.shape == (4, 6)
    assert np.array_equal(full[1], computed[0]) and np.array_equal(full[3], computed[1])
    assert not full[0].any() and not full[2].any()
    # a zero row under its one-token mask picks that token, as the real row would
    rows = [Row(SamplingParams(temperature=0.0), allowed=masks.get(r)) for r in range(4)]
    assert argmax(penalized(full, rows))[0] == 4 and argmax(penalized(full, rows))[2] == 5


def test_nothing_decided_leaves_the_rows_alone():
    chunks = [chunk(True, 1)]
    logits = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    assert decided_rows(chunks, {}) == [()]
    assert with_decided_rows(logits, [()], chunks) is logits


def test_masks_fit_the_logits_width():
    mask = only(2, 4)
    assert fit_width(mask, 4) is mask
    assert fit_width(mask, 6).tolist() == [False, False, True, False, False, False]
    assert fit_width(mask, 3).tolist() == [False, False, True]
