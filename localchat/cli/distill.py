"""`localchat distill TARGET [-o DRAFT.gguf]`: its flags and the command, which checks its
arguments, then trains (quantize/distill.py, imported only when it runs)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from localchat.errors import UsageError
from localchat.models.drafts import draft_path_for


def add_parser(sub) -> None:
    p = sub.add_parser("distill", help="train a small draft model for speculative decoding",
                       description="Cut a small draft from TARGET (its embedding, head and a few "
                                   "layers) and train it on TARGET's own next-token "
                                   "distributions. Without -o the draft is kept where the chat "
                                   "and `run` find it for TARGET (the data folder's drafts/). "
                                   "It takes a while: on 2 CPU cores, 20-28 layers of a "
                                   "30-layer target took 42-54 min (labels, then training); "
                                   "the default 4 layers fewer. Progress bars say the time "
                                   "left; Ctrl+C keeps the state for --resume.")
    p.add_argument("target", metavar="TARGET", help="model SPEC: 'default' or a Llama-family .gguf")
    p.add_argument("-o", "--output", default=None, metavar="DRAFT.gguf")
    p.add_argument("--layers", type=int, default=4, metavar="N", help="draft layers (default: 4)")
    p.add_argument("--layer-type", default="Q8_0", choices=("Q8_0", "Q4_1", "Q4_0"),
                   help="the draft's layer matrices: Q8_0 (default), or 4-bit (cheaper to run; "
                        "trained quantization-aware)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training steps of 8 sequences (default: 240)")
    p.add_argument("--temperature", "-T", type=float, default=1.0, metavar="T",
                   help="distillation temperature (default: 1.0)")
    p.add_argument("--hard-weight", type=float, default=0.0, metavar="W",
                   help="weight of the target's argmax as a hard label (default: 0)")
    p.add_argument("--lr", type=float, default=None, metavar="LR", help="learning rate (default: 5e-4)")
    p.add_argument("--teacher-tokens", type=int, default=None, metavar="N",
                   help="positions labelled by TARGET (default: 80000)")
    p.add_argument("--prompts", default="builtin", choices=("builtin", "self"),
                   help="what TARGET answers: built-in prompts (templates x subjects), or prompts "
                        "it writes itself (more varied; on the bench's prompts the built-in "
                        "ones measured better) (default: builtin)")
    p.add_argument("--history", action="store_true",
                   help="also learn from your saved conversations")
    p.add_argument("--text", default=None, metavar="FILE", help="also learn from this text")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run (its state is in DRAFT.gguf.distill/)")
    p.add_argument("--force", action="store_true", help="replace an existing DRAFT file")
    p.add_argument("--threads", type=int, default=None, metavar="N")
    p.add_argument("--json", action="store_true", help="print what was measured as JSON")
    p.set_defaults(handler=run_distill)


def run_distill(args) -> int:
    from localchat.models.specs import resolve_model_facts
    from quantize.distill import DistillOptions, distill
    from quantize.safe_output import check_output, stop_signals_clean_up

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
                             text_file=args.text, threads=args.threads,
                             layer_type=args.layer_type, prompts=args.prompts)
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
