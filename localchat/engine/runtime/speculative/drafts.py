"""Where draft tokens come from: a second model (any executor, same vocabulary) with its
own block manager, or the sequence itself (prompt lookup, no model).

Both serve every speculating sequence of a step at once: propose() drafts γ tokens after
each sequence's tokens (a model draft runs one batched forward pass per draft position),
settle() is told a sequence's tokens are final again (a model draft keeps the KV that
matches them and cuts the rest), retain() forgets every sequence no longer running.
"""

from __future__ import annotations

from typing import Protocol

import torch

from localchat.engine.executors.base import Chunk, Executor
from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.sampler import Row, argmax, distributions, draw, penalized
from localchat.engine.runtime.sequence import Sequence

Proposal = tuple[list[int], torch.Tensor | None]  # drafts, their distributions ([γ, V]) or None


class DraftSource(Protocol):
    source: str

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        """Up to γ draft tokens after each (sequence, γ)'s tokens."""

    def settle(self, seq: Sequence) -> None: ...

    def retain(self, running: set[int]) -> None: ...

    def close(self) -> None: ...


class ModelDraft:
    """A smaller (or more quantized) model of the same vocabulary."""

    def __init__(self, executor: Executor, name: str) -> None:
        self.executor = executor
        self.blocks = BlockManager(executor.layout)
        self.source = f"model:{name}"
        self._mirrors: dict[int, Sequence] = {}  # target seq_id -> the draft's copy

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        drafts: list[list[int]] = [[] for _ in requests]
        dists: list[list[torch.Tensor]] = [[] for _ in requests]
        live = [i for i, (seq, gamma) in enumerate(requests)
                if gamma > 0 and self._catch_up(seq)]
        for step in range(max((requests[i][1] for i in live), default=0)):
            live = [i for i in live if len(drafts[i]) == step and requests[i][1] > step]
            if not live:
                break
            chunks = []
            for i in live:
                mirror = self._mirrors[requests[i][0].seq_id]
                chunks.append(Chunk(slot=mirror.slot, tokens=mirror.tokens[mirror.computed:],
                                    start=mirror.computed, n_logits=1,
                                    block_table=self.blocks.block_table(mirror),
                                    write_from=self.blocks.num_committed(mirror),
                                    n_prompt=mirror.n_prompt,
                                    copy_from=self.blocks.take_copy(mirror)))
            logits = self.executor.forward(chunks)
            rows = [Row(seq.params, seq.completion + drafts[i], seq.generator)
                    for seq, i in ((requests[i][0], i) for i in live)]
            tokens = self._choose(logits, rows, [dists[i] for i in live])
            for i, chunk, token in zip(live, chunks, tokens):
                mirror = self._mirrors[requests[i][0].seq_id]
                mirror.computed = chunk.start + len(chunk.tokens)
                if not self.blocks.can_append(mirror):
                    dists[i] = dists[i][:len(drafts[i])]
                    continue
                self.blocks.append_token(mirror, token)
                mirror.tokens.append(token)
                drafts[i].append(token)
        return [(d, torch.stack(q) if q else None) for d, q in zip(drafts, dists)]

    @staticmethod
    def _choose(logits: torch.Tensor, rows: list[Row], dists: list[list[torch.Tensor]]) -> list[int]:
        """The draft's token per row: its argmax at temperature 0, else a draw from q."""
        if all(row.params.temperature == 0 for row in rows):
            return argmax(penalized(logits, rows))
        q = distributions(logits, rows)
        out = []
        for r, row in enumerate(rows):
            dists[r].append(q[r])
            out.append(argmax(q[r:r + 1])[0] if row.params.temperature == 0 else
                       draw(q[r], row.generator))
        return out

    def _catch_up(self, seq: Sequence) -> bool:
        """The draft's copy of seq holds all of seq's tokens (KV for all but the newest
        may already be there); False if the draft has no room for it now."""
        mirror = self._mirrors.get(seq.seq_id)
        if mirror is None:
            mirror = Sequence(seq.seq_id, list(seq.tokens), seq.n_prompt)
            if not self.blocks.can_admit(mirror.tokens, len(self._mirrors)):
                return False
            mirror.computed = self.blocks.allocate(mirror)
            self._mirrors[seq.seq_id] = mirror
            return True
        for token in seq.tokens[len(mirror.tokens):]:
            if not self.blocks.can_append(mirror):
                return False
            self.blocks.append_token(mirror, token)
            mirror.tokens.append(token)
        return True

    def settle(self, seq: Sequence) -> None:
        mirror = self._mirrors.get(seq.seq_id)
        if mirror is None:
            return
        final, ours = seq.tokens, mirror.tokens
        keep = min(len(final), len(ours))
        for i in range(keep):
            if ours[i] != final[i]:
                keep = i  # the first rejected draft (the target chose another token there)
                break
        self.blocks.rollback(mirror, len(ours) - keep)
        del ours[keep:]
        mirror.computed = min(mirror.computed, keep)
        self.blocks.commit(mirror, mirror.computed)

    def retain(self, running: set[int]) -> None:
        for seq_id in [i for i in self._mirrors if i not in running]:
            self.blocks.free(self._mirrors.pop(seq_id))

    def close(self) -> None:
        self.executor.close()


class NgramDraft:
    """Prompt lookup: find the latest earlier occurrence of the sequence's last few tokens
    and propose what followed it there. Free to run; pays off on replies that quote the
    prompt (code edits, summaries, retrieval)."""

    source = "ngram"

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        return [(self._lookup(seq.tokens, gamma), None) for seq, gamma in requests]

    def _lookup(self, context: list[int], gamma: int) -> list[int]:
        n = len(context)
        for size in range(min(self.max_ngram, n - 1), 0, -1):
            tail = context[n - size:]
            for start in range(n - size - 1, -1, -1):
                if context[start:start + size] == tail:
                    follow = context[start + size:start + size + gamma]
                    if follow:
                        return follow
        return []

    def settle(self, seq: Sequence) -> None:
        pass

    def retain(self, running: set[int]) -> None:
        pass

    def close(self) -> None:
        pass
