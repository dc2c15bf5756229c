"""`localchat serve`: an OpenAI-compatible HTTP server on the engine interface. It binds
127.0.0.1 by default (a non-loopback address needs --api-key), and before the model loads,
so a port in use fails at once."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

from localchat.engine.config import EngineConfig
from localchat.errors import LocalchatError, UsageError

API_KEY_ENV = "LOCALCHAT_API_KEY"


@dataclass(frozen=True)
class ServeOptions:
    """How the server listens: the address, its API key (None: $LOCALCHAT_API_KEY, else
    none), how many requests it admits at once, whether it logs each request, and whether
    its start-up names what computes (verbose)."""

    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    max_queue: int = 64
    quiet: bool = False
    verbose: bool = False


def cmd_serve(options: ServeOptions, config: EngineConfig) -> int:
    """Bind, load config's engine, serve until stopped; the exit code."""
    api_key = options.api_key if options.api_key is not None \
        else (os.environ.get(API_KEY_ENV) or None)
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key must not be empty")
    if options.max_queue < 1:
        raise UsageError(f"--max-queue must be >= 1, got {options.max_queue}")
    if not 0 <= options.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {options.port}")
    family, address, loopback = resolve_host(options.host, options.port)
    if not loopback and api_key is None:
        raise UsageError(f"{options.host} is reachable from other machines: serving it needs "
                         f"--api-key KEY (or ${API_KEY_ENV}); or bind 127.0.0.1")
    sock = bind(family, address, options.host)
    try:
        from localchat.server.run import serve  # uvicorn and the engines: only now

        return serve(options, config, sock, loopback=loopback, api_key=api_key)
    finally:
        sock.close()


def resolve_host(host: str, port: int) -> tuple[int, tuple, bool]:
    """The address --host names, and whether it is loopback only."""
    from localchat.server.security import is_loopback

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    return family, address, is_loopback(address[0])


def bind(family: int, address: tuple, host: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    # SO_REUSEADDR (not SO_REUSEPORT): a port another server listens on is still refused
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # connections made while the model loads wait in the backlog
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise LocalchatError(f"port {address[1]} on {host} is already in use "
                                 "(pick another with --port, or --port 0 for any free one)"
                                 ) from None
        raise LocalchatError(f"cannot listen on {host} port {address[1]}: {exc.strerror}") from None
    return sock
