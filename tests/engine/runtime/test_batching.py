"""Continuous batching in the torch engine, on the real bundled model: many requests at
once give exactly what each gives alone, a cache too small for all of them preempts
and still completes everything, and the nano-vllm edge cases of prefix caching."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.executor_api import KVLayout
from localchat.engine.runtime.scheduler import Scheduler
from localchat.engine.runtime.sequence import RUNNING, WAITING, Sequence

KV_BYTES_PER_BLOCK = 16 * 23040  # SmolLM2-135M, f16 cache

PROMPTS = [
    ("What is the capital of France?", SamplingParams(temperature=0.0), 20),
    ("Write a haiku about rain.", SamplingParams(temperature=0.8, seed=7), 40),
    ("Count from 1 to 20, one number per line.", SamplingParams(temperature=0.0), 60),
    ("Name three colors.", SamplingParams(temperature=1.0, top_k=20, seed=3), 12),
    ("Explain what a KV cache is in one paragraph.",
     SamplingParams(temperature=0.7, top_p=0.9, min_p=0.1, repeat_penalty=1.1, seed=11), 50),
    ("Hi", SamplingParams(temperature=0.0, repeat_penalty=1.3), 30),
]


def _request(prompt: str, sp: SamplingParams, n: int) -> Request:
    return Request(messages=[Message("user", prompt)], sampling=sp, max_tokens=n)


def _together(engine, requests: list[Request]) -> list:
    """Every request submitted at once, each from its own thread (the runtime batches them)."""
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(engine.complete, requests))


@pytest.fixture(scope="module")
def batching_engine():
    engine = open_engine(EngineConfig("default", engine="torch", ctx_size=128, threads=2,
                         kv_memory=8 * KV_BYTES_PER_BLOCK))  # 8 blocks: one 128-token context
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def alone(batching_engine):
    """Each request's tokens, run by itself (the cache always has room for one)."""
    return [batching_engine.complete(_request(*p)) for p in PROMPTS]


@pytest.mark.model
def test_concurrent_requests_give_what_each_gives_alone(batching_engine, alone):
    runner = batching_engine.runner
    before = runner.observer.steps_by_batch_size.copy()
    together = _together(batching_engine, [_request(*p) for p in PROMPTS])
    assert [r.text for r in together] == [r.text for r in alone]
    assert [r.finish_reason for r in together] == [r.finish_reason for r in alone]
    assert max(runner.observer.steps_by_batch_size - before) > 1  # they really ran in one batch


@pytest.mark.model
def test_a_cache_too_small_for_all_preempts_and_still_completes_them(batching_engine, alone):
    """8 blocks for twelve requests of up to ~100 tokens: decoding runs out of blocks, the
    least-advanced request is preempted, recomputed later, and nothing is lost."""
    scheduler = batching_engine.runner.scheduler
    before = scheduler.preemptions
    together = _together(batching_engine, [_request(*p) for p in PROMPTS] * 2)
    assert [r.text for r in together] == [r.text for r in alone] * 2
    assert scheduler.preemptions > before
    assert sum(r.stats.preemptions for r in together) == scheduler.preemptions - before
    assert sum(r.stats.recomputed_tokens for r in together) > 0
    batching_engine.blocks.check_invariants()
    assert batching_engine.blocks.usage().used == 0  # everything given back


@pytest.mark.model
def test_chunked_prefill_with_a_prefix_hit(batching_engine, alone):
    """A prompt prefilled 16 tokens per step, after the same prompt left its blocks in
    the prefix cache: cached tokens counted, the same reply."""
    scheduler = batching_engine.runner.scheduler
    scheduler.max_tokens_per_step = 16
    try:
        again = batching_engine.complete(_request(*PROMPTS[4]))
        fresh = batching_engine.complete(_request("Something unrelated, then: " + PROMPTS[4][0],
                                                  SamplingParams(temperature=0.0), 8))
    finally:
        scheduler.max_tokens_per_step = 512
    assert again.text == alone[4].text
    assert again.stats.cached_tokens >= 16
    assert fresh.stats.cached_tokens < fresh.stats.prompt_tokens
    assert fresh.text


