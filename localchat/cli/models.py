"""`localchat pull` and `localchat models`: fetch a model, list the known ones."""

from __future__ import annotations

import json
from typing import Any

from localchat.errors import UsageError
from localchat.models.draft_pairs import DRAFT_PAIRS, paired_draft, paired_draft_on_disk
from localchat.models.specs import ModelEntry, list_models, resolve_model, resolve_model_facts
from localchat.units import human_bytes

COLUMNS = ("SOURCE", "SPEC/NAME", "QUANT", "SIZE", "ARCH", "CONTEXT", "KV/TOKEN")


def add_pull_parser(sub) -> None:
    pull = sub.add_parser("pull", help="download a model from Hugging Face")
    pull.add_argument("spec", metavar="SPEC", help="OWNER/REPO:FILE.gguf or OWNER/REPO:QUANT")
    pull.add_argument("--with-draft", action="store_true",
                      help="also fetch the small model of its family that drafts for it "
                           "(speculative decoding; `--draft auto` then uses it)")
    pull.set_defaults(handler=lambda args: cmd_pull(args.spec, with_draft=args.with_draft))


def add_models_parser(sub) -> None:
    models = sub.add_parser("models", help="list models available locally")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=lambda args: cmd_models(as_json=args.json))


def cmd_pull(spec: str, with_draft: bool = False) -> int:
    """Download (if needed) and validate a model; print where it lives. with_draft: its
    paired draft too (a UsageError if its family has none)."""
    facts = resolve_model_facts(spec, local_only=False)
    print(facts.path)
    if with_draft:
        draft = paired_draft(facts)
        if draft is None:
            raise UsageError(f"{facts.name} has no known draft model (known pairs: "
                             f"{', '.join(sorted({d for _, d in DRAFT_PAIRS}))} for their "
                             "families' larger models)")
        print(resolve_model(draft, local_only=False))
    return 0


def cmd_models(as_json: bool = False) -> int:
    """Print the known models as a table, or as a JSON list for scripts."""
    entries = list_models()
    if as_json:
        print(json.dumps([_as_dict(e) for e in entries], indent=2))
        return 0
    if not entries:
        print("no models found; try `localchat pull OWNER/REPO:QUANT`")
        return 0
    rows = [_row(e) for e in entries]
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    for row, entry in zip([COLUMNS, *rows], [None, *entries]):
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
        if entry is not None and entry.error:
            line += f"  error: {entry.error}"
        elif entry is not None and (draft := _draft(entry)) is not None:
            line += f"  draft: {draft['name']}" + ("" if draft["on_disk"] else
                                                  " (pull --with-draft)")
        print(line)
    return 0


def _row(entry: ModelEntry) -> tuple[str, ...]:
    f = entry.facts
    if f is None:
        return (entry.source, entry.spec, "-", "-", "-", "-", "-")
    return (
        entry.source,
        entry.spec,
        f.quant_type,
        human_bytes(f.file_size),
        f.architecture,
        str(f.context_length),
        human_bytes(f.kv_bytes_per_token()),
    )


def _as_dict(entry: ModelEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"source": entry.source, "spec": entry.spec, "path": str(entry.path)}
    f = entry.facts
    if f is None:
        out["error"] = entry.error
        return out
    out.update(
        name=f.name,
        quant=f.quant_type,
        size_bytes=f.file_size,
        architecture=f.architecture,
        context_length=f.context_length,
        n_layers=f.n_layers,
        n_heads=f.n_heads,
        n_kv_heads=f.n_kv_heads,
        head_dim=f.head_dim,
        vocab_size=f.vocab_size,
        kv_bytes_per_token=f.kv_bytes_per_token(),
        has_chat_template=f.chat_template is not None,
        draft=_draft(entry),
    )
    return out


def _draft(entry: ModelEntry) -> dict | None:
    """The entry's paired draft: its short name and whether it is on disk."""
    name = paired_draft(entry.facts) if entry.facts is not None else None
    if name is None:
        return None
    return {"name": name, "on_disk": paired_draft_on_disk(entry.facts) is not None}
