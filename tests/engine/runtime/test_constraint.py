"""Structured output in the runtime, on the real bundled model: replies valid against 23 JSON
schemas (checked with jsonschema) batched with free requests on llama.cpp and alone on torch;
a grammar that allows anything changes nothing (greedy and seeded), invalid schemas and
grammars refused before decoding, a grammar that cannot finish ends with "length"."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.constraint import Constraint
from localchat.errors import UsageError
from helpers.schemas import SCHEMAS

GREEDY = SamplingParams(temperature=0.0)
MAX_TOKENS = 200
ANYTHING = Constraint("lark", "start: /(.|\\n)*/")


def ask(prompt: str, constraint: Constraint | None, sampling=GREEDY, max_tokens=MAX_TOKENS):
    return Request(messages=[Message("user", prompt)], sampling=sampling, max_tokens=max_tokens,
                   constraint=constraint)


def check_valid(name: str, result) -> None:
    assert result.finish_reason == "stop", (name, result.text)
    jsonschema.validate(json.loads(result.text), SCHEMAS[name][1])


QUICK = ["enum", "pattern", "nullable", "defs", "integer_enum", "boolean"]


@pytest.mark.parametrize("names", [pytest.param(list(SCHEMAS), marks=pytest.mark.slow,
                                                id="all"), pytest.param(QUICK, id="six")])
def test_schemas_are_met_batched_with_free_requests(engine, names):
    requests = [ask(SCHEMAS[n][0], Constraint.json_schema(SCHEMAS[n][1])) for n in names]
    free = [ask(f"Tell me about the number {i}.", None, max_tokens=30) for i in range(4)]
    with ThreadPoolExecutor(len(requests) + len(free)) as pool:
        results = list(pool.map(engine.complete, requests + free))
    for name, result in zip(names, results):
        check_valid(name, result)
    assert all(r.finish_reason in ("stop", "length") for r in results[len(names):])
    assert len(names) in (len(QUICK), len(SCHEMAS)) and len(SCHEMAS) >= 20


@pytest.mark.parametrize("name", ["person", "defs", "nullable", "pattern", "any_of"])
def test_schemas_alone_on_torch(torch_engine, name):
    prompt, schema = SCHEMAS[name]
    check_valid(name, torch_engine.complete(ask(prompt, Constraint.json_schema(schema))))


def test_json_object_and_a_lark_grammar(engine):
    result = engine.complete(ask("Describe a cat.", Constraint.json_object()))
    assert result.finish_reason == "stop"
    assert isinstance(json.loads(result.text), dict)
    grammar = Constraint("lark", 'start: "The answer is " ("yes" | "no") "."')
    result = engine.complete(ask("Is the earth round?", grammar))
    assert result.text in ("The answer is yes.", "The answer is no."), result.text
    assert result.finish_reason == "stop"


def test_gbnf_is_converted(engine):
    gbnf = 'root ::= "colour: " ("red" | "blue")'
    result = engine.complete(ask("Pick a colour.", Constraint("gbnf", gbnf)))
    assert result.text in ("colour: red", "colour: blue"), result.text


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.8, seed=7)])
def test_a_grammar_that_allows_anything_changes_nothing(exact_engine, sampling):
    """The mask keeps every token the model would choose and the generator is drawn from
    exactly as without it: the same reply, greedy and seeded."""
    engine = exact_engine
    prompt = "Write two sentences about rivers."
    free = engine.complete(ask(prompt, None, sampling, max_tokens=40))
    masked = engine.complete(ask(prompt, ANYTHING, sampling, max_tokens=40))
    assert masked.text == free.text


@pytest.mark.parametrize("constraint,reason", [
    (lambda: Constraint.json_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/no"}}}),
     "no"),
    (lambda: Constraint.json_schema({"type": "strange"}), "strange"),
    (lambda: Constraint("lark", "start: missing_rule"), "missing_rule"),
    (lambda: Constraint("gbnf", "root ::= ("), ""),
])
def test_invalid_constraints_are_refused_before_decoding(engine, constraint, reason):
    with pytest.raises(UsageError) as info:
        engine.complete(ask("Hi", constraint()))
    message = str(info.value)
    assert "\n" not in message and message.startswith("invalid ") and reason in message


def test_malformed_schemas_are_refused_when_built():
    with pytest.raises(UsageError, match="not valid JSON"):
        Constraint.json_schema("{not json")
    with pytest.raises(UsageError, match="JSON object"):
        Constraint.json_schema("[1, 2]")
    deep: dict = {}
    for _ in range(100):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(UsageError, match="nested deeper"):
        Constraint.json_schema(deep)


def test_a_grammar_that_cannot_finish_in_time_ends_with_length(engine):
    schema = {"type": "object", "properties": {"text": {"type": "string", "minLength": 400}},
              "required": ["text"]}
    result = engine.complete(ask("Write a story as JSON.", Constraint.json_schema(schema),
                                 max_tokens=25))
    assert result.finish_reason == "length"
    assert result.stats.completion_tokens == 25
    assert result.text.startswith('{"text": "')


def _reply(engine, name: str, forced: bool, max_tokens=MAX_TOKENS):
    prompt, schema = SCHEMAS[name]
    engine.forced_drafts = forced
    try:
        tokens, result = [], None
        for event in engine.generate(ask(prompt, Constraint.json_schema(schema),
                                         max_tokens=max_tokens)):
            tokens += getattr(event, "token_ids", ())
            result = event
        return tokens, result
    finally:
        engine.forced_drafts = True


def test_forced_drafts_change_nothing_but_the_steps(exact_engine):
    """Greedy output is identical with and without the grammar's forced tokens proposed
    as drafts; with them, fewer target passes than tokens."""
    engine = exact_engine
    steps = engine.step_stats.steps
    plain_tokens, plain = _reply(engine, "array_of_objects", forced=False)
    plain_steps, steps = engine.step_stats.steps - steps, engine.step_stats.steps
    fast_tokens, fast = _reply(engine, "array_of_objects", forced=True)
    fast_steps = engine.step_stats.steps - steps
    assert fast_tokens == plain_tokens and fast.text == plain.text
    check_valid("array_of_objects", fast)
    assert fast_steps < plain_steps * 0.75, (fast_steps, plain_steps)


def test_constrained_speculation_with_a_draft_source(exact_engine):
    """Prompt-lookup drafts under a constraint: cut where the grammar refuses them, the
    matcher kept in step with what is accepted; greedy output unchanged."""
    engine = exact_engine
    from localchat.engine import EngineConfig, open_engine
    from localchat.engine.config import DraftChoice

    reference, _ = _reply(engine, "array_of_objects", forced=False)
    speculative = open_engine(EngineConfig("default", threads=2, ctx_size=1024, exact_batching=True,
                                           draft=DraftChoice("ngram", tokens=4)))
    try:
        tokens, result = _reply(speculative, "array_of_objects", forced=False)
        assert tokens == reference
        check_valid("array_of_objects", result)
        assert result.stats.draft["proposed"] > 0
    finally:
        speculative.close()


def test_seeded_sampling_under_a_constraint_is_reproducible(exact_engine):
    """A seeded sampled request draws its generator once per token whatever the step
    holds: forced tokens are not drafted for it, so forced drafts change nothing."""
    engine = exact_engine
    seeded = SamplingParams(temperature=0.9, seed=11)
    prompt, schema = SCHEMAS["person"]
    request = ask(prompt, Constraint.json_schema(schema), seeded)
    engine.forced_drafts = False
    try:
        reference = engine.complete(request).text
    finally:
        engine.forced_drafts = True
    assert engine.complete(request).text == reference
    jsonschema.validate(json.loads(reference), schema)


def test_a_continued_reply_keeps_to_the_constraint(engine):
    prompt, schema = SCHEMAS["enum"]
    constraint = Constraint.json_schema(schema)
    result = engine.complete(Request(messages=[Message("user", prompt)], sampling=GREEDY,
                                     max_tokens=20, constraint=constraint,
                                     assistant_prefix='{"colour": "gr'))
    assert result.text == 'een"}' and result.finish_reason == "stop"
    with pytest.raises(UsageError, match="does not match"):
        engine.complete(Request(messages=[Message("user", prompt)], max_tokens=5,
                                constraint=constraint, assistant_prefix="[1"))


def test_a_hugging_face_directory_builds_its_tokenizer_from_tokenizer_json(hf_dir):
    from localchat.engine import EngineConfig, open_engine

    eng = open_engine(EngineConfig(str(hf_dir), engine="torch", ctx_size=512, threads=2))
    try:
        prompt, schema = SCHEMAS["enum"]
        check_valid("enum", eng.complete(ask(prompt, Constraint.json_schema(schema))))
    finally:
        eng.close()


@pytest.mark.model  # its engine fixture is looked up by name
@pytest.mark.parametrize("which", ["exact_engine", "torch_engine"])
def test_rows_the_grammar_decides_are_not_computed(request, which):
    """Where the grammar allows one token only (a forced key, `": "`), the executor is not
    asked for that logits row, on both executors; greedy output is unchanged."""
    engine = request.getfixturevalue(which)
    reference, _ = _reply(engine, "array_of_objects", forced=False)
    executor, forward, seen = engine.runner.executor, engine.runner.executor.forward, []

    def spy(chunks):
        rows = forward(chunks)
        seen.append((sum(c.n_logits - len(c.no_logits) for c in chunks),
                     sum(len(c.no_logits) for c in chunks), rows.shape[0]))
        return rows

    executor.forward = spy
    try:
        tokens, result = _reply(engine, "array_of_objects", forced=True)
    finally:
        del executor.forward
    assert tokens == reference
    check_valid("array_of_objects", result)
    assert all(wanted == got for wanted, _, got in seen)
    assert sum(skipped for _, skipped, _ in seen) > len(tokens) / 4
