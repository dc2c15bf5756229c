"""Constraints compose with every way of drafting: for generated schemas and grammars
(hypothesis) x ordinary prompts x {the grammar's forced tokens as drafts, auto drafting
(the default path), prompt lookup, a draft model} x {alone, 4 at once} x both executors,
greedy output is identical to constrained decoding without any drafts, no request fails,
and a reply that ends with "stop" is valid against its schema. A small budget by default;
`-m slow` runs the wide one and prints how many combinations it tried."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from localchat.engine.config import DraftChoice
from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import Message, Request, SamplingParams
from localchat.engine.constraint import Constraint
from helpers.constraint_strategies import CONSTRAINT, PROMPTS

pytestmark = pytest.mark.model  # the engines load the bundled model
GREEDY = SamplingParams(temperature=0.0)
MAX_TOKENS = 60
# drafting configurations, each against the reference (no draft, no forced drafts)
DRAFTING = {
    "forced": {},  # no draft source: only the grammar's forced tokens go as drafts
    "auto": {"draft": "auto"},  # what `run`, the chat and `serve` use unless told otherwise
    "lookup": {"draft": DraftChoice("ngram", tokens=4)},
    "model": {"draft": DraftChoice("model", "default", 3)},  # the bundled model drafting
}
EXECUTORS = {
    # llama.cpp keeps a row's bits batched only with exact batching (docs/architecture.md)
    "llama.cpp": {"exact_batching": True, "parallel": 4},
    "torch": {"engine": "torch", "kv_memory": 4096 * 23040},
}
TRIED: dict[str, int] = {"combinations": 0}


class Engines:
    """Engines loaded on first use, one per (executor, drafting), closed at the end."""

    def __init__(self) -> None:
        self.loaded: dict[tuple[str, str], object] = {}

    def get(self, executor: str, drafting: str):
        key = (executor, drafting)
        if key not in self.loaded:
            options = {**EXECUTORS[executor], **DRAFTING.get(drafting, {})}
            engine = open_engine(EngineConfig("default", threads=2, ctx_size=512, **options))
            engine.forced_drafts = drafting != "reference"
            self.loaded[key] = engine
        return self.loaded[key]

    def close(self) -> None:
        for engine in self.loaded.values():
            engine.close()


@pytest.fixture(scope="module")
def engines():
    pool = Engines()
    yield pool
    pool.close()
    print(f"\nconstraint x drafting: {TRIED['combinations']} combinations tried, none failed "
          "or differed")


def reply(engine, prompt: str, constraint: Constraint) -> tuple[list[int], str, str]:
    tokens, last = [], None
    for event in engine.generate(Request(messages=[Message("user", prompt)], sampling=GREEDY,
                                         max_tokens=MAX_TOKENS, constraint=constraint)):
        tokens += getattr(event, "token_ids", ())
        last = event
    return tokens, last.text, last.finish_reason


def at_once(engine, prompts: list[str], constraint: Constraint) -> list:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: reply(engine, p, constraint), prompts))


def check_valid(constraint: Constraint, text: str, finish: str) -> None:
    """A reply reported as complete is what the constraint asked for."""
    if finish != "stop" or constraint.kind not in ("json_schema", "json_object"):
        return
    value = json.loads(text)
    schema = json.loads(constraint.text) if constraint.kind == "json_schema" else {"type": "object"}
    jsonschema.validate(value, schema)


def differential(engines: Engines, executor: str, drafting: list[str], constraint: Constraint,
                 prompts: list[str]) -> None:
    reference = [reply(engines.get(executor, "reference"), p, constraint) for p in prompts]
    for tokens, text, finish in reference:
        check_valid(constraint, text, finish)
    for name in drafting:
        engine = engines.get(executor, name)
        alone = reply(engine, prompts[0], constraint)
        assert alone == reference[0], (executor, name, "alone", constraint, prompts[0])
        batched = at_once(engine, prompts, constraint)
        for got, want, prompt in zip(batched, reference, prompts):
            assert got == want, (executor, name, "4 at once", constraint, prompt)
        TRIED["combinations"] += 2


def _case():
    return st.tuples(CONSTRAINT, st.lists(st.sampled_from(PROMPTS), min_size=4, max_size=4))


QUICK = settings(max_examples=2, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture,
                                        HealthCheck.too_slow])
WIDE = settings(QUICK, max_examples=40, derandomize=False)


@pytest.mark.parametrize("executor", list(EXECUTORS))
@QUICK
@given(case=_case())
def test_constrained_greedy_output_is_the_same_with_every_drafting(engines, executor, case):
    constraint, prompts = case
    differential(engines, executor, ["auto", "model"], constraint, prompts)


@pytest.mark.slow
@pytest.mark.parametrize("executor", list(EXECUTORS))
@WIDE
@given(case=_case())
def test_constrained_greedy_output_is_the_same_with_every_drafting_wide(engines, executor, case):
    constraint, prompts = case
    differential(engines, executor, list(DRAFTING), constraint, prompts)


# The schema of the report (issue 52): drafting once failed it with a refused token
TAGS = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                         "age": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                                  "maxItems": 3}},
        "required": ["name", "age", "tags"]}


@pytest.mark.parametrize("executor", ["llama.cpp", pytest.param("torch", marks=pytest.mark.slow)])
def test_the_reported_schema_with_default_drafting(engines, executor):
    """Before the fix, 1 of these 8 replies failed on each executor ("the constraint refused
    a token"): prompt lookup, having seen earlier replies, drafted the closing bracket and
    the end token; the mask's rollback then undid one token too many."""
    constraint = Constraint.json_schema(TAGS)
    prompts = ["Invent a person.", "Describe the sea.", "Tell me about cats.", "Who are you?",
               "Write a poem.", "List tags.", "Give me JSON.", "Describe a city."]
    reference = [reply(engines.get(executor, "reference"), p, constraint) for p in prompts]
    engine = engines.get(executor, "lookup")
    assert [reply(engine, p, constraint) for p in prompts] == reference


def test_masks_leave_the_matcher_where_it_was_after_drafts_past_the_end():
    """The cause of the failure above, exactly: drafts that close the object and then end
    the reply. llguidance records no token for an end taken after the grammar completed,
    so the masks' rollback must not count it."""
    from localchat.engine.executors.llamacpp_vocab import LlamaCppVocabulary
    from localchat.engine.runtime.guide import Guide, grammar_for, step_masks
    from localchat.models.specs import resolve_model

    vocab = LlamaCppVocabulary.vocab_only(str(resolve_model("default")))
    try:
        tokenizer = vocab.constraint_tokenizer()
        constraint = Constraint.json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                                             "required": ["a"]})
        guide = Guide.start(tokenizer, grammar_for(constraint), constraint)
        guide.follow(vocab.tokenize_text('{"a": 5'))
        close = vocab.tokenize_text("}")
        drafts = close + [tokenizer.eos_token]
        assert guide.valid_prefix(drafts) == len(drafts)
        masks = step_masks([(guide, 0, drafts)], len(drafts) + 1, tokenizer.vocab_size)
        assert guide.valid_prefix(drafts) == len(drafts)  # the state before the drafts
        assert bool(masks[0][close[0]]) and bool(masks[1][tokenizer.eos_token])
        for row in (1, 2):  # only an end may follow
            allowed = masks[row].nonzero()[0].tolist()
            assert allowed and all(vocab.is_end_of_generation(t) for t in allowed)
    finally:
        vocab.close()