@pytest.mark.model
def test_full_hit_on_an_exact_block_multiple(batching_engine):
    """A prompt of exactly 32 tokens, run twice: the second run shares both blocks and
    runs the last block again (its KV is already in the shared block) for the logits."""
    engine = batching_engine
    tokens = engine.tokenize_text(" the quick brown fox jumps over the lazy dog" * 6)[:32]
    request = Request(prompt_tokens=tokens, sampling=SamplingParams(temperature=0.0),
                      max_tokens=8)
    first, second = engine.complete(request), engine.complete(request)
    assert second.stats.cached_tokens == 16
    assert second.text == first.text
    engine.blocks.check_invariants()


@pytest.mark.model
def test_cancelling_frees_blocks_at_once(batching_engine):
    engine = batching_engine
    cancel = threading.Event()
    stream = engine.generate(_request("Tell me a long story.", SamplingParams(temperature=0.0),
                                      60), cancel)
    used_mid_reply = 0
    for i, event in enumerate(stream):
        used_mid_reply = max(used_mid_reply, engine.blocks.usage().used)
        if i == 3:
            cancel.set()
    assert event.finish_reason == "cancelled"
    assert used_mid_reply > 0
    for _ in range(3000):  # the runner frees them on its next step (a loaded machine: seconds)
        if engine.blocks.usage().used == 0:
            break
        threading.Event().wait(0.01)
    assert engine.blocks.usage().used == 0


# ---- the scheduler alone (bookkeeping, no model) -------------------------------------


def _seq(seq_id: int, n: int) -> Sequence:
    return Sequence(seq_id, list(range(100 * seq_id, 100 * seq_id + n)), n)


def _blocks(n: int, block_size: int) -> BlockManager:
    return BlockManager(KVLayout(pools=1, blocks_per_pool=n, exclusive=False, cache_key=b"t",
                                 block_size=block_size))


def _decode_once(scheduler: Scheduler) -> list:
    """One step as the runner does it: schedule, commit, 'sample' token 7 where due."""
    chunks = scheduler.schedule()
    scheduler.after_step(chunks)
    for chunk in chunks:
        if chunk.samples:
            chunk.seq.tokens.append(7)
    return chunks


def test_preemption_takes_the_least_advanced_and_admits_nothing_that_step():
    pool = _blocks(5, 4)
    scheduler = Scheduler(pool, max_tokens_per_step=64)
    a, b = _seq(1, 8), _seq(2, 4)  # a: 2 blocks; b: 1 block; 2 left
    scheduler.add(a)
    scheduler.add(b)
    _decode_once(scheduler)
    assert a.status == b.status == RUNNING
    late = _seq(3, 4)  # would fit, but not with a block of headroom for each running one
    scheduler.add(late)
    # decode until blocks run out; b has computed less, so it goes, to the queue's head
    for _ in range(12):
        chunks = _decode_once(scheduler)
        if scheduler.preemptions:
            break
    assert scheduler.preemptions == 1 and b.status == WAITING and a.status == RUNNING
    assert scheduler.waiting[0] is b
    assert all(c.seq is not late for c in chunks)  # nothing admitted in that step
    pool.check_invariants()


def test_preempted_sequence_comes_back_through_a_prefix_hit():
    pool = _blocks(8, 4)
    scheduler = Scheduler(pool, max_tokens_per_step=64)
    seq = _seq(1, 9)
    scheduler.add(seq)
    _decode_once(scheduler)
    _decode_once(scheduler)  # 10 tokens computed: two full blocks committed and cached
    scheduler._preempt(seq)
    chunks = scheduler.schedule()
    assert chunks[0].seq is seq and chunks[0].start == 8  # two blocks found again
    assert seq.recomputed_tokens == 2  # it had computed 10; 8 came back from the cache
    pool.check_invariants()


