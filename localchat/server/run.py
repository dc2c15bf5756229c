"""Running the server: the engine loaded, uvicorn on the bound socket, a clean stop. On SIGTERM
or Ctrl+C running requests are cancelled, workers joined and the engine closed; Ctrl+C then
exits 130, SIGTERM 0."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import uvicorn

from localchat.engine import open_engine
from localchat.engine.config import EngineConfig
from localchat.engine.serving import serving_config
from localchat.server import instances
from localchat.server.app import Server
from localchat.server.connections import TimedH11Protocol

GRACEFUL_SHUTDOWN_S = 5  # for responses still being sent after their jobs are cancelled
JOIN_WORKERS_S = 10.0


class Uvicorn(uvicorn.Server):
    """uvicorn's server, telling ours when a stop signal arrives."""

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.server = server

    def handle_exit(self, sig: int, frame) -> None:
        if not self.should_exit:  # the first signal: say what is being stopped
            print(f"localchat: stopping ({self.server.jobs.in_flight()} requests in flight)",
                  file=sys.stderr, flush=True)
        super().handle_exit(sig, frame)
        self.server.stop_soon()


def _first_torch_start() -> bool:
    """No compiled layers are in the cache dir yet: this start compiles them."""
    from localchat.paths import cache_dir

    return not any((cache_dir() / "aot").glob("decode-layer-*.pt2"))


def serve(options, config: EngineConfig, sock: socket.socket, *, loopback: bool,
          api_key: str | None) -> int:
    """options: ServeOptions (server/__init__.py). The engine and llama.cpp slots the flags
    leave unset are serve's defaults (engine/serving.py), said in the start-up line."""
    choice = serving_config(config, options.max_queue)
    if choice.config.engine == "torch" and _first_torch_start():  # say why this one waits
        print("localchat: loading on torch (the first start on a machine compiles its layers "
              "for this CPU: 1-2 min; later starts take seconds)", file=sys.stderr, flush=True)
    engine = open_engine(choice.config)
    path = Path(engine.info.path)
    server = Server(engine, max_queue=options.max_queue,
                    aliases=tuple(str(a) for a in (config.model, path.name, path.stem) if a))
    try:
        app = server.build(loopback=loopback, api_key=api_key, log_requests=not options.quiet)
        config = uvicorn.Config(app,
                                log_level="warning", access_log=False, lifespan="on",
                                server_header=False,
                                # idle and slow sockets are closed by read deadlines, not
                                # counted against requests (uvicorn's limit_concurrency)
                                http=TimedH11Protocol,
                                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        print(f"localchat: serving {engine.info.name} on http://{shown}:{port}/v1 "
              f"(engine {engine.name})" + (f", {choice.why}" if choice.why else ""),
              file=sys.stderr, flush=True)
        if options.verbose and engine.info.compute:
            print(f"localchat: compute: {engine.info.compute}", file=sys.stderr, flush=True)
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        state = instances.register(f"http://{shown}:{port}/v1", engine.info.name,
                                   str(engine.info.path), engine.name, engine.info.n_ctx)
        try:
            Uvicorn(config, server).run(sockets=[sock])
        finally:
            instances.unregister(state)
            signal.signal(signal.SIGTERM, previous)
    finally:
        server.jobs.cancel_all()
        server.jobs.join(JOIN_WORKERS_S)
        engine.close()
    return 0
