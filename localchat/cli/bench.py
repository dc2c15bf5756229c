"""`localchat bench`: engines side by side on one model, llama-bench style: prefill, decode,
TTFT (turn 1 vs turn 8), weights memory and KV bytes per token beside the kernel limit;
median and spread over repeats, each on a fresh prompt."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from localchat.errors import UsageError
from localchat.cli.flags import engine_config, load_for_run
from localchat.engine.config import EngineConfig
from localchat.units import human_bytes


def add_parser(sub, model: argparse.ArgumentParser) -> None:
    bench = sub.add_parser("bench", parents=[model], help="measure prefill and decode speed",
                           description="Prefill and decode speed, llama-bench style.")
    bench.add_argument("-p", "--prompt-tokens", type=int, default=512, help="(default: %(default)s)")
    bench.add_argument("-g", "--gen-tokens", type=int, default=128, help="(default: %(default)s)")
    bench.add_argument("-r", "--repeats", type=int, default=None,
                       help="(default: 5; --task serve: 2 rounds)")
    bench.add_argument("--engines", default="torch,llama.cpp",
                       help="comma-separated engines to compare (default: %(default)s)")
    bench.add_argument("--concurrency", default=None, metavar="N[,N...]",
                       help="also serve N concurrent requests (64 tokens each): the runtime "
                            "batching them on each executor, and llama.cpp one after "
                            "another, e.g. 1,4,16 (--task serve: N clients, default 16)")
    bench.add_argument("--task", choices=("speed", "json", "restore", "serve", "start", "engines"),
                       default="speed",
                       help="speed: prefill and decode; json: free vs JSON-schema-constrained "
                            "decoding of the same prompts, with and without forced drafts "
                            "(-g tokens at most, at each --concurrency level; default 1); "
                            "restore: TTFT of a 3,000-token conversation reopened after a "
                            "restart from its KV snapshot, and of a sibling branch; "
                            "serve: --concurrency clients streaming -g tokens each from "
                            "`localchat serve` (its defaults), and from --peer-server, "
                            "alternating for -r rounds; start: a one-shot `run \"Hi\" -n 1`, "
                            "whole process, -r times per engine (min, median); engines: the "
                            "default-engine rule's probe of both executors, afresh (its "
                            "figures kept), and the engine it picks per use")
    bench.add_argument("--peer-server", default=None, metavar="PATH",
                       help="--task serve: a llama-server binary, run as its users run it "
                            "(its defaults plus -np N and -t; -c N per request if given), "
                            "to load the same way beside ours")
    bench.add_argument("--peer", nargs="?", const="", default=None, metavar="LLAMA_BENCH",
                       help="also run llama.cpp's own llama-bench (this path; without one, "
                            "$LOCALCHAT_LLAMA_BENCH or llama-bench on PATH; "
                            "scripts/build-peers builds it) on the same GGUF file with the "
                            "same -p/-g/-r/-t, decode at depth -p, with our llama.cpp "
                            "executor's K/V cache types and with its default f16; each "
                            "engine's rates as a ratio of it")
    bench.add_argument("--busy", type=int, default=0, metavar="N",
                       help="while benchmarking, N background processes each keep one core "
                            "busy (a spin loop), as another program would (default: 0)")
    bench.add_argument("--json", action="store_true", help="print JSON")
    bench.set_defaults(handler=cmd_bench)


FIXTURE_NOTE = ("a speed fixture (scripts/deep-model: the bundled model with silent extra "
                "layers), for timing only; its replies are the bundled model's")


def speed_fixture(spec: str):
    """deep:K (built into the cache the first time) or a deep-model file's path; None for
    any other model."""
    import re
    from pathlib import Path

    if spec.startswith("deep:"):
        from quantize.deep_model import resolve_deep  # the quantize package loads only here

        return resolve_deep(spec)
    path = Path(spec)
    return path if re.match(r"deep-\d+", path.name) and path.is_file() else None


def cmd_bench(args: argparse.Namespace) -> int:
    from localchat.bench.busy import BusyCores, check_busy

    busy = check_busy(args.busy)
    if busy:
        print(f"{busy} background process{'es' if busy > 1 else ''} keeping "
              f"{busy} core{'s' if busy > 1 else ''} busy (--busy)", file=sys.stderr)
    with BusyCores(busy):
        return _bench(args)


def _bench(args: argparse.Namespace) -> int:
    from localchat.bench.engine import bench_engine

    task = getattr(args, "task", "speed")
    if args.repeats is None:
        args.repeats = 2 if task == "serve" else 5
    if args.peer_server is not None and task != "serve":
        raise UsageError("--peer-server is for --task serve")
    if min(args.prompt_tokens, args.gen_tokens, args.repeats) < 1:
        raise UsageError("prompt tokens, gen tokens and repeats must each be >= 1")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if getattr(args, "peer", None) is not None and task != "speed":
        raise UsageError("--peer compares prefill and decode: it is for --task speed")
    if task == "serve":
        from localchat.bench.serve_task import run_serve_task

        return run_serve_task(args)
    if task == "json":
        return _bench_json_task(args, engines)
    if task == "start":
        from localchat.bench.start import bench_start, format_start

        report = {"task": "start", "model": args.model, "repeats": args.repeats,
                  "engines": bench_start(args.model, engines, args.repeats, args.threads)}
        print(json.dumps(report) if args.json else format_start(report))
        return 0
    if task == "restore":
        return _bench_restore_task(args, engines)
    if task == "engines":
        from localchat.bench.engines import bench_engines, format_engines

        report = {"task": "engines", **bench_engines(args.model, args.threads)}
        print(json.dumps(report) if args.json else format_engines(report))
        return 0
    levels = None
    if args.concurrency:
        from localchat.bench.concurrency import parse_levels

        levels = parse_levels(args.concurrency)
    report: dict = {"model": None, "threads": args.threads, "prompt_tokens": args.prompt_tokens,
                    "gen_tokens": args.gen_tokens, "repeats": args.repeats, "engines": {},
                    "busy": args.busy}
    config = measured_config(args)
    fixture = speed_fixture(config.model)
    if fixture is not None:
        config = replace(config, model=str(fixture))
        report["fixture"] = FIXTURE_NOTE
        print(f"{args.model}: {FIXTURE_NOTE}", file=sys.stderr)
    from localchat.bench.peer import PeerStep, format_peer

    peer = PeerStep(args, config, report, first=engines[0] if engines else None)
    for name in engines:
        peer.before(name)
        engine = load_for_run(config.without_draft(engine=name, parallel=None))
        try:
            report["model"] = f"{engine.info.name} ({engine.info.quant_type})"
            print(f"benchmarking {name}…", file=sys.stderr)
            limit = KernelLimit(engine, args) if name == "llama.cpp" else None
            try:
                report["engines"][name] = bench_engine(
                    engine, args.prompt_tokens, args.gen_tokens, args.repeats,
                    after_each=limit.single if limit else None)
                if limit is not None:
                    print("benchmarking the kernel limit (a bare llama_decode loop)…",
                          file=sys.stderr)
                    report["kernel_limit"] = limit.report()
            finally:
                if limit is not None:
                    limit.close()
        finally:
            engine.close()
    peer.finish()
    if args.draft_model or args.draft:  # beside `engines`: the first engine with and without it
        from localchat.bench.speculative import bench_speculative

        report["speculative"] = bench_speculative(replace(config, engine=engines[0]),
                                                  args.gen_tokens)
    if levels is not None:
        from localchat.bench.concurrency import bench_concurrency, knees

        report["concurrency"] = bench_concurrency(config, levels)
        report["concurrency_knee"] = knees(report["concurrency"])
        if args.draft_model or args.draft:  # the first engine's N requests with and without it
            from localchat.bench.concurrent_drafts import bench_concurrent_drafts

            report["concurrency_drafts"] = bench_concurrent_drafts(
                replace(config, engine=engines[0]), levels)
    if args.json:
        print(json.dumps(report))
    else:
        if "fixture" in report:
            print(f"{args.model}: {FIXTURE_NOTE}")
        if args.busy:
            print(f"measured with {args.busy} other core-bound process(es) running (--busy)")
        if report["engines"]:
            print(format_table(report))
        if "peer" in report:
            print(("\n" if report["engines"] else "") + format_peer(report))
        if "speculative" in report:
            from localchat.bench.speculative import format_speculative

            print("\n" + format_speculative(report["speculative"]))
        if "concurrency" in report:
            from localchat.bench.concurrency import format_concurrency

            print("\n" + format_concurrency(report["concurrency"]))
        if "concurrency_drafts" in report:
            from localchat.bench.concurrent_drafts import format_concurrent_drafts

            print("\n" + format_concurrent_drafts(report["concurrency_drafts"]))
    return 0


def chat_turns() -> int:
    from localchat.bench.engine import CHAT_TURNS

    return CHAT_TURNS


def measured_config(args: argparse.Namespace) -> EngineConfig:
    """The engines' config, KV snapshots on disk off unless --kv-disk asks: a repeat must
    compute its prompt, not restore one an earlier run (or the user's chats) saved."""
    config = engine_config(args)
    return config if config.kv_disk is not None else replace(config, kv_disk=0)


def _bench_json_task(args: argparse.Namespace, engines: list[str]) -> int:
    from localchat.bench.json_task import bench_json
    from localchat.bench.concurrency import parse_levels
    from localchat.bench.json_task import format_json_report

    levels = parse_levels(args.concurrency) if args.concurrency else [1]
    report: dict = {"task": "json", "gen_tokens": args.gen_tokens, "engines": {},
                    "busy": args.busy}
    config = measured_config(args)
    for name in engines:
        engine = load_for_run(config.without_draft(engine=name, parallel=max(levels)))
        try:
            report["model"] = f"{engine.info.name} ({engine.info.quant_type})"
            print(f"benchmarking {name} (json)…", file=sys.stderr)
            report["engines"][name] = [bench_json(engine, args.gen_tokens, level,
                                                  max(1, args.repeats // 5))
                                       for level in levels]
        finally:
            engine.close()
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join(format_json_report(name, r) for name, runs in report["engines"].items()
                        for r in runs))
    return 0


def _bench_restore_task(args: argparse.Namespace, engines: list[str]) -> int:
    from localchat.bench.kv_restore import bench_restore, format_restore

    config = engine_config(args)
    report: dict = {"task": "restore", "engines": {}, "busy": args.busy}
    for name in engines:
        print(f"benchmarking {name} (restore)…", file=sys.stderr)
        report["engines"][name] = bench_restore(
            lambda: load_for_run(config.without_draft(engine=name)), max(1, args.repeats // 2))
    if args.json:
        print(json.dumps(report))
    else:
        print("\n".join(format_restore(n, r) for n, r in report["engines"].items()))
    return 0


class KernelLimit:
    """The bare loop on the llama.cpp engine's model: the tg prompts (after each of the
    engine's repeats), then the 16 chat prompts of the concurrency bench."""

    def __init__(self, engine, args: argparse.Namespace) -> None:
        from localchat.bench.kernel import BareLoop

        self.engine, self.args = engine, args
        self.loop = BareLoop(engine.facts, n_ctx=engine.info.n_ctx, threads=args.threads,
                             slots=16)

    def single(self, prompt: list[int]) -> None:
        self.loop.single(prompt, self.args.gen_tokens)

    def report(self) -> dict:
        from localchat.bench.concurrency import GEN_TOKENS, chat_requests

        batch = [self.engine.tokenize_messages(r.messages)
                 for r in chat_requests(16, offset=16000)]
        for _ in range(max(1, self.args.repeats // 2)):
            self.loop.batch(batch, min(GEN_TOKENS, self.args.gen_tokens))
        return self.loop.report()

    def close(self) -> None:
        self.loop.close()


def format_table(report: dict) -> str:
    names = list(report["engines"])
    p, g = report["prompt_tokens"], report["gen_tokens"]

    def rate(e, key):
        s = e["spread"][key]
        return f"{s['median']:.1f} ({s['min']:.0f}-{s['max']:.0f})"

    rows = [
        (f"prefill pp{p} tok/s", lambda e: rate(e, "prefill_tok_s")),
        (f"decode tg{g} tok/s", lambda e: rate(e, "decode_tok_s")),
        (f"TTFT pp{p}", lambda e: f"{e['ttft_s'] * 1000:.0f} ms"),
        ("TTFT chat turn 1", lambda e: f"{e['ttft_turn1_s'] * 1000:.0f} ms"),
        (f"TTFT chat turn {chat_turns()}", lambda e: f"{e['ttft_turn8_s'] * 1000:.0f} ms"),
        ("weights", lambda e: human_bytes(e["weights_bytes"])),
        ("KV per token", lambda e: human_bytes(e["kv_bytes_per_token"])),
    ]
    width = 24
    lines = [f"{report['model']}, median (min-max) of {report['repeats']} repeats",
             f"{'':<22}" + "".join(f"{n:>{width}}" for n in names)]
    for label, cell in rows:
        lines.append(f"{label:<22}" + "".join(f"{cell(report['engines'][n]):>{width}}"
                                              for n in names))
    if len(names) == 2:
        a, b = (report["engines"][n] for n in names)
        lines.append(f"{names[0]} / {names[1]}: prefill "
                     f"{a['prefill_tok_s'] / b['prefill_tok_s']:.2f}x, decode "
                     f"{a['decode_tok_s'] / b['decode_tok_s']:.2f}x")
    for name in names:
        if report["engines"][name].get("compute"):
            lines.append(f"{name} computes with: {report['engines'][name]['compute']}")
        chosen = report["engines"][name].get("kernels")
        if chosen:
            lines.append(f"{name} kernels (measured on this machine): " +
                         ", ".join(f"{layer} {kernel}" for layer, kernel in chosen.items()))
    k = report.get("kernel_limit")
    if k:
        ours = report["engines"].get("llama.cpp", {}).get("decode_tok_s", 0.0)
        n = k["sequences"]
        lines.append(f"bare llama_decode loop (llama.cpp alone, no runtime; run after each "
                     f"repeat above): decode tg{g} {k['decode_tok_s']:.1f} tok/s, the runtime "
                     f"on llama.cpp {ours / k['decode_tok_s']:.2f}x of it (the runtime's own "
                     f"cost is the gap below 1.0x; above it is noise, or the thread governor "
                     f"using fewer threads on a busy machine); {n} sequences in one batch: "
                     f"{k[f'decode_{n}_tok_s']:.1f} tok/s decode, "
                     f"{k[f'aggregate_{n}_tok_s']:.1f} tok/s with their prefill")
    if len(names) == 2 and len({report["engines"][n]["weights_bytes"] for n in names}) == 2:
        lines.append("weights: llama.cpp maps the file's tensors as they are; torch holds "
                     "them repacked for its kernels (rows interleaved 8 at a time and padded, "
                     "scales per row), so the same file's weights differ a little")
    return "\n".join(lines)
