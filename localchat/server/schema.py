"""Request bodies of /v1/chat/completions and /v1/completions, checked field by field: a bad
field is a 400 naming it, never a 500. Unimplemented fields that would change the shape of
the answer (n > 1, echo, the deprecated functions, ...) are refused with a 400 naming them;
others (user, penalties we do not apply) are ignored, as llama.cpp's server does. Tools:
tool_fields.py."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

from localchat.engine.base import Message, SamplingParams
from localchat.engine.constraint import Constraint, from_response_format
from localchat.errors import ConstraintError, UsageError
from localchat.json_text import first_lone_surrogate
from localchat.sampling_fields import MAX_SEED, SAMPLING_PARAMS
from localchat.server.errors import ApiError
from localchat.server.tool_fields import (
    ToolUse,
    parse_tool_use,
    tool_call_id_field,
    tool_calls_field,
)

MAX_MESSAGES = 1024
MAX_STOPS = 16
MAX_STOP_CHARS = 1000
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool"}


@dataclass(frozen=True)
class CompletionBody:
    """One validated request: chat messages, or a plain-text prompt for /v1/completions."""

    messages: tuple[Message, ...]
    prompt: str | None
    sampling: SamplingParams
    max_tokens: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    constraint: Constraint | None = None  # response_format (or llama.cpp's json_schema/grammar)
    model: str | None = None  # the model the client names (None: the served one)
    tools: ToolUse | None = None  # functions the reply may call (chat only)
    format_prompt: bool = True  # say a JSON response_format in the system turn (ours)


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object; NaN and Infinity are not JSON and are refused too."""

    def no_constants(name: str) -> Any:
        raise ValueError(name)

    try:
        body = json.loads(raw, parse_constant=no_constants)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    _refuse_lone_surrogates(body)
    return body


def _refuse_lone_surrogates(body: dict) -> None:
    """JSON may escape half of a UTF-16 pair ("\\ud800"), which is no Unicode text: a 400
    naming the first such field."""
    path = first_lone_surrogate(body)
    if path is not None:
        raise _bad(path or "body", f"{path or 'the body'} holds a lone UTF-16 surrogate, "
                                   "which is not valid Unicode", "invalid_value")


def parse_chat(body: dict, n_ctx: int, tool_format: str = "hermes") -> CompletionBody:
    """tool_format: how the served model's family writes tool calls (tool_calls.py)."""
    parsed = _common(body, n_ctx, messages=_messages(body.get("messages")), prompt=None)
    tools = parse_tool_use(body, tool_format)
    if tools is None:
        return parsed
    forced = tools.constraint()
    if parsed.constraint is not None:
        given = next(n for n in ("response_format", "json_schema", "grammar") if body.get(n))
        raise _bad(given, f"{given} cannot be combined with tools (give tool_choice \"none\" "
                          "or leave the tools out)")
    return replace(parsed, tools=tools, constraint=forced)


def parse_text(body: dict, n_ctx: int) -> CompletionBody:
    for name in _CHAT_ONLY:
        if body.get(name) is not None:
            raise _bad(name, f"{name} is only accepted by /v1/chat/completions",
                       "unsupported_parameter")
    return _common(body, n_ctx, messages=(), prompt=_prompt(body.get("prompt")))


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _common(body: dict, n_ctx: int, *, messages: tuple[Message, ...],
            prompt: str | None) -> CompletionBody:
    if "model" in body and not isinstance(body["model"], str):
        raise _bad("model", "model must be a string", "invalid_type")
    n = body.get("n")
    if n is not None and (_integer("n", n) != 1):
        raise _bad("n", "only n=1 is supported")
    stream = _boolean("stream", body.get("stream", False))
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", "stream_options must be an object", "invalid_type")
    include_usage = _boolean("stream_options.include_usage",
                             (options or {}).get("include_usage", False))
    for unsupported in ("logprobs", "top_logprobs"):
        if body.get(unsupported) not in (None, False, 0):
            raise _bad(unsupported, f"{unsupported} is not supported by this server")
    for penalty in ("frequency_penalty", "presence_penalty"):  # OpenAI's; 0 changes nothing
        if body.get(penalty) is not None and _number(penalty, body[penalty], -2.0, 2.0) != 0:
            raise _bad(penalty, f"{penalty} is not supported by this server (use "
                                "repeat_penalty)", "unsupported_parameter")
    _refuse_unsupported_shapes(body)
    return CompletionBody(
        messages=messages, prompt=prompt, sampling=_sampling(body),
        max_tokens=_max_tokens(body, n_ctx), stop=_stop(body.get("stop")),
        stream=stream, include_usage=include_usage, constraint=_constraint(body),
        model=body.get("model"),
        format_prompt=_boolean("format_prompt", body.get("format_prompt", True)),
    )


# fields that would change the answer's shape, with the value that changes nothing;
# functions/function_call (OpenAI's deprecated form of tools) are refused: send tools
_SHAPE_FIELDS = {"functions": (None, []), "function_call": (None, "none"),
                 "echo": (None, False), "suffix": (None, ""),
                 "best_of": (None, 1), "logit_bias": (None, {}),
                 "ignore_eos": (None, False)}  # llama.cpp's: generate past the end
_CHAT_ONLY = ("tools", "tool_choice", "parallel_tool_calls")


def _refuse_unsupported_shapes(body: dict) -> None:
    for name, harmless in _SHAPE_FIELDS.items():
        if name in body and not any(body[name] == h and type(body[name]) is type(h)
                                    for h in harmless):
            raise _bad(name, f"{name} is not supported by this server", "unsupported_parameter")


