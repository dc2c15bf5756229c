"""Speculative decoding's acceptance rule and γ adaptation, on toy distributions where
the exact answer is known (the real-model checks are in test_speculative_engine.py)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from localchat.engine.runtime.speculative.adaptive import AdaptiveGamma, expected_speedup
from localchat.engine.runtime.speculative.rule import accept_drafts, accept_greedy

from helpers.stats import chi_square_p_value

V = 5  # a small vocabulary, so every outcome is seen many times


def markov(seed: int, sharp: float) -> np.ndarray:
    """A toy language model: next-token distribution given the previous token [V, V]."""
    logits = np.random.default_rng(seed).standard_normal((V, V)) * sharp
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def pick(q: np.ndarray, g: np.random.Generator) -> int:
    return int(g.choice(len(q), p=q))


def speculate(target: np.ndarray, draft: np.ndarray, first: int, gamma: int, length: int,
              g: np.random.Generator) -> list[int]:
    """Generate `length` tokens after `first` with drafts of γ, like the engine does."""
    out = [first]
    while len(out) <= length:
        drafts, qs = [], []
        for _ in range(gamma):
            q = draft[(drafts or out)[-1]]
            qs.append(q)
            drafts.append(pick(q, g))
        context = out + drafts
        p = np.stack([target[context[len(out) - 1 + i]] for i in range(gamma + 1)])
        n, nxt = accept_drafts(p, np.stack(qs), drafts, g)
        out += drafts[:n] + [nxt]
    return out[1:length + 1]


@pytest.mark.parametrize("gamma", [1, 3])
def test_speculative_sampling_has_the_targets_distribution(gamma):
    """χ² over the joint distribution of the first two generated tokens (25 outcomes):
    a draft that disagrees a lot with the target must not bias the output."""
    target, draft = markov(1, 1.5), markov(2, 1.5)
    g = np.random.default_rng(3)
    n = 6000
    observed = Counter(tuple(speculate(target, draft, 0, gamma, 2, g)) for _ in range(n))
    expected = {(a, b): float(target[0, a] * target[a, b]) for a in range(V) for b in range(V)}
    p_value = chi_square_p_value(observed, expected, n)
    assert p_value > 1e-3, f"speculative output is not distributed as the target (p={p_value:.2g})"


def test_the_chi_square_check_catches_a_biased_sampler():
    """The same check fails when tokens come from the draft unverified."""
    target, draft = markov(1, 1.5), markov(2, 1.5)
    g = np.random.default_rng(3)
    n = 6000
    observed = Counter()
    for _ in range(n):
        a = pick(draft[0], g)
        observed[(a, pick(draft[a], g))] += 1
    expected = {(a, b): float(target[0, a] * target[a, b]) for a in range(V) for b in range(V)}
    assert chi_square_p_value(observed, expected, n) < 1e-6


def test_self_draft_accepts_everything():
    target = markov(1, 1.5)
    g = np.random.default_rng(0)
    for _ in range(200):
        drafts = [pick(target[0], g) for _ in range(4)]
        p = target[[0, *drafts]]
        q = target[[0, *drafts[:-1]]]
        assert accept_drafts(p, q, drafts, g)[0] == 4


def test_zero_draft_probability_is_a_rejection_and_residual_excludes_the_draft():
    p = np.array([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = np.array([[0.0, 0.5, 0.5]])
    g = np.random.default_rng(0)
    for _ in range(50):
        n, nxt = accept_drafts(p, q, [0], g)  # q(0) = 0: never kept, even though p(0) = 0.5
        assert n == 0 and nxt == 0  # residual max(0, p - q) = [0.5, 0, 0]
    for _ in range(50):  # deterministic draft (prompt lookup): residual is p without the draft
        n, nxt = accept_drafts(np.array([[0.0, 0.5, 0.5], [1, 0, 0.0]]), None, [0], g)
        assert n == 0 and nxt in (1, 2)


def test_greedy_keeps_drafts_while_they_match_the_argmax():
    assert accept_greedy([4, 7, 9, 1], [4, 7, 2]) == (2, 9)
    assert accept_greedy([4, 7, 9, 1], [4, 7, 9]) == (3, 1)
    assert accept_greedy([4, 7], [5]) == (0, 4)


def test_expected_speedup_is_leviathans_formula():
    alpha, gamma, c = 0.8, 4, 0.1
    assert expected_speedup(alpha, gamma, c) == pytest.approx(
        (1 - alpha ** 5) / ((1 - alpha) * (gamma * c + 1)))
    assert expected_speedup(0.9, 3, 0.0) == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    assert expected_speedup(0.3, 4, 0.5) < 1  # a poor draft slows things down


def test_adaptation_picks_a_long_gamma_for_a_good_cheap_draft():
    a = AdaptiveGamma()
    assert a.choose() == 0  # first a plain step, to time the target
    a.observe_plain(0.05)
    for _ in range(80):  # the CPU-like prior starts it off; its probes find the draft good
        g = a.choose()
        if g:
            a.observe_round(g, g, draft_s=0.005 * g, verify_s=0.055)  # accepts all, c = 0.1
        else:
            a.observe_plain(0.05)
    assert a.choose() >= 5 and a.alpha > 0.95 and a.c == pytest.approx(0.1, rel=0.05)
    assert a.predicted() > 3


def test_adaptation_switches_off_a_useless_draft_and_probes_again():
    a = AdaptiveGamma(probe_every=8)
    a.observe_plain(0.05)
    choices = []
    for _ in range(60):
        g = a.choose()
        choices.append(g)
        if g:
            a.observe_round(g, 0, draft_s=0.03 * g, verify_s=0.06)  # never accepted, c = 0.6
        else:
            a.observe_plain(0.05)
    tail = choices[20:]
    assert tail.count(0) >= 0.8 * len(tail)  # mostly off ...
    assert any(tail)  # ... but it keeps probing
    assert a.predicted(1) < 1


def test_fixed_gamma_does_not_adapt():
    a = AdaptiveGamma(fixed=3)
    assert a.choose() == 0
    a.observe_plain(0.05)
    for _ in range(10):
        assert a.choose() == 3
        a.observe_round(3, 0, 0.1, 0.1)
    assert math.isfinite(a.alpha)


def _sequence(seq_id: int, tokens: list[int], n_prompt: int):
    from localchat.engine.runtime.sequence import Sequence

    return Sequence(seq_id, list(tokens), n_prompt)


def test_prompt_lookup_takes_the_longest_match_and_its_length_is_the_evidence():
    from localchat.engine.runtime.speculative.drafts import NgramDraft, longest_match

    assert longest_match([1, 2, 3, 4, 9, 2, 3, 4], 16) == (3, [9, 2, 3, 4])
    assert longest_match([7, 1, 8, 2, 9, 1], 16) == (1, [8, 2, 9, 1])  # only a one-token match
    assert longest_match([1, 2, 3], 16) == (0, [])
    draft = NgramDraft()
    assert draft.lookup([1, 2, 3, 5, 6, 3]) == (1, [5, 6, 3])
    assert draft.lookup([9, 2, 3, 5, 6, 2, 3]) == (2, [5, 6, 2, 3])
    seq = _sequence(0, [1, 2, 3, 5, 6, 7, 1, 2, 3], 3)
    assert draft.evidence(seq) == 3
    assert draft.propose([(seq, 2)]) == [([5, 6], None)]  # at most γ
    assert draft.evidence(_sequence(1, [1, 2, 3, 4], 2)) is False  # no match: nothing to draft


def test_the_acceptance_is_learned_per_match_length_and_shared_by_requests():
    """A long match that is always accepted turns speculation on for long matches only."""
    from localchat.engine.runtime.speculative.drafts import NgramDraft

    a = AdaptiveGamma(alpha_priors=NgramDraft.alpha_priors)
    a.observe_plain(0.05)
    for _ in range(40):
        for key, accepts in ((8, True), (1, False)):
            g = a.choose(key)
            if g:
                a.observe_round(g, g if accepts else 0, draft_s=0.0, verify_s=0.05 * (1 + 0.3 * g),
                                key=key)
            else:
                a.observe_plain(0.05)
    assert a.choose(8) >= 5 and a.alpha_for(8) > 0.95
    assert a.choose(1) == 0 and a.alpha_for(1) < 0.2


def test_finished_replies_feed_later_requests_drafts():
    """A regenerated reply finds the earlier one (not in its prompt) in the suffix store."""
    from localchat.engine.runtime.speculative.drafts import NgramDraft

    draft = NgramDraft()
    prompt = [100, 101, 102]
    first = _sequence(0, prompt + [7, 8, 9, 10, 11, 12], len(prompt))
    draft.evidence(first)
    assert draft.lookup(prompt + [7, 8]) == (0, [])  # nothing stored yet: no match
    draft.retain(set())  # the first reply has finished
    assert draft.lookup(prompt + [7, 8]) == (2, [9, 10, 11, 12])
    assert draft.lookup(prompt + [5, 7, 8, 9]) == (3, [10, 11, 12])


def test_the_suffix_store_forgets_when_full():
    from localchat.engine.runtime.speculative.drafts import NgramDraft

    draft = NgramDraft()
    draft.HISTORY_TOKENS = 10
    draft._remember([1, 2, 3, 4, 5, 6])
    draft._remember([20, 21, 22, 23, 24, 25])  # over the limit: the store starts again
    assert draft.lookup([0, 1, 2]) == (0, [])
    assert draft.lookup([0, 21, 22]) == (2, [23, 24, 25])
