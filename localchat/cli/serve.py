"""`localchat serve`'s flags; the server itself is localchat/server/ (cmd_serve)."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def add_parser(sub, model: argparse.ArgumentParser) -> None:
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
    serve.add_argument("--verbose", action="store_true",
                       help="name what computes at start-up (llama.cpp's CPU variant and its "
                            "instruction sets, or the torch kernels')")
    serve.set_defaults(handler=run_server)


def run_server(args: argparse.Namespace) -> int:
    """Serve until stopped. Once it has stopped (requests ended, engine closed, socket and
    state file gone) the process exits at once: the interpreter's teardown of torch alone
    takes 1-2 s, which Ctrl+C on an idle server should not wait for."""
    from localchat.cli.flags import engine_config
    from localchat.server import ServeOptions, cmd_serve  # the ASGI stack loads only later

    options = ServeOptions(host=args.host, port=args.port, api_key=args.api_key,
                           max_queue=args.max_queue, quiet=args.quiet, verbose=args.verbose)
    try:
        code = cmd_serve(options, engine_config(args))
    except KeyboardInterrupt:  # Ctrl+C, re-raised by uvicorn after a clean stop
        print(file=sys.stderr)
        code = 130
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
