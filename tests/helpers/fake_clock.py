"""A fake clock that advances only when a wrapped executor runs, by a cost model of the
pass: controller tests assert decisions and measured ratios on the real model, never speed."""

from __future__ import annotations


class Clock:
    """Seconds that pass only when a wrapped executor runs: cost(chunks) each pass."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charge(self, executor, cost) -> list:
        """Wrap executor.forward; returns the list every pass's chunks are logged to."""
        passes, forward = [], executor.forward

        def timed(chunks):
            passes.append([(len(c.tokens), c.n_logits) for c in chunks])
            self.now += cost(chunks)
            return forward(chunks)

        executor.forward = timed
        return passes


def tokens_of(chunks) -> int:
    return sum(len(c.tokens) for c in chunks)


def clocked_with_draft(eng, target_cost, draft_cost):
    """`eng`'s target and draft passes charged to a fake clock: (the target's passes, the
    draft's, and per draft pass how many target passes ran before it)."""
    clock = Clock()
    eng.runner.clock = clock
    target = clock.charge(eng.runner.executor, target_cost)
    when: list[int] = []

    def charged(chunks):
        when.append(len(target))
        return draft_cost(chunks)

    return target, clock.charge(eng.draft.executor, charged), when
