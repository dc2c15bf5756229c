"""Does any finite text satisfy a constraint? A schema whose required properties recurse
forever, a `$ref` cycle or a grammar rule that only calls itself has no finite value:
decoding one can only run out of tokens. Productivity (the least fixpoint over rules and
`$ref` targets) decides it before anything is decoded. What this cannot read is assumed
satisfiable: it only ever refuses a constraint it has proved empty."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from localchat.errors import ConstraintError

MAX_ROUNDS = 256  # rounds over a schema's $refs; a deeper chain is assumed satisfiable


def require_finite(constraint) -> None:
    """ConstraintError where no finite text satisfies the constraint (a Constraint)."""
    if not satisfiable(constraint):
        raise ConstraintError(f"invalid {constraint.label}: no finite text satisfies it "
                              "(a part it requires requires itself)")


def satisfiable(constraint) -> bool:
    """False only where no finite text can satisfy the constraint."""
    if constraint.kind == "json_object":
        return True
    try:
        if constraint.kind == "json_schema":
            return schema_satisfiable(json.loads(constraint.text))
        text = constraint.text
        if constraint.kind == "gbnf":
            import llguidance  # the runtime's own conversion to Lark

            text = llguidance.grammar_from("gbnf", text)
        return lark_satisfiable(text)
    except (ValueError, RecursionError, _Unknown):
        return True


class _Unknown(Exception):
    """Something this checker does not read: assume it can be satisfied."""


# ---- JSON Schema ---------------------------------------------------------------------

def schema_satisfiable(schema: Any) -> bool:
    """Whether some finite JSON value meets the schema, following local `$ref`s."""
    productive: dict[str, bool] = {}
    for _ in range(MAX_ROUNDS):
        before = dict(productive)
        refs: set[str] = set()
        root = _schema_productive(schema, schema, productive, refs)
        for ref in refs:
            productive[ref] = _schema_productive(_resolve(schema, ref), schema, productive, set())
        if productive == before:
            return root
    raise _Unknown


def _resolve(root: Any, ref: str) -> Any:
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        raise _Unknown  # a remote or $id reference: not ours to judge
    node = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise _Unknown
    return node


def _schema_productive(node: Any, root: Any, productive: dict[str, bool], refs: set[str]) -> bool:
    """One evaluation under the current estimate of which $ref targets are productive
    (unknown ones: not yet), noting every $ref met in refs."""
    if isinstance(node, bool):
        return node
    if not isinstance(node, dict):
        raise _Unknown

    def sub(child: Any) -> bool:
        return _schema_productive(child, root, productive, refs)

    ok = True
    if "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str):
            raise _Unknown
        _resolve(root, ref)
        refs.add(ref)
        ok = productive.get(ref, False)
    if "enum" in node and isinstance(node["enum"], list) and not node["enum"]:
        ok = False
    if isinstance(node.get("allOf"), list):
        ok = ok and all(sub(s) for s in node["allOf"])
    for key in ("anyOf", "oneOf"):
        if isinstance(node.get(key), list):
            ok = ok and any(sub(s) for s in node[key])
    if "const" in node or "enum" in node:
        return ok
    types = node.get("type")
    if types is None:
        return ok  # any type may meet it: a scalar ends it
    types = [types] if isinstance(types, str) else types
    if not isinstance(types, list):
        raise _Unknown
    return ok and any(_type_productive(t, node, sub) for t in types)


def _type_productive(kind: Any, node: dict, sub: Callable[[Any], bool]) -> bool:
    if kind == "object":
        properties = node.get("properties") or {}
        extra = node.get("additionalProperties", True)
        for key in node.get("required") or []:
            value = properties.get(key, extra) if isinstance(properties, dict) else extra
            if not sub(value):
                return False
        return True
    if kind == "array":
        need = node.get("minItems", 0)
        if not isinstance(need, int) or need <= 0:
            return True
        prefix = node.get("prefixItems") or []
        parts = [prefix[i] if i < len(prefix) else node.get("items", True)
                 for i in range(min(need, len(prefix) + 1))]
        return all(sub(p) for p in parts)
    return True  # string, number, integer, boolean, null


# ---- Lark (and GBNF, converted) ----------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>[ \t\r]+|\\\n) | (?P<newline>\n) | (?P<comment>//[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?![/*])(?:[^/\\\n]|\\.)+/[imslux]*)
  | (?P<special><\|[^|>]*\|>|<\[[^\]]*\]>)
  | (?P<directive>%[a-z_]+)
  | (?P<name>[?!]?[_A-Za-z][_A-Za-z0-9]*)
  | (?P<range>\.\.) | (?P<arrow>->) | (?P<number>-?[0-9]+)
  | (?P<punct>[:|()\[\]*+?~{},.&])
""", re.VERBOSE)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise _Unknown
        kind = match.lastgroup
        if kind == "directive" and match.group() in ("%json", "%regex", "%lark"):
            end = _balanced(text, text.index("{", match.end()) if "{" in text[match.end():]
                            else -1)
            out.append((match.group(), text[match.end():end]))
            pos = end
            continue
        if kind not in ("space", "comment"):
            out.append((kind, match.group()))
        pos = match.end()
    return out


