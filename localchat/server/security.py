"""What stands between the network and the engine, checked before any route runs: loopback
Host names only (DNS rebinding), no cross-origin pages, JSON-only POSTs, the API key
(compared in constant time) and a body size limit."""

from __future__ import annotations

import hmac
import ipaddress
import re

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from localchat.server.errors import ApiError

MAX_BODY_BYTES = 1024 * 1024
OPEN_PATHS = {"/health"}  # no API key needed: liveness probes and the tests poll it


def is_loopback(address: str) -> bool:
    """An IP address (as the socket reports it) on this machine only."""
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


_LOOPBACK_HOST = re.compile(r"(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?", re.IGNORECASE)


def is_loopback_host(value: str) -> bool:
    """A Host header (or an origin's host[:port]) naming this machine's loopback."""
    return _LOOPBACK_HOST.fullmatch(value) is not None


def check_host(headers: dict[str, str]) -> None:
    if not is_loopback_host(headers.get("host", "")):
        raise ApiError(421, "this server answers only to localhost, 127.0.0.1 and [::1] "
                            "(Host header refused)", code="invalid_host")


def check_origin(headers: dict[str, str], loopback: bool) -> None:
    origin = headers.get("origin")
    if origin is None:
        return  # not a browser, or a same-origin GET
    scheme, _, netloc = origin.partition("://")
    if not (loopback and scheme in ("http", "https") and is_loopback_host(netloc)):
        raise ApiError(403, "cross-origin requests are not allowed", code="invalid_origin")


def check_api_key(headers: dict[str, str], api_key: str) -> None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if not (scheme.lower() == "bearer"
            and hmac.compare_digest(token.strip().encode(), api_key.encode())):
        raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def check_json_content(headers: dict[str, str]) -> None:
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, "the request body must be sent as Content-Type: application/json",
                       code="unsupported_media_type")


class Guard:
    """ASGI middleware running the checks above on every HTTP request."""

    def __init__(self, app: ASGIApp, *, loopback: bool, api_key: str | None) -> None:
        self.app = app
        self.loopback = loopback
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        try:
            if self.loopback:
                check_host(headers)
            check_origin(headers, self.loopback)
            if self.api_key is not None and scope["path"] not in OPEN_PATHS:
                check_api_key(headers, self.api_key)
            if scope["method"] == "POST":
                check_json_content(headers)
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, refused with 413 as soon as more than `limit` bytes arrive (a declared
    Content-Length over the limit is refused before reading anything)."""
    too_large = ApiError(413, f"the request body is larger than {limit} bytes",
                         code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-upload: nobody to answer, and not a server error
        raise ApiError(400, "the client disconnected while sending the body") from None
    return b"".join(chunks)
