"""`localchat run --batch FILE.jsonl`: lines run concurrently, one JSON result each, written in
input order; a bad line is an error result and the rest go on. Exit code 0 when all
succeeded, 1 when any failed, 130 after Ctrl+C."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Iterable

from localchat.engine.base import Message, Request, Result, SamplingParams
from localchat.engine.constraint import from_response_format
from localchat.errors import LocalchatError, UsageError
from localchat.json_text import first_lone_surrogate
from localchat.interrupts import ctrl_c_cancels
from localchat.cli.stdin_text import read_stdin_text
from localchat.sampling_fields import FIELD, SAMPLING_PARAMS
from localchat.chat.params import ReplyParams
from localchat.cli.flags import engine_config, load_for_run, reply_params, with_parallel

MAX_IN_FLIGHT = 32
PARALLEL = 16  # requests computed at once by default (the llama.cpp engine's KV slots)

# a line's fields: these and SAMPLING_FIELDS (with max_tokens)
_OTHER_FIELDS = {"id", "prompt", "messages", "stop", "response_format"}
_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Line:
    """One non-blank input line: its id and either a request or why it is not one."""

    number: int
    id: object
    request: Request | None = None
    error: str | None = None


def read_lines(path: str, stdin=None) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines of PATH, or of stdin for '-'."""
    if path == "-":
        text = read_stdin_text(stdin if stdin is not None else sys.stdin)
    else:
        try:  # bytes that are not UTF-8 stay as lone surrogates: that line's error only
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as exc:
            raise LocalchatError(f"cannot read {path}: {exc.strerror or exc}") from None
    return [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _typed(value, types: tuple, name: str):
    if isinstance(value, bool) or not isinstance(value, types):
        kind = "an integer" if types == (int,) else "a number"
        raise UsageError(f"{name} must be {kind}, got {json.dumps(value)}")
    return value


def _messages(value) -> list[Message]:
    if not isinstance(value, list) or not value:
        raise UsageError("messages must be a non-empty list of {role, content}")
    out = []
    for m in value:
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise UsageError("each message must be an object with exactly role and content")
        if m["role"] not in _ROLES:
            raise UsageError(f"message role must be one of {', '.join(_ROLES)}, "
                             f"got {json.dumps(m['role'])}")
        if not isinstance(m["content"], str):
            raise UsageError("message content must be a string")
        out.append(Message(m["role"], m["content"]))
    return out


def _stop(value) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise UsageError("stop must be a non-empty string or a list of them")
    return tuple(value)


def parse_line(number: int, text: str, params: ReplyParams) -> Line:
    """The request one line asks for; every mistake is an error for this line only."""
    try:
        return _parse_line(number, text, params)
    except RecursionError:  # json.loads or the checks below, on [[[[... 5,000 deep
        return Line(number, number, error=f"line {number}: JSON nested too deeply")


def _parse_line(number: int, text: str, params: ReplyParams) -> Line:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return Line(number, number,
                    error=f"line {number}: not JSON ({exc.msg} at column {exc.colno})")
    if not isinstance(obj, dict):
        return Line(number, number, error=f"line {number}: expected a JSON object")
    line_id = obj.get("id", number)
    if isinstance(line_id, bool) or not isinstance(line_id, (str, int)):
        return Line(number, number, error=f"line {number}: id must be a string or an integer")
    bad = first_lone_surrogate(obj)
    if bad is not None:
        return Line(number, number if bad == "id" else line_id,
                    error=f"line {number}: {bad} is not valid Unicode (bytes that are not "
                    "UTF-8, or a lone UTF-16 surrogate)")
    try:
        return Line(number, line_id, request=_request(obj, params))
    except LocalchatError as exc:
        return Line(number, line_id, error=f"line {number}: {exc}")


def _request(obj: dict, params: ReplyParams) -> Request:
    unknown = sorted(set(obj) - _OTHER_FIELDS - set(FIELD))
    if unknown:
        allowed = ", ".join(sorted(_OTHER_FIELDS | set(FIELD)))
        raise UsageError(f"unknown field {unknown[0]!r} (fields: {allowed})")
    if ("prompt" in obj) == ("messages" in obj):
        raise UsageError("a line needs exactly one of 'prompt' or 'messages'")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise UsageError("prompt must be a non-empty string")
        messages = params.system_messages() + [Message("user", obj["prompt"])]
    else:
        messages = _messages(obj["messages"])
    overrides = {f.name: None if f.nullable and obj[f.name] is None
                 else _typed(obj[f.name], f.json_types, f.name)
                 for f in SAMPLING_PARAMS if f.name in obj}
    sampling: SamplingParams = replace(params.sampling, **overrides)  # UsageError if invalid
    max_tokens = params.max_tokens
    if "max_tokens" in obj and obj["max_tokens"] is not None:
        max_tokens = _typed(obj["max_tokens"], FIELD["max_tokens"].json_types, "max_tokens")
    stop = _stop(obj["stop"]) if "stop" in obj else ()
    constraint = from_response_format(obj.get("response_format"))
    return Request(messages=messages, sampling=sampling, max_tokens=max_tokens, stop=stop,
                   constraint=constraint)


def _run_one(engine, line: Line, cancel: threading.Event) -> dict | None:
    """The output record of one request; None when it was cancelled before it started."""
    if cancel.is_set():
        return None
    try:
        result: Result = engine.complete(line.request, cancel)
    except LocalchatError as exc:  # e.g. ContextOverflowError: this line only
        return {"id": line.id, "error": f"line {line.number}: {exc}"}
    return {"id": line.id, "text": result.text, "finish_reason": result.finish_reason,
            "stats": result.stats.to_dict()}


def _write(record: dict) -> None:
    sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def cmd_batch(args: argparse.Namespace) -> int:
    if (args.prompt is not None or args.prompt_flag is not None or args.prompt_file is not None
            or args.attach):
        raise UsageError("--batch reads its prompts from FILE.jsonl; give no PROMPT, -p, -f "
                         "or --attach")
    if getattr(args, "continue_last", False):
        raise UsageError("--batch cannot be combined with --continue")
    params = reply_params(args)
    lines = [parse_line(n, text, params) for n, text in read_lines(args.batch)]
    config = with_parallel(engine_config(args, use="many"), max(1, min(PARALLEL, len(lines))))
    if not any(line.request for line in lines):
        for line in lines:
            _write({"id": line.id, "error": line.error})
        return 1 if lines else 0
    engine = load_for_run(config, verbose=args.verbose)
    try:
        return _run_all(engine, lines, verbose=args.verbose)
    finally:
        engine.close()


def _run_all(engine, lines: list[Line], *, verbose: bool) -> int:
    from quantize.progress import Progress

    cancel = threading.Event()
    progress = Progress("batch", len(lines))
    progress_lock = threading.Lock()

    def advanced(_future=None) -> None:
        with progress_lock:
            progress.advance()

    start = time.perf_counter()
    failed = written = tokens = 0
    with ctrl_c_cancels(cancel), ThreadPoolExecutor(
            max_workers=min(MAX_IN_FLIGHT, len(lines)), thread_name_prefix="batch") as pool:
        futures: list[Future | dict] = []
        for line in lines:
            if line.request is None:
                futures.append({"id": line.id, "error": line.error})
                advanced()
            else:
                future = pool.submit(_run_one, engine, line, cancel)
                future.add_done_callback(advanced)
                futures.append(future)
        try:
            for item in _in_order(futures):
                if item is None:
                    continue  # cancelled before it started: not written
                _write(item)
                written += 1
                failed += "error" in item
                tokens += item.get("stats", {}).get("completion_tokens", 0)
        except BaseException:  # a bug, a closed stdout, a second Ctrl+C: stop the others
            cancel.set()
            raise
    progress.close()
    elapsed = time.perf_counter() - start
    if verbose:
        print(f"batch: {written} of {len(lines)} line(s) written, {failed} failed, "
              f"{tokens} token(s) generated in {elapsed:.2f} s "
              f"({tokens / elapsed if elapsed else 0:.1f} tokens/s overall)", file=sys.stderr)
    if cancel.is_set():
        print(f"localchat: batch cancelled after {written} of {len(lines)} line(s)",
              file=sys.stderr)
        return 130
    return 1 if failed else 0


def _in_order(futures: Iterable[Future | dict]) -> Iterable[dict | None]:
    for item in futures:
        yield item.result() if isinstance(item, Future) else item
