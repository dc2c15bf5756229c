"""`localchat bench --concurrency 1,4,16` measured: N prompts at once, batched continuously on each
executor, against llama.cpp serving them one after another; aggregate tokens/s and latency
(p50, p95, max) per level, and the knee where batching stops paying."""

from __future__ import annotations

import statistics
import sys
import threading
import time

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine import open_engine
from localchat.engine.config import EngineConfig
from localchat.errors import UsageError

GEN_TOKENS = 64
PROMPT = ("Request {i}: write a long, detailed essay about the history of the number {i}, "
          "its uses in science, art and daily life, and why it matters.")
GREEDY = SamplingParams(temperature=0.0)
KNEE_GAIN = 1.15  # a level that adds less than 15% aggregate throughput is past the knee


MODES = ("torch", "llama.cpp", "llama.cpp one at a time")


def chat_requests(n: int, offset: int) -> list[Request]:
    return [Request(messages=[Message("user", PROMPT.format(i=offset + i))],
                    sampling=GREEDY, max_tokens=GEN_TOKENS) for i in range(n)]


def _summary(tokens: int, wall: float, latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"aggregate_tok_s": tokens / wall, "p50_latency_s": statistics.median(ordered),
            "p95_latency_s": p95, "max_latency_s": ordered[-1], "completion_tokens": tokens,
            "wall_s": wall}


def run_concurrent(engine, requests: list[Request]) -> dict:
    """All at once, each on its own thread (the runtime batches them)."""
    return complete_concurrently(engine, requests)[0]


def complete_concurrently(engine, requests: list[Request]) -> tuple[dict, list]:
    """All at once, each on its own thread: (the summary, each request's Result)."""
    latencies: list[float] = [0.0] * len(requests)
    results: list = [None] * len(requests)
    start = time.perf_counter()

    def work(i: int) -> None:
        results[i] = engine.complete(requests[i])
        latencies[i] = time.perf_counter() - start

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tokens = sum(r.stats.completion_tokens for r in results)
    return _summary(tokens, time.perf_counter() - start, latencies), results


def run_sequential(engine, requests: list[Request]) -> dict:
    """One after another: a request's latency includes waiting for those before it."""
    latencies, total = [], 0
    start = time.perf_counter()
    for request in requests:
        total += engine.complete(request).stats.completion_tokens
        latencies.append(time.perf_counter() - start)
    return _summary(total, time.perf_counter() - start, latencies)


def bench_concurrency(config: EngineConfig, levels: list[int]) -> dict:
    """{"N": {mode: {...}}} for each mode in MODES."""

    table: dict[str, dict] = {str(n): {} for n in levels}
    runs = (("torch", "torch", run_concurrent), ("llama.cpp", "llama.cpp", run_concurrent),
            ("llama.cpp", "llama.cpp one at a time", run_sequential))
    for name, mode, runner in runs:
        engine = open_engine(config.without_draft(engine=name, parallel=max(levels)))
        try:
            engine.complete(Request(messages=[Message("user", "Hi")], sampling=GREEDY,
                                    max_tokens=4))
            for n in levels:
                print(f"concurrency {n}: {mode}…", file=sys.stderr)
                # fresh prompts per level and mode: no prefix-cache hits from earlier runs
                offset = 1000 * n + 100000 * MODES.index(mode)
                table[str(n)][mode] = runner(engine, chat_requests(n, offset))
        finally:
            engine.close()
    return table


def knees(table: dict[str, dict]) -> dict[str, int | None]:
    return {mode: knee(table, mode) for mode in MODES}


def knee(table: dict[str, dict], engine: str) -> int | None:
    """The first level whose successor adds < 15% aggregate throughput while its p50
    latency still rises; None if throughput kept growing at every measured level."""
    levels = sorted(table, key=int)
    for a, b in zip(levels, levels[1:]):
        x, y = table[a][engine], table[b][engine]
        if y["aggregate_tok_s"] < KNEE_GAIN * x["aggregate_tok_s"] and \
                y["p50_latency_s"] > x["p50_latency_s"]:
            return int(a)
    return None


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--concurrency takes numbers like 1,4,16, got {text!r}") from None
    if not levels or levels[0] < 1 or levels[-1] > 256:
        raise UsageError(f"--concurrency levels must be 1..256, got {text!r}")
    return levels


def format_concurrency(table: dict[str, dict]) -> str:
    lines = [f"{GEN_TOKENS} tokens per request; aggregate tok/s, p50 / max latency (s)",
             f"{'N':>4}" + "".join(f"{mode:>28}" for mode in MODES)]
    for n, row in sorted(table.items(), key=lambda kv: int(kv[0])):
        cells = [f"{row[m]['aggregate_tok_s']:.1f}  {row[m]['p50_latency_s']:.2f}/"
                 f"{row[m]['max_latency_s']:.2f}" for m in MODES]
        lines.append(f"{n:>4}" + "".join(f"{c:>28}" for c in cells))
    for mode, level in knees(table).items():
        lines.append(f"knee ({mode}): " + (
            f"past {level} concurrent requests throughput grows < 15% while latency rises"
            if level is not None else "none within the measured levels"))
    return "\n".join(lines)
