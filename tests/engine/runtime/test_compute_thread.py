"""The process's one compute thread (engine/compute_thread.py): calls run there and
return or raise here, and the torch
model computes the same bits for a token alone, batched with others, or verified as a
draft (what continuous batching and speculation promise), on the real bundled model."""

from __future__ import annotations

import threading

import pytest
import torch

from localchat.engine import EngineConfig, open_engine
from localchat.engine.runtime.compute_thread import COMPUTE, ComputeThread
from localchat.engine.executors.torch.model import Batch


def test_calls_run_on_the_compute_thread_and_raise_in_the_caller():
    compute = ComputeThread()
    assert compute.call(lambda: threading.current_thread().name) == "localchat-compute"
    assert compute.call(lambda: compute.call(lambda: 5)) == 5  # from inside: runs inline
    with pytest.raises(ZeroDivisionError):
        compute.call(lambda: 1 / 0)


def test_a_submitted_call_runs_while_the_caller_goes_on():
    """submit() (an executor loading while the runtime imports): the caller is not held,
    the call runs on the compute thread, its future gives the result or the exception."""
    compute, release = ComputeThread(), threading.Event()
    future = compute.submit(lambda: release.wait(10) and threading.current_thread().name)
    assert not future.done()  # held by the event: the caller went on without it
    release.set()
    assert future.result(10) == "localchat-compute"
    with pytest.raises(ZeroDivisionError):
        compute.submit(lambda: 1 / 0).result(10)
    assert compute.call(lambda: compute.submit(lambda: 7).done())  # inside: run at once


@pytest.fixture(scope="module")
def model_and_kv():
    engine = open_engine(EngineConfig("default", engine="torch", ctx_size=256, threads=2,
                         kv_memory=64 * 16 * 23040))
    yield engine.executor.model, engine.executor.kv
    engine.close()


def _prefill(base: int, tokens: list[int]) -> Batch:
    n = len(tokens)
    slots = torch.arange(base, base + n)
    return Batch(torch.tensor(tokens), torch.arange(n), slots, [(n, slots, n)], torch.tensor([n - 1]))


def _decode(seqs: list[tuple[int, int, int]]) -> Batch:
    """seqs: (first slot, tokens already cached, next token), one new token each."""
    return Batch(torch.tensor([t for _, _, t in seqs]), torch.tensor([n for _, n, _ in seqs]),
                 torch.tensor([base + n for base, n, _ in seqs]),
                 [(1, torch.arange(base, base + n + 1), n) for base, n, _ in seqs],
                 torch.arange(len(seqs)))


@pytest.mark.model
def test_a_token_computes_the_same_bits_alone_batched_or_verified(model_and_kv):
    model, kv = model_and_kv

    def check():
        g = torch.Generator().manual_seed(0)
        a, b, c = (torch.randint(0, 49000, (n,), generator=g).tolist() for n in (40, 47, 90))
        for base, tokens in ((0, a), (256, b), (512, c)):
            model.forward_batch(_prefill(base, tokens), kv)
        alone = model.forward_batch(_decode([(0, 40, 5)]), kv)[0]
        batched = model.forward_batch(_decode([(256, 47, 7), (0, 40, 5), (512, 90, 9)]), kv)
        assert torch.equal(alone, batched[1])
        # the same token and a guess after it, verified in one pass (as a draft is)
        verified = model.forward_batch(Batch(
            torch.tensor([5, 11]), torch.tensor([40, 41]), torch.tensor([40, 41]),
            [(2, torch.arange(0, 42), 40)], torch.tensor([0, 1])), kv)
        assert torch.equal(alone, verified[0])

    COMPUTE.call(check)
