"""Hypothesis strategies for constraints a small model can finish: JSON schemas built from
bounded parts (strings with maxLength, integer ranges, enums, booleans, bounded arrays,
nested objects, anyOf, nullable, $defs) and Lark / GBNF grammars (alternatives, bounded
repetition, character classes). Each comes with a prompt that asks for it."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from localchat.engine.constraint import Constraint

WORDS = ["red", "green", "blue", "a", "b", "c", "yes", "no", "cat", "sea", "Paris", "42"]
KEYS = ["name", "age", "tags", "colour", "city", "count", "ok", "kind", "items", "note"]
PROMPTS = [
    "Invent a person.",
    "Describe the sea.",
    "List tags.",
    "Give me JSON.",
    "Describe a city.",
    "Answer yes or no: is the sky blue?",
    # a prompt that holds the answer's shape, so that prompt lookup finds drafts
    'Copy this: {"name": "Ann", "age": 3, "tags": ["a", "b"], "ok": true}',
    'Repeat: red, green, blue, red, green, blue, red, green, blue',
]


def _scalar() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.integers(1, 24).map(lambda n: {"type": "string", "maxLength": n}),
        st.tuples(st.integers(-50, 50), st.integers(0, 200)).map(
            lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
        st.just({"type": "integer"}),
        st.just({"type": "boolean"}),
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True).map(
            lambda values: {"enum": values}),
        st.sampled_from(WORDS).map(lambda w: {"const": w}),
        st.integers(1, 12).map(lambda n: {"type": ["string", "null"], "maxLength": n}),
    )


def _with_children(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    array = st.tuples(children, st.integers(0, 2), st.integers(0, 3)).map(
        lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]})
    any_of = st.lists(children, min_size=2, max_size=3).map(lambda options: {"anyOf": options})
    return st.one_of(array, any_of, _object(children))


def _object(values: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    @st.composite
    def build(draw) -> dict:
        keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
        props = {k: draw(values) for k in keys}
        required = draw(st.lists(st.sampled_from(keys), unique=True))
        schema = {"type": "object", "properties": props, "required": sorted(required)}
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema
    return build()


SCHEMA = _object(st.recursive(_scalar(), _with_children, max_leaves=6))


@st.composite
def _with_defs(draw) -> dict:
    """A schema whose parts are shared through $defs and $ref."""
    part = draw(_object(_scalar()))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    return {"$defs": {"part": part}, "type": "object",
            "properties": {k: {"$ref": "#/$defs/part"} for k in keys}, "required": keys,
            "additionalProperties": False}


@st.composite
def _lark(draw) -> Constraint:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=4, unique=True))
    n = draw(st.integers(1, 4))
    choice = " | ".join(json.dumps(w) for w in words)
    sep = draw(st.sampled_from([", ", " ", "; "]))
    return Constraint("lark", f'start: "Answer: " item ({json.dumps(sep)} item)~0..{n} "."\n'
                              f"item: {choice} | /[0-9]{{1,3}}/")


@st.composite
def _gbnf(draw) -> Constraint:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True))
    choice = " | ".join(json.dumps(w) for w in words)
    return Constraint("gbnf", f'root ::= "- " item ("\\n- " item)?\nitem ::= {choice} | [a-z]{{1,6}}')


CONSTRAINT = st.one_of(
    SCHEMA.map(Constraint.json_schema),
    _with_defs().map(Constraint.json_schema),
    st.just(Constraint.json_object()),
    _lark(),
    _gbnf(),
)
