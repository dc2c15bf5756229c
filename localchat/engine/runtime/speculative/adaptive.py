"""How many tokens to draft: α and the cost ratios are measured online across requests, γ
maximises the expected speedup, and speculation switches itself off (probing less and less
often) when no γ is predicted to pay. DraftStats is what results report.

The cost model: c = the draft's time per drafted token ÷ the target's time per plain step,
β = the verify pass's extra cost per draft token (in plain steps); both are medians over the
last `window` measurements, the plain step re-timed every `remeasure_every` rounds, and
structural priors (structural_c: weight bytes and layers of draft vs target) stand in
until measured. The draft's catch-up (its prefill of tokens it has not seen) is not c."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from statistics import median

from localchat.engine.runtime.speculative.acceptance import (
    ESTABLISHED_ROUNDS, MatchAcceptance, chain_tokens, expected_tokens)

# verify passes timed at a γ before its β is taken as measured; until then the γ choice is
# optimistic about it (no worse than the best settled β), so one slow pass (a new batch
# shape, a busy moment) cannot keep a larger γ from ever being tried again
SETTLED_SAMPLES = 3
EXPLORE_GAIN = 1.05  # ... where that would gain 5 % or more over the measured best γ
# A lookup key's α is a rate over at most `window` single guesses (± 0.1): its rounds are
# taken where they are predicted to gain this much (at 1.0, γ 1 at a one-token match's α
# 0.25 drafted at a predicted 1.04 on torch, and lost)
KEYED_GAIN = 1.05
# A draft model's first probe, while its c is still the structural prior, drafts this many
# tokens: enough to time c, at most about one step lost. The prior is a guess both ways (the
# bundled draft for its deep-2 copy: prior 0.43, measured 0.50-0.73; a draft with more but
# narrower layers than its target reads high), and a first probe at the optimistic peak
# (γ 16, predicted 1.07x for deep-2) cost short one-shot replies 18-51 % of their time.
FIRST_MODEL_PROBE = 1


def expected_speedup(alpha: float, gamma: int, c: float, verify_extra: float = 0.0) -> float:
    """Leviathan et al.'s (1 − α^(γ+1)) / ((1 − α)(γc + 1)), with the verify pass costing
    1 + verify_extra·γ target steps instead of exactly one (on a CPU, scoring γ+1
    tokens costs more than scoring one)."""
    if gamma == 0:
        return 1.0
    return expected_tokens(alpha, gamma) / round_cost(gamma, c, verify_extra)


def round_cost(gamma: int, c: float, verify_extra: float) -> float:
    """A round of γ drafts in plain target steps: drafting them, verifying γ + 1 tokens."""
    return gamma * c + 1 + verify_extra * gamma


def structural_c(draft_bytes: int, draft_layers: int, target_bytes: int,
                 target_layers: int, default: float = 0.3) -> float:
    """The prior c before any draft round is timed: the mean of the weight-bytes ratio (a
    bandwidth-bound step reads every weight) and the layer ratio (per-layer overheads);
    `default` where either model's sizes are unknown."""
    if min(draft_bytes, draft_layers, target_bytes, target_layers) <= 0:
        return default
    return (draft_bytes / target_bytes + draft_layers / target_layers) / 2


