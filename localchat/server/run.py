"""Running the server: the engine loaded, uvicorn on the bound socket, a clean stop. On SIGTERM
or Ctrl+C running requests are cancelled, workers joined and the engine closed; Ctrl+C then
exits 130, SIGTERM 0."""

from __future__ import annotations

import signal
import socket
import sys

import uvicorn

from localchat.engine import open_engine
from localchat.engine.config import EngineConfig
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


def serve(options, config: EngineConfig, sock: socket.socket, *, loopback: bool,
          api_key: str | None) -> int:
    """options: ServeOptions (server/__init__.py)."""
    engine = open_engine(config)
    server = Server(engine, max_queue=options.max_queue)
    try:
        app = server.build(loopback=loopback, api_key=api_key, log_requests=not options.quiet)
        config = uvicorn.Config(app,
                                log_level="warning", access_log=False, lifespan="on",
                                server_header=False,
                                limit_concurrency=options.max_queue + EXTRA_CONNECTIONS,
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
