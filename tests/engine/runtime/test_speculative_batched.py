"""Four concurrent greedy requests on the real bundled model drafting for itself, with every
forward pass charged to a fake clock by a cost model: the batch's aggregate time with
drafts against the same four without, on that clock (a decision check, never speed), and
the replies identical to plain decoding's."""

from __future__ import annotations

import threading
import time

import pytest

from helpers.fake_clock import Clock, clocked_with_draft, tokens_of
from helpers.replies import reply_tokens

from localchat.engine import EngineConfig, open_engine
from localchat.engine.runtime.compute_thread import COMPUTE

pytestmark = pytest.mark.model  # loads the bundled model

PROMPTS = ("Write a haiku about the sea.", "Name three colours and say why you like them.",
           "Explain what a list is in Python.", "Give a tip for sleeping well.")
N_TOKENS = 32


def concurrently(eng) -> tuple[float, list[list[int]], list[dict | None]]:
    """All four prompts at once, in the same first step however the machine schedules
    their threads: (fake seconds from the first step to the last, the replies' token ids,
    their draft stats)."""
    tokens: list = [None] * len(PROMPTS)
    stats: list = [None] * len(PROMPTS)
    start = eng.runner.clock()

    def work(i: int) -> None:
        tokens[i], stats[i] = reply_tokens(eng, PROMPTS[i], N_TOKENS)

    held = threading.Event()

    def hold() -> None:  # on the compute thread: no step runs before all four are submitted
        held.set()
        deadline = time.monotonic() + 60
        while len(eng.runner._inbox) < len(PROMPTS) and time.monotonic() < deadline:
            time.sleep(0.001)

    holder = threading.Thread(target=COMPUTE.call, args=(hold,))
    holder.start()
    held.wait()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in [holder, *threads]:
        t.join()
    return eng.runner.clock() - start, tokens, stats


def aggregate(target_cost, draft_cost) -> tuple[float, float, list, list, list]:
    """(plain seconds, drafted seconds, plain replies, drafted replies, drafted stats) on
    the fake clock, each engine warmed by one pass over the same prompts first."""
    out = []
    for draft in ("none", "default"):
        eng = open_engine(EngineConfig("default", ctx_size=1024, threads=2, draft=draft,
                                       parallel=4, exact_batching=True))
        try:
            if draft == "none":
                clock = Clock()
                eng.runner.clock = clock
                clock.charge(eng.runner.executor, target_cost)
            else:
                clocked_with_draft(eng, target_cost, draft_cost)
            concurrently(eng)  # the controller's measurements, and the prompts cached
            out.append(concurrently(eng))
        finally:
            eng.close()
    (plain_s, plain, _), (drafted_s, drafted, stats) = out
    return plain_s, drafted_s, plain, drafted, stats


@pytest.mark.slow
def test_four_at_once_on_a_compute_bound_target_draft_no_slower_than_plain():
    """A pass costs its token count (a CPU's compute full at 4 rows): verifying 4·(γ+1)
    tokens costs γ+1 plain steps, so no γ pays and the batch must not lose (the
    single-sequence model, measured at 1 row, kept probing and lost)."""
    plain_s, drafted_s, plain, drafted, stats = aggregate(
        lambda ch: 0.01 * tokens_of(ch), lambda ch: 0.002 * tokens_of(ch))
    assert drafted == plain
    assert plain_s / drafted_s >= 0.95, (plain_s, drafted_s, stats)


@pytest.mark.slow
def test_four_at_once_on_a_bandwidth_bound_target_draft_and_pay():
    """A pass costs mostly its weights' reading (1 unit) and little per token: the batch
    drafts, at γ where the batch gain peaks, and the aggregate is ≥ 1.5x plain."""
    plain_s, drafted_s, plain, drafted, stats = aggregate(
        lambda ch: 1.0 + 0.005 * tokens_of(ch), lambda ch: 0.1 + 0.002 * tokens_of(ch))
    assert drafted == plain
    assert all(s["proposed"] > 0 and s["acceptance_rate"] > 0.8 for s in stats)
    assert plain_s / drafted_s >= 1.5, (plain_s, drafted_s, stats)
