"""The controller's decisions on the real bundled model with injected timings: each forward
pass advances a fake clock by a cost model (a bandwidth-bound target, or a compute-bound
one), so what is asserted is the controller's decision and its measured c, never speed."""

from __future__ import annotations

import pytest

from helpers.fake_clock import Clock, clocked_with_draft, tokens_of
from helpers.replies import reply_tokens

from localchat.bench.speculative import SHORT, SHORT_TOKENS, TASKS
from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
LONG_REPLY = ("Write a Python function that reverses a string, then explain it line by line "
              "and give three examples of calling it.")
REPEAT = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"

# drafted replies are compared with plain ones: exact batching keeps their bits
EXACT = dict(ctx_size=1024, threads=2, exact_batching=True)


def generate(engine, prompt: str, n: int) -> tuple[list[int], dict | None]:
    return reply_tokens(engine, prompt, n)


@pytest.mark.slow
def test_a_cheap_draft_on_a_bandwidth_bound_target_is_on_and_c_is_drafting_alone(exact_engine):
    """The bundled model drafting for itself, timed as a 1-unit target step and a
    0.1-unit draft step (plus a little per token): c must come out near 0.1 on every
    round -- the draft's catch-up over the prompt is a separate pass, not drafting."""
    engine = exact_engine
    # long enough for the 8 rounds a measured speedup needs (state.MIN_MEASURED_ROUNDS)
    plain, _ = generate(engine, LONG_REPLY, 200)
    eng = open_engine(EngineConfig("default", **EXACT, draft="default"))
    try:
        clock = Clock()
        runner = eng.runner
        runner.clock = clock
        clock.charge(runner.executor, lambda ch: 1.0 + 0.002 * tokens_of(ch))
        drafted = clock.charge(eng.draft.executor, lambda ch: 0.1 + 0.001 * tokens_of(ch))
        tokens, stats = generate(eng, LONG_REPLY, 200)
        assert tokens == plain
        assert stats["acceptance_rate"] == 1.0
        a = runner.speculator.adaptive
        assert all(0.09 < c < 0.12 for c in a._c_all), list(a._c_all)
        assert a.gamma >= 4 and stats["predicted_speedup"] > 3
        assert stats["measured_speedup"] > 2.5 and stats["switched_off"] == 0
        # one catch-up pass over the prompt (no logits), then drafting passes of 1-2 tokens
        assert drafted[0][0][1] == 0 and drafted[0][0][0] > 10
        assert all(n <= 2 for p in drafted[1:] for n, logits in p if logits)
    finally:
        eng.close()


@pytest.mark.slow
def test_auto_on_a_compute_bound_target_stays_within_noise_of_plain():
    """Compute-bound (the bundled model on a CPU): a pass costs its token count, so no draft
    can pay. auto (prompt lookup) must keep this request at >= 0.95x of plain decoding as
    measured on the injected clock, with plain decoding's exact output."""
    prompts = (REPEAT, "List the days of the week, one per line, twice.")
    costs = {}
    for draft in ("none", "auto"):
        eng = open_engine(EngineConfig("default", **EXACT, draft=draft))
        try:
            clock = Clock()
            eng.runner.clock = clock
            clock.charge(eng.runner.executor, lambda ch: float(tokens_of(ch)))
            for prompt in prompts:
                start = clock.now
                tokens, stats = generate(eng, prompt, 60)
                costs[draft, prompt] = (clock.now - start, tokens, stats)
        finally:
            eng.close()
    for prompt in prompts:
        plain_s, expected, _ = costs["none", prompt]
        auto_s, tokens, stats = costs["auto", prompt]
        assert tokens == expected
        assert stats["source"] == "ngram" and stats["proposed"] > 0  # it did probe
        assert plain_s / auto_s >= 0.95, (plain_s, auto_s, stats)


