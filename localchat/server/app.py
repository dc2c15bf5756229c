"""The routes: /v1/chat/completions, /v1/completions, /v1/models and /health. A completion's
response waits for the engine's first event, so a prompt that does not fit is a plain 400."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from localchat.engine.base import Engine, Request as EngineRequest, Result
from localchat.errors import ConstraintError, ContextOverflowError, EngineError, LocalchatError
from localchat.server.access_log import AccessLog, note_usage
from localchat.server.errors import ApiError, internal_error
from localchat.server.jobs import Jobs, shutting_down
from localchat.server.responses import Reply
from localchat.server.schema import CompletionBody, parse_chat, parse_json, parse_text
from localchat.server.security import Guard, read_body
from localchat.server.streaming import JobStream

log = logging.getLogger("localchat.server")
SHUTDOWN_WAIT_S = 10.0  # for worker threads to stop after their requests are cancelled


class Server:
    """One engine served over HTTP; build() gives the ASGI app."""

    def __init__(self, engine: Engine, *, max_queue: int, aliases: tuple[str, ...] = ()) -> None:
        """aliases: other names a request's `model` may give the served one (the spec
        it was started with, its file's name)."""
        self.engine = engine
        self.model_names = {engine.info.name, *aliases}
        self.jobs = Jobs(engine, max_queue)
        self.started = int(time.time())
        self._loop: asyncio.AbstractEventLoop | None = None

    def build(self, *, loopback: bool, api_key: str | None, log_requests: bool = True) -> ASGIApp:
        """The routes behind the Host/Origin/key guard; log_requests: a line per request."""
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]
        app = Starlette(routes=routes, lifespan=self._lifespan, exception_handlers={
            ApiError: _api_error, HTTPException: _http_error, Exception: _server_error})
        guarded = Guard(app, loopback=loopback, api_key=api_key)
        return AccessLog(guarded) if log_requests else guarded

    def stop_soon(self) -> None:
        """From the signal handler: cancel every request (on the event loop, not inside
        whatever the handler interrupted), so streams end now, not at uvicorn's timeout."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.jobs.cancel_all)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        self._loop = asyncio.get_running_loop()
        yield
        self.jobs.cancel_all()  # requests still running at shutdown stop at the next token
        await anyio.to_thread.run_sync(self.jobs.join, SHUTDOWN_WAIT_S)

    # -- information ----------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        try:
            memory = {k: v for k, v in self.engine.memory().items()
                      if isinstance(v, (int, float))}
        except Exception:  # the engine is closing; health must still answer
            memory = {}
        return JSONResponse({"status": "stopping" if self.jobs.closing else "ok",
                             "model": self.engine.info.name,
                             "engine": self.engine.name, **self.jobs.counts(),
                             "memory": memory})

    def _model_card(self) -> dict:
        info = self.engine.info
        return {"id": info.name, "object": "model", "created": self.started,
                "owned_by": "localchat",
                "meta": {"engine": self.engine.name, "n_ctx": info.n_ctx,
                         "n_ctx_train": info.n_ctx_train, "architecture": info.architecture,
                         "quant_type": info.quant_type}}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        self._check_model(request.path_params["model_id"])
        return JSONResponse(self._model_card())

    def _check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise ApiError(404, f"the model {name[:200]!r} is not served here; GET /v1/models "
                                "lists the one served", param="model", code="model_not_found")

    # -- completions ----------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        body = parse_chat(parse_json(await read_body(request)), self.engine.info.n_ctx,
                          self.engine.info.tool_format)
        return await self._complete(request, body, chat=True)

    async def completions(self, request: Request) -> Response:
        body = parse_text(parse_json(await read_body(request)), self.engine.info.n_ctx)
        return await self._complete(request, body, chat=False)

    async def _complete(self, request: Request, body: CompletionBody, *, chat: bool) -> Response:
        self._check_model(body.model)
        job = self.jobs.admit()
        try:
            engine_request = await self._engine_request(body)
            job.start(engine_request)
        finally:
            job.release()  # only if it never started
        reply = Reply(chat, self.engine.info.name, body.tools)
        try:
            if body.stream:
                first = await job.next_or_disconnect(request.receive)
            else:
                first = await job.result(request.receive)
        except LocalchatError as exc:
            raise _engine_error(exc, self.engine.info.n_ctx, chat,
                                "tools" if body.tools is not None else "response_format") \
                from None
        if first is None:
            raise internal_error()
        if isinstance(first, Result) and first.finish_reason == "cancelled":
            if not self.jobs.closing:  # the client is gone (it reads nothing): log what it cost
                note_usage(request.scope, first.stats, finished=False)
            raise shutting_down()
        if not body.stream:
            note_usage(request.scope, first.stats)
            return JSONResponse(reply.body(first))
        return JobStream(job, reply, first, body.include_usage)

    async def _engine_request(self, body: CompletionBody) -> EngineRequest:
        if body.prompt is None:
            prompt_tokens = None
        else:  # tokenizing a long prompt takes a while: not on the event loop
            prompt_tokens = await anyio.to_thread.run_sync(self.engine.tokenize_text,
                                                           body.prompt)
            if not prompt_tokens:
                raise ApiError(400, "the prompt has no tokens", param="prompt")
        try:
            return EngineRequest(messages=body.messages, prompt_tokens=prompt_tokens,
                                 sampling=body.sampling, max_tokens=body.max_tokens,
                                 stop=body.stop, constraint=body.constraint,
                                 format_prompt=body.format_prompt,
                                 tools=body.tools.tools if body.tools is not None else ())
        except LocalchatError as exc:  # schema.py checks first; this is the engine's word
            raise ApiError(400, str(exc)) from None


def _engine_error(exc: LocalchatError, n_ctx: int, chat: bool,
                  constraint_param: str) -> ApiError:
    """An engine error as the client should see it; its own text only where it cannot
    hold a path (EngineError messages name files)."""
    param = "messages" if chat else "prompt"
    if isinstance(exc, ConstraintError):  # llguidance refused the schema or grammar
        return ApiError(400, str(exc), param=constraint_param, code="invalid_value")
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, f"the prompt does not fit in the context window ({n_ctx} "
                             "tokens)", param=param, code="context_length_exceeded")
    if isinstance(exc, EngineError):
        log.error("engine error: %s", exc)
        return internal_error()
    return ApiError(400, str(exc), param=param)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405, in the same error shape as everything else."""
    assert isinstance(exc, HTTPException)
    messages = {404: "no such route", 405: "method not allowed on this route"}
    error = ApiError(exc.status_code, messages.get(exc.status_code, "request refused"))
    response = error.response()
    response.headers.update(exc.headers or {})
    return response


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug: Starlette re-raises it afterwards, so uvicorn logs the traceback."""
    return internal_error().response()
