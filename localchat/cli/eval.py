"""`localchat eval`'s flags; it runs in the top-level quantize/ package
(quantize/commands.py), and --agreement in eval_agreement.py."""

from __future__ import annotations

from localchat.cli.flags import quality_flags


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
    from quantize.commands import cmd_eval  # torch and the quantize package load only here

    return cmd_eval(args)
