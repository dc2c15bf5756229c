"""Sampling a step's rows in llama.cpp's order (repeat penalty, top-k, top-p, min-p,
temperature, draw; temperature 0: argmax), each row with its own seeded generator and
computed on its own, so a row samples the same whichever rows share its step. A
constrained row is first masked to the tokens its grammar allows, and then samples the
same way (one draw of its generator). numpy only: a prompt on the llama.cpp executor never
imports torch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from localchat.engine.base import SamplingParams

PENALTY_LAST_N = 64  # as llama-cpp-python: the penalty looks at the last 64 sampled tokens


def generator(seed: int | None) -> np.random.Generator:
    """A request's own random stream: seeded, it samples the same alone or batched."""
    return np.random.Generator(np.random.PCG64(
        seed if seed is not None else int.from_bytes(os.urandom(8), "little")))


@dataclass(frozen=True)
class Row:
    """How one row of logits is sampled."""

    params: SamplingParams
    recent: Sequence[int] = ()  # the tokens the repeat penalty looks at
    generator: np.random.Generator | None = None
    allowed: np.ndarray | None = None  # [V] bool: the tokens a constraint allows here


def argmax(logits: np.ndarray) -> list[int]:
    """Each row's argmax (the first on ties)."""
    return np.asarray(logits).argmax(-1).tolist()


def penalized(logits: np.ndarray, rows: Sequence[Row]) -> np.ndarray:
    """[R, V] float32 logits with each row's repeat penalty applied and the tokens its
    constraint refuses at -inf (a copy if any)."""
    logits = np.asarray(logits, dtype=np.float32)
    copied = False
    for r, row in enumerate(rows):
        if row.allowed is not None:
            if not copied:
                logits, copied = logits.copy(), True
            logits[r, ~row.allowed] = -np.inf
        if row.params.repeat_penalty == 1.0 or not row.recent:
            continue
        if not copied:
            logits, copied = logits.copy(), True
        ids = np.array(sorted(set(row.recent[-PENALTY_LAST_N:])))
        seen = logits[r, ids]
        penalty = np.float32(row.params.repeat_penalty)
        logits[r, ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return logits


def candidates(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probs) of one row: its top candidates, best first (ties: the lower id), and the
    probabilities it draws them with (0 where top-k, top-p or min-p removed one). logits
    are already penalized; the row samples (temperature > 0)."""
    vocab = logits.shape[-1]
    k = params.top_k if 0 < params.top_k < vocab else vocab
    if k < vocab:
        top = np.argpartition(-logits, k - 1)[:k]
        ids = top[np.lexsort((top, -logits[top]))]
    else:
        ids = np.argsort(-logits, kind="stable")
    values = logits[ids].astype(np.float64)
    probs = _softmax(values)
    keep = np.isfinite(values)
    if params.top_p < 1.0:  # through the one crossing p
        keep &= (np.cumsum(probs) - probs) < params.top_p
    keep &= probs >= params.min_p * probs[0]
    return ids, _softmax(np.where(keep, values / params.temperature, -np.inf))


def _softmax(values: np.ndarray) -> np.ndarray:
    finite = np.isfinite(values)
    if not finite.any():
        return np.zeros_like(values)
    e = np.where(finite, np.exp(values - values[finite].max()), 0.0)
    return e / e.sum()


def distributions(logits: np.ndarray, rows: Sequence[Row]) -> np.ndarray:
    """[R, V]: the whole distribution each row samples from (one-hot at temperature 0),
    for speculative decoding, which compares target and draft under the same filters."""
    logits = penalized(logits, rows)
    out = np.zeros(logits.shape, dtype=np.float64)
    for r, row in enumerate(rows):
        if row.params.temperature == 0:
            out[r, int(logits[r].argmax())] = 1.0
        else:
            ids, probs = candidates(logits[r], row.params)
            out[r, ids] = probs
    return out


def sample(logits: np.ndarray, rows: Sequence[Row]) -> list[int]:
    """One token per row of [R, V] logits."""
    if all(r.params.temperature == 0 and r.params.repeat_penalty == 1.0 and r.allowed is None
           for r in rows):
        return argmax(logits)  # the common greedy case: nothing else to do
    logits = penalized(logits, rows)
    tokens = []
    for r, row in enumerate(rows):
        if row.params.temperature == 0:
            tokens.append(int(logits[r].argmax()))
        else:
            ids, probs = candidates(logits[r], row.params)
            tokens.append(int(ids[draw(probs, row.generator)]))
    return tokens


def draw(probs: np.ndarray, generator: np.random.Generator | None) -> int:
    """One index from a [V] distribution (need not be normalized): the first whose
    cumulative probability passes one uniform draw of the generator."""
    cdf = np.cumsum(probs, dtype=np.float64)
    u = uniform(generator) * cdf[-1]
    return min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)


def uniform(generator: np.random.Generator | None) -> float:
    """One draw in [0, 1) from the generator (a fresh random one without)."""
    return float((generator or np.random.default_rng()).random())
