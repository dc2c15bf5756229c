"""The KV cache's bookkeeping for one executor: one shared pool of 16-token blocks (torch), or
one pool per llama.cpp slot, where a new sequence goes to the free slot sharing most of its
prompt and a diverging branch is copied to another slot so both stay cached."""

from __future__ import annotations

import itertools
from typing import Callable

from localchat.engine.runtime.block_pool import BlockPool, BlockUsage, KVCacheFullError
from localchat.engine.runtime.executor_api import KVLayout

class BlockManager:
    def __init__(self, layout: KVLayout) -> None:
        self.layout = layout
        self.block_size = layout.block_size
        self.pools = [BlockPool(layout.blocks_per_pool, layout.block_size,
                                cache_key=layout.cache_key) for _ in range(layout.pools)]
        self._live: list[int | None] = [None] * layout.pools  # exclusive: seq_id per pool
        self._kept: list[list[int]] = [[] for _ in range(layout.pools)]  # exclusive: KV held
        self._clock = itertools.count()
        self._last_used = [0] * layout.pools
        self._copies: dict[int, int] = {}  # seq_id -> the slot its KV is copied from first

    def pool(self, seq) -> BlockPool:
        return self.pools[seq.slot]

    # ---- admission -------------------------------------------------------------------

    def _choose(self, tokens: list[int]) -> int | None:
        """The pool a new sequence should go to (exclusive: the best free slot)."""
        if not self.layout.exclusive:
            return 0
        free = self._free_slots()
        if not free:
            return None
        return max(free, key=lambda i: (self._hits(i, tokens), -self._last_used[i]))

    def _free_slots(self) -> list[int]:
        """Slots no sequence lives in, but for those a branch's first chunk has still to
        copy (their KV must stay as it is until then)."""
        sources = set(self._copies.values())
        return [i for i, live in enumerate(self._live) if live is None and i not in sources]

    def _hits(self, pool: int, tokens: list[int]) -> int:
        """Prompt tokens whose KV pool `pool` already holds."""
        if not self.layout.prefix_cache:
            return 0
        if self.layout.exclusive:
            return _common_prefix(self._kept[pool], tokens)
        new, _ = self.pools[pool].blocks_needed(tokens)
        return (-(-len(tokens) // self.block_size) - new) * self.block_size

    def can_admit(self, tokens: list[int], n_running: int) -> bool:
        """Whether a prompt of these tokens can have its blocks now. A shared pool keeps
        one block of headroom per running sequence, so an admission does not force a
        preemption on the very next step."""
        pool = self._choose(tokens)
        if pool is None:
            return False
        new, available = self.pools[pool].blocks_needed(tokens)
        if self.layout.exclusive or not n_running:
            return new <= available
        return new + n_running <= available

    def allocate(self, seq) -> int:
        """Give seq its blocks (sets seq.slot); returns the prompt tokens already cached."""
        slot = self._choose(seq.tokens)
        if slot is None:
            raise RuntimeError("no free slot: can_admit() must be asked first")
        spare = self._spare(slot, seq.tokens)
        if spare is not None:  # keep the slot's other branch: continue in a copy of it
            self._kept[spare] = list(self._kept[slot])
            self._copies[seq.seq_id] = slot
            slot = spare
        pool = self.pools[slot]
        cached = pool.allocate(seq.seq_id, seq.tokens)  # 0 without a prefix cache: nothing commits
        if self.layout.exclusive:
            pool.drop_cached()  # the slot's KV past the hit is about to be overwritten
            kept = min(self._hits(slot, seq.tokens), len(seq.tokens) - 1)
            if kept > cached:  # the rest of a partly filled block is there too
                pool.commit(seq.seq_id, kept)
                cached = kept
            self._live[slot] = seq.seq_id
        self._last_used[slot] = next(self._clock)
        seq.slot = slot
        return cached

    def _spare(self, slot: int, tokens: list[int]) -> int | None:
        """The free slot to copy `slot` into before a prompt that shares at least a block
        with it but would overwrite at least a block of it; None: use `slot` itself."""
        if not (self.layout.exclusive and self.layout.slot_copy and self.layout.prefix_cache):
            return None
        hits = self._hits(slot, tokens)
        if hits < self.block_size or len(self._kept[slot]) - hits < self.block_size:
            return None
        free = [i for i in self._free_slots() if i != slot]
        return min(free, key=lambda i: (bool(self._kept[i]), self._last_used[i]), default=None)

    def take_copy(self, seq) -> int | None:
        """The slot whose KV the sequence's slot must copy before its first chunk (once)."""
        return self._copies.pop(seq.seq_id, None)

    # ---- per-sequence operations ----------------------------------------------------------

    def can_append(self, seq) -> bool:
        return self.pool(seq).can_append(seq.seq_id)

    def append_token(self, seq, token: int) -> None:
        self.pool(seq).append_token(seq.seq_id, token)

    def commit(self, seq, n_tokens: int) -> None:
        if self.layout.prefix_cache:
            self.pool(seq).commit(seq.seq_id, n_tokens)

    def rollback(self, seq, n_tokens: int) -> None:
        self.pool(seq).rollback(seq.seq_id, n_tokens)

    def free(self, seq) -> None:
        """Release a finished or preempted sequence; its full committed blocks stay cached."""
        self.pool(seq).free(seq.seq_id)
        never_ran = self._copies.pop(seq.seq_id, None) is not None  # so nothing was copied
        if self.layout.exclusive:
            self._kept[seq.slot] = [] if never_ran else seq.tokens[:seq.computed]
            self._live[seq.slot] = None
            self._last_used[seq.slot] = next(self._clock)

    def block_table(self, seq) -> list[int]:
        return self.pool(seq).block_table(seq.seq_id)

    def num_tokens(self, seq) -> int:
        return self.pool(seq).num_tokens(seq.seq_id)

    def num_committed(self, seq) -> int:
        return self.pool(seq).num_committed(seq.seq_id)

    # ---- KV restored from disk ------------------------------------------------------------

    def cached_tokens(self, tokens: list[int]) -> int:
        """Tokens of this prompt's prefix the cache holds now, where admission would put it."""
        slot = self._choose(tokens)
        return 0 if slot is None else self._hits(slot, tokens)

    def saved_table(self, seq, n_tokens: int) -> list[int] | None:
        """The blocks holding seq's first n_tokens (a shared pool: after it finished, its
        cached blocks; None if some are gone). An exclusive slot needs none: []."""
        if self.layout.exclusive:
            return []
        table = self.pool(seq).cached_blocks(seq.tokens[:n_tokens])
        return table if len(table) * self.block_size >= n_tokens else None

    def restore(self, tokens: list[int], write: Callable[[int, list[int], int], bool]) -> bool:
        """Make the full blocks of `tokens` cached, their KV written by write(slot,
        block_table, start), which fills positions start.. (those before are cached already);
        False, with nothing cached, if there is no room or write refuses."""
        if self.layout.exclusive:
            free = self._free_slots()
            if not free:
                return False
            slot = min(free, key=lambda i: (bool(self._kept[i]), self._last_used[i]))
            self.pools[slot].drop_cached()  # whatever the slot held is overwritten
            self._kept[slot] = []
            if not write(slot, [], 0):
                return False
            self._kept[slot] = list(tokens)
            self._last_used[slot] = next(self._clock)
            return True
        pool, seq_id = self.pools[0], -1 - next(self._clock)  # never a runtime sequence's id
        try:
            start = pool.allocate(seq_id, tokens)
        except KVCacheFullError:
            return False
        ok = write(0, pool.block_table(seq_id), start)
        if ok:
            pool.commit(seq_id, len(tokens))
        pool.free(seq_id)
        return ok

    # ---- accounting -------------------------------------------------------------------

    def held(self, seq) -> tuple[int, int]:
        """(blocks holding seq's KV: in use while it runs, its prefix still cached after; those of
        them no sequence uses now)."""
        return self.pool(seq).held(seq.seq_id, seq.tokens[:seq.computed])

    def usage(self) -> BlockUsage:
        parts = [p.usage() for p in self.pools]
        return BlockUsage(*(sum(getattr(u, f) for u in parts)
                            for f in ("used", "cached", "free", "total")),
                          block_size=self.block_size)

    @property
    def evictions(self) -> int:
        return sum(p.evictions for p in self.pools)

    def check_invariants(self) -> None:
        for pool in self.pools:
            pool.check_invariants()


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
