"""What a reply must look like: a JSON Schema, any JSON object, or a grammar (Lark, or GBNF
that the runtime converts to Lark). A plain value on Request; the runtime compiles it with
llguidance and masks sampling by it. Imports nothing heavy."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from localchat.errors import ConstraintError

ConstraintKind = Literal["json_schema", "json_object", "lark", "gbnf"]
KINDS = ("json_schema", "json_object", "lark", "gbnf")
MAX_CONSTRAINT_CHARS = 1_000_000  # a schema or grammar larger than this is refused unread
MAX_SCHEMA_DEPTH = 64  # nesting of JSON values in a schema


@dataclass(frozen=True)
class Constraint:
    """kind, and its text: the schema as JSON text (json_schema) or the grammar
    (lark, gbnf); json_object has none."""

    kind: ConstraintKind
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r} (one of {', '.join(KINDS)})")
        if len(self.text) > MAX_CONSTRAINT_CHARS:
            raise ConstraintError(f"the {self.label} is {len(self.text)} characters; "
                             f"at most {MAX_CONSTRAINT_CHARS} are accepted")
        if self.kind != "json_object" and not self.text.strip():
            raise ConstraintError(f"the {self.label} is empty")

    @property
    def label(self) -> str:
        return {"json_schema": "JSON schema", "json_object": "JSON object constraint",
                "lark": "Lark grammar", "gbnf": "GBNF grammar"}[self.kind]

    def check(self) -> None:
        """llguidance's verdict on a JSON schema or Lark grammar, without a tokenizer, and
        that some finite text satisfies it: ConstraintError with its reason (one line).
        Checked once more when decoding."""
        import llguidance  # a compiled extension: loaded only when a schema is checked

        from localchat.engine.finite import require_finite

        require_finite(self)

        try:
            if self.kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(self.text)
            elif self.kind == "lark":
                grammar = llguidance.LLMatcher.grammar_from_lark(self.text)
            else:
                return
            error = llguidance.LLMatcher.validate_grammar(grammar)
        except ValueError as e:
            error = str(e)
        if error:
            raise ConstraintError(f"invalid {self.label}: {' '.join(error.split())[:500]}")

    @classmethod
    def json_schema(cls, schema: Any) -> "Constraint":
        """From a schema as a dict (or bool) or as JSON text; checked to be JSON and not
        nested deeper than MAX_SCHEMA_DEPTH (llguidance checks the rest)."""
        if isinstance(schema, str):
            if len(schema) > MAX_CONSTRAINT_CHARS:
                raise ConstraintError(f"the JSON schema is {len(schema)} characters; "
                                 f"at most {MAX_CONSTRAINT_CHARS} are accepted")
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError) as e:
                raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError("a JSON schema must be a JSON object (or true/false), "
                             f"not {type(schema).__name__}")
        if _depth(schema) > MAX_SCHEMA_DEPTH:
            raise ConstraintError(f"the JSON schema is nested deeper than {MAX_SCHEMA_DEPTH} levels")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")


def _depth(value: Any, limit: int = MAX_SCHEMA_DEPTH + 1) -> int:
    """Nesting depth of a JSON value, counted up to `limit` (iterative: no recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest >= limit:
            return deepest
        children = item.values() if isinstance(item, dict) else \
            item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def from_response_format(value: Any, field: str = "response_format") -> Constraint | None:
    """OpenAI's response_format ({"type": "text" | "json_object" | "json_schema",
    "json_schema": {"name", "schema", "strict", "description"}}) as a Constraint (None for
    text). ConstraintError naming the field for anything else."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ConstraintError(f"{field} must be an object with a 'type'")
    kind = value["type"]
    extra = sorted(set(value) - {"type", "json_schema"})
    if extra:
        raise ConstraintError(f"{field}.{extra[0]} is not supported")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object()
    if kind != "json_schema":
        raise ConstraintError(f"{field}.type {kind!r} is not supported "
                         "(one of text, json_object, json_schema)")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ConstraintError(f"{field}.json_schema must be an object with a 'schema'")
    unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
    if unknown:
        raise ConstraintError(f"{field}.json_schema.{unknown[0]} is not supported")
    if "strict" in spec and spec["strict"] is not None and not isinstance(spec["strict"], bool):
        raise ConstraintError(f"{field}.json_schema.strict must be true or false")
    if "schema" not in spec:  # OpenAI: no schema means any JSON
        return Constraint.json_object()
    try:
        return Constraint.json_schema(spec["schema"])
    except ConstraintError as e:
        raise ConstraintError(f"{field}.json_schema.schema: {e}") from None
