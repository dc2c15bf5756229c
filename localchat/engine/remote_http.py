"""HTTP for the remote engine: the endpoint URL, and every failure of an
OpenAI-compatible server turned into a one-line LocalchatError (never a traceback).
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from typing import Iterator
from urllib.parse import urlsplit

from localchat.errors import (ConfigError, ContextOverflowError, EngineError, LocalchatError,
                              ModelNotFoundError, UsageError)

# What servers say when the prompt does not fit: OpenAI and vLLM ("maximum context
# length"), llama-cpp-python (code context_length_exceeded), llama.cpp's server
# (exceed_context_size_error, "exceeds the available context size").
_CONTEXT_CODES = {"context_length_exceeded", "exceed_context_size_error"}
_CONTEXT_WORDS = re.compile(r"context (length|size|window)|too many tokens|prompt is too long",
                            re.IGNORECASE)


def split_endpoint(url: str) -> tuple[str, str]:
    """(API base ending in /v1, server root without it). A bare host gets /v1; a URL with
    another path (a gateway's /openai/v1-like base) is kept as given."""
    url = url.strip().rstrip("/")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as exc:
        raise ConfigError("endpoint", f"is not a valid URL ({exc}): {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError("endpoint", f"must be an http:// or https:// URL, got {url!r}")
    if not parts.path:
        url += "/v1"
    root = url[: -len("/v1")] if url.endswith("/v1") else url
    return url, root


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def server_message(body: bytes | str) -> tuple[str, str]:
    """(message, code or type) from an error body in any of the usual shapes."""
    try:
        obj = json.loads(body)
    except (ValueError, TypeError):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        return one_line(text) or "(no message)", ""
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail") or obj.get("detail") or err
            code = err.get("code") or err.get("type") or ""
            return one_line(message if isinstance(message, str) else json.dumps(message)), \
                str(code)
        if isinstance(err, str):
            return one_line(err), ""
    return one_line(json.dumps(obj)), ""


def status_error(status: int, body: bytes | str, *, base: str, what: str,
                 has_key: bool) -> LocalchatError:
    """The typed error for an HTTP error status from the server."""
    message, code = server_message(body)
    if status in (401, 403):
        hint = ("check the API key ($LOCALCHAT_API_KEY)" if has_key
                else "give its API key (or $LOCALCHAT_API_KEY)")
        return UsageError(f"{base} refused the request ({status} {message}): {hint}")
    if status == 404 and what == "models":
        return EngineError(f"no OpenAI-compatible API at {base} (GET /models: 404); "
                           "such URLs usually end in /v1")
    if status == 404:
        return ModelNotFoundError(f"{base}: {message} (404)")
    if status in (400, 413, 422) and (code in _CONTEXT_CODES or _CONTEXT_WORDS.search(message)):
        return ContextOverflowError(f"the server says the prompt does not fit: {message}")
    if status in (400, 422):
        return UsageError(f"{base} refused the request: {message}")
    if status in (429, 503):
        return EngineError(f"{base} is busy ({status}): {message}")
    return EngineError(f"{base} failed ({status}): {message}")


def stream_error(payload: dict, *, base: str) -> LocalchatError:
    """An error the server sent inside the event stream (llama.cpp's server, vLLM)."""
    message, code = server_message(json.dumps(payload))
    if code in _CONTEXT_CODES or _CONTEXT_WORDS.search(message):
        return ContextOverflowError(f"the server says the prompt does not fit: {message}")
    return EngineError(f"{base} failed mid-reply: {message}")


class ConnectionLost(EngineError):
    """The connection broke after it was made (the server dropped or reset it)."""


@contextmanager
def transport_errors(base: str, timeout: float) -> Iterator[None]:
    """Network failures as one-line EngineErrors; `timeout`: the timeout setting that ran out."""
    import httpx2

    try:
        yield
    except httpx2.UnsupportedProtocol as exc:
        raise ConfigError("endpoint", f"{base} is not a usable URL: {exc}") from None
    except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
        raise EngineError(f"cannot reach {base}: {one_line(exc) or 'connection failed'}") \
            from None
    except httpx2.TimeoutException:
        raise EngineError(f"{base} did not answer within {timeout:g} s "
                          "(raise the timeout for a slow or busy server)") from None
    except httpx2.HTTPError as exc:
        raise ConnectionLost(f"the connection to {base} broke: "
                          f"{one_line(exc) or type(exc).__name__}") from None
