"""Block pool of the paged KV cache: prefix sharing, commit/rollback, eviction, invariants.

The state machine simulates a model runner. It writes into a shadow KV store the token
prefix that each position's KV depends on, and checks after every step that every live
sequence still reads the KV of its own prefix. That catches false prefix hits, writes
into shared blocks, and blocks reused while still live.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from localchat.engine.runtime import block_pool as blocks
from localchat.engine.runtime.block_pool import BlockPool, KVCacheFullError
from localchat.errors import ContextOverflowError


def committed_pool(bs: int, num_blocks: int, seq_id: int, tokens: list[int]) -> BlockPool:
    pool = BlockPool(num_blocks, bs)
    pool.allocate(seq_id, tokens)
    pool.commit(seq_id, len(tokens))
    return pool


def slot(pool: BlockPool, seq_id: int, position: int) -> int:
    """The physical slot holding a position's KV, as an executor addresses it from the
    sequence's block table."""
    bs = pool.block_size
    return pool.block_table(seq_id)[position // bs] * bs + position % bs


# ---- edge cases ----------------------------------------------------------------------

def test_exact_multiple_fully_cached_shares_all_blocks_and_recomputes_the_last_block():
    pool = committed_pool(4, 8, 1, list(range(8)))
    assert pool.allocate(2, list(range(8))) == 4  # the last block runs again, never n
    assert pool.block_table(2) == pool.block_table(1) and pool.usage().used == 2
    assert pool.num_committed(2) == 8  # so its KV, already in the shared block, is not written
    pool.append_token(2, 99)  # the next token goes into a new, private block
    assert pool.block_table(2)[:2] == pool.block_table(1)
    assert pool.block_table(2)[2] not in pool.block_table(1) and pool.usage().used == 3
    pool.check_invariants()


def test_exact_multiple_fully_cached_after_free():
    pool = committed_pool(4, 8, 1, list(range(8)))
    table = pool.block_table(1)
    pool.free(1)
    assert pool.usage().cached == 2
    assert pool.allocate(2, list(range(8))) == 4 and pool.block_table(2) == table
    pool.check_invariants()


def test_second_turn_reuses_first_turn_blocks():
    pool = BlockPool(16, 4)
    prompt = list(range(10))
    assert pool.allocate(1, prompt) == 0
    pool.commit(1, 10)
    reply = [50, 51, 52, 53, 54]
    for t in reply:
        pool.append_token(1, t)
    pool.commit(1, 15)
    table = pool.block_table(1)
    pool.free(1)
    turn2 = prompt + reply + [60, 61, 62]
    assert pool.allocate(2, turn2) == 12  # three full committed blocks
    assert pool.block_table(2)[:3] == table[:3]
    pool.check_invariants()


def test_two_sequences_share_a_system_prompt():
    system = [7] * 8
    pool = BlockPool(16, 4)
    pool.allocate(1, system + [1, 2])
    pool.commit(1, 10)
    assert pool.allocate(2, system + [3]) == 8
    shared = pool.block_table(1)[:2]
    assert pool.block_table(2)[:2] == shared
    assert pool.block_table(2)[2] != pool.block_table(1)[2]
    assert pool.usage().used == 4
    pool.check_invariants()


def test_prompt_longer_than_the_whole_pool():
    pool = BlockPool(4, 4)
    with pytest.raises(KVCacheFullError, match="never") as e:
        pool.allocate(1, [0] * 17)
    assert "17 tokens" in str(e.value) and "16 tokens" in str(e.value)
    assert isinstance(e.value, ContextOverflowError)
    pool.check_invariants()


def test_pool_full_of_in_use_blocks():
    pool = BlockPool(4, 4)
    pool.allocate(1, list(range(16)))
    with pytest.raises(KVCacheFullError, match="right now"):
        pool.allocate(2, [1])
    assert not pool.can_append(1)
    with pytest.raises(KVCacheFullError):
        pool.append_token(1, 5)
    assert pool.num_tokens(1) == 16 and pool.usage().used == 4
    pool.check_invariants()


def test_eviction_picks_least_recently_used_cached_block():
    pool = BlockPool(3, 2)
    tables = {}
    for sid, toks in ((1, [1, 2]), (2, [3, 4]), (3, [5, 6])):
        pool.allocate(sid, toks)
        pool.commit(sid, 2)
        tables[sid] = pool.block_table(sid)[0]
        pool.free(sid)
    assert pool.usage() == blocks.BlockUsage(used=0, cached=3, free=0, total=3, block_size=2)
    assert pool.allocate(4, [1, 2]) == 0  # a (full) hit makes [1, 2] the most recently used
    pool.free(4)
    pool.allocate(5, [9])  # no free block: evicts the LRU one, [3, 4]
    assert pool.evictions == 1 and pool.block_table(5) == [tables[2]]
    pool.allocate(6, [5, 6])
    pool.allocate(7, [1, 2])
    assert pool.evictions == 1 and {pool.block_table(6)[0], pool.block_table(7)[0]} == \
        {tables[3], tables[1]}  # both still cached: shared, not recomputed into new blocks
    with pytest.raises(KVCacheFullError, match="right now"):
        pool.allocate(8, [3, 4])  # gone: it would need a new block and none is left
    pool.check_invariants()


def test_rollback_keeps_committed_blocks_and_never_hashes_uncommitted_ones():
    pool = BlockPool(16, 4)
    pool.allocate(1, list(range(6)))
    pool.commit(1, 6)
    committed_blocks = pool.block_table(1)
    for t in range(10, 15):
        pool.append_token(1, t)  # 11 tokens, 3 blocks
    assert len(pool.block_table(1)) == 3
    pool.rollback(1, 5)
    assert pool.num_tokens(1) == 6 and pool.block_table(1) == committed_blocks
    with pytest.raises(ValueError):
        pool.rollback(1, 1)  # below the committed length
    pool.append_token(1, 20)
    pool.append_token(1, 21)
    pool.commit(1, 7)  # block 1 is full now, but only 7 of its 8 tokens are committed
    probe = list(range(6)) + [20, 21, 22]
    assert pool.allocate(2, probe) == 4  # the uncommitted block is not findable
    pool.free(2)
    pool.commit(1, 8)
    assert pool.allocate(3, probe) == 8
    pool.check_invariants()


def test_rollback_frees_emptied_blocks_to_the_free_list():
    pool = BlockPool(4, 2)
    pool.allocate(1, [1])
    for t in (2, 3, 4, 5):
        pool.append_token(1, t)
    assert pool.usage().used == 3
    pool.rollback(1, 4)
    assert pool.usage() == blocks.BlockUsage(used=1, cached=0, free=3, total=4, block_size=2)
    pool.check_invariants()


@pytest.mark.parametrize("first, probe", [
    ([5, 6, 5, 6], [5, 6, 5, 6, 1]),  # a second-position block must not match the first
    ([5, 6, 1, 2], [1, 2, 9]),  # tokens match but the block was computed after [5, 6]
    ([5, 6, 1, 2], [7, 8, 1, 2, 9]),
])
def test_forced_hash_collision_never_gives_a_false_hit(monkeypatch, first, probe):
    monkeypatch.setattr(blocks, "block_hash", lambda parent, tokens, key: b"same")
    pool = committed_pool(2, 16, 1, first)
    cached = pool.allocate(2, probe)
    genuine = 0
    while genuine + 2 <= min(len(first), len(probe)) and first[:genuine + 2] == probe[:genuine + 2]:
        genuine += 2
    assert cached <= genuine
    assert pool.block_table(2)[:cached // 2] == pool.block_table(1)[:cached // 2]
    pool.check_invariants()


def test_hash_ignoring_the_parent_cannot_chain_onto_a_look_alike(monkeypatch):
    """A block registered after a colliding look-alike must not inherit its place in a chain."""
    monkeypatch.setattr(blocks, "block_hash", lambda parent, tokens, key: bytes(tokens))
    pool = committed_pool(1, 16, 1, [1])  # [1] at depth 0
    pool.allocate(2, [2, 1, 3])  # [1] at depth 1 collides with it; [3] follows [2, 1]
    pool.commit(2, 3)
    assert pool.allocate(3, [1, 3, 0]) == 0  # [3]'s KV was computed after [2, 1], not [1]
    pool.check_invariants()


def test_cache_key_and_parent_change_the_hash_and_it_is_stable():
    h = blocks.block_hash(b"", [1, 2, 3], b"model-a/f16")
    assert h == blocks.block_hash(b"", (1, 2, 3), b"model-a/f16")
    assert h != blocks.block_hash(b"", [1, 2, 3], b"model-a/q8")
    assert h != blocks.block_hash(h, [1, 2, 3], b"model-a/f16")
    assert h.hex() == blocks.block_hash(b"", [1, 2, 3], b"model-a/f16").hex()


def test_usage_in_bytes():
    pool = BlockPool(4, 16)
    pool.allocate(1, list(range(20)))
    assert pool.usage().bytes(100) == {"used": 3200, "cached": 0, "free": 3200, "total": 6400}


def test_misuse_is_rejected():
    pool = BlockPool(4, 4)
    with pytest.raises(ValueError):
        pool.allocate(1, [])
    pool.allocate(1, [1])
    with pytest.raises(ValueError):
        pool.allocate(1, [1])
    with pytest.raises(ValueError):
        pool.commit(1, 2)
    with pytest.raises(KeyError):
        pool.append_token(2, 1)


# ---- property-based: random workloads keep the invariants and report exact hits ----

VOCAB = st.integers(0, 2)  # a tiny vocabulary so prefixes collide often


class PoolMachine(RuleBasedStateMachine):
    collide = False  # subclass: a weak block hash, so that collisions are frequent

    def __init__(self) -> None:
        super().__init__()
        self._real_hash = blocks.block_hash
        if self.collide:
            # ignores the parent and most of the tokens: collides across depths and contents
            blocks.block_hash = lambda parent, tokens, key: bytes([sum(tokens) % 2])

    def teardown(self) -> None:
        blocks.block_hash = self._real_hash

    @initialize(bs=st.sampled_from([1, 2, 4]), num_blocks=st.sampled_from([3, 8, 64]))
    def make_pool(self, bs: int, num_blocks: int) -> None:
        self.bs, self.pool = bs, BlockPool(num_blocks, bs, cache_key=b"test")
        self.tokens: dict[int, list[int]] = {}
        self.committed: dict[int, int] = {}
        self.history: list[list[int]] = []
        self.prefixes: set[tuple[int, ...]] = set()  # every full-block committed prefix
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> the prefix its KV was computed from
        self.next_id = 0

    def write(self, sid: int, start: int, end: int) -> None:
        """Compute positions [start, end) as an executor does: KV is written from the
        committed length on (Chunk.write_from), never into a block another sequence holds."""
        toks = self.tokens[sid]
        others = {b for other in self.tokens if other != sid for b in self.pool.block_table(other)}
        for p in range(max(start, self.pool.num_committed(sid)), end):
            s = slot(self.pool, sid, p)
            assert s // self.bs not in others, f"seq {sid} writes position {p} into a shared block"
            self.kv[s] = tuple(toks[:p + 1])

    def pick(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(sorted(self.tokens)))

    @rule(data=st.data())
    def allocate(self, data: st.DataObject) -> None:
        base: list[int] = []
        earlier = self.history + list(self.tokens.values())  # later turns, shared system prompts
        if earlier and data.draw(st.integers(0, 3)):
            base = data.draw(st.sampled_from(earlier))
            base = base[:data.draw(st.integers(0, len(base)))]
        prompt = base + data.draw(st.lists(VOCAB, min_size=0 if base else 1, max_size=10))
        sid, n = self.next_id, len(prompt)
        self.next_id += 1
        before = self.pool.usage()
        need = -(-n // self.bs)
        try:
            cached = self.pool.allocate(sid, prompt)
        except KVCacheFullError as e:
            assert self.pool.usage() == before
            assert ("never" in str(e)) == (need > self.pool.num_blocks)
            assert need > self.pool.num_blocks or self.tokens  # with nothing live it must fit
            return
        hit = self.pool.num_committed(sid)
        assert hit % self.bs == 0 and cached == (hit - self.bs if hit == n else hit)
        present = 0  # the longest committed full-block prefix of the prompt
        while present + self.bs <= n and tuple(prompt[:present + self.bs]) in self.prefixes:
            present += self.bs
        if self.pool.evictions == 0 and not self.collide:
            assert hit == present
        else:  # eviction or a weak hash may lose a prefix, never invent one
            assert hit <= present
        self.tokens[sid], self.committed[sid] = list(prompt), hit
        self.write(sid, cached, n)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), token=VOCAB)
    def append(self, data: st.DataObject, token: int) -> None:
        sid = self.pick(data)
        before = self.pool.usage()
        try:
            self.pool.append_token(sid, token)
        except KVCacheFullError:
            assert len(self.tokens[sid]) % self.bs == 0 and before.free + before.cached == 0
            assert self.pool.usage() == before
            return
        self.tokens[sid].append(token)
        n = len(self.tokens[sid])
        self.write(sid, n - 1, n)

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        sid = self.pick(data)
        toks = self.tokens[sid]
        self.do_commit(sid, data.draw(st.integers(self.committed[sid], len(toks))))

    def do_commit(self, sid: int, k: int) -> None:
        self.pool.commit(sid, k)
        self.committed[sid] = k
        self.prefixes.update(tuple(self.tokens[sid][:j]) for j in range(self.bs, k + 1, self.bs))

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        sid = self.pick(data)
        toks = self.tokens[sid]
        k = data.draw(st.integers(0, len(toks) - self.committed[sid] + 1))
        if k > len(toks) - self.committed[sid]:
            with pytest.raises(ValueError):
                self.pool.rollback(sid, k)
            return
        self.pool.rollback(sid, k)
        del toks[len(toks) - k:]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        sid = self.pick(data)
        self.pool.free(sid)
        self.history.append(self.tokens.pop(sid))
        del self.committed[sid]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def finish_turn(self, data: st.DataObject) -> None:
        """Commit a whole sequence and free it, like the end of a chat turn."""
        sid = self.pick(data)
        self.do_commit(sid, len(self.tokens[sid]))
        self.pool.free(sid)
        self.history.append(self.tokens.pop(sid))
        del self.committed[sid]

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "pool"):
            return
        self.pool.check_invariants()
        u = self.pool.usage()
        assert u.used + u.cached + u.free == u.total
        for sid, toks in self.tokens.items():
            assert self.pool.num_tokens(sid) == len(toks)
            assert self.pool.num_committed(sid) == self.committed[sid]
            for p in range(len(toks)):
                assert self.kv.get(slot(self.pool, sid, p)) == tuple(toks[:p + 1]), (sid, p)


class CollidingPoolMachine(PoolMachine):
    collide = True


TestBlockPool = PoolMachine.TestCase
TestBlockPool.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
TestBlockPoolWithHashCollisions = CollidingPoolMachine.TestCase
TestBlockPoolWithHashCollisions.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)


def test_held_counts_a_sequences_blocks_live_then_those_still_cached_for_it():
    pool = BlockPool(8, block_size=4)
    tokens = list(range(10))
    pool.allocate(1, tokens)
    assert pool.held(1, tokens) == (3, 0)  # its table, all in use
    pool.commit(1, 10)
    pool.free(1)
    assert pool.held(1, tokens) == (2, 2)  # the two full blocks, cached; the partial one freed
    pool.allocate(2, tokens[:8] + [99])  # another sequence shares them now: in use
    assert pool.held(1, tokens) == (2, 0)
    assert pool.held(3, [7, 7, 7, 7]) == (0, 0)  # nothing cached for it
