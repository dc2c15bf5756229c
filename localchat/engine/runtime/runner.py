"""The runtime's step loop on the compute thread (continuous batching): schedule -> draft
(and forced tokens) -> executor.forward -> mask, sample and verify -> postprocess. Callers on any thread submit a Sequence
and read its queue; one that stops reading cancels it."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import Counter
from typing import Callable, Iterator

import numpy as np

from localchat.engine.base import SamplingParams
from localchat.engine.runtime.executor_api import Chunk, Executor
from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.engine.runtime.decided import decided_rows, fit_width, with_decided_rows
from localchat.engine.runtime.guide import Guide, step_masks
from localchat.engine.runtime.kv_disk import DiskCache
from localchat.engine.runtime.sampler import Row, argmax, distributions, penalized, sample
from localchat.engine.runtime.scheduler import ScheduledChunk, Scheduler
from localchat.engine.runtime.sequence import FINISHED, Sequence
from localchat.engine.runtime.speculative.adaptive import AdaptiveGamma, structural_c
from localchat.engine.runtime.speculative.batch import BatchGamma, BatchPlan
from localchat.engine.runtime.speculative.drafts import DraftSource
from localchat.engine.runtime.speculative.rule import accept_drafts, accept_greedy
from localchat.engine.runtime.speculative.state import Speculation
from localchat.engine.runtime.thread_governor import ThreadGovernor
from localchat.errors import EngineError

_DONE = object()
CANCEL_POLL_S = 0.05  # how often a reader waiting for a token looks at its cancel event
FROM_DRAFT = True  # queued as (token, FROM_DRAFT) for tokens a draft proposed and the target kept


def draft_cost_prior(draft: DraftSource | None, target: Executor) -> float:
    """c before any round is timed: a draft model's structural ratio to the target (weight
    bytes, layers), prompt lookup's ~0."""
    executor = getattr(draft, "executor", None)
    if draft is None or executor is None:
        return 0.0 if draft is not None else AdaptiveGamma.c_prior
    d, t = executor.info, target.info
    return structural_c(d.weights_bytes, d.n_layers, t.weights_bytes, t.n_layers)


