"""The sandbox that untrusted chat templates render in: Jinja's ImmutableSandboxedEnvironment
plus a time limit and size limits, which that sandbox does not impose itself."""

from __future__ import annotations

import inspect
import json
import re
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, wraps
from typing import Any, Callable, Iterable, Iterator

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from localchat.errors import TemplateError

_MIN_JINJA = (3, 1, 6)  # older releases have known sandbox escapes
if tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3]) < _MIN_JINJA:
    raise TemplateError(
        f"Jinja2 {jinja2.__version__} is too old to render chat templates safely; need >= 3.1.6"
    )

DEFAULT_TIME_LIMIT_S = 2.0
DEFAULT_MAX_OUTPUT_CHARS = 4 * 1024 * 1024
_ALLOCATION_FACTOR = 16  # all values a render creates, together, vs the output cap
_MAX_INT_BITS = 1 << 16  # chat templates never need big integers


class _LimitExceeded(TemplateError):
    """A render went over its time or size limit."""


# --- per-render limits -------------------------------------------------------------


@dataclass
class _Budget:
    deadline: float
    time_limit_s: float
    max_chars: int
    allocated: int = 0


_state = threading.local()  # .budget: the render running in this thread, if any


def _cap() -> int:
    budget = getattr(_state, "budget", None)
    return budget.max_chars if budget else DEFAULT_MAX_OUTPUT_CHARS


def _too_big(what: str) -> _LimitExceeded:
    return _LimitExceeded(
        f"chat template rejected: {what} would exceed the {_cap()}-character output limit"
    )


def _weight(value: Any, limit: int, memo: dict[int, int] | None = None, depth: int = 0) -> int:
    """Roughly len(str(value)), counting shared references each time they print; stops once past
    limit. Memoized by identity, so it takes linear time even on nested shared references."""
    if isinstance(value, str):
        return len(value) + 1
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3 + 1
    if isinstance(value, Namespace):
        value = object.__getattribute__(value, "_Namespace__attrs")
    if not isinstance(value, (list, tuple, set, frozenset, dict)):
        return 1
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    if depth > 64:
        return limit + 1
    items = [x for kv in value.items() for x in kv] if isinstance(value, dict) else value
    total = len(value) + 1
    for item in items:
        total += _weight(item, limit, memo, depth + 1)
        if total > limit:
            break
    memo[id(value)] = total
    return total


def _check(value: Any, what: str = "a value") -> Any:
    """Refuse a value bigger than the output cap; count it against the render's budget."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > _MAX_INT_BITS:
            raise _LimitExceeded("chat template rejected: integer too large")
        return value
    cap = _cap()
    weight = _weight(value, cap)
    if weight > cap:
        raise _too_big(what)
    budget = getattr(_state, "budget", None)
    if budget is not None:
        budget.allocated += weight
        if budget.allocated > budget.max_chars * _ALLOCATION_FACTOR:
            raise _LimitExceeded("chat template rejected: rendering exceeded the memory limit")
    return value


def _check_args(args: Iterable[Any]) -> None:
    cap, total = _cap(), 0
    for arg in args:
        total += len(arg) if isinstance(arg, str) else _weight(arg, cap)
    if total > cap:
        raise _too_big("a call")


def _check_widths(fmt: Any) -> None:
    """Refuse %- and {}-format strings whose field widths alone exceed the cap."""
    if isinstance(fmt, str):
        for digits in re.findall(r"\d+", fmt):
            if len(digits) > 12 or int(digits) > _cap():
                raise _too_big("a format width")


def _check_format(fmt: Any, args: Any) -> None:
    """Refuse a %- or {}-format whose widths or precisions exceed the cap, whether written in
    the string or taken from `args` (`'%*s' % (10**9, 'a')`, `'{:>{}}'.format('a', 10**9)`),
    before Python allocates the padded text."""
    if not isinstance(fmt, str):
        return
    _check_widths(fmt)
    if "*" not in fmt and not re.search(r"\{[^{}]*\{", fmt):
        return  # no width or precision comes from the arguments
    values = args.values() if isinstance(args, dict) else (
        args if isinstance(args, (tuple, list)) else (args,))
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _cap():
            raise _too_big("a format width")


def _estimate_translate(s: str, table: Any) -> None:
    """str.translate: each character may become its mapping's longest value."""
    if isinstance(table, dict):
        longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
        if len(s) * longest > _cap():
            raise _too_big("a translate")


