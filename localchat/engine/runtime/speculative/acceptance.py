"""How likely a prompt-lookup draft is kept, per match length: each draft is judged at the
length of the match it extends (a round at a k-token match judges its first draft at k,
its second, once the first was kept, at k + 1, ...), and a plain step's free guess (the
lookup's next token, against the target's) is a first draft at its match length. A
round's expected yield is then the chain of those rates: with one α per match length,
the long runs a quoting reply kept made short matches look as good in the chat after it."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

ESTABLISHED_ROUNDS = 4  # drafts judged at a key before its α is its own, not its prior's


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens a round of γ drafts yields on average (the kept drafts and the target's
    own), each draft kept with probability α while all before it were."""
    return gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def chain_tokens(chain: list[float], gamma: int) -> float:
    """The same where the i-th draft is kept with probability chain[i - 1] once all
    before it were."""
    total = kept = 1.0
    for rate in chain[:gamma]:
        kept *= rate
        total += kept
    return total


@dataclass
class MatchAcceptance:
    """Per match length, its recent events (kept, judged): each round or guess that judged
    drafts there; the rate is theirs with the length's prior (the longest prior for longer
    matches, the caller's fallback where there is none) counting as `weight` drafts."""

    priors: dict
    weight: float = 2.0
    window: int = 16  # events kept per match length
    longest: int = 8  # longer matches are judged as this long
    _judged: dict = field(default_factory=dict)  # length -> deque of (kept, judged)

    def observe(self, key: int, gamma: int, accepted: int) -> None:
        """A round of γ drafts after a `key`-token match, `accepted` of them kept (the first
        miss judged, the drafts after it not): an event at each length it judged drafts at
        (a quote's 15 kept drafts after an 8-token match are one event, as a chat's miss
        there is, so that one miss does not outweigh the quote)."""
        events: dict[int, list[int]] = {}
        for i in range(min(gamma, accepted + 1)):
            kept_judged = events.setdefault(min(key + i, self.longest), [0, 0])
            kept_judged[0] += i < accepted
            kept_judged[1] += 1
        for length, (kept, judged) in events.items():
            self._add(length, kept, judged)

    def guess(self, key: int, kept: bool) -> None:
        """A plain step's free guess after a `key`-token match."""
        self._add(key, int(kept), 1)

    def rate(self, key: int, fallback: float, optimistic: bool = False) -> float:
        """The chance a draft after a `key`-token match is kept (optimistic: with the
        prior's drafts counted as kept)."""
        events = self._judged.get(min(key, self.longest), ())
        prior = 1.0 if optimistic else self.prior(key, fallback)
        return (sum(k for k, _ in events) + prior * self.weight) / (
            sum(j for _, j in events) + self.weight)

    def chain(self, key: int, gamma: int, fallback: float,
              optimistic: bool = False) -> list[float]:
        """The rates of a round's γ drafts after a `key`-token match (optimistic: the
        first one's)."""
        return [self.rate(key + i, fallback, optimistic and i == 0) for i in range(gamma)]

    def established(self, key: int) -> bool:
        return len(self._judged.get(min(key, self.longest), ())) >= ESTABLISHED_ROUNDS

    def prior(self, key: int, fallback: float) -> float:
        """The rate after a `key`-token match before any draft is judged there."""
        if key in self.priors:
            return self.priors[key]
        shorter = [k for k in self.priors if isinstance(k, int) and k < key]
        return self.priors[max(shorter)] if shorter else fallback

    def _add(self, key: int, kept: int, judged: int) -> None:
        self._judged.setdefault(min(key, self.longest), deque(maxlen=self.window)).append(
            (kept, judged))
