"""`localchat eval`: its flags and the command; the measuring is the top-level quantize/
package (eval_file, eval_table, agreement), imported only when it runs."""

from __future__ import annotations

import json
import sys

from localchat.cli.flags import quality_flags, quality_protocol
from localchat.errors import UsageError
from localchat.engine.choice import default_threads


def add_parser(sub) -> None:
    evaluate = sub.add_parser("eval", help="measure a model's numerics and quality",
                              description="Perplexity, KL, top-1 agreement and draft "
                                          "acceptance α of -m against --reference; --table: "
                                          "every quantization scheme on one model; "
                                          "--agreement: the torch engine against llama.cpp.")
    evaluate.add_argument("-m", "--model", default="default", metavar="SPEC")
    evaluate.add_argument("--agreement", action="store_true",
                          help="teacher-forced top-1 agreement, max logit difference and greedy "
                               "continuations, torch vs llama.cpp")
    evaluate.add_argument("--table", action="store_true",
                          help="int8/int4 (per tensor, row, group 128), NF4 and GGUF types, "
                               "simulated on -m's float32 weights")
    evaluate.add_argument("--schemes", default=None, metavar="A,B,...",
                          help="--table rows (default: the full table)")
    evaluate.add_argument("--drafts", default=None, metavar="A,B,...",
                          help="--table: distilled drafts to score beside the schemes "
                               "(default: the one kept for -m, if any)")
    evaluate.add_argument("--reference", default=None, metavar="SPEC",
                          help="compare -m against this model (run as float32)")
    evaluate.add_argument("--positions", type=int, default=1100, metavar="N",
                          help="--agreement: teacher-forced positions (default: %(default)s)")
    evaluate.add_argument("--no-float32", action="store_true",
                          help="--agreement: skip the float32 reference copy of a quantized file")
    quality_flags(evaluate)
    evaluate.add_argument("--threads", type=int, default=None, metavar="N")
    evaluate.add_argument("--json", action="store_true", help="print JSON")
    evaluate.set_defaults(handler=run_eval)


def run_eval(args) -> int:
    import torch

    from localchat.models.specs import resolve_model_facts

    if args.drafts is not None and not args.table:
        raise UsageError("--drafts adds rows to --table")
    if args.agreement and (args.table or args.reference):
        raise UsageError("--agreement compares engines; it does not combine with --table or --reference")
    if args.agreement:
        return _agreement(args)
    torch.set_num_threads(args.threads or default_threads())
    protocol = quality_protocol(args)
    facts = resolve_model_facts(args.model)
    if args.table:
        from quantize.eval_table import format_table, run_table
        from quantize.schemes import TABLE_SCHEMES

        schemes = tuple(s.strip() for s in args.schemes.split(",")) if args.schemes else TABLE_SCHEMES
        if args.drafts is not None:
            drafts = [resolve_model_facts(d.strip()) for d in args.drafts.split(",") if d.strip()]
        else:
            from localchat.models.drafts import kept_draft

            kept = None if facts.path.is_dir() else kept_draft(facts)
            drafts = [] if kept is None else [resolve_model_facts(str(kept))]
        result = run_table(facts, protocol, schemes, text_file=args.text, drafts=drafts,
                           log=lambda line: print(line, file=sys.stderr, flush=True))
        print(json.dumps(result, indent=2) if args.json else format_table(result, protocol))
        return 0
    from quantize.eval_file import evaluate_file, format_report

    reference = resolve_model_facts(args.reference) if args.reference else None
    report = evaluate_file(facts, protocol, reference=reference, text_file=args.text)
    print(json.dumps(report, indent=2) if args.json else format_report(report, protocol))
    return 0


def _agreement(args) -> int:
    from localchat.models.specs import resolve_model
    from quantize.agreement import measure_agreement

    if args.positions < 16:
        raise UsageError(f"--positions must be at least 16, got {args.positions}")
    report = measure_agreement(resolve_model(args.model), positions=args.positions,
                               threads=args.threads or default_threads(),
                               with_float32=not args.no_float32)
    print(report.to_json() if args.json else report.table())
    return 0
