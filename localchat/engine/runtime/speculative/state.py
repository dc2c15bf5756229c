"""One request's speculation: its rounds through the engine's shared γ adaptation, a guard
that turns it off for this request when its measured speedup falls below FLOOR (probing
back with backoff), a per-reply credit that prices rounds whose gain is not yet shown
(probes, and prompt-lookup evidence only its prior vouches for), and the statistics its
results report."""

from __future__ import annotations

from collections import deque

from localchat.engine.runtime.speculative.adaptive import AdaptiveGamma, DraftStats
from localchat.engine.runtime.speculative.rule import RULE

FLOOR = 0.95  # a request measured slower than this fraction of plain decoding stops drafting
JUDGE_AFTER = 4  # rounds measured before the request's speedup is judged
JUDGE_WINDOW = 8  # the most recent rounds it is judged on
# A reply may spend on rounds whose gain is not yet shown at most this share of its plain
# steps, plus what its earlier rounds gained: a reply where no draft is kept decodes at
# >= 1 - CREDIT_SHARE of plain decoding (less one round's misjudged cost at most).
CREDIT_SHARE = 0.03
MIN_MEASURED_ROUNDS = 8  # fewer drafted rounds: no measured speedup is reported
# Evidence its prior rates this likely to be kept (a prompt-lookup match of 8+ tokens: the
# reply is quoting) may spend one plain step beyond the credit at once, so quoting speeds
# up from its first tokens; what it gains then pays for longer rounds.
STRONG_PRIOR = 0.9
STRONG_ADVANCE = 1.0
# A reply whose own last judgments (free guesses, rounds) were all kept, this many in a row,
# and none of whose rounds missed, has the advance at any match length, and prices its rounds
# at the measured α even while behind its credit by less than the advance: a quote's first
# tokens (2- to 7-token matches) had decoded plain, and one slow first pass (a noisy VM) held
# it to plain steps for 9 more while every guess was right.
STRONG_STREAK = 3
# A round at a γ with no verify pass timed near it is unproven too, and its drafts are priced
# as a compute-bound target verifies them: a whole plain step each. (β's prior is an
# average, and extrapolated beyond the γs measured: a 24-token reply lost 4 % to one rejected
# draft priced at the prior, and a compute-bound reply 9 % to a γ of 8 priced from γ 3's.)
UNMEASURED_BETA = 1.0


