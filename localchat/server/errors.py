"""Errors as OpenAI clients expect them: {"error": {message, type, param, code}}. Every refusal
goes through ApiError with a message written here or in schema.py: no path, no traceback."""

from __future__ import annotations

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    421: "invalid_request_error",
    503: "server_error",
}


class ApiError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message,
                          "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def internal_error() -> ApiError:
    """What a bug looks like from outside: no detail (the traceback goes to the log)."""
    return ApiError(500, "internal server error", code="internal_error")