def _estimate_replace(s: Any, old: Any, new: Any, count: Any = None) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        hits = s.count(old) if old else len(s) + 1
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        if len(s) + hits * max(0, len(new) - len(old)) > _cap():
            raise _too_big("a replace")


def _bounded(items: Iterable[Any], sep: Any) -> Iterator[Any]:
    """Feed join() while keeping a running total of the text it will build."""
    total, cap, sep_len = 0, _cap(), len(sep) if isinstance(sep, str) else 0
    for item in items:
        total += sep_len + (len(item) if isinstance(item, str) else _weight(item, cap))
        if total > cap:
            raise _too_big("a join")
        yield item


def _precheck_method(obj: Any, args: tuple, kwargs: dict) -> tuple:
    """Bound the str methods that amplify text; returns (possibly wrapped) args."""
    target = getattr(obj, "__wrapped__", obj)  # sandboxed str.format keeps the original
    owner = getattr(target, "__self__", None)
    if not isinstance(owner, str):
        return args
    name = getattr(target, "__name__", "")
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        if args[0] > _cap():
            raise _too_big(f"str.{name}")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int) and len(owner) + owner.count("\t") * size > _cap():
            raise _too_big("str.expandtabs")
    elif name == "replace" and len(args) >= 2:
        _estimate_replace(owner, *args[:3])
    elif name == "format":
        _check_format(owner, tuple(args) + tuple(kwargs.values()))
    elif name == "format_map" and args:
        _check_format(owner, args[0])
    elif name == "translate" and args:
        _estimate_translate(owner, args[0])
    elif name == "join" and args:
        return (_bounded(args[0], owner),) + args[1:]
    return args


def _pre_center(a: dict[str, Any]) -> None:
    if isinstance(a.get("width"), int) and a["width"] > _cap():
        raise _too_big("center")


def _pre_indent(a: dict[str, Any]) -> None:
    width, text = a.get("width", 4), a.get("s", "")
    pad = len(width) if isinstance(width, str) else width
    if isinstance(pad, int) and isinstance(text, str):
        if len(text) + (text.count("\n") + 1) * pad > _cap():
            raise _too_big("indent")


def _pre_wordwrap(a: dict[str, Any]) -> None:
    text, wrap = a.get("s", ""), a.get("wrapstring") or "\n"
    if isinstance(text, str) and isinstance(wrap, str) and len(text) * (1 + len(wrap)) > _cap():
        raise _too_big("wordwrap")


def _pre_join(a: dict[str, Any]) -> None:
    a["value"] = _bounded(a["value"], a.get("d", ""))


# Filters whose output can be much bigger than their input get a specific estimate.
_FILTER_PRECHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "center": _pre_center,
    "indent": _pre_indent,
    "wordwrap": _pre_wordwrap,
    "join": _pre_join,
    "replace": lambda a: _estimate_replace(a.get("s"), a.get("old"), a.get("new"), a.get("count")),
    "format": lambda a: _check_format(a.get("value"), a.get("args", ()) or a.get("kwargs", {})),
}


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a filter: bounded inputs, a specific estimate for amplifiers, checked output."""
    skip = 0 if getattr(func, "jinja_pass_arg", None) is None else 1  # context/env argument
    precheck = _FILTER_PRECHECKS.get(name)
    signature = inspect.signature(func) if precheck else None
    what = f"the {name} filter"

    @wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if name != "join":
            _check_args(args[skip:])
            if kwargs:
                _check_args(kwargs.values())
        if precheck and signature:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return func(*args, **kwargs)  # let the filter raise its own usage error
            precheck(bound.arguments)
            args, kwargs = bound.args, bound.kwargs
        return _check(func(*args, **kwargs), what)

    return guarded


# --- the environment -----------------------------------------------------------------


class _GuardedCodeGenerator(CodeGenerator):
    """Routes `~` and container literals through the environment's size checks."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.guarded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.guarded_value(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.guarded_value(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # an assignment target, not a value
            super().visit_Tuple(node, frame)
            return
        self.write("environment.guarded_value(")
        super().visit_Tuple(node, frame)
        self.write(")")


