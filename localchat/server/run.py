"""Running the server: the engine loaded, uvicorn on the bound socket, a clean stop. On SIGTERM
or Ctrl+C running requests are cancelled, workers joined and the engine closed; Ctrl+C then
exits 130, SIGTERM 0."""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from pathlib import Path

import uvicorn

from localchat.server.app import Server

GRACEFUL_SHUTDOWN_S = 5  # for responses still being sent after their jobs are cancelled
JOIN_WORKERS_S = 10.0
# Connections beyond the admitted requests (health probes, requests being refused):
# past this, uvicorn itself answers 503, so a flood of idle connections cannot pile up.
EXTRA_CONNECTIONS = 64


class Uvicorn(uvicorn.Server):
    """uvicorn's server, telling ours when a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.server = server

    def handle_exit(self, sig: int, frame) -> None:
        super().handle_exit(sig, frame)
        self.server.stop_soon()


def engine_settings(args: argparse.Namespace):
    """ChatSettings from the serve flags: the sampling flags it lacks (requests bring
    their own) take their defaults, and --api-key is this server's, not an endpoint's."""
    from localchat.cli.flags import sampling_defaults
    from localchat.settings import ChatSettings

    defaults = sampling_defaults()
    return ChatSettings.from_args(argparse.Namespace(
        **{**defaults, **vars(args), "endpoint": None, "api_key": None}))


def serve(args: argparse.Namespace, sock: socket.socket, *, loopback: bool,
          api_key: str | None) -> int:
    settings = engine_settings(args)
    engine = settings.load_engine()
    path = Path(engine.info.path)
    server = Server(engine, max_queue=args.max_queue,
                    aliases=tuple(str(a) for a in (settings.model, path.name, path.stem) if a))
    try:
        app = server.build(loopback=loopback, api_key=api_key,
                           log_requests=not getattr(args, "quiet", False))
        config = uvicorn.Config(app,
                                log_level="warning", access_log=False, lifespan="on",
                                server_header=False,
                                limit_concurrency=args.max_queue + EXTRA_CONNECTIONS,
                                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"localchat: serving {engine.info.name} on http://{shown}:{port}/v1 "
              f"(engine {engine.name})", file=sys.stderr, flush=True)
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        try:
            Uvicorn(config, server).run(sockets=[sock])
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        server.jobs.cancel_all()
        server.jobs.join(JOIN_WORKERS_S)
        engine.close()
    return 0