def _constraint(body: dict) -> Constraint | None:
    """response_format, or llama.cpp's own json_schema (an object) or grammar (GBNF):
    at most one of them."""
    given = [name for name in ("response_format", "json_schema", "grammar")
             if body.get(name) is not None]
    if len(given) > 1:
        raise _bad(given[1], f"give one of {' and '.join(given)}, not both")
    if not given:
        return None
    name, value = given[0], body[given[0]]
    try:
        if name == "response_format":
            constraint = from_response_format(value)
        elif name == "json_schema":
            constraint = Constraint.json_schema(value)
        elif not isinstance(value, str):
            raise _bad("grammar", "grammar must be a string (GBNF)", "invalid_type")
        else:
            constraint = Constraint("gbnf", value) if value else None
        if constraint is not None:  # llguidance's verdict, and a finite text exists
            constraint.check()
        return constraint
    except ConstraintError as exc:
        raise _bad(name, f"{name}: {exc}" if not str(exc).startswith(name) else str(exc)) \
            from None


def _sampling(body: dict) -> SamplingParams:
    """SAMPLING_FIELDS' api_range for each field the body gives; the seed is special."""
    seed = body.get("seed")
    if seed is not None:
        seed = _integer("seed", seed)
        if seed > MAX_SEED:  # as `run --seed` and --batch: never silently another seed
            raise _bad("seed", f"seed must be at most {MAX_SEED} (2^64 - 1)")
        seed = None if seed < 0 else seed  # -1: random, as in llama.cpp
    values = {"seed": seed}
    for f in sorted(SAMPLING_PARAMS, key=lambda f: f.kind is int):  # top_k's error after others
        value, limits = body.get(f.name), f.api_range
        if limits is None:  # the seed, above
            continue
        if value is None:
            values[f.name] = f.default
        elif f.kind is int:
            values[f.name] = _int_range(f.name, value, limits.lo, limits.hi)
        else:
            values[f.name] = _number(f.name, value, limits.lo, limits.hi,
                                     lo_open=limits.lo_open)
    try:
        return SamplingParams(**values)
    except UsageError as exc:  # the ranges above are SamplingParams'; this is a backstop
        raise _bad("sampling", str(exc)) from None


def _max_tokens(body: dict, n_ctx: int) -> int | None:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    value = body.get(name)
    if value is None:
        return None  # until a stop or the end of the context, as llama.cpp does
    if _integer(name, value) < 1 or value > n_ctx:
        raise _bad(name, f"{name} must be between 1 and the context window ({n_ctx} tokens), "
                         f"got {value}")
    return value


def _messages(value: Any) -> tuple[Message, ...]:
    if value is None:
        raise _bad("messages", "messages is required", "missing_required_parameter")
    if not isinstance(value, list):
        raise _bad("messages", "messages must be an array", "invalid_type")
    if not 1 <= len(value) <= MAX_MESSAGES:
        raise _bad("messages", f"messages must hold 1 to {MAX_MESSAGES} messages, "
                               f"got {len(value)}")
    return tuple(_message(i, m) for i, m in enumerate(value))


def _message(i: int, value: Any) -> Message:
    param = f"messages[{i}]"
    if not isinstance(value, dict):
        raise _bad(param, f"{param} must be an object", "invalid_type")
    role = value.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise _bad(f"{param}.role", f"{param}.role must be one of system, developer, user, "
                                    "assistant, tool")
    content = value.get("content")
    calls = tool_calls_field(f"{param}.tool_calls", value.get("tool_calls")) \
        if role == "assistant" else ()
    if content is None and role == "assistant":
        content = ""
    call_id = tool_call_id_field(f"{param}.tool_call_id", value.get("tool_call_id")) \
        if role == "tool" else None
    return Message(_ROLES[role], _content(f"{param}.content", content), tool_calls=calls,
                   tool_call_id=call_id)


def _content(param: str, value: Any) -> str:
    """A string, or an array of text parts (the form newer OpenAI clients send)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text"
                    and isinstance(part.get("text"), str)):
                raise _bad(param, f"{param}: only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(param, f"{param} must be a string or an array of text parts", "invalid_type")


def _prompt(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]  # ["text"]: one prompt, as some clients send it
    if value is None:
        raise _bad("prompt", "prompt is required", "missing_required_parameter")
    if not isinstance(value, str):
        raise _bad("prompt", "prompt must be a string", "invalid_type")
    if not value:
        raise _bad("prompt", "prompt must not be empty")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop", "stop must be a string or an array of strings", "invalid_type")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise _bad("stop", f"stop takes at most {MAX_STOPS} strings of at most "
                           f"{MAX_STOP_CHARS} characters")
    return tuple(s for s in stops if s)


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _bad(name, f"{name} must be true or false", "invalid_type")
    return value


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"{name} must be an integer", "invalid_type")
    return value


def _int_range(name: str, value: Any, lo: int, hi: int) -> int:
    if not lo <= _integer(name, value) <= hi:
        raise _bad(name, f"{name} must be between {lo} and {hi}, got {value}")
    return value


def _number(name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(name, f"{name} must be a number", "invalid_type")
    try:
        value = float(value)
    except OverflowError:  # an integer with hundreds of digits
        value = math.inf
    low_ok = value > lo if lo_open else value >= lo
    if not (math.isfinite(value) and low_ok and value <= hi):
        bracket = "(" if lo_open else "["
        raise _bad(name, f"{name} must be in {bracket}{lo:g}, {hi:g}], got {value:g}")
    return value
