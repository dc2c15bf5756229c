"""RemoteEngine: any OpenAI-compatible server behind the engine interface (the endpoint setting).
Its stats are what a client can see (TTFT at the first chunk, rates from chunks or the usage
record); the KV cache fields stay 0."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from typing import Iterator, Sequence

from localchat.engine.base import Delta, Engine, Event, Message, ModelInfo, Request, Result, Stats
from localchat.engine.remote_http import (ConnectionLost, server_message, split_endpoint,
                                          status_error, stream_error, transport_errors)
from localchat.engine.sse import BackgroundStream, Cancelled, sse_data
from localchat.errors import ConfigError, EngineError, ModelNotFoundError, UsageError
from localchat.models.facts import DEFAULT_CTX
from localchat.prompt.tool_calls import has_tool_turns
from localchat.sampling_fields import SAMPLING_PARAMS

CONNECT_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 60.0  # timeout: the longest wait for any answer (first byte, next chunk)
# count_prompt_tokens: chat-template tokens around each message and before the reply
# (ChatML and Llama 3 both spend about this much), and, without a tokenize endpoint,
# a deliberately high estimate of the content's tokens so history is dropped early
# rather than overflowing.
TEMPLATE_TOKENS_PER_MESSAGE = 5
TEMPLATE_TOKENS_FOR_REPLY = 3
CHARS_PER_TOKEN_ESTIMATE = 3
# Sampling parameters that llama.cpp-family servers, vLLM and Ollama take but OpenAI's
# own API refuses: sent unless the server refused them once.
_EXTENSIONS = tuple(f.name for f in SAMPLING_PARAMS if not f.openai)
_FINISH = {"stop": "stop", "length": "length"}  # anything else (tool_calls, ...) -> stop


class RemoteEngine(Engine):
    name = "remote"

    def __init__(self, endpoint: str, *, model: str | None = None, api_key: str | None = None,
                 ctx_size: int | None = None, timeout: float | None = None) -> None:
        import httpx2

        if ctx_size is not None and ctx_size < 0:
            raise ConfigError("ctx_size", f"must be >= 0, got {ctx_size}")
        self._timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
        if not (math.isfinite(self._timeout) and self._timeout > 0):
            raise ConfigError("timeout", f"must be a number of seconds > 0, got {timeout}")
        self.base, self.root = split_endpoint(endpoint)
        key = api_key if api_key is not None else os.environ.get("LOCALCHAT_API_KEY")
        self._has_key = bool(key)
        self._client = httpx2.Client(
            headers={"Authorization": f"Bearer {key}"} if key else {},
            timeout=httpx2.Timeout(self._timeout, connect=min(CONNECT_TIMEOUT_S, self._timeout)),
            limits=httpx2.Limits(max_connections=64, max_keepalive_connections=32),
        )
        self._send_extensions = True
        # (URL, text field) of the tokenize endpoint: both candidates until one answers
        self._tokenize_routes = [(f"{self.root}/extras/tokenize", "input"),  # llama-cpp-python
                                 (f"{self.root}/tokenize", "content")]  # llama.cpp's server
        try:
            card = self._model_card(model)
            meta = card.get("meta") if isinstance(card.get("meta"), dict) else {}
            self.model = card["id"]
            n_ctx_server = self._server_context(card)
        except BaseException:
            self._client.close()
            raise
        n_ctx = ctx_size or n_ctx_server or DEFAULT_CTX  # neither ctx_size nor the server says
        name = self.model.rsplit("/", 1)[-1] if self.model.startswith("/") else self.model
        self.info = ModelInfo(
            name=name, path=self.base, architecture="remote", quant_type="remote",
            file_size=0, n_ctx_train=_int(meta.get("n_ctx_train")) or n_ctx,
            n_ctx=n_ctx, n_layers=0, n_kv_heads=0, head_dim=0, kv_bytes_per_token=0,
            chat_template="the server's",
        )

    # --- setup -----------------------------------------------------------------------

    def _get_json(self, url: str, what: str) -> dict:
        with transport_errors(self.base, self._timeout):
            response = self._client.get(url)
        if response.status_code >= 400:
            raise status_error(response.status_code, response.content, base=self.base,
                               what=what, has_key=self._has_key)
        try:
            return response.json()
        except ValueError:
            raise EngineError(f"{url} did not answer with JSON: is this an OpenAI-compatible "
                              "server?") from None

    def _model_card(self, model: str | None) -> dict:
        """The entry of GET /models for MODEL (None: the server's first model)."""
        listing = self._get_json(f"{self.base}/models", "models")
        cards = [c for c in listing.get("data", []) if isinstance(c, dict) and "id" in c]
        if model is None:
            if not cards:
                raise ModelNotFoundError(f"{self.base} serves no models (GET /models is empty)")
            return cards[0]
        for card in cards:
            if card["id"] == model:
                return card
        names = ", ".join(c["id"] for c in cards) or "none"
        raise ModelNotFoundError(f"{self.base} has no model {model!r} (it serves: {names})")

    def _server_context(self, card: dict) -> int:
        """The context the server runs with, where it says: localchat serve's meta.n_ctx
        or vLLM's max_model_len in the model card, llama.cpp's /props; llama-cpp-python
        reports none."""
        meta = card.get("meta") if isinstance(card.get("meta"), dict) else {}
        found = _int(meta.get("n_ctx")) or _int(card.get("max_model_len"))
        if found:
            return found
        try:
            with transport_errors(self.base, self._timeout):
                response = self._client.get(f"{self.root}/props")
            props = response.json() if response.status_code == 200 else {}
        except (ValueError, EngineError):
            return 0
        settings = props.get("default_generation_settings", {}) if isinstance(props, dict) else {}
        return _int(settings.get("n_ctx")) or _int(props.get("n_ctx") if props else None)

    # --- generation ------------------------------------------------------------------

    def _body(self, request: Request, *, stream: bool) -> tuple[str, dict]:
        s = request.sampling
        body: dict = {"model": self.model, "stream": stream, "temperature": s.temperature,
                      "top_p": s.top_p}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self._send_extensions:
            body.update({name: getattr(s, name) for name in _EXTENSIONS})
        if s.seed is not None:
            body["seed"] = s.seed
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.stop:
            body["stop"] = list(request.stop)
        if request.constraint is not None:
            body.update(_constraint_fields(request.constraint))
        if request.prompt_tokens is not None:
            return "/completions", {**body, "prompt": list(request.prompt_tokens)}
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        return "/chat/completions", {**body, "messages": messages}

    def _post(self, request: Request, *, stream: bool, stopped=None):
        """POST the request; one retry without the sampling extensions if refused for
        them. Yields SSE data strings (stream) or the one JSON body."""
        for _ in range(2):
            route, body = self._body(request, stream=stream)
            with transport_errors(self.base, self._timeout), self._client.stream(
                    "POST", self.base + route, json=body) as response:
                if response.status_code >= 400:
                    content = response.read()
                    message, _ = server_message(content)
                    if (response.status_code in (400, 422) and self._send_extensions
                            and _refuses_extensions(message)):
                        self._send_extensions = False
                        continue
                    raise status_error(response.status_code, content, base=self.base,
                                       what="generate", has_key=self._has_key)
                if not stream:
                    yield response.read().decode("utf-8", "replace")
                    return
                for data in sse_data(response.iter_lines()):
                    yield data
                    if stopped is not None and stopped.is_set():
                        return  # leaving the with-block closes the connection
                return

    def generate(self, request: Request, cancel: threading.Event | None = None) -> Iterator[Event]:
        if request.assistant_prefix:
            # Most servers (llama-cpp-python, localchat serve) answer a final assistant
            # message with a new reply rather than continuing it: refuse, not garble.
            raise UsageError("continuing a stopped reply is not supported with a remote endpoint: "
                             "the server would start a new reply instead")
        if request.tools or has_tool_turns(request.messages):
            raise UsageError("tools are not supported with a remote endpoint yet")
        cancel = cancel or threading.Event()
        start = time.perf_counter()
        stream = BackgroundStream(lambda stopped: self._post(request, stream=True,
                                                             stopped=stopped))
        pieces: list[str] = []
        times: list[float] = []
        usage: dict = {}
        finish = None
        done = False

        def stats(final: bool = False) -> Stats:
            return self._stats(request, start, times, usage, final=final)

        try:
            while True:
                try:
                    data = stream.next_item(cancel)
                except Cancelled:
                    yield Result("".join(pieces), "cancelled", stats())
                    return
                except ConnectionLost:
                    if not times:  # llama-cpp-python drops a refused stream: learn why
                        self._explain_empty_stream(request)
                    raise
                if data is None:
                    break
                if data.strip() == "[DONE]":
                    done = True
                    break
                chunk = _parse_chunk(data, self.base)
                if "error" in chunk:
                    raise stream_error(chunk, base=self.base)
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content") or choice.get("text")
                    if text:
                        times.append(time.perf_counter())
                        pieces.append(text)
                        yield Delta(text, (), stats())
                    finish = choice.get("finish_reason") or finish
        finally:
            stream.close()
        if finish is None and not done:
            if not times:
                self._explain_empty_stream(request)
            raise EngineError(f"the connection to {self.base} closed mid-reply")
        yield Result("".join(pieces), _FINISH.get(finish or "stop", "stop"), stats(final=True))

    def _explain_empty_stream(self, request: Request) -> None:
        """Re-send a stream that broke before any text, not streaming and for one token,
        so that the server's refusal (e.g. the prompt does not fit) comes as a status
        code; returns when the server accepts it (the caller then raises its own error)."""
        from dataclasses import replace

        for attempt in range(2):  # the first may meet the connection the server just dropped
            try:
                for _ in self._post(replace(request, max_tokens=1), stream=False):
                    pass
                return
            except EngineError:
                if attempt:
                    raise

    def _stats(self, request: Request, start: float, times: list[float], usage: dict, *,
               final: bool) -> Stats:
        now = time.perf_counter()
        completion = _int(usage.get("completion_tokens")) or len(times)
        prompt = _int(usage.get("prompt_tokens"))
        if not prompt and final:
            prompt = (len(request.prompt_tokens) if request.prompt_tokens is not None
                      else self.count_prompt_tokens(request.messages))
        ttft = times[0] - start if times else 0.0
        decode_s = times[-1] - times[0] if len(times) > 1 else 0.0
        return Stats(
            prompt_tokens=prompt,
            cached_tokens=_int((usage.get("prompt_tokens_details") or {}).get("cached_tokens")),
            completion_tokens=completion, ttft_s=ttft,
            prefill_tok_s=prompt / ttft if prompt and ttft > 0 else 0.0,
            decode_tok_s=(completion - 1) / decode_s if decode_s > 0 else 0.0,
            elapsed_s=now - start,
            context_tokens=prompt + completion if prompt else 0,
            context_capacity=self.info.n_ctx,
        )

    # --- token counting --------------------------------------------------------------

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        """The server's tokenizer on the messages' text (llama-cpp-python's
        /extras/tokenize, llama.cpp's /tokenize) plus the template's tokens per message;
        without such an endpoint, one token per CHARS_PER_TOKEN_ESTIMATE characters."""
        text = "\n".join(m.content for m in messages)
        template = TEMPLATE_TOKENS_PER_MESSAGE * len(messages) + TEMPLATE_TOKENS_FOR_REPLY
        counted = self._tokenize(text)
        if counted is None:
            counted = math.ceil(len(text) / CHARS_PER_TOKEN_ESTIMATE)
        return counted + template

    def _tokenize(self, text: str) -> int | None:
        """Tokens of TEXT by the server's tokenizer; None where it has no endpoint for it."""
        for url, field in self._tokenize_routes:
            try:
                with transport_errors(self.base, self._timeout):
                    response = self._client.post(url, json={field: text, "model": self.model},
                                                 timeout=min(CONNECT_TIMEOUT_S, self._timeout))
                tokens = response.json().get("tokens") if response.status_code == 200 else None
            except (ValueError, AttributeError, EngineError, UsageError):
                tokens = None
            if isinstance(tokens, list):
                self._tokenize_routes = [(url, field)]
                return len(tokens)
        if len(self._tokenize_routes) > 1:
            self._tokenize_routes = []  # the server has none: estimate from now on
        return None

    def close(self) -> None:
        self._client.close()


def _parse_chunk(data: str, base: str) -> dict:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise EngineError(f"{base} sent an event that is not JSON: {data[:80]!r}") from None
    if not isinstance(chunk, dict):
        raise EngineError(f"{base} sent an unexpected event: {data[:80]!r}")
    return chunk


def _refuses_extensions(message: str) -> bool:
    """'Unrecognized request argument supplied: top_k' (OpenAI) and the like; not a
    complaint about a value (those cannot happen: SamplingParams checked them)."""
    lowered = message.lower()
    return any(name in message for name in _EXTENSIONS) and any(
        word in lowered for word in ("unrecognized", "unknown", "extra", "not permitted",
                                     "unexpected", "not supported"))


def _int(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _constraint_fields(constraint) -> dict:
    """A constraint as OpenAI's response_format; a grammar is refused (OpenAI servers
    take none, and a field they ignored would be silently dropped)."""
    if constraint.kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if constraint.kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": "reply", "schema": json.loads(constraint.text), "strict": True}}}
    raise UsageError(f"a {constraint.label} needs a local model; a remote endpoint takes "
                     "JSON schemas only")
