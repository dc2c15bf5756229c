"""One request's speculation: its rounds through the engine's shared γ adaptation, and the
statistics its results report."""

from __future__ import annotations

from localchat.engine.runtime.speculative.adaptive import AdaptiveGamma, DraftStats
from localchat.engine.runtime.speculative.rule import RULE


class Speculation:
    def __init__(self, source: str, adaptive: AdaptiveGamma) -> None:
        self.adaptive = adaptive  # the engine's, shared by its requests
        self.stats = DraftStats(source=source, rule=RULE)
        self.decode_s = 0.0
        self.key = None  # the evidence this round's γ was chosen on

    def choose(self, limit: int, key=None) -> int:
        """γ for this step given the draft's evidence `key`, at most `limit` (room left in
        the context and the step)."""
        self.key = key
        return max(0, min(self.adaptive.choose(key), limit))

    def record(self, proposed: int, accepted: int, draft_s: float, step_s: float) -> None:
        """A decode step of this request: `proposed` drafts (0: a plain step), `accepted`
        of them kept; draft_s of the step's step_s went to drafting."""
        self.decode_s += step_s
        s = self.stats
        s.target_passes += 1
        s.tokens += accepted + 1
        if proposed:
            s.proposed += proposed
            s.accepted += accepted
            s.accepted_runs[accepted] += 1
            self.adaptive.observe_round(proposed, accepted, draft_s, step_s - draft_s, self.key)
        else:
            self.adaptive.observe_plain(step_s)

    def snapshot(self) -> dict:
        s, a = self.stats, self.adaptive
        s.gamma, s.alpha, s.c, s.beta = a.gamma, a.alpha_for(self.key), a.c, a.extra_at(max(a.gamma, 1))
        s.predicted_speedup = a.predicted(max(a.gamma, 1), self.key) if a.target_step_s else 1.0
        if a.target_step_s and self.decode_s > 0 and s.tokens:
            s.measured_speedup = s.tokens / self.decode_s * a.target_step_s
        return s.as_dict()
