"""`bench --task serve`: the same concurrent chat load (serve_load.py) against `localchat
serve` and, given a llama-server binary, against it, alternating ours, peer, ours, peer for
the rounds (one server up at a time), so drift cancels in the medians and their ratio."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from localchat.bench.concurrency import chat_requests
from localchat.bench.serve_load import run_clients
from localchat.bench.served import OURS, PEER, scratch_dir, start_ours, start_peer
from localchat.errors import EngineError, UsageError
import argparse
import json
import signal
from localchat.bench.served import check_peer_binary
from localchat.engine.choice import default_threads

MEDIAN_KEYS = ("aggregate_tok_s", "ttft_p50_s", "ttft_p90_s", "decode_tok_s_median")
PROMPT_OFFSET = 7000  # chat_requests' numbering: prompts no other bench task sends


@dataclass(frozen=True)
class ServeLoad:
    """What one bench run does: the model, our serve's extra flags, the peer binary (or
    None), N clients of max_tokens each, the rounds, the threads and -c per request (None:
    each server's default, as its users run it)."""

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
    threads = load.threads or default_threads()  # the executors' own default
    prompts = conversations(load.concurrency)
    report: dict = {"task": "serve", "model": f"{facts.name} ({facts.quant_type})",
                    "concurrency": load.concurrency, "gen_tokens": load.gen_tokens,
                    "rounds": load.rounds, "threads": threads,
                    "ctx_per_request": load.ctx_size,  # None: each server's own default
                    "servers": {}}
    sides = [OURS] + ([PEER] if load.peer is not None else [])
    with scratch_dir() as tmp:
        for r in range(load.rounds):
            for side in sides:
                print(f"round {r + 1}/{load.rounds}: {side}, {load.concurrency} clients…",
                      file=sys.stderr)
                served = (start_ours(load.serve_flags, Path(tmp)) if side == OURS else
                          start_peer(load.peer, facts.path, load.concurrency, threads,
                                     Path(tmp), load.ctx_size))
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


DEFAULT_CLIENTS = 16
SERVE_MAX_QUEUE = 64  # serve's --max-queue default: more clients need a larger one

# The model flags passed on to `localchat serve` when given (serve's defaults otherwise).
PASSED_ON = (("engine", "--engine"), ("ctx_size", "-c"), ("threads", "-t"),
             ("device", "--device"), ("gpu_layers", "-ngl"), ("kv_memory", "--kv-memory"),
             ("kv_disk", "--kv-disk"), ("parallel", "-np"), ("cache_type_k", "-ctk"),
             ("cache_type_v", "-ctv"), ("chat_template", "--chat-template"),
             ("draft_model", "--draft-model"), ("draft", "--draft"),
             ("num_draft_tokens", "--num-draft-tokens"))


def serve_flags(args: argparse.Namespace, clients: int) -> list[str]:
    """-m and each model flag the bench was given, for `localchat serve`."""
    flags = ["-m", args.model]
    for dest, flag in PASSED_ON:
        value = getattr(args, dest, None)
        if value is not None:
            flags += [flag, str(value)]
    if getattr(args, "kv_disk", None) is None:  # each round computes its prompts (see measured_config)
        flags += ["--kv-disk", "0"]
    if args.no_draft:
        flags.append("--no-draft")
    if getattr(args, "exact_batching", False):
        flags.append("--exact-batching")
    if clients > SERVE_MAX_QUEUE:
        flags += ["--max-queue", str(clients)]
    return flags


def clients_flag(text: str | None) -> int:
    if text is None:
        return DEFAULT_CLIENTS
    try:
        n = int(text)
    except ValueError:
        raise UsageError(f"--task serve takes one --concurrency number, got {text!r}") from None
    if not 1 <= n <= 256:
        raise UsageError(f"--concurrency must be 1..256, got {n}")
    return n


def run_serve_task(args: argparse.Namespace) -> int:
    clients = clients_flag(args.concurrency)
    peer = check_peer_binary(args.peer_server) if args.peer_server else None
    if peer is not None and args.chat_template:
        raise UsageError("--chat-template: the peer renders the GGUF's own template; "
                         "compare without it")
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the servers are stopped
    try:
        report = bench_serve(ServeLoad(
            model=args.model, serve_flags=serve_flags(args, clients), peer=peer,
            concurrency=clients, gen_tokens=args.gen_tokens, rounds=args.repeats,
            threads=args.threads, ctx_size=args.ctx_size))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps(report) if args.json else format_serve(report))
    return 0


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def format_serve(report: dict) -> str:
    """One row per server (medians over the rounds), then the ratio."""
    lines = [f"{report['model']}: {report['concurrency']} concurrent streamed chat "
             f"completions of {report['gen_tokens']} tokens, {report['threads']} threads, "
             f"median of {report['rounds']} rounds",
             f"{'server':<28}{'aggregate tok/s':>16}{'TTFT p50':>11}{'TTFT p90':>11}"
             f"{'decode tok/s':>14}"]
    for name, entry in report["servers"].items():
        m = entry["median"]
        decode = m["decode_tok_s_median"]
        label = f"{name} ({entry['engine']})"
        lines.append(f"{label:<28}{m['aggregate_tok_s']:>16.1f}"
                     f"{m['ttft_p50_s'] * 1000:>9.0f}ms{m['ttft_p90_s'] * 1000:>9.0f}ms"
                     f"{decode if decode is not None else float('nan'):>14.1f}")
    ours = report["servers"][OURS]
    if ours["why"]:
        lines.append(f"{OURS}: {ours['why']}")
    if "ratio" in report:
        r = report["ratio"]
        lines.append(f"{OURS} / {PEER}: aggregate {r['aggregate_tok_s']:.2f}x, "
                     f"TTFT p50 {r['ttft_p50_s']:.2f}x (lower is faster)")
        lines.append(f"{PEER}: {' '.join(report['servers'][PEER]['command'])}")
    counted = {c["tokens_from"] for e in report["servers"].values() for run in e["runs"]
               for c in run["clients"]}
    if counted != {"usage"}:
        lines.append("tokens: counted from content deltas where a server sent no usage")
    return "\n".join(lines)
