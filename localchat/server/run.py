"""Running the server: the engine loaded, uvicorn on the bound socket, a clean stop. On SIGTERM
or Ctrl+C running requests are cancelled, workers joined and the engine closed; Ctrl+C then
exits 130, SIGTERM 0."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path

import uvicorn

from dataclasses import replace

from localchat.engine import choose, open_engine
from localchat.engine.choice import LoadPlan
from localchat.engine.config import EngineConfig
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


def serving_plan(config: EngineConfig, max_queue: int) -> tuple[LoadPlan, str]:
    """The plan for many streams, llama.cpp's default slots no more than the queue admits,
    and why this engine (and slots) for the start-up line."""
    plan = choose(replace(config, use="many"))
    if plan.engine == "remote":
        return plan, ""
    why = plan.why
    if plan.engine == "llama.cpp" and config.parallel is None:
        slots = min(plan.spec.parallel, max_queue)
        plan = replace(plan, spec=replace(plan.spec, parallel=slots))
        why += f"; {slots} KV slots"
    return plan, why


def _first_torch_start() -> bool:
    """No compiled layers are in the cache dir yet: this start compiles them."""
    from localchat.paths import cache_dir

    return not any((cache_dir() / "aot").glob("decode-layer-*.pt2"))


def serve(options, config: EngineConfig, sock: socket.socket, *, loopback: bool,
          api_key: str | None) -> int:
    """options: ServeOptions (server/__init__.py). The engine and llama.cpp slots the flags
    leave unset are chosen for many streams (engine/choice.py), said in the start-up line."""
    plan, why = serving_plan(config, options.max_queue)
    if plan.engine == "torch" and _first_torch_start():  # say why this one waits
        print("localchat: loading on torch (the first start on a machine compiles its layers "
              "for this CPU: 1-2 min; later starts take seconds)", file=sys.stderr, flush=True)
    for note in plan.notes:
        print(f"localchat: note: {note}", file=sys.stderr, flush=True)
    engine = open_engine(config, plan)
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
              f"(engine {engine.name})" + (f", {why}" if why else ""),
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
