"""`bench --task serve`: the same concurrent chat load (serve_load.py) against `localchat
serve` and, given a llama-server binary, against it, alternating ours, peer, ours, peer for
the rounds (one server up at a time), so drift cancels in the medians and their ratio."""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from localchat.bench.concurrency import chat_requests
from localchat.bench.serve_load import run_clients
from localchat.bench.served import OURS, PEER, scratch_dir, start_ours, start_peer
from localchat.errors import EngineError, UsageError
from localchat.models.facts import load_context

MEDIAN_KEYS = ("aggregate_tok_s", "ttft_p50_s", "ttft_p90_s", "decode_tok_s_median")
PROMPT_OFFSET = 7000  # chat_requests' numbering: prompts no other bench task sends


@dataclass(frozen=True)
class ServeLoad:
    """What one bench run does: the model, our serve's extra flags, the peer binary (or
    None), N clients of max_tokens each, the rounds, the threads and -c per request."""

    model: str
    serve_flags: list[str]
    peer: Path | None
    concurrency: int
    gen_tokens: int
    rounds: int
    threads: int | None
    ctx_size: int | None


def conversations(n: int) -> list[list[dict]]:
    """bench/concurrency.py's chat prompts as OpenAI messages."""
    return [[{"role": m.role, "content": m.content} for m in r.messages]
            for r in chat_requests(n, PROMPT_OFFSET)]


def bench_serve(load: ServeLoad) -> dict:
    """{"servers": {name: {"command", "engine", "runs": [summary per round], "median"}},
    "ratio": ours / peer (aggregate tok/s, TTFT p50), ...} (no ratio without a peer)."""
    from localchat.models.specs import resolve_model_facts

    facts = resolve_model_facts(load.model)
    if load.peer is not None and facts.path.is_dir():
        raise UsageError(f"--peer-server runs GGUF files; {load.model} is a directory")
    threads = load.threads or max(1, os.cpu_count() or 1)  # the executors' own default
    ctx = load_context(load.ctx_size, facts.context_length)
    prompts = conversations(load.concurrency)
    report: dict = {"task": "serve", "model": f"{facts.name} ({facts.quant_type})",
                    "concurrency": load.concurrency, "gen_tokens": load.gen_tokens,
                    "rounds": load.rounds, "threads": threads, "ctx_per_request": ctx,
                    "servers": {}}
    sides = [OURS] + ([PEER] if load.peer is not None else [])
    with scratch_dir() as tmp:
        for r in range(load.rounds):
            for side in sides:
                print(f"round {r + 1}/{load.rounds}: {side}, {load.concurrency} clients…",
                      file=sys.stderr)
                served = (start_ours(load.serve_flags, Path(tmp)) if side == OURS else
                          start_peer(load.peer, facts.path, load.concurrency, ctx, threads,
                                     Path(tmp)))
                try:
                    run = run_clients(served.url, prompts, load.gen_tokens)
                except EngineError as exc:  # say which server; if it died, its last words
                    died = served.proc.poll() is not None
                    raise EngineError(f"{side}: {exc}" + (
                        f" (it exited: {served.last_line()})" if died else "")) from None
                finally:
                    served.stop()
                entry = report["servers"].setdefault(side, {
                    "command": served.command, "engine": served.engine, "why": served.why,
                    "runs": []})
                entry["runs"].append(run)
    for entry in report["servers"].values():
        entry["median"] = medians(entry["runs"])
    if load.peer is not None:
        ours, peer = (report["servers"][s]["median"] for s in (OURS, PEER))
        report["ratio"] = {"aggregate_tok_s": ours["aggregate_tok_s"] / peer["aggregate_tok_s"],
                           "ttft_p50_s": ours["ttft_p50_s"] / peer["ttft_p50_s"]}
    return report


def medians(runs: list[dict]) -> dict:
    """Each MEDIAN_KEYS value's median over the rounds (None where a round has none)."""
    out = {}
    for key in MEDIAN_KEYS:
        values = [run[key] for run in runs if run[key] is not None]
        out[key] = statistics.median(values) if values else None
    return out
