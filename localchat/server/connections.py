"""uvicorn's h11 protocol with read deadlines, so idle or slow clients cannot hold the server:
a request's headers must arrive within HEADER_TIMEOUT_S of the connection (or of the previous
response), its body may pause at most BODY_IDLE_S between reads, and past MAX_CONNECTIONS open
sockets a new one is closed at once. Idle sockets never count against the request limit, so
/health stays answerable. Framing h11 lets through that RFC 9112 says to refuse (both
Transfer-Encoding and Content-Length; a chunk larger than any body the server reads) is
a 400, and the connection closes."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from localchat.server.security import MAX_BODY_BYTES

HEADER_TIMEOUT_S = 10.0
BODY_IDLE_S = 10.0
MAX_CONNECTIONS = 1024


class StrictConnection(h11.Connection):
    """h11's server side, refusing what request smuggling and memory attacks are made of:
    uvicorn answers the RemoteProtocolError with a 400 and closes the connection."""

    def next_event(self):
        event = super().next_event()
        if isinstance(event, h11.Request):
            names = {name.lower() for name, _ in event.headers}
            if b"transfer-encoding" in names and b"content-length" in names:
                raise h11.RemoteProtocolError("both Transfer-Encoding and Content-Length")
        if getattr(self._reader, "_bytes_in_chunk", 0) > MAX_BODY_BYTES:
            raise h11.RemoteProtocolError("a chunk larger than the largest body accepted")
        return event


class TimedH11Protocol(H11Protocol):
    """H11Protocol closing a connection whose client owes the server data for too long."""

    _read_deadline: asyncio.TimerHandle | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.conn = StrictConnection(h11.SERVER, self.conn._max_incomplete_event_size)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            transport.close()
            return
        self._arm(HEADER_TIMEOUT_S)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm(BODY_IDLE_S)  # each piece of the body restarts the wait
        elif state is h11.IDLE:
            if self._read_deadline is None:  # the next request on a kept-alive connection
                self._arm(HEADER_TIMEOUT_S)
        else:  # the request is in: the response may take as long as it takes
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timeout
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _too_slow(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()
