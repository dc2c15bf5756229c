"""The runtime's side of KV snapshots on disk: a finished reply's full blocks are captured
(on the compute thread, a copy) and handed to the store's writer thread; a prompt whose
prefix the in-memory cache lacks but a snapshot holds gets that KV restored before it is
admitted, so only the rest is prefilled."""

from __future__ import annotations

import time

from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.block_pool import block_hash
from localchat.engine.runtime.executor_api import Executor
from localchat.engine.runtime.sequence import Sequence
from localchat.errors import EngineError
from localchat.storage.kv_snapshots import KVSnapshotStore

# One block: every full block is worth keeping. A 16-token prefix restored in 2.3 ms against
# ~100 ms of llama.cpp prefill (Ice Lake, bundled model), so a one-shot `run` restores the
# chat template's system prompt that every prompt starts with.
MIN_TOKENS = 16


def chain_keys(tokens: list[int], block_size: int) -> list[bytes]:
    """The prefix key of each full block of `tokens` (the prefix cache's block hash)."""
    keys, parent = [], b""
    for i in range(len(tokens) // block_size):
        parent = block_hash(parent, tokens[i * block_size:(i + 1) * block_size], b"kv-disk")
        keys.append(parent)
    return keys


class DiskCache:
    """Snapshots for one executor's KV. Every method runs on the compute thread."""

    def __init__(self, executor: Executor, blocks: BlockManager, store: KVSnapshotStore,
                 *, min_tokens: int | None = None) -> None:
        self.executor, self.blocks, self.store = executor, blocks, store
        self.identity = executor.kv_identity()
        self.model = executor.info.path
        self.min_tokens = MIN_TOKENS if min_tokens is None else min_tokens
        self.restored_tokens = 0  # totals, for the engine's stats
        self.restore_s = 0.0
        self.saved = 0

    @property
    def enabled(self) -> bool:
        return self.identity is not None and self.executor.layout.prefix_cache

    def restore(self, seq: Sequence) -> None:
        """Before seq's first admission: restore the longest snapshot of its prompt's prefix
        if it gives at least min_tokens more than the in-memory cache (sets
        seq.restored_tokens and seq.restore_s); a damaged snapshot is removed, nothing else."""
        if not self.enabled:
            return
        t0 = time.perf_counter()
        bs = self.blocks.block_size
        keys = chain_keys(seq.tokens, bs)
        in_memory = self.blocks.cached_tokens(seq.tokens)
        if len(keys) * bs - in_memory < self.min_tokens:
            return
        found = self.store.longest(self.model, self.identity, keys)
        if found is None or found[1] * bs - in_memory < self.min_tokens:
            return
        snapshot = self.store.load(found[0])
        n = found[1] * bs
        if snapshot is None or snapshot.tokens[:n] != seq.tokens[:n]:
            return

        refused = []

        def write(slot: int, table: list[int], start: int) -> bool:
            try:
                ok = self.executor.restore_kv(slot, table, start, n, snapshot.payload,
                                              len(snapshot.tokens))
            except (EngineError, ValueError, TypeError):
                ok = False
            if not ok:
                refused.append(slot)
            return ok

        if self.blocks.restore(seq.tokens[:n], write):
            seq.restored_tokens = n - in_memory
            seq.restore_s = time.perf_counter() - t0
            self.restored_tokens += seq.restored_tokens
            self.restore_s += seq.restore_s
        elif refused:  # the executor could not take it: damaged for this engine
            self.store.discard(found[0])

    def note(self, seq: Sequence) -> None:
        """Before seq's last tokens are handed out: seq.kv_note says whether save() will
        keep its KV (the reply's stats carry it), or why not."""
        n = seq.computed // self.blocks.block_size * self.blocks.block_size
        seq.kv_note = ("not saved: this model's cache cannot be restored exactly"
                       if not self.enabled else
                       f"not saved: shorter than {self.min_tokens} tokens" if n < self.min_tokens else
                       f"saved: {n:,} tokens")

    def save(self, seq: Sequence) -> None:
        """After seq finished: queue a snapshot of its full computed blocks, unless one of
        them (or of a longer conversation starting with them) is on disk already."""
        problem = self._save(seq)
        if problem:
            seq.kv_note = problem

    def _save(self, seq: Sequence) -> str | None:
        """None if the snapshot is queued or on disk; else why not."""
        bs = self.blocks.block_size
        n = seq.computed // bs * bs
        if not self.enabled or n < self.min_tokens:
            return None  # note() said so
        tokens = seq.tokens[:n]
        keys = chain_keys(tokens, bs)
        found = self.store.longest(self.model, self.identity, keys)
        if found is not None and found[1] == len(keys):
            self.store.touch(found[0])
            return None
        table = self.blocks.saved_table(seq, n)
        if table is None:
            return "not saved: its blocks were reused"
        try:
            data = self.executor.save_kv(seq.slot, table, n)
        except EngineError:  # no snapshot: never a failed reply
            return "not saved: the engine could not copy its cache"
        if not self.store.put(self.model, self.identity, tokens, keys, data):
            return "not saved: over the --kv-disk budget, or the folder is not usable"
        self.saved += 1
        return None
