"""How many tokens to draft: α (acceptance) and the cost ratios are measured online, γ
is chosen to maximise the expected speedup, and speculation switches itself off (probing
now and then) when no γ is predicted to pay. DraftStats is what results report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


def expected_speedup(alpha: float, gamma: int, c: float, verify_extra: float = 0.0) -> float:
    """Leviathan et al.'s (1 − α^(γ+1)) / ((1 − α)(γc + 1)), with the verify pass costing
    1 + verify_extra·γ target steps instead of exactly one (on a CPU, scoring γ+1
    tokens costs more than scoring one)."""
    if gamma == 0:
        return 1.0
    tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + 1 + verify_extra * gamma)


@dataclass
class AdaptiveGamma:
    """Online estimates of α, c (draft step ÷ target step) and the verify pass's extra
    cost per draft token; choose() returns γ for the next round (0 = plain step)."""

    gamma_max: int = 8
    fixed: int | None = None  # --num-draft-tokens: no adaptation
    probe_every: int = 16  # plain steps between probes while speculation is off
    smoothing: float = 0.2
    alpha: float = 0.6  # a hopeful start, so speculation gets tried
    c: float = 0.3
    verify_extra: float = 0.5  # a CPU-like prior (a GPU measures it down within rounds)
    target_step_s: float | None = None
    gamma: int = 0
    _plain_since_probe: int = 0

    def choose(self) -> int:
        if self.target_step_s is None:
            self.gamma = 0  # time one plain target step first: c and the speedup need it
        elif self.fixed is not None:
            self.gamma = self.fixed
        else:
            best = max(range(1, self.gamma_max + 1), key=self.predicted)
            if self.predicted(best) > 1.0:
                self.gamma = best
            else:  # off; now and then try a short round, so α and c stay current
                self._plain_since_probe += 1
                probe = self._plain_since_probe >= self.probe_every
                self.gamma = 2 if probe else 0
                if probe:
                    self._plain_since_probe = 0
        return self.gamma

    def predicted(self, gamma: int | None = None) -> float:
        g = self.gamma if gamma is None else gamma
        return expected_speedup(self.alpha, g, self.c, self.verify_extra)

    def _ema(self, old: float, new: float) -> float:
        return (1 - self.smoothing) * old + self.smoothing * new

    def observe_plain(self, step_s: float) -> None:
        self.target_step_s = step_s if self.target_step_s is None else self._ema(self.target_step_s, step_s)

    def observe_round(self, gamma: int, accepted: int, draft_s: float, verify_s: float) -> None:
        tried = accepted + (1 if accepted < gamma else 0)
        self.alpha = self._ema(self.alpha, accepted / tried)
        if self.target_step_s:
            self.c = self._ema(self.c, draft_s / gamma / self.target_step_s)
            extra = max(0.0, verify_s / self.target_step_s - 1) / gamma
            self.verify_extra = self._ema(self.verify_extra, extra)


@dataclass
class DraftStats:
    """What the results, JSON and the gauge bar report about speculation."""

    source: str  # "model:<name>" or "ngram"
    rule: str  # the acceptance rule this engine applied
    proposed: int = 0
    accepted: int = 0
    target_passes: int = 0  # decode-time target forward passes (verify rounds and plain steps)
    tokens: int = 0  # tokens produced by those passes
    accepted_runs: Counter = field(default_factory=Counter)  # drafts kept per round -> rounds
    gamma: int = 0
    alpha: float = 0.0
    c: float = 0.0
    beta: float = 0.0  # the verify pass's extra cost per draft token, in target steps
    predicted_speedup: float = 1.0
    measured_speedup: float | None = None  # decode rate ÷ the measured plain-step rate

    def as_dict(self) -> dict:
        return {
            "source": self.source, "rule": self.rule,
            "proposed": self.proposed, "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
            "tokens_per_target_pass": self.tokens / self.target_passes if self.target_passes else 0.0,
            "accepted_run_histogram": {str(k): v for k, v in sorted(self.accepted_runs.items())},
            "gamma": self.gamma, "alpha": self.alpha, "c": self.c, "beta": self.beta,
            "predicted_speedup": self.predicted_speedup, "measured_speedup": self.measured_speedup,
        }