def _balanced(text: str, start: int) -> int:
    """The index after the brace that closes the one at start (strings respected)."""
    if start < 0:
        raise _Unknown
    depth, i, in_string = 0, start, False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise _Unknown


def _rules(tokens: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Rule name -> its definition's tokens. A definition starts at the beginning of a
    line: NAME (.priority)? ':'."""
    rules: dict[str, list] = {}
    current: list | None = None
    at_line_start = True
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == "newline":
            at_line_start = True
            i += 1
            continue
        if at_line_start and kind == "directive":
            current = None  # %ignore, %import, %llguidance ...: not a rule
            while i < len(tokens) and tokens[i][0] != "newline":
                i += 1
            continue
        if at_line_start and kind == "name":
            j = i + 1
            if j + 1 < len(tokens) and tokens[j] == ("punct", ".") and tokens[j + 1][0] == "number":
                j += 2
            if j < len(tokens) and tokens[j] == ("punct", ":"):
                current = rules.setdefault(value.lstrip("?!"), [])
                if current:
                    current.append(("punct", "|"))
                i = j + 1
                at_line_start = False
                continue
        at_line_start = False
        if current is None:
            raise _Unknown
        current.append((kind, value))
        i += 1
    return rules


def lark_satisfiable(text: str) -> bool:
    """Whether the grammar's start rule derives some finite text (a worklist: a rule is
    evaluated again only when a rule it names has just become productive)."""
    rules = _rules(_tokens(text))
    if "start" not in rules:
        raise _Unknown
    productive = {name: False for name in rules}
    users: dict[str, set[str]] = {name: set() for name in rules}
    for name, body in rules.items():
        for kind, value in body:
            if kind == "name" and value.lstrip("?!") in users:
                users[value.lstrip("?!")].add(name)
    pending = list(rules)
    while pending:
        name = pending.pop()
        if not productive[name] and _Expression(rules[name], productive).value():
            productive[name] = True
            pending.extend(users[name])
    return productive["start"]


class _Expression:
    """Recursive descent over one rule's tokens, evaluating productivity."""

    def __init__(self, tokens: list[tuple[str, str]], productive: dict[str, bool]) -> None:
        self.tokens = [t for t in tokens if t[0] != "newline"]
        self.productive = productive
        self.i = 0

    def value(self) -> bool:
        result = self._alternatives()
        if self.i != len(self.tokens):
            raise _Unknown
        return result

    def _peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _alternatives(self) -> bool:
        result = self._sequence()
        while self._peek() == ("punct", "|"):
            self.i += 1
            result = self._sequence() or result
        return result

    def _sequence(self) -> bool:
        result = True
        while (token := self._peek()) is not None and token not in (
                ("punct", "|"), ("punct", ")"), ("punct", "]")):
            if token[0] == "arrow":  # an alias names the alternative
                self.i += 2
                continue
            result = self._repeated() and result
        return result

    def _repeated(self) -> bool:
        inner = self._atom()
        token = self._peek()
        if token in (("punct", "*"), ("punct", "?")):
            self.i += 1
            return True
        if token == ("punct", "+"):
            self.i += 1
            return inner
        if token == ("punct", "~"):
            self.i += 1
            low = self._number()
            if self._peek() == ("range", ".."):
                self.i += 1
                self._number()
            return inner or low == 0
        if token == ("punct", "{"):
            self.i += 1
            low = self._number()
            if self._peek() == ("punct", ","):
                self.i += 1
                if (self._peek() or ("",))[0] == "number":
                    self.i += 1
            self._expect("}")
            return inner or low == 0
        return inner

    def _atom(self) -> bool:
        token = self._peek()
        if token is None:
            raise _Unknown
        kind, value = token
        self.i += 1
        if token == ("punct", "("):
            result = self._alternatives()
            self._expect(")")
            return result
        if token == ("punct", "["):
            self._alternatives()
            self._expect("]")
            return True
        if kind in ("string", "regex", "special", "%regex", "%lark"):
            return True
        if kind == "%json":
            return schema_satisfiable(json.loads(value))
        if kind == "name":
            name = value.lstrip("?!")
            if name not in self.productive:
                raise _Unknown
            return self.productive[name]
        raise _Unknown

    def _number(self) -> int:
        token = self._peek()
        if token is None or token[0] != "number":
            raise _Unknown
        self.i += 1
        return int(token[1])

    def _expect(self, punct: str) -> None:
        if self._peek() != ("punct", punct):
            raise _Unknown
        self.i += 1
