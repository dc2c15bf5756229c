"""Which draft tokens to keep (Leviathan, Kalman & Matias 2023), so that the output is distributed
exactly as the target's own sampling (at temperature 0: keep while the draft is its argmax)."""

from __future__ import annotations

import numpy as np

from localchat.engine.runtime.sampler import draw, uniform

RULE = ("greedy: keep drafts equal to the target's argmax; sampling: Leviathan "
        "min(1, p/q), residual norm(max(0, p - q))")


def accept_drafts(p: np.ndarray, q: np.ndarray | None, drafts: list[int],
                  generator: np.random.Generator | None) -> tuple[int, int]:
    """p: [γ+1, vocab] target distributions; q: [γ, vocab] draft distributions, or None
    for a deterministic draft (q one-hot at each draft token). Returns (number of drafts
    kept, the token that follows them)."""
    for i, d in enumerate(drafts):
        q_d = 1.0 if q is None else float(q[i, d])
        p_d = float(p[i, d])
        if q_d > 0 and (p_d >= q_d or uniform(generator) < p_d / q_d):
            continue
        residual = p[i].copy()
        if q is None:
            residual[d] = 0.0
        else:
            residual = np.maximum(residual - q[i], 0.0)
        if float(residual.sum()) <= 0.0:  # p ≤ q everywhere: only rounding gets here
            residual = p[i]
        return i, draw(residual / residual.sum(), generator)
    return len(drafts), draw(p[len(drafts)], generator)


def accept_greedy(target_argmax: list[int], drafts: list[int]) -> tuple[int, int]:
    """Temperature 0: keep drafts while they equal the target's argmax."""
    for i, d in enumerate(drafts):
        if target_argmax[i] != d:
            return i, target_argmax[i]
    return len(drafts), target_argmax[len(drafts)]


