"""How many compute threads the executor uses, chosen from measured step times: with another
process holding a core, threads that synchronise every layer wait for the one it preempts, and
fewer threads decode faster (docs/benchmarks.md, "Threads on a busy machine")."""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from typing import Callable, Hashable

FIRST_PROBE_AFTER = 4  # decoding steps before the first probe (load may be there at start)
CLEAR_LOSS = 1.5  # a probe stops early once the candidate is this much slower
PROBE_LIMIT = 4  # a probe ends after this many times probe_steps steps, compared or not
Key = Hashable  # the step's shape: steps are compared only with steps of the same shape


class ThreadGovernor:
    """Probes another thread count now and then (one more or fewer, further each time that way
    loses; alternated with the current count on each step shape, so both see the same load and
    a shape is only compared with itself), moves when it is clearly faster, and probes at once
    when the current count's steps slow down."""

    def __init__(self, max_threads: int, set_threads: Callable[[int], None], *,
                 interval: int = 64, max_interval: int = 1024, probe_steps: int = 6,
                 gain: float = 0.9, slowdown: float = 1.3) -> None:
        self.max_threads = max_threads
        self.threads = max_threads
        self._set = set_threads
        self.interval, self.base_interval, self.max_interval = interval, interval, max_interval
        self.probe_steps, self.gain, self.slowdown = probe_steps, gain, slowdown
        self._since_probe = max(0, interval - FIRST_PROBE_AFTER)
        self._recent: dict[Key, deque[float]] = defaultdict(lambda: deque(maxlen=8))
        self._settled: dict[Key, float] = {}  # the current count's median step at the last decision
        self._probe: list[tuple[int, Key, float]] | None = None
        self._candidate: int | None = None
        self._down = True  # which way the next probe tries first
        self._stride = {-1: 1, 1: 1}  # how far it tries: doubled each time that way loses
        self._way = -1
        self.switches = self.probes = 0
        self.counts_used: set[int] = set()  # every thread count a step ran with

    def before_step(self, key: Key | None) -> None:
        """Set the thread count for the next step, of shape `key` (None: a step observe() will
        not time): during a probe, the candidate for every other step of each shape. A
        speculative round whose γ is new runs at the current count, not at a count that has
        nothing to be compared with."""
        want = self.threads
        if self._probe is not None and key is not None:
            counts = [n for n, k, _ in self._probe if k == key]
            if counts.count(self.threads) > counts.count(self._candidate):
                want = self._candidate
        self._apply(want)

    @property
    def settled(self) -> bool:
        """The step runs at the chosen count (not a probe's candidate): its time is the one
        other instruments (the speculation cost model) should learn from."""
        return self._applied == self.threads

    def observe(self, key: Key | None, seconds: float) -> None:
        """The step just run took `seconds`; key None: not comparable (not timed)."""
        if key is None:
            return
        if self._probe is not None:
            self._probe.append((self._applied, key, seconds))
            if self._compared() or self._clearly_slower() or \
                    len(self._probe) >= PROBE_LIMIT * self.probe_steps:
                self._decide()
            return
        recent = self._recent[key]
        recent.append(seconds)
        self._since_probe += 1
        settled = self._settled.get(key)
        slowed = (settled is not None and len(recent) == recent.maxlen
                  and statistics.median(recent) > self.slowdown * settled)
        if self._since_probe >= self.interval or slowed:
            self._start_probe(reset_backoff=slowed)

    def _start_probe(self, reset_backoff: bool) -> None:
        if reset_backoff:
            self.interval = self.base_interval
        ways = [w for w in ((-1, 1) if self._down else (1, -1))
                if 1 <= self.threads + w <= self.max_threads]
        if not ways:
            self._since_probe = 0
            return
        way = ways[0]
        self._way = way
        reach = max(1, self.threads // 2) if way < 0 else self.max_threads - self.threads
        self._candidate = self.threads + way * min(self._stride[way], reach)  # never below half
        self._down = not self._down if len(ways) > 1 else self._down
        self.probes += 1
        self._probe = []

    def _by_key(self) -> dict[Key, dict[int, list[float]]]:
        by_key: dict[Key, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for n, key, s in self._probe:
            by_key[key][n].append(s)
        return by_key

    def _compared(self) -> bool:
        """Some shape has probe_steps steps at each count."""
        return any(min(len(t[self.threads]), len(t[self._candidate])) >= self.probe_steps
                   for t in self._by_key().values())

    def _clearly_slower(self) -> bool:
        """Two candidate steps each slower than every current one by CLEAR_LOSS: stop the
        probe (on a busy machine the way back to more threads costs 3x a step)."""
        return any(len(t[self._candidate]) >= 2 and len(t[self.threads]) >= 2
                   and min(t[self._candidate]) > CLEAR_LOSS * max(t[self.threads])
                   for t in self._by_key().values())

    def _decide(self) -> None:
        by_key, candidate, current = self._by_key(), self._candidate, self.threads
        self._probe, self._candidate, self._since_probe = None, None, 0
        comparable = [(sum(len(v) for v in t.values()), key, t) for key, t in by_key.items()
                      if len(t[current]) >= 2 and len(t[candidate]) >= 2]
        if not comparable:  # shapes changed under the probe: try again after the next interval
            self._apply(current)
            return
        _, key, times = max(comparable, key=lambda c: c[0])
        now, other = statistics.median(times[current]), statistics.median(times[candidate])
        self._recent.clear()
        if other < self.gain * now:
            self.threads, self.switches = candidate, self.switches + 1
            self._settled = {key: other}
            self.interval = self.base_interval
            self._down = candidate < current  # keep going the way that paid
            self._stride = {-1: 1, 1: 1}
        else:
            self._settled = {key: now}
            self._stride[self._way] = min(2 * self._stride[self._way], self.max_threads)
            self.interval = min(2 * self.interval, self.max_interval)
        self._apply(self.threads)

    _applied: int = 0

    def _apply(self, n: int) -> None:
        if n != self._applied:
            self._set(n)
            self._applied = n
            self.counts_used.add(n)


def governor_for(executor, draft) -> ThreadGovernor | None:
    """A thread governor over the target and a draft model's executor (an Executor and a
    DraftSource), if both can change their thread count."""
    from localchat.engine.runtime.executor_api import Executor

    executors = [executor] + [e for e in [getattr(getattr(draft, "model", draft), "executor",
                                                  None)] if e is not None]
    if any(type(e).set_threads is Executor.set_threads or not getattr(e, "threads", None)
           for e in executors):
        return None
    return ThreadGovernor(executor.threads, lambda n: [e.set_threads(n) for e in executors])
