"""One pool of paged KV blocks: which blocks hold which sequence's tokens (bookkeeping only).
Full committed blocks are shared by a collision-guarded prefix hash; rolled-back drafts are
never hashed. A full hit recomputes its last block for logits, writing nothing: KV is only
written from num_committed() on (the executor's Chunk.write_from)."""

from __future__ import annotations

import hashlib
import struct
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from localchat.errors import ContextOverflowError


class KVCacheFullError(ContextOverflowError):
    """The KV cache has no room for the request, either right now or ever."""


def block_hash(parent: bytes, tokens: Sequence[int], cache_key: bytes) -> bytes:
    """Stable chained hash of one full block.

    Python's hash() is salted per process and was attackable (vLLM GHSA-rm76-4mrf-v9r8),
    so this uses blake2b. The module-level name lets tests force collisions.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(len(cache_key).to_bytes(4, "little"))
    h.update(cache_key)
    h.update(len(parent).to_bytes(1, "little"))
    h.update(parent)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


@dataclass(frozen=True)
class BlockUsage:
    """Block counts: used (ref > 0), cached (ref 0 but findable, evictable), free."""

    used: int
    cached: int
    free: int
    total: int
    block_size: int

    def bytes(self, kv_bytes_per_token: int) -> dict[str, int]:
        """The same counts in bytes, given the KV bytes one token takes across all layers."""
        per_block = self.block_size * kv_bytes_per_token
        return {"used": self.used * per_block, "cached": self.cached * per_block,
                "free": self.free * per_block, "total": self.total * per_block}


@dataclass
class _Block:
    id: int
    ref: int = 0
    hash: bytes | None = None  # set if and only if _by_hash[hash] is this block
    parent_hash: bytes = b""  # kept so check_invariants can recompute hash
    tokens: tuple[int, ...] = ()  # registered content, compared on a hit
    serial: int = 0  # unique and never reused per registration; 0 = unregistered
    parent: int = 0  # serial of the previous block in the chain; 0 = first block


@dataclass
class _Seq:
    tokens: list[int]
    table: list[int]
    committed: int
    # (hash, serial) of each full committed block. The serial is that of the
    # registered block holding equal KV, which is this block or an earlier duplicate.
    chain: list[tuple[bytes, int]] = field(default_factory=list)


class BlockPool:
    """num_blocks physical blocks of block_size token slots, shared by sequences."""

    def __init__(self, num_blocks: int, block_size: int = 16, cache_key: bytes = b"") -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.cache_key = cache_key  # model id + KV dtype: different caches never share blocks
        self.evictions = 0  # cached blocks recycled so far (a stat; tests use it too)
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))  # ref 0, unregistered
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, registered; LRU first
        self._by_hash: dict[bytes, int] = {}
        self._seqs: dict[int, _Seq] = {}
        self._next_serial = 1

    # ---- sequence operations -------------------------------------------------------

    def allocate(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Give a new sequence blocks for its prompt, sharing cached prefix blocks. Returns
        cached_tokens, the prompt tokens that need no prefill: a multiple of block_size below n
        (the last token must run to produce logits). Nothing changes if this raises."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already has blocks")
        tokens = list(token_ids)
        n = len(tokens)
        if n == 0:
            raise ValueError("cannot allocate an empty prompt")
        bs = self.block_size
        need = -(-n // bs)
        if need > self.num_blocks:
            raise KVCacheFullError(
                f"the prompt ({n} tokens, {need} KV blocks) can never fit: the whole KV cache "
                f"holds {self.num_blocks * bs} tokens ({self.num_blocks} blocks of {bs})")
        hits, chain = self._match_prefix(tokens)
        new, available = self._blocks_needed(need, hits)
        if new > available:
            raise KVCacheFullError(
                f"the prompt ({n} tokens) needs {new} new KV blocks but only {available} of "
                f"{self.num_blocks} are free right now; the rest are in use by other sequences")
        for b in hits:
            self._acquire(b)
        table = hits + [self._take_block() for _ in range(new)]
        hit_tokens = len(hits) * bs
        self._seqs[seq_id] = _Seq(tokens, table, committed=hit_tokens, chain=chain)
        return hit_tokens - bs if hit_tokens == n else hit_tokens

    def blocks_needed(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """(new blocks a prompt of these tokens would take now, blocks available for
        them): what allocate() checks, for a scheduler deciding whether to admit."""
        tokens = list(token_ids)
        return self._blocks_needed(-(-len(tokens) // self.block_size),
                                   self._match_prefix(tokens)[0])

    def _blocks_needed(self, need: int, hits: list[int]) -> tuple[int, int]:
        revived = sum(1 for b in hits if self._blocks[b].ref == 0)  # cached hits leave the LRU
        return need - len(hits), len(self._free) + len(self._evictable) - revived

    def append_token(self, seq_id: int, token_id: int) -> None:
        """Add a generated or draft token, taking a new block when the last one is full."""
        seq = self._seq(seq_id)
        if len(seq.tokens) % self.block_size == 0:
            if not self._free and not self._evictable:
                raise KVCacheFullError(
                    f"no free KV block for sequence {seq_id}: all {self.num_blocks} blocks are in use")
            seq.table.append(self._take_block())
        else:
            assert self._blocks[seq.table[-1]].ref == 1, "a sequence wrote into a shared block"
        seq.tokens.append(token_id)

    def can_append(self, seq_id: int) -> bool:
        """Whether append_token would succeed now (the scheduler preempts when it would not)."""
        seq = self._seq(seq_id)
        return len(seq.tokens) % self.block_size != 0 or bool(self._free or self._evictable)

    def commit(self, seq_id: int, n_tokens: int) -> None:
        """Mark the first n_tokens final, with their KV written. Full committed blocks
        become findable by later prompts. Committing less than before does nothing."""
        seq = self._seq(seq_id)
        if not 0 <= n_tokens <= len(seq.tokens):
            raise ValueError(f"cannot commit {n_tokens} of sequence {seq_id}'s {len(seq.tokens)} tokens")
        if n_tokens <= seq.committed:
            return
        seq.committed = n_tokens
        for i in range(len(seq.chain), n_tokens // self.block_size):
            self._register(seq, i)

    def rollback(self, seq_id: int, n_tokens: int) -> None:
        """Drop the last n_tokens (rejected drafts) and free blocks left empty. No copies."""
        seq = self._seq(seq_id)
        new_len = len(seq.tokens) - n_tokens
        if n_tokens < 0 or new_len < seq.committed:
            raise ValueError(f"cannot roll back {n_tokens} tokens of sequence {seq_id}: "
                             f"{len(seq.tokens)} tokens, {seq.committed} committed")
        del seq.tokens[new_len:]
        keep = -(-new_len // self.block_size)
        for b in reversed(seq.table[keep:]):
            self._release(b)
        del seq.table[keep:]

    def drop_cached(self) -> None:
        """Forget every cached block no sequence uses (their KV is about to be overwritten)."""
        for b in list(self._evictable):
            del self._evictable[b]
            self._forget(b)
            self._free.append(b)

    def free(self, seq_id: int) -> None:
        """Release a finished or preempted sequence. Its registered blocks stay findable.

        Blocks are released tail first, as vLLM does, so that the least shareable
        blocks at the end of a chain are evicted before its prefix.
        """
        seq = self._seqs.pop(seq_id)
        for b in reversed(seq.table):
            self._release(b)

    # ---- queries -------------------------------------------------------------------

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).table)

    def num_tokens(self, seq_id: int) -> int:
        return len(self._seq(seq_id).tokens)

    def num_committed(self, seq_id: int) -> int:
        return self._seq(seq_id).committed

    def held(self, seq_id: int, tokens: Sequence[int]) -> tuple[int, int]:
        """(blocks holding a sequence's KV, those of them no sequence uses): its table while
        it has blocks, else the full blocks of `tokens` (its KV'd tokens) still cached."""
        seq = self._seqs.get(seq_id)
        blocks = seq.table if seq is not None else self._match_prefix(list(tokens))[0]
        return len(blocks), sum(1 for b in blocks if self._blocks[b].ref == 0)

    def cached_blocks(self, tokens: Sequence[int]) -> list[int]:
        """The registered blocks holding the longest prefix of `tokens` (full blocks)."""
        return self._match_prefix(list(tokens))[0]

    def usage(self) -> BlockUsage:
        cached, free = len(self._evictable), len(self._free)
        return BlockUsage(self.num_blocks - cached - free, cached, free, self.num_blocks, self.block_size)

    # ---- internals -----------------------------------------------------------------

    def _seq(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id}") from None

    def _match_prefix(self, tokens: list[int]) -> tuple[list[int], list[tuple[bytes, int]]]:
        """The longest chain of registered full blocks equal to the prompt's prefix."""
        bs = self.block_size
        hits: list[int] = []
        chain: list[tuple[bytes, int]] = []
        parent_hash, parent_serial = b"", 0
        for i in range(len(tokens) // bs):
            block_tokens = tuple(tokens[i * bs:(i + 1) * bs])
            h = block_hash(parent_hash, block_tokens, self.cache_key)
            b = self._by_hash.get(h)
            if b is None:
                break
            blk = self._blocks[b]
            if blk.tokens != block_tokens or blk.parent != parent_serial:
                break  # a hash collision, or a child of an evicted parent
            hits.append(b)
            chain.append((h, blk.serial))
            parent_hash, parent_serial = h, blk.serial
        return hits, chain

    def _register(self, seq: _Seq, i: int) -> None:
        """Make block i of seq (full, committed) findable, unless an equal block already is."""
        bs = self.block_size
        block_tokens = tuple(seq.tokens[i * bs:(i + 1) * bs])
        parent_hash, parent_serial = seq.chain[-1] if seq.chain else (b"", 0)
        h = block_hash(parent_hash, block_tokens, self.cache_key)
        existing = self._by_hash.get(h)
        if existing is not None:
            other = self._blocks[existing]
            if other.tokens == block_tokens and other.parent == parent_serial:
                seq.chain.append((h, other.serial))  # same prefix computed twice: keep the first
                return
            self._forget(existing)  # collision or stale chain: the newest block wins
            if existing in self._evictable:
                del self._evictable[existing]
                self._free.append(existing)
        blk = self._blocks[seq.table[i]]
        assert blk.hash is None and blk.ref >= 1
        blk.hash, blk.parent_hash, blk.tokens = h, parent_hash, block_tokens
        blk.serial, blk.parent = self._next_serial, parent_serial
        self._next_serial += 1
        self._by_hash[h] = blk.id
        seq.chain.append((h, blk.serial))

    def _forget(self, b: int) -> None:
        """Unregister block b; the caller moves it between the free list and the LRU."""
        blk = self._blocks[b]
        assert blk.hash is not None
        del self._by_hash[blk.hash]
        blk.hash, blk.parent_hash, blk.tokens, blk.serial, blk.parent = None, b"", (), 0, 0

    def _take_block(self) -> int:
        """A fresh block with ref 1: free list first, else evict the LRU cached block."""
        if self._free:
            b = self._free.popleft()
        else:
            b, _ = self._evictable.popitem(last=False)
            self._forget(b)
            self.evictions += 1
        self._blocks[b].ref = 1
        return b

    def _acquire(self, b: int) -> None:
        blk = self._blocks[b]
        if blk.ref == 0:
            del self._evictable[b]
        blk.ref += 1

    def _release(self, b: int) -> None:
        blk = self._blocks[b]
        assert blk.ref > 0
        blk.ref -= 1
        if blk.ref == 0:
            if blk.hash is not None:
                self._evictable[b] = None  # most recently used end
            else:
                self._free.append(b)

    # ---- checking ------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (for tests and debugging)."""
        bs = self.block_size
        refs: Counter[int] = Counter()
        for sid, seq in self._seqs.items():
            n = len(seq.tokens)
            _check(len(seq.table) == -(-n // bs), f"seq {sid}: {len(seq.table)} blocks for {n} tokens")
            _check(len(set(seq.table)) == len(seq.table), f"seq {sid}: a block twice in its table")
            _check(0 <= seq.committed <= n, f"seq {sid}: committed {seq.committed} of {n}")
            _check(len(seq.chain) == seq.committed // bs, f"seq {sid}: chain length")
            parent = b""
            for i, (h, _) in enumerate(seq.chain):
                h_want = block_hash(parent, seq.tokens[i * bs:(i + 1) * bs], self.cache_key)
                _check(h == h_want, f"seq {sid}: chain hash {i}")
                parent = h
            for i, b in enumerate(seq.table):
                refs[b] += 1
                blk = self._blocks[b]
                full_committed = (i + 1) * bs <= seq.committed
                if blk.hash is not None:
                    _check(full_committed, f"seq {sid}: block {b} hashed but not full and committed")
                    _check(blk.tokens == tuple(seq.tokens[i * bs:(i + 1) * bs]), f"block {b}: tokens")
                if blk.ref > 1:
                    _check(full_committed, f"seq {sid}: shared block {b} is still writable")
            if n % bs:
                _check(self._blocks[seq.table[-1]].ref == 1, f"seq {sid}: partial last block shared")
        free, evictable = set(self._free), set(self._evictable)
        _check(len(free) == len(self._free), "a block twice in the free list")
        used = {blk.id for blk in self._blocks if blk.ref > 0}
        _check(not (free & evictable) and not (free & used) and not (evictable & used),
               "free, evictable and used overlap")
        _check(len(free) + len(evictable) + len(used) == self.num_blocks, "blocks lost")
        serials = set()
        for blk in self._blocks:
            _check(blk.ref == refs[blk.id], f"block {blk.id}: ref {blk.ref} but in {refs[blk.id]} tables")
            if blk.id in free:
                _check(blk.hash is None, f"free block {blk.id} still hashed")
            if blk.id in evictable:
                _check(blk.hash is not None, f"evictable block {blk.id} has no hash")
            if blk.hash is not None:
                _check(self._by_hash.get(blk.hash) == blk.id, f"block {blk.id}: hash not mapped to it")
                _check(blk.serial > 0 and blk.serial not in serials and blk.parent < blk.serial,
                       f"block {blk.id}: serial")
                serials.add(blk.serial)
        for h, b in self._by_hash.items():
            blk = self._blocks[b]
            _check(blk.hash == h and len(blk.tokens) == bs, f"hash entry for block {b} is stale")
            _check(block_hash(blk.parent_hash, blk.tokens, self.cache_key) == h, f"block {b}: hash mismatch")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)
