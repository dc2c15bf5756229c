"""`bench --peer`: when llama-bench runs among our engines, and its table: its rows per
cache setting and each engine's rates as a ratio of them (the measuring is bench/peer.py)."""

from __future__ import annotations

import argparse
import sys

from localchat.engine.config import EngineConfig


class PeerStep:
    """`--peer`: checked before anything is measured, run once between the first engine and
    the second (after the only one, if one), so that drift on a shared machine falls on both
    sides of it; its ratios once every engine is measured."""

    def __init__(self, args: argparse.Namespace, config: EngineConfig, report: dict,
                 first: str | None) -> None:
        from localchat.bench.peer import plan_peer

        self.args, self.report, self.first = args, report, first
        self.plan = plan_peer(args.peer or None, config) if args.peer is not None else None

    def before(self, engine: str) -> None:
        """Call before measuring each engine."""
        if self.plan is not None and "peer" not in self.report and engine != self.first:
            self._run()

    def finish(self) -> None:
        if self.plan is None:
            return
        if "peer" not in self.report:
            self._run()
        from localchat.bench.peer import peer_ratios

        self.report["peer"]["ratios"] = peer_ratios(self.report["engines"], self.report["peer"])

    def _run(self) -> None:
        from localchat.bench.peer import run_peer

        print(f"benchmarking the peer {self.plan.binary}…", file=sys.stderr)
        self.report["peer"] = run_peer(self.plan, prompt=self.args.prompt_tokens,
                                       gen=self.args.gen_tokens, repeats=self.args.repeats)


def format_peer(report: dict) -> str:
    """The peer's block under the engines' table (report as `bench --json` prints it)."""
    peer = report["peer"]
    s = peer["settings"]
    caches = s["cache_types"]
    width = 44
    lines = [f"peer: llama-bench {peer['build']} at {peer['binary']}",
             f"  CPU {peer['cpu_info']} ({peer['backends']}), -t {s['threads']} -fa "
             f"{s['flash_attn']}, mean ± stddev of {s['repeats']} repeats; decode at depth "
             f"{s['depth']} (-d), as ours follows the prompt",
             f"{'':<26}" + "".join(f"{f'K/V {c} ({label})':>{width}}" for c, label in caches.items())]
    for kind in ("prefill", "decode"):
        rows = [next(r for r in peer["rows"] if r["cache"] == c and r["kind"] == kind)
                for c in caches]
        label = f"{kind} {rows[0]['test']} tok/s"
        lines.append(f"{label:<26}" + "".join(
            f"{r['avg_ts']:.1f} ± {r['stddev_ts']:.1f}".rjust(width) for r in rows))
    for name, by_cache in peer.get("ratios", {}).items():
        lines.append(f"{name} / llama-bench: " + "; ".join(
            f"K/V {c}: prefill {r['prefill']:.2f}x, decode {r['decode']:.2f}x"
            for c, r in by_cache.items()))
    return "\n".join(lines)