def test_masks_past_a_position_do_not_outlive_the_drafts_that_reached_it():
    """Found by the wide test (lookup, 4 at once): drafts opened an object where the reply
    went on with an array, and '",' was then refused inside the array. llguidance keeps a
    mask computed at a position it is rolled back from and hands it out when other tokens
    reach that position; the drafts' rows are masked on a copy instead."""
    from localchat.engine.executors.llamacpp_vocab import LlamaCppVocabulary
    from localchat.engine.runtime.guide import Guide, grammar_for, step_masks
    from localchat.models.specs import resolve_model

    vocab = LlamaCppVocabulary.vocab_only(str(resolve_model("default")))
    try:
        tokenizer = vocab.constraint_tokenizer()
        inner = {"type": "array", "items": {"type": "string", "maxLength": 2}, "minItems": 2,
                 "maxItems": 2}
        constraint = Constraint.json_schema({
            "type": "object", "required": [], "properties": {"tags": {
                "type": "object", "properties": {"count": inner}, "required": [],
                "additionalProperties": False}}})
        grammar = grammar_for(constraint)

        def guide_after(text):
            guide = Guide.start(tokenizer, grammar, constraint)
            guide.follow(vocab.tokenize_text(text))
            return guide

        def allowed(guide):
            return step_masks([(guide, 0, [])], 1, tokenizer.vocab_size)[0]

        prefix = '{"name": "Ann", "tags.items'
        opened = vocab.tokenize_text('": {"')  # the drafts: an object
        went_on = vocab.tokenize_text('": ["')  # what the reply wrote: an array
        assert opened != went_on
        guide = guide_after(prefix)
        step_masks([(guide, 0, opened)], len(opened) + 1, tokenizer.vocab_size)
        for token in went_on:
            assert guide.consume(token)
        straight = guide_after(prefix + '": ["')
        assert (allowed(guide) == allowed(straight)).all()
        assert allowed(guide)[vocab.tokenize_text('a",')[-1]]  # a string may close in the array
    finally:
        vocab.close()
