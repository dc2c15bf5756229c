"""Prompt lookup's acceptance per match length: each draft judged at the length of the
match it extends, plain steps' free guesses as evidence, and what a reply may still spend
once it is behind its credit. Synthetic timings (the controller's decisions, not speed)."""

from __future__ import annotations

import pytest

from localchat.engine.runtime.speculative.acceptance import (
    MatchAcceptance, chain_tokens, expected_tokens)
from localchat.engine.runtime.speculative.adaptive import AdaptiveGamma
from localchat.engine.runtime.speculative.drafts import NgramDraft
from localchat.engine.runtime.speculative.state import Speculation

STEP = 0.1
PRIORS = NgramDraft.alpha_priors


def lookup_controller(beta: float = 0.5, gammas=(1, 2, 4, 8, 16)) -> AdaptiveGamma:
    """An engine's controller for prompt lookup with plain steps and β timed at `gammas`
    (rounds after 8-token matches: they teach the 8-token rate only)."""
    a = AdaptiveGamma(alpha_priors=PRIORS, c_prior=0.0)
    for _ in range(3):
        a.observe_plain(STEP)
    for g in gammas:
        a.observe_round(g, g, 0.0, (1 + beta * g) * STEP, key=8)
    return a


def test_a_chain_of_equal_rates_is_leviathans_expected_tokens():
    for alpha, gamma in ((0.6, 4), (0.9, 8), (0.3, 1), (1.0, 5)):
        assert chain_tokens([alpha] * 16, gamma) == pytest.approx(expected_tokens(alpha, gamma))
    assert chain_tokens([0.25, 1.0, 1.0], 3) == pytest.approx(1 + 3 * 0.25)


def test_each_draft_of_a_round_is_judged_at_the_match_it_extends():
    keys = MatchAcceptance(PRIORS)
    keys.observe(2, 4, 0)  # the first draft missed: judged at 2, the rest never judged
    keys.observe(2, 4, 2)  # kept at 2 and 3, missed at 4
    keys.observe(7, 4, 4)  # 7, then 8 and longer (judged as 8)
    assert {k: list(v) for k, v in keys._judged.items()} == {
        2: [(0, 1), (1, 1)], 3: [(1, 1)], 4: [(0, 1)], 7: [(1, 1)], 8: [(3, 3)]}
    assert keys.rate(2, 0.6) == pytest.approx((1 + 0.35 * 2) / (2 + 2))
    assert keys.rate(12, 0.6) == keys.rate(8, 0.6)  # judged as 8 tokens long
    assert keys.chain(3, 3, 0.6) == [keys.rate(3, 0.6), keys.rate(4, 0.6), keys.rate(5, 0.6)]
    assert not keys.established(2)
    keys.guess(2, True)
    keys.guess(2, True)
    assert keys.established(2)


def test_long_kept_runs_do_not_make_a_short_match_look_good():
    """Three quoting rounds after a 2-token match kept 15 drafts each; six chat replies'
    guesses after 2-token matches missed. With one α per match length that was 0.88
    (45 of 51 drafts kept) and chat replies drafted on it; judged at the match each draft
    extends, a 2-token match is kept 3 times in 9, an 8-token one 39 in 39."""
    keys = MatchAcceptance(PRIORS)
    for _ in range(3):
        keys.observe(2, 15, 15)
    for _ in range(6):
        keys.guess(2, False)
    assert keys.rate(2, 0.6) == pytest.approx((3 + 0.35 * 2) / (9 + 2))
    a = lookup_controller()
    a._keys = keys
    assert a.choose(2) == 0
    assert a.choose(8) >= 8  # where quoting's runs were judged, they count


def test_free_guesses_establish_a_match_length_that_no_round_was_priced_for():
    """After a 4-token match (prior 0.65) a fresh reply has no credit for a round, so without
    the plain steps' guesses it stayed unproven however often quoting replies passed it."""
    a = lookup_controller()
    spec = Speculation("ngram", a)
    assert spec.choose(99, 4) == 0
    for key in range(4, 9):  # a quote: each plain step's guess was the target's token
        spec.choose(99, key)
        spec.shadow(True)
        spec.record(0, 0, 0.0, STEP, STEP)
    assert Speculation("ngram", a).choose(99, 4) == 0  # one guess each: not yet established
    assert 0 < spec.choose(99, 4) <= 2  # this reply's own 5 right guesses vouch for one step
    for _ in range(3):
        for key in range(4, 9):
            a.observe_shadow(key, True)
    assert a.established(4) and a.alpha_for(4) > 0.85
    assert Speculation("ngram", a).choose(99, 4) >= 2


def test_missed_guesses_stop_the_probes_after_a_match_length():
    """Probing after one-token matches (prior 0.25) cost γ 1 rounds in replies that kept
    nothing; once their guesses show no gain even at an optimistic α, none is probed."""
    a = lookup_controller(beta=0.6)
    for _ in range(16):
        a.observe_shadow(1, False)
    assert not any(a.choose(1) for _ in range(300))
    fresh = lookup_controller(beta=0.6)
    assert any(fresh.choose(1) for _ in range(300))  # unmeasured: probed now and then


def test_a_reply_behind_its_credit_drafts_only_what_it_may_still_lose():
    """Quoting established 3-token matches at α 0.9, and a chat reply after it drafted
    there again and again. Once a reply has lost more than its credit, its rounds are
    priced as unproven ones (a strong match may still spend its one step)."""
    a = lookup_controller()
    for _ in range(8):
        for key in range(3, 9):
            a.observe_shadow(key, True)
    spec = Speculation("ngram", a)
    spec.credit = 0.2
    assert spec.choose(99, 3) > 0
    spec.credit = -0.1
    assert spec.choose(99, 3) == 0
    assert 0 < spec.choose(99, 8) <= 2  # 0.9 of a step to lose at β 0.5
