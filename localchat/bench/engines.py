"""`localchat bench --task engines`: the default-engine rule's probe run afresh on a file
(engine/engine_figures.py), its figures kept, and the engine the rule then picks per use."""

from __future__ import annotations

from localchat.engine.choice import default_threads
from localchat.engine.engine_probe import measure_engines
from localchat.engine.config import USES
from localchat.engine.engine_rule import faster
from localchat.models.specs import resolve_model_facts


def bench_engines(model: str, threads: int | None) -> dict:
    """{"model", "threads", "figures": {engine: {...}}, "choice": {use: [engine, why]}}."""
    from dataclasses import asdict

    facts = resolve_model_facts(model)
    threads = threads or default_threads()
    figures = measure_engines(facts, threads, ("llama.cpp", "torch"))
    return {"model": facts.name, "threads": threads,
            "figures": {name: asdict(f) for name, f in figures.items()},
            "choice": {use: list(faster(figures["llama.cpp"], figures["torch"], use))
                       for use in USES}}


def format_engines(report: dict) -> str:
    lines = [f"{report['model']}, {report['threads']} threads: start (s), prefill and decode "
             "(one stream, tok/s), 8 streams (tok/s)"]
    for name, f in report["figures"].items():
        lines.append(f"  {name:<10} " + (f"failed: {f['failed']}" if f["failed"] else
                     f"{f['start_s']:6.2f} {f['prefill_tok_s']:8.1f} {f['decode_tok_s']:8.1f} "
                     f"{f['many_tok_s']:8.1f}"))
    for use, (engine, why) in report["choice"].items():
        lines.append(f"  {use:<9} -> {engine} ({why})")
    return "\n".join(lines)
