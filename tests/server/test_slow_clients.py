"""Idle and slow sockets against a real `localchat serve` (issue 39 #10): 130 of them, idle or
stopped mid-headers, once made every request, /health included, a 503, and none was closed.
Now they are closed by read deadlines and never count against the requests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx2
import pytest

from localchat.server.connections import BODY_IDLE_S, HEADER_TIMEOUT_S
from helpers.server import ServerProcess

pytestmark = pytest.mark.subprocess  # runs the CLI or starts a process

WAIT_FOR_CLOSE_S = 3 * max(HEADER_TIMEOUT_S, BODY_IDLE_S)  # a bound on the test, not a threshold


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    proc = ServerProcess(["-m", "default", "--engine", "llama.cpp", "-c", "256", "--threads", "1",
                          "--max-queue", "2"],
                         tmp_path_factory.mktemp("slow-clients"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module", autouse=True)
def stalled_body(server: ServerProcess) -> Iterator[socket.socket]:
    """A request whose body stops coming, sent as the module starts: the server's wait for
    it (BODY_IDLE_S) runs while the first test waits for its own sockets to be closed."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
        yield sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Read until the server closes the socket (True) or the wait runs out (False)."""
    sock.settimeout(WAIT_FOR_CLOSE_S)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_and_half_sent_sockets_neither_block_health_nor_stay_open(server: ServerProcess) -> None:
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(130)]
    try:
        for sock in socks[::2]:  # every other one stops in the middle of its headers
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        response = httpx2.get(server.url + "/health", timeout=30)
        assert response.status_code == 200, response.text
        assert _closed_by_server(socks[0]) and _closed_by_server(socks[1])
        assert all(_closed_by_server(sock) for sock in socks)
    finally:
        for sock in socks:
            sock.close()


def test_a_body_that_stops_coming_is_dropped(server: ServerProcess, stalled_body: socket.socket) -> None:
    assert _closed_by_server(stalled_body)
    response = httpx2.get(server.url + "/health", timeout=30)
    assert response.status_code == 200


def _answer(server: ServerProcess, raw: bytes) -> bytes:
    """Everything the server sends back to one raw request, until it closes."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(raw)
        sock.settimeout(WAIT_FOR_CLOSE_S)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return data


BODY = b'{"prompt": "Hi", "max_tokens": 2}'
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def test_chunked_and_content_length_together_are_a_400(server: ServerProcess) -> None:
    """RFC 9112 6.3: a request with both may be smuggling another; it was accepted."""
    answer = _answer(server, HEAD + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
                     + b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert b"connection: close" in answer.lower()


def test_a_chunk_larger_than_any_body_is_a_400(server: ServerProcess) -> None:
    """A 2^64-1 byte chunk closed the connection with no response at all."""
    answer = _answer(server, HEAD + b"Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n" + BODY)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
