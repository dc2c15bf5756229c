"""Text that JSON can carry but Unicode cannot: a lone UTF-16 surrogate ("\\ud800" escaped
in the JSON, or undecodable bytes kept by surrogateescape). Found without recursion, since
the JSON comes from anywhere and may nest deeply."""

from __future__ import annotations

from typing import Any


def first_lone_surrogate(value: Any) -> str | None:
    """The path (`messages[0].content`, `a key`) of the first string in `value` that is not
    valid Unicode; None when every string is. "" names `value` itself."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:  # the path itself may hold one (a bad key): escaped
                return path.encode("utf-8", "backslashreplace").decode("utf-8")
        elif isinstance(item, dict):
            stack += [(f"{path}.{k}" if path else str(k), v) for k, v in item.items()]
            stack += [(f"{path} (a key)" if path else "a key", k) for k in item]
        elif isinstance(item, list):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(item)]
    return None