def test_the_drafts_prompt_pass_lands_in_the_prefill_step_not_in_decoding(exact_engine):
    """The draft model reads the prompt in the step that ends the target's prefill (TTFT,
    as llama.cpp's speculative example does), so the first drafted round drafts alone: a
    catch-up there was counted as decode time, and cost a long-prompt reply 20 % of its
    measured speedup. The output stays plain decoding's."""
    engine = exact_engine
    prompt = "Write a Python function that reverses a string, with a docstring."
    plain, _ = generate(engine, prompt, 16)
    eng = open_engine(EngineConfig("default", **EXACT, draft="default"))
    try:
        target, drafted, when = clocked_with_draft(eng, lambda ch: 1.0 + 0.002 * tokens_of(ch),
                                                   lambda ch: 0.1 + 0.001 * tokens_of(ch))
        generate(eng, "Hi", 4)  # times the target's step: the next request drafts at once
        seen, before = len(target), len(drafted)
        tokens, stats = generate(eng, prompt, 16)
        assert tokens == plain
        assert stats["proposed"] > 0 and stats["acceptance_rate"] == 1.0
        passes, when = drafted[before:], when[before:]
        # the draft's first pass is over the prompt, without logits, before the target's
        # prefill pass (the same step)
        (n_prompt, logits), = passes[0]
        assert logits == 0 and n_prompt > 10 and when[0] == seen
        assert target[seen][0][0] > 2  # that target pass is the prefill (a prefix of it cached)
        # every later draft pass drafts: 1-2 tokens with a logits row, no catch-up
        assert all(n <= 2 and lg == 1 for p in passes[1:] for n, lg in p), passes
    finally:
        eng.close()


def test_with_drafting_off_the_drafts_prompt_pass_still_lands_in_prefill(exact_engine):
    """A draft as slow as the target (compute-bound): the controller keeps drafting off and
    probes now and then. The draft still reads each prompt in the prefill step, so a probe
    never stalls decoding with a catch-up over the prompt (deep-2's quote task ran at 0.55x
    with drafting off because of that)."""
    engine = exact_engine
    prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"
    plain, _ = generate(engine, prompt, 40)
    eng = open_engine(EngineConfig("default", **EXACT, draft="default"))
    try:
        target, drafted, when = clocked_with_draft(eng, lambda ch: float(tokens_of(ch)),
                                                   lambda ch: float(tokens_of(ch)))
        generate(eng, "Write a haiku about the sea.", 40)  # probes find no gain: off
        assert eng.runner.speculator.adaptive.predicted(eng.runner.speculator.adaptive.peak()) < 1.0
        seen, before = len(target), len(drafted)
        tokens, stats = generate(eng, prompt, 40)
        assert tokens == plain
        passes, when = drafted[before:], when[before:]
        (n_prompt, logits), = passes[0]
        assert logits == 0 and n_prompt > 10 and when[0] == seen  # in the prefill step
        # any probe later drafts from a caught-up copy: no pass over the prompt again
        assert all(n < n_prompt for p in passes[1:] for n, _ in p), passes
    finally:
        eng.close()


# the short replies and the bench's chat prompts (64 tokens); by default one of each kind: a
# reply too short to pay for a probe, and replies where one probe is tried and not kept
QUICK_SHORT = (SHORT[0], TASKS["chat"][0], TASKS["chat"][4])


@pytest.mark.model  # loads the bundled model, a fresh engine per reply
@pytest.mark.parametrize("prompts", [pytest.param(QUICK_SHORT, id="three"), pytest.param(
    SHORT + TASKS["chat"], id="all", marks=pytest.mark.slow)])
def test_default_drafting_never_costs_a_short_one_shot_reply_on_a_compute_bound_target(prompts):
    """`run PROMPT -n 64` against `run --no-draft` (a fresh engine each, as a new process
    has), every pass charged its token count (no draft can pay): each reply decodes at >= 0.97x
    of plain decoding, the same tokens, and the reply's own_steps_speedup says what the clock
    says (drafting's cost counted in the run's own plain steps)."""
    def decode_cost(draft: str, prompt: str):
        eng = open_engine(EngineConfig("default", **EXACT, draft=draft))
        try:
            clock = Clock()
            eng.runner.clock = clock
            passes = clock.charge(eng.runner.executor, lambda ch: float(tokens_of(ch)))
            tokens, stats = generate(eng, prompt, SHORT_TOKENS)
        finally:
            eng.close()
        return sum(n for p in passes[1:] for n, _ in p), tokens, stats  # passes[0]: the prompt

    proposed = 0
    for prompt in prompts:
        plain_cost, plain, _ = decode_cost("none", prompt)
        cost, tokens, stats = decode_cost("auto", prompt)
        assert tokens == plain, prompt
        assert plain_cost / cost >= 0.97, (prompt, plain_cost, cost, stats)
        if stats["proposed"]:
            assert stats["own_steps_speedup"] == pytest.approx(plain_cost / cost, abs=0.005)
        proposed += stats["proposed"]
    assert proposed > 0  # drafting was tried, not only kept off