def _slots(n: int, copy: bool = True) -> BlockManager:
    return BlockManager(KVLayout(pools=n, blocks_per_pool=16, exclusive=True, cache_key=b"t",
                                 slot_copy=copy))


def _run(blocks: BlockManager, seq_id: int, tokens: list[int]) -> Sequence:
    """Admit a sequence, compute all of it and free it (its KV stays in its slot)."""
    seq = Sequence(seq_id, list(tokens), len(tokens))
    seq.computed = blocks.allocate(seq)
    copied = blocks.take_copy(seq)
    seq.computed = len(tokens)
    blocks.commit(seq, len(tokens))
    blocks.free(seq)
    seq.copied = copied
    return seq


def test_a_branch_continues_in_a_copy_so_both_branches_stay_cached():
    shared, a, b = list(range(40)), list(range(100, 140)), list(range(200, 240))
    blocks = _slots(3)
    first = _run(blocks, 1, shared + a)
    assert first.copied is None
    branch = Sequence(2, shared + b, 80)
    assert blocks.allocate(branch) == 40  # the shared prefix, read from first's slot ...
    assert blocks.take_copy(branch) == first.slot != branch.slot  # ... in a copy of it
    assert blocks.take_copy(branch) is None  # once
    branch.computed = 80
    blocks.commit(branch, 80)
    blocks.free(branch)
    back = Sequence(3, shared + a + [7], 81)  # switching back: all of branch a is still there
    assert blocks.allocate(back) == 80 and back.slot == first.slot
    assert blocks.take_copy(back) is None
    blocks.free(back)


def test_no_copy_for_a_continuation_a_small_prefix_or_without_the_feature():
    shared = list(range(40))
    blocks = _slots(2)
    _run(blocks, 1, shared)
    assert _run(blocks, 2, shared + [1] * 30).copied is None  # extends it: nothing to keep
    blocks = _slots(2)
    _run(blocks, 1, list(range(8)) + [5] * 40)
    assert _run(blocks, 2, list(range(8)) + [6] * 40).copied is None  # under a block shared
    blocks = _slots(2, copy=False)
    first = _run(blocks, 1, shared + [5] * 40)
    second = _run(blocks, 2, shared + [6] * 40)
    assert second.copied is None and second.slot == first.slot  # the slot is cut back instead


def test_a_copy_that_never_ran_leaves_its_slot_empty():
    blocks = _slots(2)
    first = _run(blocks, 1, list(range(80)))
    seq = Sequence(2, list(range(40)) + [9] * 40, 80)
    seq.computed = blocks.allocate(seq)  # as the scheduler admits it
    assert seq.computed == 40 and seq.slot != first.slot
    blocks.free(seq)  # preempted or cancelled before its first chunk: nothing was copied
    assert blocks._hits(seq.slot, list(range(40))) == 0  # so its slot claims no KV
    again = Sequence(3, list(range(80)) + [1], 81)
    assert blocks.allocate(again) == 80 and again.slot == first.slot


def test_a_slot_waiting_to_be_copied_is_not_given_to_another_sequence():
    """Between a branch's admission and its first chunk (when the executor copies), the
    source slot must keep its KV: a second sequence sharing it goes elsewhere, or waits (the
    draft's mirrors were admitted together and one overwrote the other's source)."""
    shared = list(range(40))
    blocks = _slots(3)
    first = _run(blocks, 1, shared + [5] * 40)
    branch = Sequence(2, shared + [6] * 40, 80)
    assert blocks.allocate(branch) == 40 and branch.slot != first.slot
    other = Sequence(3, shared + [7] * 40, 80)
    assert blocks.can_admit(other.tokens, 1)
    blocks.allocate(other)
    assert other.slot not in (first.slot, branch.slot)
    assert not blocks.can_admit(shared + [8] * 40, 2)  # the source is the only slot left
    assert blocks.take_copy(branch) == first.slot  # copied: the source is free again
    assert blocks.can_admit(shared + [8] * 40, 2)
