"""Where draft tokens come from: a second model (any executor, same vocabulary, own block manager)
or the sequence itself (prompt lookup). Each serves a step's speculating sequences at once
(a model draft runs them as one batch per draft position): prefill() beside the target's
prompt, evidence() before γ is chosen, propose() γ tokens each, settle() to final tokens,
retain() live."""

from __future__ import annotations

from typing import Protocol

import time

import numpy as np

from localchat.engine.runtime.executor_api import Chunk, Executor
from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.sampler import Row, argmax, distributions, draw, penalized
from localchat.engine.runtime.sequence import Sequence

Proposal = tuple[list[int], np.ndarray | None]  # drafts, their distributions ([γ, V]) or None


class DraftSource(Protocol):
    source: str
    auto: bool  # chosen for the user: seeded requests (reproducible ones) do not speculate
    alpha_priors: dict  # evidence key -> the acceptance expected before any is measured
    catch_up_s: float  # seconds the last propose() spent on the draft's own catch-up

    def prefill(self, seqs: list[Sequence]) -> None:
        """The draft's own pass over these sequences' prompts, run in the step that ends the
        target's prefill (so that it counts in TTFT, not in decoding, as llama.cpp's
        speculative example does)."""

    def evidence(self, seq: Sequence) -> object:
        """What this draft knows before drafting for seq: a key the acceptance is tracked
        by, None (no such evidence), or False (nothing to propose now)."""

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        """Up to γ draft tokens after each (sequence, γ)'s tokens."""

    def peek(self, seq: Sequence) -> int | None:
        """The token propose() would put first for seq, where knowing it costs nothing (a
        lookup's, after evidence()); None otherwise."""

    def settle(self, seq: Sequence) -> None: ...

    def retain(self, running: set[int]) -> None: ...

    def close(self) -> None: ...


