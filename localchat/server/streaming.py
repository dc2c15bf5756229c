"""A streamed completion: SSE chunks from a running job, ending with `data: [DONE]`. However it
ends (a client disconnecting too) its job is cancelled; a server stop ends it with an error
event, never "cancelled"."""

from __future__ import annotations

import logging
from typing import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from localchat.engine.base import Delta, Event, Result
from localchat.server.access_log import note_usage
from localchat.server.errors import internal_error
from localchat.server.jobs import Job, shutting_down
from localchat.server.responses import SSE_DONE, SSE_HEADERS, Reply, sse
from localchat.server.tool_replies import ToolStream

log = logging.getLogger("localchat.server")


class JobStream(StreamingResponse):
    """text/event-stream of one job; the job is cancelled when the response ends."""

    def __init__(self, job: Job, reply: Reply, first: Event, include_usage: bool) -> None:
        self.scope: Scope = {}
        super().__init__(_chunks(self, job, reply, first, include_usage),
                         media_type="text/event-stream", headers=SSE_HEADERS)
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope  # _chunks notes the tokens sent in it, for the access log
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel.set()  # no effect on a job that has finished
            await self.body_iterator.aclose()


async def _chunks(stream: JobStream, job: Job, reply: Reply, first: Event,
                  include_usage: bool) -> AsyncIterator[bytes]:
    if reply.chat:
        yield sse(reply.chunk(role=True))
    tools = ToolStream(reply.tools) if reply.tools is not None else None
    event: Event | None = first
    while event is not None:
        note_usage(stream.scope, event.stats, finished=isinstance(event, Result))
        if isinstance(event, Result):
            if event.finish_reason == "cancelled" and job.jobs.closing:
                yield sse(shutting_down().body())  # cut short: no finish, no [DONE]
                return
            called = False
            if tools is not None:
                rest, deltas, called = tools.finish()
                for chunk in reply.pieces(rest, deltas):
                    yield sse(chunk)
            yield sse(reply.chunk(finish=event, called=called))
            if include_usage:
                yield sse(reply.usage_chunk(event))
            yield SSE_DONE
            return
        if isinstance(event, Delta) and event.text:
            text, deltas = tools.feed(event.text) if tools is not None else (event.text, [])
            for chunk in reply.pieces(text, deltas):
                yield sse(chunk)
        try:
            event = await job.next()
        except Exception:  # the headers are sent: the error goes in the stream
            log.exception("generation failed mid-stream")
            yield sse(internal_error().body())
            return