class Speculation:
    def __init__(self, source: str, adaptive: AdaptiveGamma) -> None:
        self.adaptive = adaptive  # the engine's, shared by its requests
        self.stats = DraftStats(source=source, rule=RULE)
        self.decode_s = 0.0
        self.key = None  # the evidence this round's γ was chosen on
        self._recent: deque = deque(maxlen=JUDGE_WINDOW)  # (tokens, seconds) per round
        self._off_for = 0  # plain steps left before this request probes again
        self._backoff = adaptive.probe_every
        self.switched_off = 0  # times the guard turned this request's drafting off
        self.credit = 0.0  # plain steps this reply may still lose to unproven rounds
        self.rounds = 0  # drafted rounds
        self.streak = 0  # this reply's judgments kept in a row (guesses and whole rounds)
        self.round_missed = False  # a round of this reply had a draft rejected

    def choose(self, limit: int, key=None) -> int:
        """γ for this step given the draft's evidence `key`, at most `limit` (room left in
        the context and the step); 0 while the guard holds this request off."""
        self.key = key
        if self._off_for > 0:
            self._off_for -= 1
            return 0
        return self.affordable(max(0, min(self.adaptive.choose(key), limit)), key)

    def affordable(self, gamma: int, key=None) -> int:
        """γ, or less where a prompt-lookup round's gain is not yet shown and its price
        would cost this reply more than its credit: a probe, a match length with too few
        measured rounds, or any round once the reply has lost more than its credit (unless
        its last STRONG_STREAK judgments were kept and the advance covers the loss), at
        what losing every draft costs; a γ with no verify timed near it, at what it is
        expected to lose at the key's measured α if the pass costs a whole step a draft.
        A draft model's rounds (no key) are its guard's to judge."""
        a = self.adaptive
        if gamma == 0 or a.fixed is not None or key is None:
            return gamma
        strong = a.prior(key) >= STRONG_PRIOR or self.vouched
        allowance = self.credit + (STRONG_ADVANCE if strong else 0.0)
        proven = a.established(key) and not a.probing and (self.credit >= 0 or (
            self.vouched and allowance >= 0))
        if proven and self.credit >= 0 and a.measured_near(gamma):
            return gamma
        price = a.expected_loss if proven else a.worst_loss
        while gamma > 0 and price(gamma, key, unmeasured=UNMEASURED_BETA) > allowance:
            gamma -= 1
        return gamma

    def record(self, proposed: int, accepted: int, draft_s: float, verify_s: float,
               step_s: float, catch_up_s: float = 0.0, untimed: bool = False) -> None:
        """A decode step of this request: `proposed` drafts (0: a plain step), `accepted`
        of them kept; draft_s drafting them, verify_s the target's pass, step_s the whole
        step, catch_up_s of it the draft's catch-up (a one-off after rounds off: the
        guard does not count it against drafting). untimed: a step whose timings are not
        this request's (the batch controller chose for it, or the thread governor probed
        another count in it): only α is learnt here."""
        self.decode_s += step_s
        s = self.stats
        s.target_passes += 1
        s.tokens += accepted + 1
        self._settle_credit(proposed, accepted, step_s - catch_up_s, untimed)
        if proposed:
            self.streak = self.streak + 1 if accepted == proposed else 0
            self.round_missed = self.round_missed or accepted < proposed
        if untimed:
            if proposed:
                self._count(proposed, accepted)
                self.adaptive.observe_acceptance(proposed, accepted, self.key)
            return
        if not proposed:
            self.adaptive.observe_plain(step_s)
            return
        self._count(proposed, accepted)
        self.adaptive.observe_round(proposed, accepted, draft_s, verify_s, self.key)
        self._recent.append((accepted + 1, step_s - catch_up_s))
        self._judge()

    @property
    def vouched(self) -> bool:
        """This reply's own evidence says it quotes: its last STRONG_STREAK judgments were
        kept and none of its rounds missed (guesses that keep coming right while its rounds
        miss earn no second advance)."""
        return self.streak >= STRONG_STREAK and not self.round_missed

    def shadow(self, kept: bool) -> None:
        """This plain step's evidence guessed its token for free (a lookup's first draft):
        kept or not, a one-draft round at that evidence, for α alone."""
        self.streak = self.streak + 1 if kept else 0
        if self.key is not None and self.adaptive.fixed is None:
            self.adaptive.observe_shadow(self.key, kept)

    def _settle_credit(self, proposed: int, accepted: int, seconds: float,
                       untimed: bool) -> None:
        """A plain step earns CREDIT_SHARE of a step; a round pays what it cost beyond the
        plain steps its tokens would have taken (a gain adds to the credit). An untimed
        round pays the cost model's price instead."""
        step = self.adaptive.target_step_s
        if not proposed:
            self.credit += CREDIT_SHARE
            return
        self.rounds += 1
        if untimed:
            lost = self.adaptive.worst_loss(proposed, self.key) - accepted
        elif step:
            lost = seconds / step - (accepted + 1)
        else:
            return
        self.credit -= lost
        self.stats.lost_steps += lost

    def _count(self, proposed: int, accepted: int) -> None:
        s = self.stats
        s.proposed += proposed
        s.accepted += accepted
        s.judged += accepted + (1 if accepted < proposed else 0)
        s.accepted_runs[accepted] += 1

    def recent_speedup(self) -> float | None:
        """This request's tokens per second over its recent rounds ÷ the plain rate."""
        plain = self.adaptive.target_step_s
        seconds = sum(s for _, s in self._recent)
        if not plain or seconds <= 0:
            return None
        return sum(t for t, _ in self._recent) / seconds * plain

    def _judge(self) -> None:
        if len(self._recent) < JUDGE_AFTER or self.adaptive.fixed is not None:
            return
        speedup = self.recent_speedup()
        if speedup is None:
            return
        if speedup < FLOOR:  # off for a while; each failed probe doubles the wait
            self._off_for = self._backoff
            self._backoff = min(2 * self._backoff, self.adaptive.probe_max)
            self._recent.clear()
            self.switched_off += 1
        else:
            self._backoff = self.adaptive.probe_every

    def snapshot(self) -> dict:
        s, a = self.stats, self.adaptive
        s.gamma, s.alpha, s.c = a.gamma, a.alpha_for(self.key), a.c_for(self.key)
        s.beta = a.extra_at(max(a.gamma, 1))
        s.predicted_speedup = a.predicted(max(a.gamma, 1), self.key) if a.target_step_s else 1.0
        if a.target_step_s and self.decode_s > 0 and s.tokens and \
                self.rounds >= MIN_MEASURED_ROUNDS:  # fewer rounds: noise, not a measurement
            s.measured_speedup = s.tokens / self.decode_s * a.target_step_s
        s.switched_off = self.switched_off
        return s.as_dict()
