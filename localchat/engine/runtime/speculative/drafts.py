"""Where draft tokens come from: a second model (any executor, same vocabulary, own block manager)
or the sequence itself (prompt lookup). Each serves all speculating sequences of a step at once:
propose() drafts γ tokens each, settle() syncs to final tokens, retain() forgets ended ones."""

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
    auto: bool  # chosen for the user: seeded requests (reproducible ones) do not speculate

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        """Up to γ draft tokens after each (sequence, γ)'s tokens."""

    def settle(self, seq: Sequence) -> None: ...

    def retain(self, running: set[int]) -> None: ...

    def close(self) -> None: ...


class ModelDraft:
    """A smaller (or more quantized) model of the same vocabulary."""

    auto = False

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
    """Prompt lookup over the whole sequence (system prompt, earlier turns, attached text),
    then over the engine's earlier replies (a suffix index, as in SuffixDecoding): the
    longest match of the sequence's tail wins, and it proposes more tokens the longer
    the match (1 after a one-token match, 3 after two, γ after three or more)."""

    source = "ngram"
    auto = False
    MAX_MATCH = 16  # tokens of the tail compared
    HISTORY_TOKENS = 65_536  # earlier replies kept for lookup

    def __init__(self) -> None:
        self._live: dict[int, Sequence] = {}
        self._replies: list[list[int]] = []
        self._index: dict[tuple[int, int], list[tuple[int, int]]] = {}  # bigram -> (reply, end)
        self._kept = 0

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        for seq, _ in requests:
            self._live[seq.seq_id] = seq
        return [(self._lookup(seq.tokens, gamma) if gamma else [], None) for seq, gamma in requests]

    def _lookup(self, context: list[int], gamma: int) -> list[int]:
        length, follow = longest_match(context, self.MAX_MATCH)
        if length < self.MAX_MATCH and len(context) >= 2:
            for r, end in reversed(self._index.get((context[-2], context[-1]), ())):
                reply = self._replies[r]
                m = 2
                while m < self.MAX_MATCH and end - m >= 0 and m < len(context) and \
                        reply[end - m] == context[-1 - m]:
                    m += 1
                if m > length and end + 1 < len(reply):
                    length, follow = m, reply[end + 1:]
        return follow[:min(gamma, (1, 3)[length - 1] if length < 3 else gamma)] if length else []

    def settle(self, seq: Sequence) -> None:
        pass

    def retain(self, running: set[int]) -> None:
        for seq_id in [i for i in self._live if i not in running]:
            self._remember(self._live.pop(seq_id).completion)

    def _remember(self, reply: list[int]) -> None:
        """Index a finished reply by its bigrams; the oldest go once the history is full."""
        if len(reply) < 3:
            return
        if self._kept + len(reply) > self.HISTORY_TOKENS:
            self._replies, self._index, self._kept = [], {}, 0
        r = len(self._replies)
        self._replies.append(list(reply))
        self._kept += len(reply)
        for end in range(1, len(reply) - 1):
            self._index.setdefault((reply[end - 1], reply[end]), []).append((r, end))

    def close(self) -> None:
        pass


def longest_match(context: list[int], max_len: int) -> tuple[int, list[int]]:
    """The latest earlier place in context whose tokens match its tail longest (up to
    max_len); returns (match length, the tokens that followed that place)."""
    n = len(context)
    best, best_end = 0, -1
    for j in range(n - 2, -1, -1):
        if context[j] != context[-1]:
            continue
        m = 1
        while m < max_len and j - m >= 0 and context[j - m] == context[n - 1 - m]:
            m += 1
        if m > best:
            best, best_end = m, j
            if m == max_len:
                break
    return (best, context[best_end + 1:]) if best else (0, [])
