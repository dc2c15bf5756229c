"""`localchat bench --task serve`: its flags turned into our serve's command line and the
peer's, and its table; bench/serve_task.py measures."""

from __future__ import annotations

import argparse
import json
import signal

from localchat.bench.serve_task import ServeLoad, bench_serve
from localchat.bench.served import OURS, PEER, check_peer_binary
from localchat.errors import UsageError

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
