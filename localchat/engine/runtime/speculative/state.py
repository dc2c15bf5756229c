"""One request's speculation: its rounds through the engine's shared γ adaptation, a guard
that turns it off for this request when its measured speedup falls below FLOOR (probing
back with backoff), and the statistics its results report."""

from __future__ import annotations

from collections import deque

from localchat.engine.runtime.speculative.adaptive import AdaptiveGamma, DraftStats
from localchat.engine.runtime.speculative.rule import RULE

FLOOR = 0.95  # a request measured slower than this fraction of plain decoding stops drafting
JUDGE_AFTER = 4  # rounds measured before the request's speedup is judged
JUDGE_WINDOW = 8  # the most recent rounds it is judged on


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

    def choose(self, limit: int, key=None) -> int:
        """γ for this step given the draft's evidence `key`, at most `limit` (room left in
        the context and the step); 0 while the guard holds this request off."""
        self.key = key
        if self._off_for > 0:
            self._off_for -= 1
            return 0
        return max(0, min(self.adaptive.choose(key), limit))

    def record(self, proposed: int, accepted: int, draft_s: float, verify_s: float,
               step_s: float, catch_up_s: float = 0.0, batched: bool = False) -> None:
        """A decode step of this request: `proposed` drafts (0: a plain step), `accepted`
        of them kept; draft_s drafting them, verify_s the target's pass, step_s the whole
        step, catch_up_s of it the draft's catch-up (a one-off after rounds off: the
        guard does not count it against drafting). batched: a step the batch controller
        chose for (its timings are the batch's; only α is learnt here)."""
        self.decode_s += step_s
        s = self.stats
        s.target_passes += 1
        s.tokens += accepted + 1
        if batched:
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
        if a.target_step_s and self.decode_s > 0 and s.tokens:
            s.measured_speedup = s.tokens / self.decode_s * a.target_step_s
        s.switched_off = self.switched_off
        return s.as_dict()