def _raise_exception(message: Any) -> None:
    raise TemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > 1000:
        raise TemplateError("chat template rejected: bad strftime_now format")
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """As transformers defines it: keeps non-ASCII text, unlike Jinja's HTML-safe tojson."""
    if isinstance(indent, int) and indent > 64:
        raise _too_big("tojson indent")
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _guarded_join(chunks: Iterable[str]) -> str:
    """Environment.concat: joins block output (macros, {% set %} blocks) within the cap."""
    return "".join(_bounded(chunks, ""))


class _ChatTemplateEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox HF templates expect, with every text-building operation size-checked."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})
    concat = staticmethod(_guarded_join)  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
            finalize=lambda value: _check(value, "an output value"),
        )
        self.filters["tojson"] = _tojson
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        """Fail at the first unsafe access instead of rendering it as empty text."""
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        cap = _cap()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and n > 0:
                    if _weight(seq, cap) * n > cap:
                        raise _too_big("a repetition")
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                    raise _LimitExceeded("chat template rejected: integer too large")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                if left.bit_length() * right > _MAX_INT_BITS:
                    raise _LimitExceeded("chat template rejected: integer too large")
        elif operator == "+":
            if not isinstance(left, (int, float)) or not isinstance(right, (int, float)):
                if _weight(left, cap) + _weight(right, cap) > cap:
                    raise _too_big("a concatenation")
        elif operator == "%" and isinstance(left, str):
            _check_format(left, right)
            _check_args((left, right))
        return _check(super().call_binop(context, operator, left, right))

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _check_args(list(args) + list(kwargs.values()))
        args = _precheck_method(obj, args, kwargs)
        return _check(super().call(context, obj, *args, **kwargs), "a call result")

    def guarded_concat(self, parts: tuple) -> str:
        _check_args(parts)
        return _check("".join(str(p) for p in parts), "a ~ concatenation")

    def guarded_value(self, value: Any) -> Any:
        return _check(value, "a literal")


_ENV = _ChatTemplateEnvironment()


@lru_cache(maxsize=32)
def compile_template(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


# --- running a render under limits ---------------------------------------------------


class RenderLimits:
    """Installs the budget and a deadline tracer for this thread, for one render."""

    def __init__(self, time_limit_s: float, max_chars: int) -> None:
        self.budget = _Budget(time.monotonic() + time_limit_s, time_limit_s, max_chars)

    def _timeout(self) -> _LimitExceeded:
        return _LimitExceeded(
            "chat template rejected: rendering exceeded the "
            f"{self.budget.time_limit_s:g} s time limit"
        )

    def run(self, fn: Callable[[], Any]) -> Any:
        deadline = self.budget.deadline

        def tracer(frame: Any, event: str, arg: Any) -> Any:
            if time.monotonic() > deadline:
                raise self._timeout()
            # Line events only in template code (its loops may make no calls); library
            # code is checked at each call, which keeps the overhead small.
            return tracer if frame.f_code.co_filename == "<template>" else None

        previous_trace, previous_budget = sys.gettrace(), getattr(_state, "budget", None)
        _state.budget = self.budget
        sys.settrace(tracer)  # re-installed per phase: a swallowed raise unsets it
        try:
            result = fn()
        except TemplateError:
            raise
        except SecurityError as exc:
            raise TemplateError(f"chat template rejected: unsafe operation ({exc})") from None
        except TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template has a syntax error on line {exc.lineno}: {exc.message}"
            ) from None
        except RecursionError:
            raise TemplateError("chat template rejected: recursion too deep") from None
        except MemoryError:
            raise _too_big("rendering") from None
        except Exception as exc:  # anything the template code raised
            raise TemplateError(f"chat template failed to render: {exc}") from None
        finally:
            sys.settrace(previous_trace)
            _state.budget = previous_budget
        if time.monotonic() > deadline:
            raise self._timeout()
        return result

    def render(self, template: jinja2.Template, context: dict[str, Any]) -> str:
        def produce() -> str:
            parts, total = [], 0
            for chunk in template.generate(**context):
                total += len(chunk)
                if total > self.budget.max_chars:
                    raise _too_big("the rendered prompt")
                parts.append(chunk)
            return "".join(parts)

        return self.run(produce)
