"""Command line: `localchat` opens the chat TUI, each subcommand lives in its own module, and
this one builds the parser and dispatches. A LocalchatError is one line on stderr and a
non-zero exit code."""

from __future__ import annotations

import argparse
import sys

from localchat import __version__
from localchat.cli import bench, cache, distill, mcp, models, plan, run, serve
from localchat.cli import eval as eval_command
from localchat.cli import quantize as quantize_command
from localchat.cli.flags import endpoint_flags, flag_error, model_flags, sampling_flags
from localchat.cli.process_exit import exit_now
from localchat.errors import ConfigError, LocalchatError


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
    parser.add_argument("--mcp", default=None, metavar="FILE",
                        help="the MCP servers whose tools the chat offers the model (the "
                             "mcpServers shape Claude Desktop reads; default: mcp.json in the "
                             "data dir, where there is one); each call asks first")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_parser(sub, model, endpoint, sampling)
    models.add_pull_parser(sub)
    bench.add_parser(sub, model)
    serve.add_parser(sub, model)
    plan.add_parser(sub)
    eval_command.add_parser(sub)
    quantize_command.add_parser(sub)
    distill.add_parser(sub)
    models.add_models_parser(sub)
    cache.add_parser(sub)
    mcp.add_parser(sub)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    """The subcommand's own handler (set by its module's add_parser), else the chat TUI."""
    handler = getattr(args, "handler", None)
    if handler is not None:
        return handler(args)
    from localchat.cli.flags import engine_config, reply_params, with_parallel
    from localchat.tui.app import run_tui

    # two KV slots: the chat, and the one before it stays cached when you switch back
    return run_tui(with_parallel(engine_config(args), 2), reply_params(args),
                   continue_last=args.continue_last, mcp=args.mcp)


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
        try:
            return _dispatch(args)
        except ConfigError as exc:  # a setting's error, said with the flag that sets it
            raise flag_error(exc) from None
    except LocalchatError as exc:
        print(f"localchat: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 141


def entry() -> None:
    """The `localchat` command: main(), then a quick exit (process_exit.py)."""
    exit_now(main())
