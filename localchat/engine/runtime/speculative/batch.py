"""One γ for a step's speculating sequences when several run at once: the predicted gain of
the whole batch's throughput from costs measured at its size (the target's pass by token
count, a draft pass by rows), and a guard on the batch's *measured* throughput that turns
drafting off for that batch size quickly and probes back with backoff.

Why: a single sequence leaves a CPU's compute idle, so verifying γ+1 tokens costs little
more than one; B sequences already fill it, so B·(γ+1) tokens cost far more than B (4
requests on deep-8: 0.87x with the single-sequence model)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from localchat.engine.runtime.speculative.acceptance import chain_tokens
from localchat.engine.runtime.speculative.state import FLOOR, JUDGE_AFTER, JUDGE_WINDOW


class CostCurve:
    """Seconds of a pass by its size (tokens, or rows): the median of recent timings at each
    size measured, linear between measured sizes, beyond the largest along the chord from
    the smallest (a CPU's cost per token only grows with size), or along `slope` per unit
    where one size is measured."""

    def __init__(self, window: int = 16) -> None:
        self.window = window
        self._at: dict[int, deque] = {}

    def observe(self, size: int, seconds: float) -> None:
        self._at.setdefault(size, deque(maxlen=self.window)).append(seconds)

    def measured(self) -> dict[int, float]:
        return {n: median(v) for n, v in sorted(self._at.items())}

    def count(self, size: int) -> int:
        return len(self._at.get(size, ()))

    def at(self, size: int, slope: float) -> float | None:
        """The estimated seconds at `size`; None before any size is measured."""
        points = self.measured()
        if not points:
            return None
        if size in points:
            return points[size]
        sizes = list(points)
        lo = max((n for n in sizes if n < size), default=None)
        hi = min((n for n in sizes if n > size), default=None)
        if lo is not None and hi is not None:
            return points[lo] + (points[hi] - points[lo]) * (size - lo) / (hi - lo)
        if hi is not None:  # below every measured size: at most the smallest's cost
            return points[hi] * max(size, 1) / hi if len(sizes) == 1 else \
                max(0.0, points[hi] - self._chord(points) * (hi - size))
        if len(sizes) > 1:
            slope = self._chord(points)
        return points[lo] + slope * (size - lo)

    @staticmethod
    def _chord(points: dict[int, float]) -> float:
        first, last = min(points), max(points)
        return max(0.0, (points[last] - points[first]) / (last - first))


@dataclass
class BatchPlan:
    """A step's sequences as the batch controller sees them: each speculating one's
    acceptance (the chance each draft is kept once all before it were, see
    AdaptiveGamma.acceptance) and γ limit (room left), how many rows sample a token (the
    batch size the guard keys on), the step's tokens without drafts."""

    chains: list[list[float]]
    limits: list[int]
    sampling: int
    base_tokens: int


@dataclass
class BatchGamma:
    """γ for batched steps (the engine's, shared by its requests): choose() from the
    predicted batch gain, observe() each pure decode step's timings."""

    gamma_max: int = 16
    plain_first: int = 3  # plain steps timed at a batch's size before it drafts
    probe_every: int = 16  # steps held off after the first measured loss at a size
    probe_max: int = 256  # each loss measured again doubles the hold, up to this
    verify_extra: float = 0.5  # extra tokens' cost ÷ the plain pass's per token, a prior
    target: CostCurve = field(default_factory=CostCurve)  # target pass by tokens
    draft: CostCurve = field(default_factory=CostCurve)  # one draft pass by rows
    _guards: dict = field(default_factory=dict)  # batch size -> _Guard

    def gain(self, plan: BatchPlan, gamma: int, c: float,
             beta_s: float | None = None) -> float | None:
        """Predicted tokens/s of the step with γ drafts each ÷ without; None until the
        target is timed. c: a draft pass's cost ÷ a target pass's at the same rows
        (until drafts are timed), beta_s: seconds per extra verified token (until a
        second size is timed; None: verify_extra × the plain pass's cost per token)."""
        plain_s = self.target.at(plan.base_tokens, 0.0)
        if not plain_s:
            return None
        if beta_s is None:
            beta_s = self.verify_extra * plain_s / max(plan.base_tokens, 1)
        gammas = [min(gamma, limit) for limit in plan.limits]
        rows = sum(1 for g in gammas if g)
        if not rows:
            return 1.0
        extra = sum(chain_tokens(chain, g) - 1 for chain, g in zip(plan.chains, gammas) if g)
        draft_s = self.draft.at(rows, 0.0) if self.draft.count(rows) else \
            c * (self.target.at(rows, beta_s) or plain_s)
        verify_s = self.target.at(plan.base_tokens + sum(gammas), beta_s)
        drafted_s = max(gammas) * draft_s + verify_s
        return (plan.sampling + extra) / drafted_s * plain_s / plan.sampling

    def peak(self, plan: BatchPlan, c: float,
             beta_s: float | None = None) -> tuple[int, float]:
        """(γ ≥ 1 with the highest predicted gain, that gain); (0, 1.0) until timed."""
        gains = {g: self.gain(plan, g, c, beta_s) for g in range(1, self.gamma_max + 1)}
        if None in gains.values():
            return 0, 1.0
        best = max(gains, key=gains.get)
        return best, gains[best]

    def choose(self, plan: BatchPlan, c: float, beta_s: float | None = None) -> int:
        """One γ for the plan's speculating sequences (each capped at its limit); 0 while
        the target is timed at this size, while the guard holds this size off after a
        measured loss, and when no γ is predicted to pay (one probe first if no round
        ran at this size: after that the prediction, re-made every step from the live
        plain-step time, is the evidence; a periodic probe would cost the draft a
        catch-up over every sequence's tokens since, 25 % of deep-2's 4-row steps)."""
        guard = self.guard_for(plan)
        if self.target.count(plan.base_tokens) < self.plain_first:
            return 0
        if guard.hold > 0:
            guard.hold -= 1
            return 0
        gamma, gain = self.peak(plan, c, beta_s)
        return gamma if gain > 1.0 or not guard.rounds else 0

    def observe(self, plan: BatchPlan, tokens: int, gammas: list[int], produced: int,
                draft_s: float, verify_s: float) -> None:
        """A step of decoding sequences only: the target's pass over `tokens` took
        verify_s; gammas the drafts each speculating sequence carried (all 0: no drafts),
        drafted in draft_s (the draft's catch-up not counted); produced the tokens the
        step yielded. Judges drafted steps' measured rate against the plain rate here."""
        self.target.observe(tokens, verify_s)
        rows = sum(1 for g in gammas if g)
        if not rows:
            return
        if draft_s > 0:
            self.draft.observe(rows, draft_s / max(gammas))
        plain_s = self.target.at(plan.base_tokens, 0.0)
        if plain_s:
            self.guard_for(plan).judge(produced, draft_s + verify_s, plan.sampling / plain_s,
                                       self.probe_every, self.probe_max)

    def guard_for(self, plan: BatchPlan) -> "Guard":
        return self._guards.setdefault(plan.sampling, Guard(self.probe_every))

    @property
    def switched_off(self) -> int:
        """Times a batch's measured throughput turned its drafting off."""
        return sum(g.switched_off for g in self._guards.values())


@dataclass
class Guard:
    """One batch size's drafted rounds measured against its plain rate, and its backoff."""

    wait: int  # steps the first measured loss holds this size off
    hold_wait: int = 0  # steps the next measured loss holds this size off (0: wait)
    hold: int = 0  # steps left off after a measured loss
    rounds: int = 0  # drafted steps measured at this size
    switched_off: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=JUDGE_WINDOW))

    def judge(self, tokens: int, seconds: float, plain_rate: float, probe_every: int,
              probe_max: int) -> None:
        """A drafted step's tokens and seconds: below FLOOR × plain_rate over the recent
        ones, this size is held off for a while, each failed try doubling the hold."""
        self.rounds += 1
        self.recent.append((tokens, seconds))
        if len(self.recent) < JUDGE_AFTER:
            return
        rate = sum(t for t, _ in self.recent) / max(sum(s for _, s in self.recent), 1e-12)
        if rate < FLOOR * plain_rate:
            self.hold = self.hold_wait or self.wait
            self.hold_wait = min(2 * self.hold, probe_max)
            self.recent.clear()
            self.switched_off += 1
        else:
            self.hold_wait = probe_every