class ModelDraft:
    """A smaller (or more quantized) model of the same vocabulary."""

    auto = False
    alpha_priors: dict = {}
    CATCH_UP_AFTER = 2  # more unseen tokens than this: a separate pass, not timed as drafting

    def __init__(self, executor: Executor, name: str) -> None:
        self.executor = executor
        self.blocks = BlockManager(executor.layout)
        self.source = f"model:{name}"
        self.catch_up_s = 0.0
        self.clock = time.perf_counter  # the runner's, so that catch_up_s is on its clock
        self._mirrors: dict[int, Sequence] = {}  # target seq_id -> the draft's copy

    def evidence(self, seq: Sequence) -> None:
        return None

    def peek(self, seq: Sequence) -> None:
        return None  # a forward pass of the draft

    def prefill(self, seqs: list[Sequence]) -> None:
        """The whole prompt, as the catch-up in the first round read it (a self-draft's
        KV then matches the target's and it keeps every draft)."""
        self._prefill([self._mirrors[seq.seq_id] for seq in seqs if self._catch_up(seq)],
                      whole=True)

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        drafts: list[list[int]] = [[] for _ in requests]
        dists: list[list[np.ndarray]] = [[] for _ in requests]
        live = [i for i, (seq, gamma) in enumerate(requests)
                if gamma > 0 and self._catch_up(seq)]
        self._prefill([self._mirrors[requests[i][0].seq_id] for i in live])
        for step in range(max((requests[i][1] for i in live), default=0)):
            live = [i for i in live if len(drafts[i]) == step and requests[i][1] > step]
            if not live:
                break
            chunks = []
            for i in live:
                mirror = self._mirrors[requests[i][0].seq_id]
                chunks.append(self._chunk(mirror, len(mirror.tokens), n_logits=1))
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
        return [(d, np.stack(q) if q else None) for d, q in zip(drafts, dists)]

    def _prefill(self, mirrors: list[Sequence], whole: bool = False) -> None:
        """One pass over the mirrors' unseen tokens but the last (whole: all of them),
        where more than CATCH_UP_AFTER wait (after a prompt, or rounds off): timed as
        catch_up_s, so that c measures drafting alone."""
        t0 = self.clock()
        end = len if whole else (lambda tokens: len(tokens) - 1)
        behind = [m for m in mirrors if len(m.tokens) - m.computed > self.CATCH_UP_AFTER]
        if behind:
            self.executor.forward([self._chunk(m, end(m.tokens), n_logits=0) for m in behind])
            for m in behind:
                m.computed = end(m.tokens)
        self.catch_up_s = self.clock() - t0

    def _chunk(self, mirror: Sequence, end: int, n_logits: int) -> Chunk:
        return Chunk(slot=mirror.slot, tokens=mirror.tokens[mirror.computed:end],
                     start=mirror.computed, n_logits=n_logits,
                     block_table=self.blocks.block_table(mirror),
                     write_from=self.blocks.num_committed(mirror),
                     n_prompt=mirror.n_prompt, copy_from=self.blocks.take_copy(mirror))

    @staticmethod
    def _choose(logits: np.ndarray, rows: list[Row], dists: list[list[np.ndarray]]) -> list[int]:
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
    longest match of the sequence's tail wins; its length is the evidence γ is chosen on."""

    source = "ngram"
    auto = False
    catch_up_s = 0.0
    MAX_MATCH = 16  # tokens of the tail compared
    HISTORY_TOKENS = 65_536  # earlier replies kept for lookup
    # acceptance after a match of 1, 2, ... 8+ tokens, before any is measured
    alpha_priors = {1: 0.25, 2: 0.35, 3: 0.55, 4: 0.65, 5: 0.7, 6: 0.75, 7: 0.8, 8: 0.9}

    def __init__(self) -> None:
        self._live: dict[int, Sequence] = {}
        self._found: dict[int, tuple[int, list[int]]] = {}  # seq_id -> (at length, tokens)
        self._replies: list[list[int]] = []
        self._index: dict[tuple[int, int], list[tuple[int, int]]] = {}  # bigram -> (reply, end)
        self._kept = 0

    def evidence(self, seq: Sequence) -> int | bool:
        self._live[seq.seq_id] = seq
        length, follow = self.lookup(seq.tokens)
        self._found[seq.seq_id] = (len(seq.tokens), follow)
        return length or False

    def peek(self, seq: Sequence) -> int | None:
        at, follow = self._found.get(seq.seq_id, (-1, []))
        return follow[0] if at == len(seq.tokens) and follow else None

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        out = []
        for seq, gamma in requests:
            at, follow = self._found.pop(seq.seq_id, (-1, []))
            if at != len(seq.tokens):
                follow = self.lookup(seq.tokens)[1]
            out.append((follow[:gamma], None))
        return out

    def lookup(self, context: list[int]) -> tuple[int, list[int]]:
        """(the longest match of context's tail, in itself or in earlier replies; the
        tokens that followed it)."""
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
        return length, follow

    def prefill(self, seqs: list[Sequence]) -> None:
        pass

    def settle(self, seq: Sequence) -> None:
        pass

    def retain(self, running: set[int]) -> None:
        for seq_id in [i for i in self._live if i not in running]:
            self._found.pop(seq_id, None)
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


class LookupThenModel:
    """Prompt lookup where the sequence's tail has a match, the model draft elsewhere (auto's
    choice when a distilled draft is kept); acceptance is tracked per match length and model."""

    auto = False

    def __init__(self, lookup: NgramDraft, model: ModelDraft) -> None:
        self.lookup, self.model = lookup, model
        self.source = f"ngram+{model.source}"
        self.alpha_priors = lookup.alpha_priors
        self._looked_up: set[int] = set()  # sequences whose next proposal is the lookup's

    @property
    def executor(self) -> Executor:
        return self.model.executor

    @property
    def catch_up_s(self) -> float:
        return self.model.catch_up_s

    def evidence(self, seq: Sequence) -> int | None:
        key = self.lookup.evidence(seq)
        if key is False:
            self._looked_up.discard(seq.seq_id)
            return None
        self._looked_up.add(seq.seq_id)
        return key

    def peek(self, seq: Sequence) -> int | None:
        return self.lookup.peek(seq) if seq.seq_id in self._looked_up else None

    def prefill(self, seqs: list[Sequence]) -> None:
        self.model.prefill(seqs)

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[Proposal]:
        mine = [seq.seq_id in self._looked_up for seq, _ in requests]
        looked = iter(self.lookup.propose([r for r, m in zip(requests, mine) if m]))
        drafted = iter(self.model.propose([r for r, m in zip(requests, mine) if not m]))
        return [next(looked) if m else next(drafted) for m in mine]

    def settle(self, seq: Sequence) -> None:
        self.model.settle(seq)

    def retain(self, running: set[int]) -> None:
        self._looked_up &= running
        self.lookup.retain(running)
        self.model.retain(running)

    def close(self) -> None:
        self.model.close()


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
