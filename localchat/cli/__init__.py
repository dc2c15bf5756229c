"""Command line: `localchat` opens the chat TUI; subcommands do the rest
(quantize and eval live in the top-level quantize/ package).

Flags follow what llama.cpp and Ollama users know (-m, -n, -c, --temp, ...). Every user
mistake surfaces as a LocalchatError: one line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import sys

from localchat import __version__
from localchat.cli.flags import endpoint_flags, model_flags, quality_flags, sampling_flags
from localchat.errors import LocalchatError


class OneLineParser(argparse.ArgumentParser):
    """A bad flag or value is one line naming it (and where the help is), not a usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    model, sampling, endpoint = model_flags(), sampling_flags(), endpoint_flags()
    parser = OneLineParser(
        prog="localchat",
        parents=[model, endpoint, sampling],
        description="Chat with a local, quantized LLM. With no command, opens the chat UI.",
    )
    parser.add_argument("--version", action="version", version=f"localchat {__version__}")
    parser.add_argument("--continue", dest="continue_last", action="store_true",
                        help="reopen the last conversation (long flag only: -c is --ctx-size)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", parents=[model, endpoint, sampling],
                         help="one-shot prompt, reply on stdout",
                         description="Print the model's reply to PROMPT (and/or stdin) on stdout.")
    run.add_argument("prompt", nargs="?", default=None,
                     help="the prompt; '-' or piped stdin supplies it (stdin first, then this)")
    run.add_argument("-p", "--prompt", dest="prompt_flag", default=None, metavar="TEXT",
                     help="the prompt, as a flag (llama.cpp's spelling of PROMPT)")
    run.add_argument("-f", "--file", dest="prompt_file", default=None, metavar="FILE",
                     help="read the prompt from FILE (after stdin, before PROMPT)")
    run.add_argument("--attach", action="append", default=[], metavar="FILE",
                     help="put a text file into the prompt, named and fenced (repeatable)")
    run.add_argument("--batch", default=None, metavar="FILE.jsonl",
                     help="one request per line ('prompt' or 'messages', optional sampling "
                          "fields and 'id'; '-' reads stdin): one JSON result per line on "
                          "stdout, in input order")
    run.add_argument("--verbose", action="store_true", help="stats block on stderr")
    run.add_argument("--json", action="store_true", help="print one JSON object with text and stats")
    run.add_argument("--continue", dest="continue_last", action="store_true",
                     help="add PROMPT to the last conversation and reply with its history, "
                          "system prompt and sampling (flags that differ from their defaults "
                          "override them); saved to the history as it streams")
    run.add_argument("--no-history", action="store_true",
                     help="do not save this exchange (by default each run is kept as a "
                          "conversation, so --continue and the chat UI's list find it)")

    pull = sub.add_parser("pull", help="download a model from Hugging Face")
    pull.add_argument("spec", metavar="SPEC", help="OWNER/REPO:FILE.gguf or OWNER/REPO:QUANT")

    bench = sub.add_parser("bench", parents=[model], help="measure prefill and decode speed",
                           description="Prefill and decode speed, llama-bench style.")
    bench.add_argument("-p", "--prompt-tokens", type=int, default=512, help="(default: %(default)s)")
    bench.add_argument("-g", "--gen-tokens", type=int, default=128, help="(default: %(default)s)")
    bench.add_argument("-r", "--repeats", type=int, default=5, help="(default: %(default)s)")
    bench.add_argument("--engines", default="torch,llama.cpp",
                       help="comma-separated engines to compare (default: %(default)s)")
    bench.add_argument("--concurrency", default=None, metavar="N[,N...]",
                       help="also serve N concurrent requests (64 tokens each): the runtime "
                            "batching them on each executor, and llama.cpp one after "
                            "another, e.g. 1,4,16")
    bench.add_argument("--json", action="store_true", help="print JSON")

    serve = sub.add_parser("serve", parents=[model],
                           help="OpenAI-compatible HTTP server on this machine",
                           description="Serve -m over an OpenAI-compatible API "
                                       "(/v1/chat/completions, /v1/completions, /v1/models, "
                                       "/health). Binds 127.0.0.1 unless told otherwise; any "
                                       "other address needs --api-key.")
    serve.add_argument("--host", default="127.0.0.1", help="(default: %(default)s)")
    serve.add_argument("--port", type=int, default=8080, help="(default: %(default)s)")
    serve.add_argument("--api-key", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' (default: $LOCALCHAT_API_KEY)")
    serve.add_argument("--max-queue", type=int, default=64, metavar="N",
                       help="requests admitted at once; more get 503 (default: %(default)s)")
    serve.add_argument("--quiet", action="store_true",
                       help="no line per request on stderr (method, path, status, tokens, "
                            "seconds)")

    plan = sub.add_parser("plan", help="how much context, for how many users, fits in memory",
                          description="Memory plan from a model's metadata: weights, KV per "
                                      "token, and the context and users a budget allows.")
    plan.add_argument("-m", "--model", default="default", metavar="SPEC")
    plan.add_argument("--memory", default=None, metavar="SIZE[,SIZE...]",
                      help="memory budgets, e.g. 8GB or 8GB,16GB (default: this machine's RAM)")
    plan.add_argument("-c", "--ctx-size", type=int, default=None, metavar="N",
                      help="context per user (default: 4096)")
    plan.add_argument("--json", action="store_true", help="print JSON")

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
    evaluate.add_argument("--reference", default=None, metavar="SPEC",
                          help="compare -m against this model (run as float32)")
    evaluate.add_argument("--positions", type=int, default=1100, metavar="N",
                          help="--agreement: teacher-forced positions (default: %(default)s)")
    evaluate.add_argument("--no-float32", action="store_true",
                          help="--agreement: skip the float32 reference copy of a quantized file")
    quality_flags(evaluate)
    evaluate.add_argument("--threads", type=int, default=None, metavar="N")
    evaluate.add_argument("--json", action="store_true", help="print JSON")

    quant = sub.add_parser("quantize", help="convert a model to another type",
                           description="SRC (a GGUF of any type, or a Hugging Face directory) "
                                       "-> OUT: a GGUF (F32 ... Q4_K_M) or a safetensors "
                                       "directory (nf4, int8, int4). Written atomically.")
    quant.add_argument("src", metavar="SRC", help="model SPEC: 'default', a .gguf, an HF directory")
    quant.add_argument("-o", "--output", required=True, metavar="OUT")
    quant.add_argument("--type", required=True, metavar="TYPE",
                       help="F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 (gguf-py), Q2_K Q3_K_S/M/L "
                            "Q4_K_S/M Q5_K_S/M Q6_K (llama.cpp), nf4 int8 int4 (safetensors)")
    quant.add_argument("--method", default="rtn", choices=["rtn", "gptq"])
    quant.add_argument("--group-size", type=int, default=None, metavar="N",
                       help="int4: weights per scale, 32/64/128/256 (default 128)")
    quant.add_argument("--double-quant", action="store_true", help="nf4: quantize the absmax too")
    quant.add_argument("--calibration", default=None, metavar="FILE", help="gptq: calibration text")
    quant.add_argument("--force", action="store_true", help="replace an existing OUT file")
    quant.add_argument("--report", action="store_true",
                       help="then measure OUT against SRC (as `localchat eval --reference`)")
    quality_flags(quant)
    quant.add_argument("--threads", type=int, default=None, metavar="N")
    quant.add_argument("--json", action="store_true", help="--report as JSON")

    models = sub.add_parser("models", help="list models available locally")
    models.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run" and args.batch is not None:
        from localchat.cli.batch import cmd_batch

        return cmd_batch(args)
    if args.command == "run":
        from localchat.cli.run import cmd_run

        return cmd_run(args)
    if args.command == "serve":
        from localchat.server import cmd_serve

        return cmd_serve(args)
    if args.command == "bench":
        from localchat.cli.bench import cmd_bench

        return cmd_bench(args)
    if args.command == "plan":
        from localchat.cli.plan import cmd_plan

        return cmd_plan(args)
    if args.command == "eval":
        from quantize.commands import cmd_eval

        return cmd_eval(args)
    if args.command == "quantize":
        from quantize.commands import cmd_quantize

        return cmd_quantize(args)
    if args.command == "pull":
        from localchat.cli.models import cmd_pull

        return cmd_pull(args.spec)
    if args.command == "models":
        from localchat.cli.models import cmd_models

        return cmd_models(as_json=args.json)
    from localchat.tui.app import run_tui

    return run_tui(args)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, except that a flag the subcommand does not know is reported by the
    subcommand's parser (naming `localchat run --help`, not the top-level help)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        culprit = subparsers.choices.get(getattr(args, "command", None) or "", parser)
        culprit.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        return _dispatch(args)
    except LocalchatError as exc:
        print(f"localchat: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 141