def nearest(table: dict[int, float], gamma: int) -> float | None:
    """The value measured at the γ nearest to gamma (the larger on a tie) within half of
    gamma (at least 1); None if none is that near."""
    near = [g for g in table if abs(g - gamma) <= max(1, gamma // 2)]
    return table[min(near, key=lambda g: (abs(g - gamma), -g))] if near else None


@dataclass
class AdaptiveGamma:
    """Online estimates of α (per evidence key: a prompt-lookup match length, say), c and β
    (medians of recent timings; c per key, β per γ), shared by an engine's requests;
    choose(key) returns γ for the next round (0 = plain step)."""

    gamma_max: int = 16
    fixed: int | None = None  # num_draft_tokens set: no adaptation
    probe_every: int = 16  # plain steps before the first probe while speculation is off
    probe_max: int = 256  # a probe that finds no gain doubles the wait, up to this
    window: int = 16  # timings kept per estimate; the estimate is their median
    remeasure_every: int = 32  # rounds in a row before a plain step re-times the target
    # plain steps timed before the first round: a median of 3 drops the first call's
    # one-off cost (allocations, kernels loaded), which made c and β look small
    plain_first: int = 3
    prior_weight: float = 2.0  # drafts the prior α counts as, until measured ones outweigh it
    alpha: float = 0.6  # all recent rounds' acceptance; also the prior of keys with none below
    alpha_priors: dict = field(default_factory=dict)  # key -> prior α for that evidence
    c_prior: float = 0.3  # c until a round is timed (structural_c where the sizes are known)
    verify_extra: float = 0.5  # β's prior, for a γ with none measured near it (CPU-like)
    gamma: int = 0
    _plain: deque = field(default_factory=deque)
    _c_all: deque = field(default_factory=deque)
    _c_by_key: dict = field(default_factory=dict)  # lookup and model drafts cost differently
    _extra: dict = field(default_factory=dict)  # γ -> recent extras measured at that γ
    _rounds: deque = field(default_factory=deque)  # (accepted, tried) of recent rounds
    _keys: MatchAcceptance | None = None  # α per match length (made from alpha_priors)
    _alpha_prior: float | None = None
    _plain_since_probe: int = 0
    _probe_wait: int = 0
    _probing: bool = False
    _exploring: bool = False
    _rounds_in_a_row: int = 0
    _extra_medians: dict | None = None
    _measured: int = 0  # rounds and acceptances observed: what peak()'s cache is valid for
    _peaks: dict = field(default_factory=dict)  # peaks and acceptances, while _measured holds
    _peaks_at: int = -1

    @property
    def probing(self) -> bool:
        """The γ last chosen probes (speculation is off and this round tries it)."""
        return self._probing

    @property
    def exploring(self) -> bool:
        """The γ last chosen is not the measured best but one whose β is not settled yet."""
        return self._exploring

    @property
    def keys(self) -> MatchAcceptance:
        if self._keys is None:
            self._keys = MatchAcceptance(self.alpha_priors, self.prior_weight, self.window)
        return self._keys

    def established(self, key=None) -> bool:
        """α for this evidence rests on measured rounds, not on its prior alone."""
        return len(self._rounds) >= ESTABLISHED_ROUNDS if key is None else \
            self.keys.established(key)

    def worst_loss(self, gamma: int, key=None, unmeasured: float | None = None) -> float:
        """What a round of γ drafts costs, in plain steps, if none is kept: drafting them
        and verifying them beside the target's own token (unmeasured: the β to price them
        at where none was measured near γ, if more than extra_at's estimate)."""
        extra = self.extra_at(gamma)
        if unmeasured is not None and not self.measured_near(gamma):
            extra = max(extra, unmeasured)
        return gamma * (self.c_for(key) + extra) if gamma else 0.0

    def expected_loss(self, gamma: int, key=None, unmeasured: float | None = None) -> float:
        """What a round of γ drafts costs beyond the tokens it yields on average at this
        evidence's α, in plain steps: worst_loss where α is 0; at most 0 where α is 1,
        whatever the verify pass costs, if no more than a step a draft."""
        if not gamma:
            return 0.0
        return 1 + self.worst_loss(gamma, key, unmeasured) - \
            chain_tokens(self.acceptance(key), gamma)

    def measured_near(self, gamma: int) -> bool:
        """A verify pass of about γ drafts was timed (β at γ is measured, not extrapolated)."""
        return nearest(self.extra_by_gamma, gamma) is not None

    @property
    def target_step_s(self) -> float | None:
        """The median of the recent plain steps' times; None before the first."""
        return median(self._plain) if self._plain else None

    @property
    def c(self) -> float:
        """All recent rounds' c (median), else the prior."""
        return median(self._c_all) if self._c_all else self.c_prior

    def c_for(self, key=None) -> float:
        recent = self._c_by_key.get(key)
        return median(recent) if recent else self.c

    @property
    def extra_by_gamma(self) -> dict[int, float]:
        """β measured at each γ (medians; recomputed only after a new measurement: the
        γ choice asks every step)."""
        if self._extra_medians is None:
            self._extra_medians = {g: median(v) for g, v in self._extra.items() if v}
        return self._extra_medians

    def choose(self, key=None) -> int:
        """γ for the next round after evidence `key` (0: a plain step)."""
        if self.target_step_s is None or (
                self.fixed is None and len(self._plain) < self.plain_first):
            self.gamma = 0  # time plain target steps first: c, β and the speedup need them
        elif self.fixed is not None:
            self.gamma = self.fixed
        else:
            best = self.peak(key)
            self._exploring = False
            if self.predicted(best, key) > (1.0 if key is None else KEYED_GAIN):
                self._probe_wait = self.probe_every
                self._rounds_in_a_row += 1
                # now and then a plain step, so the target's step time follows the load
                if self._rounds_in_a_row > self.remeasure_every:
                    self.gamma = 0
                else:
                    self.gamma = best
                    wider = self.peak(key, unsettled=True)
                    if wider != best and self.predicted(wider, key, unsettled=True) >= \
                            EXPLORE_GAIN * self.predicted(best, key):
                        self.gamma, self._exploring = wider, True
            else:  # off: a round at once if none was timed yet, then now and then, each at
                # the peak γ for an optimistic α (and β, at a γ not measured): probes explore
                self._plain_since_probe += 1
                self._probing = (not self._c_all or self._plain_since_probe >= (
                    self._probe_wait or self.probe_every)) and self._worth_probing(key)
                self.gamma = self._probe_gamma(key) if self._probing else 0
                if self._probing:
                    self._plain_since_probe = 0
        return self.gamma

    def _worth_probing(self, key) -> bool:
        """Evidence whose first drafts plain steps judge for free (a lookup's guesses, see
        observe_shadow) is probed only where its optimistic α predicts a gain; a draft
        model's α is learnt from rounds alone, so it is always probed."""
        if key is None:
            return True
        gamma = self.peak(key, optimistic=True)
        return self.predicted(gamma, key, self.acceptance(key, optimistic=True)) > 1.0

    def _probe_gamma(self, key) -> int:
        """A probe's γ: the peak for an optimistic α, but FIRST_MODEL_PROBE for a draft
        model whose c is not measured yet."""
        if key is None and not self._c_all:
            return FIRST_MODEL_PROBE
        return self.peak(key, optimistic=True)

    def peak(self, key=None, optimistic: bool = False, unsettled: bool = False) -> int:
        """The γ (≥ 1) with the highest predicted speedup (optimistic: for the acceptance
        the recent rounds allow at best, see optimistic_alpha; unsettled: β at γs with
        fewer than SETTLED_SAMPLES passes no worse than the best settled one). Asked every
        step: kept until a round or an acceptance changes α, c or β."""
        if self._peaks_at != self._measured:
            self._peaks, self._peaks_at = {}, self._measured
        cache = (key, optimistic, unsettled)
        if cache not in self._peaks:
            acceptance = self.acceptance(key, optimistic)
            self._peaks[cache] = max(range(1, self.gamma_max + 1), key=lambda g: self.predicted(
                g, key, acceptance, unsettled))
        return self._peaks[cache]

    def predicted(self, gamma: int | None = None, key=None,
                  acceptance: list[float] | None = None, unsettled: bool = False) -> float:
        """The speedup a round of γ drafts is expected to give at this evidence (at
        `acceptance`'s rates, where given: see acceptance())."""
        g = self.gamma if gamma is None else gamma
        if g == 0:
            return 1.0
        chain = self.acceptance(key) if acceptance is None else acceptance
        extra = self.extra_at(g)
        if unsettled and len(self._extra.get(g, ())) < SETTLED_SAMPLES:
            extra = min(extra, self._settled_floor())
        return chain_tokens(chain, g) / round_cost(g, self.c_for(key), extra)

    def _settled_floor(self) -> float:
        """The lowest β among γs with SETTLED_SAMPLES passes timed (the prior if none)."""
        medians = self.extra_by_gamma
        return min((medians[g] for g, v in self._extra.items() if len(v) >= SETTLED_SAMPLES),
                   default=self.verify_extra)

    def optimistic_alpha(self, key=None) -> float:
        """α with the prior's drafts counted as all kept: 1.0 before any round, falling
        fast when drafts are rejected (a probe of a useless draft stays short, a good
        draft's probe is long enough to show its gain)."""
        if key is not None:
            return self.keys.rate(key, self._fallback(), optimistic=True)
        kept, tried = sum(a for a, _ in self._rounds), sum(t for _, t in self._rounds)
        return (kept + self.prior_weight) / (tried + self.prior_weight)

    def extra_at(self, gamma: int) -> float:
        """β at γ: measured there or near it (CPU matmuls tile, so 8 rows can cost less
        than 9); beyond every γ measured, the largest one's or the prior if lower (a pass's
        fixed cost spreads over more tokens: llama.cpp's deep-8 β is 0.65 at γ 1, 0.31 at
        8); below them, the smallest one's; the prior before any."""
        table = self.extra_by_gamma
        if not table:
            return self.verify_extra
        extra = nearest(table, gamma)
        if extra is not None:
            return extra
        largest = max(table)
        if gamma > largest:
            return min(table[largest], self.verify_extra)
        return table[min(table)]

    def alpha_for(self, key=None) -> float:
        """The chance a draft after this evidence is kept (the overall α where there is
        no key)."""
        return self.alpha if key is None else self.keys.rate(key, self._fallback())

    def prior(self, key) -> float:
        """This evidence's α before any is measured."""
        return self.keys.prior(key, self._fallback())

    def acceptance(self, key=None, optimistic: bool = False) -> list[float]:
        """The chance each of a round's drafts is kept once all before it were: α for
        each without a key; after a k-token match, the rate at k, k + 1, ... (the match
        each kept draft extends). optimistic: the first's prior counted as kept."""
        if self._peaks_at != self._measured:
            self._peaks, self._peaks_at = {}, self._measured
        cached = self._peaks.get(("acceptance", key, optimistic))
        if cached is None:
            cached = [self.optimistic_alpha() if optimistic else self.alpha] * self.gamma_max \
                if key is None else \
                self.keys.chain(key, self.gamma_max, self._fallback(), optimistic)
            self._peaks[("acceptance", key, optimistic)] = cached
        return cached

    def _fallback(self) -> float:
        """The prior of a key with none of its own: α as it was before the first round."""
        return self.alpha if self._alpha_prior is None else self._alpha_prior

    def _keep(self, recent: deque, value: float) -> None:
        recent.append(value)
        while len(recent) > self.window:
            recent.popleft()

    def observe_plain(self, step_s: float) -> None:
        self._rounds_in_a_row = 0
        self._keep(self._plain, step_s)

    def observe_acceptance(self, gamma: int, accepted: int, key=None) -> None:
        """α alone from a round of gamma drafts, accepted of them kept (a batched round's
        timings are the batch controller's, not this single-sequence cost model's)."""
        tried = accepted + (1 if accepted < gamma else 0)
        self._measured += 1
        if self._alpha_prior is None:
            self._alpha_prior = self.alpha
        self.alpha = self._estimate(self._rounds, (accepted, tried), self._alpha_prior)
        if key is not None:
            self.keys.observe(key, gamma, accepted)

    def observe_shadow(self, key, kept: bool) -> None:
        """A plain step where evidence `key` guessed the token at no cost: whether its
        first draft would have been kept (evidence whose rounds are priced out until it
        is established otherwise never is); the overall α is the rounds' alone."""
        self._measured += 1
        self.keys.guess(key, kept)

    def _estimate(self, rounds: deque, new: tuple[int, int], prior: float) -> float:
        """α over the recent rounds: drafts kept ÷ drafts judged (a round's first rejected
        draft is judged, the ones after it are not), the prior counting as prior_weight
        drafts."""
        self._keep(rounds, new)
        kept = sum(a for a, _ in rounds) + prior * self.prior_weight
        return kept / (sum(t for _, t in rounds) + self.prior_weight)

    def observe_round(self, gamma: int, accepted: int, draft_s: float, verify_s: float,
                      key=None) -> None:
        """A round of gamma drafts, accepted of them kept; draft_s: drafting them (not
        the draft's catch-up), verify_s: the target's pass over them."""
        self.observe_acceptance(gamma, accepted, key)
        step = self.target_step_s
        if step:
            c = draft_s / gamma / step
            self._keep(self._c_all, c)
            self._keep(self._c_by_key.setdefault(key, deque()), c)
            self._keep(self._extra.setdefault(gamma, deque()),
                       max(0.0, verify_s / step - 1) / gamma)
            self._extra_medians = None
            self._measured += 1
        if self._probing:  # a probe that still predicts no gain waits twice as long next time
            self._probing = False
            if self.predicted(self.peak(key), key) <= 1.0:
                self._probe_wait = min(2 * (self._probe_wait or self.probe_every), self.probe_max)


@dataclass
class DraftStats:
    """What the results, JSON and the gauge bar report about speculation."""

    source: str  # "model:<name>", "ngram" or "ngram+model:<name>"
    rule: str  # the acceptance rule this engine applied
    proposed: int = 0
    accepted: int = 0
    judged: int = 0  # drafts the target judged: the kept ones and the first rejected of a round
    target_passes: int = 0  # decode-time target forward passes (verify rounds and plain steps)
    tokens: int = 0  # tokens produced by those passes
    accepted_runs: Counter = field(default_factory=Counter)  # drafts kept per round -> rounds
    gamma: int = 0
    alpha: float = 0.0
    c: float = 0.0
    beta: float = 0.0  # the verify pass's extra cost per draft token, in target steps
    predicted_speedup: float = 1.0
    measured_speedup: float | None = None  # decode rate ÷ the measured plain-step rate
    switched_off: int = 0  # times this request's measured speedup turned its drafting off
    # plain steps this request's rounds cost beyond the tokens they gave (negative: gained),
    # timed against the engine's plain steps in the same run
    lost_steps: float = 0.0

    def as_dict(self) -> dict:
        return {
            "source": self.source, "rule": self.rule,
            "proposed": self.proposed, "accepted": self.accepted,
            "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
            "judged": self.judged,  # accepted ÷ judged is α per token (drafts after a miss are unjudged)
            "tokens_per_target_pass": self.tokens / self.target_passes if self.target_passes else 0.0,
            "accepted_run_histogram": {str(k): v for k, v in sorted(self.accepted_runs.items())},
            "gamma": self.gamma, "alpha": self.alpha, "c": self.c, "beta": self.beta,
            "predicted_speedup": self.predicted_speedup, "measured_speedup": self.measured_speedup,
            "switched_off": self.switched_off, "lost_steps": self.lost_steps,
            "own_steps_speedup": self.own_steps_speedup,
        }

    @property
    def own_steps_speedup(self) -> float | None:
        """The reply's tokens ÷ the plain steps its decoding cost (its tokens plus lost_steps):
        drafting's effect measured in the run's own steps, free of run-to-run noise."""
        if not self.tokens or self.tokens + self.lost_steps <= 0:
            return None
        return self.tokens / (self.tokens + self.lost_steps)
