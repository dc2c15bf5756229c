"""How many tokens to draft: α and the cost ratios are measured online across requests, γ
maximises the expected speedup, and speculation switches itself off (probing less and less
often) when no γ is predicted to pay. DraftStats is what results report."""

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


def nearest(table: dict[int, float], gamma: int) -> float | None:
    """The value measured at the γ nearest to gamma (the larger on a tie) within half of
    gamma (at least 1); None if none is that near."""
    near = [g for g in table if abs(g - gamma) <= max(1, gamma // 2)]
    return table[min(near, key=lambda g: (abs(g - gamma), -g))] if near else None


@dataclass
class AdaptiveGamma:
    """Online estimates of α (per evidence key: a prompt-lookup match length, say), c (draft
    step ÷ target step) and the verify pass's extra cost per draft token (per γ), shared by
    an engine's requests; choose(key) returns γ for the next round (0 = plain step)."""

    gamma_max: int = 16
    fixed: int | None = None  # num_draft_tokens set: no adaptation
    probe_every: int = 16  # plain steps before the first probe while speculation is off
    probe_max: int = 256  # a probe that finds no gain doubles the wait, up to this
    smoothing: float = 0.2
    alpha: float = 0.6  # all rounds' acceptance; also the prior of keys with none below
    alpha_priors: dict = field(default_factory=dict)  # key -> prior α for that evidence
    c: float = 0.3  # all rounds' draft cost; also the prior of keys with none below
    verify_extra: float = 0.5  # prior, for a γ with none measured near it (CPU-like)
    extra_by_gamma: dict = field(default_factory=dict)  # γ -> the extra measured at that γ
    target_step_s: float | None = None
    gamma: int = 0
    _alpha_by_key: dict = field(default_factory=dict)
    _c_by_key: dict = field(default_factory=dict)  # lookup and model drafts cost differently
    _plain_since_probe: int = 0
    _probe_wait: int = 0
    _probing: bool = False

    def choose(self, key=None) -> int:
        if self.target_step_s is None:
            self.gamma = 0  # time one plain target step first: c and the speedup need it
        elif self.fixed is not None:
            self.gamma = self.fixed
        else:
            best = max(range(1, self.gamma_max + 1), key=lambda g: self.predicted(g, key))
            if self.predicted(best, key) > 1.0:
                self.gamma, self._probe_wait = best, self.probe_every
            else:  # off; now and then a one-token round, so α and the costs stay current
                self._plain_since_probe += 1
                self._probing = self._plain_since_probe >= (self._probe_wait or self.probe_every)
                self.gamma = 1 if self._probing else 0
                if self._probing:
                    self._plain_since_probe = 0
        return self.gamma

    def predicted(self, gamma: int | None = None, key=None) -> float:
        g = self.gamma if gamma is None else gamma
        return expected_speedup(self.alpha_for(key), g, self._c_by_key.get(key, self.c),
                                self.extra_at(g))

    def extra_at(self, gamma: int) -> float:
        """The verify pass's extra cost per draft token at γ: measured there or near it (CPU
        matmuls tile, so 8 rows can cost less than 9), else the prior."""
        extra = nearest(self.extra_by_gamma, gamma)
        return self.verify_extra if extra is None else extra

    def alpha_for(self, key=None) -> float:
        """The acceptance expected after this evidence (the overall α where there is none)."""
        if key is None:
            return self.alpha
        return self._alpha_by_key.get(key, self.alpha_priors.get(key, self.alpha))

    def _ema(self, old: float, new: float) -> float:
        return (1 - self.smoothing) * old + self.smoothing * new

    def observe_plain(self, step_s: float) -> None:
        self.target_step_s = step_s if self.target_step_s is None else self._ema(self.target_step_s, step_s)

    def observe_round(self, gamma: int, accepted: int, draft_s: float, verify_s: float,
                      key=None) -> None:
        tried = accepted + (1 if accepted < gamma else 0)
        self.alpha = self._ema(self.alpha, accepted / tried)
        if key is not None:
            self._alpha_by_key[key] = self._ema(self.alpha_for(key), accepted / tried)
        if self.target_step_s:
            c = draft_s / gamma / self.target_step_s
            self.c = self._ema(self.c, c)
            self._c_by_key[key] = self._ema(self._c_by_key.get(key, c), c)
            extra = max(0.0, verify_s / self.target_step_s - 1) / gamma
            known = self.extra_by_gamma.get(gamma)
            self.extra_by_gamma[gamma] = extra if known is None else self._ema(known, extra)
        if self._probing:  # a probe that still predicts no gain waits twice as long next time
            self._probing = False
            if max(self.predicted(g, key) for g in range(1, self.gamma_max + 1)) <= 1.0:
                self._probe_wait = min(2 * (self._probe_wait or self.probe_every), self.probe_max)


@dataclass
class DraftStats:
    """What the results, JSON and the gauge bar report about speculation."""

    source: str  # "model:<name>", "ngram" or "ngram+model:<name>"
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