class Runner:
    def __init__(self, executor: Executor, is_end_of_generation: Callable[[int], bool], *,
                 n_ctx: int, draft: DraftSource | None = None,
                 num_draft_tokens: int | None = None, max_tokens_per_step: int = 512,
                 max_running: int = 64, adapt_threads: bool = False) -> None:
        """adapt_threads: let measured step times choose the executor's thread count (where
        it can change it), as when the user named none."""
        self.executor = executor
        self.blocks = BlockManager(executor.layout)
        if executor.layout.exclusive:
            max_running = min(max_running, executor.layout.pools)
        self.scheduler = Scheduler(self.blocks, max_tokens_per_step, max_running)
        self.n_ctx = n_ctx
        self.draft = draft
        self.adaptive = AdaptiveGamma(fixed=num_draft_tokens,
                                      alpha_priors=draft.alpha_priors if draft else {},
                                      c_prior=draft_cost_prior(draft, executor))
        self.batch = BatchGamma()  # γ for steps of several sequences (adaptive's: one alone)
        self._plan: BatchPlan | None = None  # this step's, where the batch controller chose
        self.clock = time.perf_counter
        self._is_end = is_end_of_generation
        self._ids = itertools.count()
        self._inbox: list[Sequence] = []
        self._lock = threading.Lock()
        self._closed = False
        self.steps = 0
        # steps run with each number of sequences (bounded: one key per batch size seen)
        self.steps_by_batch_size: Counter[int] = Counter()
        # tokens a grammar forces go to the target as drafts (False: one per step like
        # any other token, the baseline `bench --task json` compares with)
        self.forced_drafts = True
        self.mask_s = 0.0  # time spent computing constraint masks, and the rows masked
        self.masked_rows = 0
        self.forced_proposed = self.forced_kept = 0  # forced tokens drafted, and kept
        self.disk: DiskCache | None = None  # KV snapshots on disk (use_disk())
        self.threads = self._governor(executor, draft) if adapt_threads else None
        COMPUTE.add(self)

    @staticmethod
    def _governor(executor: Executor, draft: DraftSource | None) -> ThreadGovernor | None:
        """A thread governor over the target and a draft model's executor, if both can
        change their thread count."""
        executors = [executor] + [e for e in [getattr(getattr(draft, "model", draft), "executor",
                                                      None)] if e is not None]
        if any(type(e).set_threads is Executor.set_threads or not getattr(e, "threads", None)
               for e in executors):
            return None
        return ThreadGovernor(executor.threads, lambda n: [e.set_threads(n) for e in executors])

    @property
    def clock(self) -> Callable[[], float]:
        """What steps (and the draft's catch-up) are timed with; tests inject timings."""
        return self._clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        for source in (self.draft, getattr(self.draft, "model", None)):
            if hasattr(source, "clock"):
                source.clock = clock

    def use_disk(self, disk: DiskCache) -> None:
        """Restore prompts' prefixes from these snapshots and save finished replies' KV."""
        self.disk = disk
        self.scheduler.before_admit = disk.restore

    # ---- caller side ---------------------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams, budget: int,
               generator: np.random.Generator, guide: Guide | None = None) -> Sequence:
        seq = Sequence(next(self._ids), list(prompt), len(prompt), params, budget, generator)
        seq.guide = guide
        if self.draft is not None and not (self.draft.auto and params.seed is not None):
            seq.speculation = Speculation(self.draft.source, self.adaptive)
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            self._inbox.append(seq)
        COMPUTE.wake()
        return seq

    def tokens(self, seq: Sequence, cancel: threading.Event | None = None
               ) -> Iterator[int | tuple[int, bool]]:
        """The sequence's tokens as they come; they stop when `cancel` is set (even while
        the sequence waits for its turn), and closing this cancels it."""
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    return
                try:
                    item = seq.out.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    continue
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel(seq)

    def cancel(self, seq: Sequence) -> None:
        if seq.status != FINISHED:
            seq.cancelled = True
            COMPUTE.wake()

    def close(self) -> None:
        """Stop stepping; requests still in flight end with an error."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        COMPUTE.call(self._shut_down)

    def _shut_down(self) -> None:
        COMPUTE.remove(self)
        self._fail_all(EngineError("the engine was closed"))

    # ---- the steps (on the compute thread) -------------------------------------------

    def has_work(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_work()

    def step(self) -> bool:
        """One forward pass over what the scheduler picks; False if nothing could run
        yet (no blocks free: cannot last, finishing requests free them)."""
        with self._lock:
            for seq in self._inbox:
                self.scheduler.add(seq)
            self._inbox.clear()
        try:
            return self._step()
        except Exception as exc:  # noqa: BLE001 -- every waiting caller must hear of it
            self._fail_all(EngineError(f"the {self.executor.name} engine failed: {exc}"))
            return True

    def _step(self) -> bool:
        chunks = self.scheduler.schedule()
        if not chunks:
            return False
        decoding = all(c.decodes for c in chunks)  # before the step's tokens are handed out
        self._prefill_draft(chunks)
        if self.threads is not None:
            self.threads.before_step(eligible=decoding)
        t0 = self.clock()
        speculating = self._propose(chunks)
        t_drafted = self.clock()
        masks = self._masks(chunks)
        decided = decided_rows(chunks, masks)
        passed = [self._executor_chunk(c, d) for c, d in zip(chunks, decided)]
        logits = self.executor.forward(passed)
        new_tokens = self._choose(chunks, with_decided_rows(logits, decided, chunks), masks)
        for chunk in chunks:
            if chunk.drafts:
                self._cut_rejected(chunk, new_tokens[chunk.seq.seq_id])
                if chunk.forced:
                    self.forced_kept += len(chunk.drafts)
        self.scheduler.after_step(chunks)
        t_verified = self.clock()
        step_s = t_verified - t0
        if self.threads is not None:
            self.threads.observe((len(passed), sum(len(c.tokens) for c in passed))
                                 if decoding else None, step_s)
        self.steps += 1
        self.steps_by_batch_size[len(chunks)] += 1
        for chunk in chunks:
            if chunk.samples:
                self._hand_out(chunk, new_tokens[chunk.seq.seq_id])
        catch_up_s = self.draft.catch_up_s if speculating else 0.0
        draft_s = max(0.0, t_drafted - t0 - catch_up_s)
        plan = self._plan
        for chunk, proposed in speculating:
            chunk.seq.speculation.record(proposed, len(chunk.drafts), draft_s,
                                         t_verified - t_drafted, step_s, catch_up_s,
                                         batched=plan is not None)
        if plan is not None and decoding:
            self.batch.observe(plan, sum(len(c.tokens) for c in passed),
                               [proposed for _, proposed in speculating],
                               sum(len(c.drafts) + 1 for c in chunks), draft_s,
                               t_verified - t_drafted)
        return True

    def _executor_chunk(self, chunk: ScheduledChunk, decided: tuple[int, ...]) -> Chunk:
        seq = chunk.seq
        return Chunk(slot=seq.slot, tokens=seq.tokens[chunk.start:chunk.end] + chunk.drafts,
                     start=chunk.start,
                     n_logits=1 + len(chunk.drafts) if chunk.samples else 0,
                     block_table=self.blocks.block_table(seq),
                     write_from=self.blocks.num_committed(seq), n_prompt=seq.n_prompt,
                     copy_from=self.blocks.take_copy(seq), no_logits=decided)

    # ---- speculation ---------------------------------------------------------------------

    def _prefill_draft(self, chunks: list[ScheduledChunk]) -> None:
        """The draft model's pass over the prompts whose prefill ends this step, in this
        step (their TTFT) rather than in their first drafted round or probe (their decode
        time: a probe's catch-up over a 125-token prompt cost a 32-token reply on deep-2
        as much as its decoding, with drafting off)."""
        if self.draft is None:
            return
        seqs = [c.seq for c in chunks
                if c.seq.speculation is not None and c.samples and not c.decodes]
        if seqs:
            self.draft.prefill(seqs)

    def _propose(self, chunks: list[ScheduledChunk]) -> list[tuple[ScheduledChunk, int]]:
        """Draft tokens for every decoding sequence that speculates or whose grammar forces
        what comes next, appended to its chunk (and its blocks) for the target to verify.
        Forced tokens cost no drafting; a draft source's tokens are cut where the grammar
        refuses one. Returns (chunk, drafts proposed) for the draft source's chunks."""
        if self.draft is not None:
            self.draft.retain({s.seq_id for s in self.scheduler.running})
        budget = self.scheduler.max_tokens_per_step - sum(c.end - c.start for c in chunks)
        requests, owners, forced, candidates = [], [], [], []
        for chunk in chunks:
            seq = chunk.seq
            if (seq.speculation is None and seq.guide is None) or not chunk.decodes:
                continue
            room = min(self.n_ctx - len(seq.tokens) - 1,
                       seq.budget - len(seq.completion) - 1, budget)
            ff = seq.guide.forced()[:max(0, room)] if self._forces(seq) else []
            if ff:
                budget -= len(ff)
                forced.append((chunk, ff))
                continue
            if seq.speculation is None or self.draft is None:
                continue
            candidates.append((chunk, self.draft.evidence(seq), room))
        self._plan = self._batch_plan(chunks, candidates)
        batch_gamma = self._batch_choice(self._plan)
        for chunk, evidence, room in candidates:
            seq = chunk.seq
            if evidence is False:
                gamma = 0
            elif self._plan is None:
                gamma = seq.speculation.choose(min(room, budget), evidence)
            else:
                seq.speculation.key = evidence
                gamma = seq.speculation.affordable(max(0, min(batch_gamma, room, budget)),
                                                   evidence)
            budget -= gamma
            requests.append((seq, gamma))
            owners.append(chunk)
        proposals = self.draft.propose(requests) if any(g for _, g in requests) else \
            [([], None)] * len(requests)
        for chunk, ff in forced:
            self._append_drafts(chunk, ff, None)
            chunk.forced = True
            self.forced_proposed += len(chunk.drafts)
        out = []
        for chunk, (drafts, q) in zip(owners, proposals):
            if chunk.seq.guide is not None:
                drafts, q = self._grammatical(chunk.seq.guide, drafts, q)
            self._append_drafts(chunk, drafts, q)
            out.append((chunk, len(chunk.drafts)))
        return out

    def _batch_plan(self, chunks: list[ScheduledChunk], candidates: list) -> BatchPlan | None:
        """The step as the batch controller sees it where it decides (several sequences in
        the step, γ not fixed); None where each request's own controller does."""
        if len(chunks) < 2 or self.adaptive.fixed is not None or not candidates:
            return None
        live = [(ev, room) for _, ev, room in candidates if ev is not False]
        return BatchPlan(alphas=[self.adaptive.alpha_for(ev) for ev, _ in live],
                         limits=[max(0, room) for _, room in live],
                         sampling=sum(1 for c in chunks if c.samples),
                         base_tokens=sum(c.end - c.start for c in chunks))

    def _batch_choice(self, plan: BatchPlan | None) -> int:
        """The batch controller's γ for this step's speculating sequences (0 without a plan)."""
        if plan is None or not plan.limits:
            return 0
        a = self.adaptive
        beta_s = a.extra_at(1) * a.target_step_s if a.target_step_s and a.extra_by_gamma \
            else None  # one sequence's measured β until a second size is timed here
        return self.batch.choose(plan, a.c, beta_s)

    def _forces(self, seq: Sequence) -> bool:
        """Its grammar's forced tokens go to the target as drafts: not for a seeded
        sampled request, whose generator must be drawn the same however many drafts
        fit in a step (reproducible alone or batched), as for auto drafts."""
        return seq.guide is not None and self.forced_drafts and (
            seq.params.temperature == 0 or seq.params.seed is None)

    @staticmethod
    def _grammatical(guide: Guide, drafts: list[int], q: np.ndarray | None
                     ) -> tuple[list[int], np.ndarray | None]:
        """Drafts cut at the first one the grammar refuses. A sampled draft (q given)
        keeps that one, so that the acceptance rule rejects it and draws from the
        residual, as exactness needs; a deterministic one's rejection draws from p."""
        n = guide.valid_prefix(drafts)
        if n < len(drafts) and q is not None:
            n += 1
        return drafts[:n], None if q is None else q[:n]

    def _append_drafts(self, chunk: ScheduledChunk, drafts: list[int],
                       q: np.ndarray | None) -> None:
        seq = chunk.seq
        fitted = []
        for token in drafts:
            if not self.blocks.can_append(seq):
                break
            self.blocks.append_token(seq, token)
            fitted.append(token)
        chunk.drafts = fitted
        chunk.q = None if q is None else q[:len(fitted)]
        seq.in_pool += len(fitted)

    def _cut_rejected(self, chunk: ScheduledChunk, new: list[int | tuple[int, bool]]) -> None:
        kept = len(new) - 1
        rejected = len(chunk.drafts) - kept
        if rejected:
            self.blocks.rollback(chunk.seq, rejected)
            chunk.seq.in_pool -= rejected
        chunk.drafts = chunk.drafts[:kept]

    # ---- sampling ----------------------------------------------------------------------

    def _choose(self, chunks: list[ScheduledChunk], logits: np.ndarray,
                masks: dict[int, np.ndarray]) -> dict[int, list]:
        """Per sampling sequence, its new tokens: kept drafts (as (token, FROM_DRAFT)),
        then the token the target chose. Plain rows are sampled together; a constrained
        row only among the tokens its grammar allows there (masks: row -> allowed)."""
        out: dict[int, list] = {}
        masks = {r: fit_width(m, logits.shape[-1]) for r, m in masks.items()}
        plain_rows, plain_seqs = [], []
        row = 0
        for chunk in chunks:
            if not chunk.samples:
                continue
            seq, n = chunk.seq, 1 + len(chunk.drafts)
            if chunk.drafts:
                allowed = [masks.get(r) for r in range(row, row + n)]
                kept, token = self._verify(seq, chunk, logits[row:row + n], allowed)
                out[seq.seq_id] = [(d, FROM_DRAFT) for d in chunk.drafts[:kept]] + [token]
            else:
                plain_rows.append(row)
                plain_seqs.append(seq)
            row += n
        if plain_seqs:
            rows = [Row(s.params, s.completion if s.params.repeat_penalty != 1.0 else (),
                        s.generator, masks.get(r)) for s, r in zip(plain_seqs, plain_rows)]
            plain = logits if len(plain_rows) == logits.shape[0] else logits[plain_rows]
            for seq, token in zip(plain_seqs, sample(plain, rows)):
                out[seq.seq_id] = [token]
        return out

    def _masks(self, chunks: list[ScheduledChunk]) -> dict[int, np.ndarray]:
        """logits row -> the tokens allowed there (the tokenizer's width), for the rows a
        constraint governs."""
        guided, row = [], 0
        for chunk in chunks:
            if not chunk.samples:
                continue
            guide = chunk.seq.guide
            if guide is not None:
                guided.append((guide, row, chunk.drafts[:guide.valid_prefix(chunk.drafts)]))
            row += 1 + len(chunk.drafts)
        if not guided:
            return {}
        t0 = time.perf_counter()
        masks = step_masks(guided, row, guided[0][0].vocab_size)
        self.mask_s += time.perf_counter() - t0
        self.masked_rows += len(masks)
        return masks

    @staticmethod
    def _verify(seq: Sequence, chunk: ScheduledChunk, logits: np.ndarray,
                allowed: list[np.ndarray | None]) -> tuple[int, int]:
        drafts, sp = chunk.drafts, seq.params
        rows = [Row(sp, seq.completion + drafts[:i], seq.generator, allowed[i])
                for i in range(len(drafts) + 1)]
        if sp.temperature == 0:
            return accept_greedy(argmax(penalized(logits, rows)), drafts)
        return accept_drafts(distributions(logits, rows), chunk.q, drafts, seq.generator)

    def _hand_out(self, chunk: ScheduledChunk, new: list[int | tuple[int, bool]]) -> None:
        """Append the new tokens and queue them; a sequence that ends (end-of-generation,
        budget, its grammar complete: then its end token follows) gives its blocks back
        before its last token is handed out."""
        seq, guide = chunk.seq, chunk.seq.guide
        complete = False
        for i, item in enumerate(new):
            token = item[0] if isinstance(item, tuple) else item
            seq.tokens.append(token)
            end = self._is_end(token)
            done = end or len(seq.tokens) - seq.n_prompt >= seq.budget
            if guide is not None and end and not guide.accepting:
                self.scheduler.finish(seq)  # never a "stop" for text the grammar has not accepted
                seq.out.put(EngineError("the reply ended before its constraint was met"))
                return
            if guide is not None and not end:
                if not guide.consume(token):
                    self.scheduler.finish(seq)
                    seq.out.put(EngineError(f"the constraint refused a token: {guide.error}"))
                    return
                complete = guide.complete
            if done or complete or i == len(new) - 1:
                break
        handed = list(new[:i + 1])
        if complete and not done:
            seq.tokens.append(guide.end_token)
            handed.append(guide.end_token)
            done = True
        if seq.speculation is not None and self.draft is not None:
            self.draft.settle(seq)
        if done:
            self.scheduler.finish(seq)
            if self.disk is not None:  # before its last token: the reply's stats say it
                self.disk.note(seq)
        for item in handed:
            seq.out.put(item)
        if done:
            seq.out.put(_DONE)
            if self.disk is not None:
                self.disk.save(seq)

    def _fail_all(self, error: EngineError) -> None:
        with self._lock:
            pending = [*self.scheduler.running, *self.scheduler.waiting, *self._inbox]
            self._inbox.clear()
        for seq in pending:
            try:
                self.scheduler.finish(seq)
            except Exception:  # noqa: BLE001 -- the bookkeeping may be what failed
                seq.status = FINISHED
            seq.out.put(error)
