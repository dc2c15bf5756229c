"""`localchat distill TARGET [-o DRAFT.gguf]`'s flags; it runs in quantize/distill.py."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("distill", help="train a small draft model for speculative decoding",
                       description="Cut a small draft from TARGET (its embedding, head and a few "
                                   "layers) and train it on TARGET's own next-token "
                                   "distributions. Without -o the draft is kept where the chat "
                                   "and `run` find it for TARGET (the data folder's drafts/).")
    p.add_argument("target", metavar="TARGET", help="model SPEC: 'default' or a Llama-family .gguf")
    p.add_argument("-o", "--output", default=None, metavar="DRAFT.gguf")
    p.add_argument("--layers", type=int, default=4, metavar="N", help="draft layers (default: 4)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="training steps of 8 sequences (default: 240)")
    p.add_argument("--temperature", "-T", type=float, default=1.0, metavar="T",
                   help="distillation temperature (default: 1.0)")
    p.add_argument("--hard-weight", type=float, default=0.0, metavar="W",
                   help="weight of the target's argmax as a hard label (default: 0)")
    p.add_argument("--lr", type=float, default=None, metavar="LR", help="learning rate (default: 5e-4)")
    p.add_argument("--teacher-tokens", type=int, default=None, metavar="N",
                   help="positions labelled by TARGET (default: 80000)")
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
    from quantize.distill_command import cmd_distill  # torch loads only here

    return cmd_distill(args)
