"""What `localchat bench --task restore` measures: the TTFT of reopening a 3,000-token
conversation after a restart (its KV restored from a snapshot on disk) and of switching to a
sibling branch sharing 2,000 tokens of it, against a cold prefill and a 50-token prompt's
TTFT; and whether greedy replies after the restore are identical to the cold ones."""

from __future__ import annotations

import statistics
import tempfile
from typing import Callable

from localchat.bench.engine import BENCH_TEXT
from localchat.engine.base import Request, SamplingParams
from localchat.errors import UsageError
from localchat.storage.kv_snapshots import KVSnapshotStore

CONVERSATION, SHARED, SHORT = 3000, 2000, 50
REPLY_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0)


def _tokens(engine, n: int, variant: str) -> list[int]:
    return engine.tokenize_text(f"{variant}: " + BENCH_TEXT * (n // 30 + 2))[:n]


def _reply(engine, tokens: list[int]):
    return engine.complete(Request(prompt_tokens=tokens, sampling=GREEDY,
                                   max_tokens=REPLY_TOKENS))


def bench_restore(open_engine: Callable[[], object], repeats: int = 2) -> dict:
    """open_engine() loads a fresh engine (a restart); its snapshots go to a temporary folder
    here. Conversation a = shared + its own 1,000 tokens, sibling b = shared + another 1,000."""
    folder = tempfile.mkdtemp(prefix="localchat-kv-bench-")

    def fresh():
        engine = open_engine()
        if getattr(engine, "disk", None) is None:
            engine.close()
            raise UsageError("--task restore needs KV snapshots: --kv-disk above 0")
        engine.disk.store = KVSnapshotStore(folder, budget=engine.disk.store.budget)
        return engine

    engine = fresh()
    try:
        _reply(engine, _tokens(engine, 16, "warm"))
        shared = _tokens(engine, SHARED, "shared")
        a = shared + _tokens(engine, CONVERSATION - SHARED, "branch a")
        b = shared + _tokens(engine, CONVERSATION - SHARED, "branch b")
        short = [_reply(engine, _tokens(engine, SHORT, f"short {i}")).stats.ttft_s
                 for i in range(repeats)]
        cold_a, cold_b = _reply(engine, a), _reply(engine, b)  # both branches saved
    finally:
        engine.close()  # the writer finishes: the snapshots are on disk
    runs = []
    for _ in range(repeats):
        engine = fresh()
        try:
            _reply(engine, _tokens(engine, 16, "warm"))
            reopen = _reply(engine, a)
            sibling = _reply(engine, b)  # a is in memory; b's other 1,000 tokens come from disk
            short.append(_reply(engine, _tokens(engine, SHORT, f"short {len(short)}")).stats.ttft_s)
            runs.append((reopen, sibling))
        finally:
            engine.close()
    short_ttft = statistics.median(short)
    reopen_ttft = statistics.median(r.stats.ttft_s for r, _ in runs)
    sibling_ttft = statistics.median(s.stats.ttft_s for _, s in runs)
    store = KVSnapshotStore(folder)
    report = {
        "conversation_tokens": len(a), "shared_tokens": SHARED,
        "short_ttft_s": short_ttft, "cold_ttft_s": cold_a.stats.ttft_s,
        "reopen_ttft_s": reopen_ttft, "sibling_ttft_s": sibling_ttft,
        "reopen_restored_tokens": runs[0][0].stats.restored_tokens,
        "reopen_restore_s": statistics.median(r.stats.restore_s for r, _ in runs),
        "sibling_restored_tokens": runs[0][1].stats.restored_tokens,
        "reopen_vs_short": reopen_ttft / short_ttft, "sibling_vs_short": sibling_ttft / short_ttft,
        "identical": all(r.text == cold_a.text and s.text == cold_b.text for r, s in runs),
        "snapshot_bytes": store.total_bytes(),
    }
    store.clear()
    return report


def format_restore(name: str, r: dict) -> str:
    """The report as a few lines of the bench's table."""
    return "\n".join([
        f"{name}: reopen a {r['conversation_tokens']:,}-token conversation after a restart",
        f"  TTFT cold prefill {r['cold_ttft_s'] * 1000:8.0f} ms",
        f"  TTFT restored     {r['reopen_ttft_s'] * 1000:8.0f} ms  ({r['reopen_restored_tokens']:,} "
        f"tokens from disk in {r['reopen_restore_s']:.2f} s) = {r['reopen_vs_short']:.2f}x",
        f"  TTFT sibling      {r['sibling_ttft_s'] * 1000:8.0f} ms  (shares {r['shared_tokens']:,}; "
        f"{r['sibling_restored_tokens']:,} from disk) = {r['sibling_vs_short']:.2f}x",
        f"  TTFT {SHORT}-token prompt {r['short_ttft_s'] * 1000:4.0f} ms (the 1.0x)",
        f"  greedy identical to the cold prefill: {r['identical']}; snapshots "
        f"{r['snapshot_bytes'] / 2**20:.1f} MiB"])
