"""The batch controller against synthetic timings: γ for several sequences at once from the
target's measured pass cost by token count (not one sequence's c and β), off where a full
batch leaves no compute to verify drafts with, and a guard on the batch's measured
throughput that turns drafting off within a few steps and probes back with backoff."""

from __future__ import annotations

import pytest

from localchat.engine.runtime.speculative.adaptive import expected_tokens
from localchat.engine.runtime.speculative.batch import BatchGamma, BatchPlan, CostCurve
from localchat.engine.runtime.speculative.state import FLOOR


def plan(b: int, alpha: float = 1.0, limit: int = 99) -> BatchPlan:
    return BatchPlan(chains=[[alpha] * 16] * b, limits=[limit] * b, sampling=b, base_tokens=b)


def drive(bg: BatchGamma, steps: int, b: int, target, draft_row, *, accept=lambda g: g,
          alpha: float = 1.0, c: float = 0.1) -> list[int]:
    """`steps` decode steps of b sequences timed by target(tokens) and draft_row(rows)
    seconds per draft pass; accept(γ) drafts kept per sequence. Returns each step's γ."""
    choices = []
    for _ in range(steps):
        p = plan(b, alpha)
        g = bg.choose(p, c)
        choices.append(g)
        gammas = [g] * b
        produced = b * (accept(g) + 1) if g else b
        bg.observe(p, b + b * g, gammas, produced, g * draft_row(b) if g else 0.0,
                   target(b + b * g))
    return choices


def compute_bound(tokens: int) -> float:  # every token costs the same: a full CPU
    return 0.01 * tokens


def bandwidth_bound(tokens: int) -> float:  # reading the weights dominates
    return 0.1 + 0.001 * tokens


def test_cost_curve_interpolates_and_extrapolates_along_the_chord():
    curve = CostCurve()
    assert curve.at(4, 0.1) is None
    curve.observe(4, 0.4)
    assert curve.at(8, 0.05) == pytest.approx(0.6)  # one size: the slope given
    for s in (0.4, 9.0, 0.4):  # a stall: medians
        curve.observe(4, s)
    curve.observe(12, 0.8)
    assert curve.at(8, 0.0) == pytest.approx(0.6)  # between: linear
    assert curve.at(20, 0.0) == pytest.approx(0.8 + 8 * 0.05)  # beyond: the chord 4 -> 12
    assert curve.at(2, 0.0) == pytest.approx(0.3)


def test_compute_bound_batch_probes_once_then_stays_off():
    """4 sequences on a target whose pass costs its token count: no γ can pay, even with
    every draft accepted and nearly free drafting; the one probe measures that, and no
    more rounds follow (each would cost the draft a catch-up over every sequence)."""
    bg = BatchGamma(probe_every=16, probe_max=64)
    choices = drive(bg, 300, 4, compute_bound, lambda rows: 0.001 * rows)
    assert choices[:3] == [0, 0, 0]  # the plain pass at 4 tokens is timed first
    assert [i for i, g in enumerate(choices) if g] == [3]
    assert bg.gain(plan(4), 1, 0.0) < 1.0


def test_a_load_that_raises_the_plain_step_turns_a_batch_back_on():
    """Off from measured costs; then the plain 4-token pass is measured slower (another
    process, say) while the stored verify point is not: the prediction, re-made every
    step, turns drafting back on, and the verify pass is measured again."""
    bg = BatchGamma()
    drive(bg, 30, 4, compute_bound, lambda rows: 0.001 * rows)
    assert bg.choose(plan(4), 0.1) == 0
    for _ in range(16):
        bg.observe(plan(4), 4, [0] * 4, 4, 0.0, 0.5)
    assert bg.choose(plan(4), 0.1) > 0


def test_bandwidth_bound_batch_drafts_at_the_peak_of_the_batch_gain():
    bg = BatchGamma()
    choices = drive(bg, 60, 4, bandwidth_bound, lambda rows: 0.01)
    assert all(choices[4:])  # on once timed
    gains = {g: bg.gain(plan(4), g, 0.1) for g in range(1, bg.gamma_max + 1)}
    assert choices[-1] == max(gains, key=gains.get) and gains[choices[-1]] > 2


def test_a_fuller_batch_gets_a_smaller_gamma_than_one_sequence():
    """The same target timed alike, α 0.8: the verify cost that four sequences' drafts add
    is four times one sequence's, so the peak γ is smaller at 4 (possibly 0) than at 1."""
    def target(tokens):  # flat to 4 tokens (bandwidth), then compute per token
        return 0.1 + 0.02 * max(0, tokens - 4)

    bg = BatchGamma()
    for tokens in range(1, 70):
        for _ in range(3):
            bg.target.observe(tokens, target(tokens))
    for rows in (1, 4):
        bg.draft.observe(rows, 0.01)
    one, _ = bg.peak(plan(1, alpha=0.8), 0.1)
    four, gain4 = bg.peak(plan(4, alpha=0.8), 0.1)
    assert four < one
    # the gain is the formula's: tokens per pass over the pass's time, against plain
    expected = 4 * expected_tokens(0.8, four) / (four * 0.01 + target(4 + 4 * four)) \
        * target(4) / 4
    assert gain4 == pytest.approx(expected)


def test_measured_batch_loss_turns_drafting_off_within_4_steps_then_probes_with_backoff():
    """The prediction says gain (α believed 1) but the batch's drafts are all rejected: the
    measured aggregate rate is below the floor, so drafting stops after 4 drafted steps and
    each try back waits twice as long."""
    bg = BatchGamma(probe_every=16, probe_max=64)
    choices = drive(bg, 300, 4, bandwidth_bound, lambda rows: 0.02, accept=lambda g: 0)
    first = next(i for i, g in enumerate(choices) if g)
    assert choices[first:first + 4] == [choices[first]] * 4 and choices[first + 4] == 0
    drafted = [i for i, g in enumerate(choices) if g]
    assert len(drafted) < 0.15 * len(choices)
    assert bg.switched_off >= 3
    holds = [j - i for i, j in zip(drafted, drafted[1:]) if j - i > 1]
    assert holds == sorted(holds) and holds[-1] == 64 + 1


def test_a_batch_measured_above_the_floor_keeps_drafting():
    bg = BatchGamma()
    choices = drive(bg, 100, 4, bandwidth_bound, lambda rows: 0.01, accept=lambda g: g // 2)
    assert bg.switched_off == 0 and sum(1 for g in choices if g) > 90
    tokens = sum(t for t, _ in bg.guard_for(plan(4)).recent)
    seconds = sum(s for _, s in bg.guard_for(plan(4)).recent)
    assert tokens / seconds > FLOOR * 4 / bandwidth_bound(4)
