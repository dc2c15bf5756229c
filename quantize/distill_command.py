"""`localchat distill`: checks its arguments, then trains (quantize/distill.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from localchat.models.drafts import draft_path_for
from localchat.errors import UsageError
from quantize.distill import DistillOptions, distill
from quantize.safe_output import check_output, stop_signals_clean_up


def cmd_distill(args) -> int:
    from localchat.models.specs import resolve_model_facts

    facts = resolve_model_facts(args.target)
    if facts.path.is_dir() or facts.architecture != "llama":
        raise UsageError(f"distill needs a Llama-architecture GGUF target, not {facts.path.name}")
    if not 1 <= args.layers < facts.n_layers:
        raise UsageError(f"--layers must be 1..{facts.n_layers - 1} ({facts.name} has {facts.n_layers})")
    out = Path(args.output).expanduser() if args.output else draft_path_for(facts)
    if not args.output:
        out.parent.mkdir(parents=True, exist_ok=True)
    if not args.resume:
        check_output(facts.path, out, replace=args.force)
    options = DistillOptions(layers=args.layers, temperature=args.temperature,
                             hard_weight=args.hard_weight, history=args.history,
                             text_file=args.text, threads=args.threads)
    for flag, field in (("steps", "steps"), ("lr", "lr"), ("teacher_tokens", "teacher_tokens")):
        if getattr(args, flag) is not None:
            options = replace(options, **{field: getattr(args, flag)})
    if options.temperature <= 0 or options.steps < 1 or options.teacher_tokens < 1000:
        raise UsageError("need --temperature > 0, --steps ≥ 1 and --teacher-tokens ≥ 1000")
    with stop_signals_clean_up():
        result = distill(facts.path, out, options, resume=args.resume)
    if args.json:
        print(json.dumps(result, indent=2))
    return 0
