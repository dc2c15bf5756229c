"""`bench --peer`: llama.cpp's own llama-bench on the same GGUF file, with the same -p/-g/-r/-t,
prefill from an empty context and decode at the depth of our decode (after -p prompt tokens:
llama-bench `-d`), with our llama.cpp executor's K/V cache types and llama-bench's default
f16; each engine's rates as a ratio of the peer's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from localchat.engine.config import EngineConfig
from localchat.errors import EngineError, UsageError
import argparse
import sys

PEER_ENV = "LOCALCHAT_LLAMA_BENCH"
DEFAULT_CACHE = ("f16", "f16")  # llama-bench's own -ctk/-ctv


@dataclass(frozen=True)
class PeerSetting:
    """One llama-bench configuration: its K/V cache types and why we run it."""

    cache_k: str
    cache_v: str
    label: str

    @property
    def key(self) -> str:
        return f"{self.cache_k}/{self.cache_v}"


@dataclass(frozen=True)
class PeerPlan:
    """What `bench --peer` runs: the binary, the GGUF file, the threads our llama.cpp
    executor uses and the cache settings."""

    binary: Path
    model: Path
    threads: int
    settings: list[PeerSetting]


def plan_peer(asked: str | None, config: EngineConfig) -> PeerPlan:
    """Every check before anything is measured: the binary (find_peer), a GGUF model (a
    Hugging Face directory is refused), our executor's threads and K/V cache types."""
    from localchat.engine.choice import capped_threads, default_threads
    from localchat.models.planner import chosen_cache_types
    from localchat.models.specs import resolve_model_facts

    binary = find_peer(asked)
    facts = resolve_model_facts(config.model)
    if facts.path.is_dir():
        raise UsageError(f"--peer needs a GGUF file: llama-bench cannot read {facts.path.name}, "
                         "a Hugging Face directory")
    threads = capped_threads(config.threads)[0] or default_threads()  # as the executor
    ours = chosen_cache_types(facts, config.cache_types, exact=config.exact_batching)
    return PeerPlan(binary, facts.path, threads, peer_settings(ours))


def find_peer(asked: str | None) -> Path:
    """The llama-bench binary: `asked` (a path), else $LOCALCHAT_LLAMA_BENCH, else
    `llama-bench` on PATH; a UsageError naming what is missing or not executable."""
    spec = asked or os.environ.get(PEER_ENV) or shutil.which("llama-bench")
    if not spec:
        raise UsageError(f"--peer: no llama-bench given, none in ${PEER_ENV} and none on PATH "
                         "(scripts/build-peers builds one)")
    path = Path(spec).expanduser()
    if not path.is_file():
        raise UsageError(f"--peer: {spec} is not a file")
    if not os.access(path, os.X_OK):
        raise UsageError(f"--peer: {spec} is not executable")
    return path.resolve()


def peer_settings(ours: tuple[str, str]) -> list[PeerSetting]:
    """Our llama.cpp executor's cache types first, then llama-bench's default (f16 K and V,
    which prefills faster than a q8_0 K) unless they are the same."""
    settings = [PeerSetting(*ours, "as our llama.cpp executor")]
    if tuple(ours) != DEFAULT_CACHE:
        settings.append(PeerSetting(*DEFAULT_CACHE, "llama-bench's default"))
    return settings


def peer_command(binary: Path, model: Path, setting: PeerSetting, *, prompt: int, gen: int,
                 repeats: int, threads: int, flash_attn: str = "on") -> list[list[str]]:
    """Two llama-bench runs: pp`prompt` at depth 0 (like our prefill of a fresh prompt) and
    tg`gen` at depth `prompt` (like our decode, which follows the prompt)."""
    common = [str(binary), "-m", str(model), "-r", str(repeats), "-t", str(threads),
              "-ctk", setting.cache_k, "-ctv", setting.cache_v, "-fa", flash_attn, "-o", "json"]
    return [common + ["-p", str(prompt), "-n", "0", "-d", "0"],
            common + ["-p", "0", "-n", str(gen), "-d", str(prompt)]]


def parse_rows(stdout: str, setting: PeerSetting) -> list[dict]:
    """llama-bench's `-o json` output (a list of tests) as our rows: the test's shape, its
    rate (avg_ts, stddev_ts, samples_ts, tok/s) and the build and settings it ran with."""
    try:
        tests = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise EngineError(f"llama-bench printed no JSON ({exc})") from None
    if not isinstance(tests, list) or not tests:
        raise EngineError("llama-bench's JSON holds no test")
    rows = []
    for t in tests:
        kind = "prefill" if t["n_prompt"] > 0 else "decode"
        name = f"pp{t['n_prompt']}" if kind == "prefill" else f"tg{t['n_gen']}"
        rows.append({
            "test": name + (f" @ d{t['n_depth']}" if t["n_depth"] else ""), "kind": kind,
            "cache": setting.key, "setting": setting.label,
            **{key: t[key] for key in ("n_prompt", "n_gen", "n_depth", "avg_ts", "stddev_ts",
                                       "samples_ts", "type_k", "type_v", "flash_attn",
                                       "n_threads", "n_batch", "n_ubatch", "build_commit",
                                       "build_number", "cpu_info", "backends",
                                       "model_filename", "model_type") if key in t}})
    return rows


def run_peer(plan: PeerPlan, *, prompt: int, gen: int, repeats: int) -> dict:
    """Every setting's two runs; the report `bench --json` prints under "peer". A failing
    llama-bench is an EngineError with its exit code and last stderr line."""
    rows, threads, settings = [], plan.threads, plan.settings
    for setting in settings:
        for cmd in peer_command(plan.binary, plan.model, setting, prompt=prompt, gen=gen,
                                repeats=repeats, threads=threads):
            rows += parse_rows(_run(cmd), setting)
    first = rows[0]
    return {
        "binary": str(plan.binary), "model": str(plan.model),
        "build": f"b{first.get('build_number')} ({first.get('build_commit')})",
        "build_number": first.get("build_number"), "build_commit": first.get("build_commit"),
        "cpu_info": first.get("cpu_info"), "backends": first.get("backends"),
        "settings": {"threads": threads, "repeats": repeats, "flash_attn": "on",
                     "prompt_tokens": prompt, "gen_tokens": gen, "depth": prompt,
                     "cache_types": {s.key: s.label for s in settings}},
        "rows": rows,
    }


def _run(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise EngineError(f"llama-bench could not start: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "no message"
        how = (f"exit {proc.returncode}" if proc.returncode > 0
               else f"killed by {_signal_name(-proc.returncode)}")
        raise EngineError(f"llama-bench failed ({how}): {last}")
    return proc.stdout


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def peer_rate(peer: dict, cache: str, kind: str) -> float:
    """The peer's mean tok/s (llama-bench's avg_ts) for `kind` (prefill|decode) at `cache`."""
    return next(r["avg_ts"] for r in peer["rows"] if r["cache"] == cache and r["kind"] == kind)


def peer_ratios(engines: dict, peer: dict) -> dict:
    """Each engine's prefill and decode (its median) over the peer's, per cache setting."""
    caches = list(peer["settings"]["cache_types"])
    return {name: {cache: {kind: figures[f"{kind}_tok_s"] / peer_rate(peer, cache, kind)
                           for kind in ("prefill", "decode")} for cache in caches}
            for name, figures in engines.items()}


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
