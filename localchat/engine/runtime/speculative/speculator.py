"""Speculation inside a step, in one place: before the forward pass, each decoding sequence's
draft tokens (a draft source's, cut where its grammar refuses one, or the tokens its grammar
forces) are appended to its chunk; after it, the rejected ones are cut back and the round
is recorded with the controllers (one sequence's AdaptiveGamma, a batch's BatchGamma)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.executor_api import Executor
from localchat.engine.runtime.guide import Guide
from localchat.engine.runtime.scheduler import ScheduledChunk, Scheduler
from localchat.engine.runtime.sequence import Sequence
from localchat.engine.runtime.speculative.adaptive import AdaptiveGamma, structural_c
from localchat.engine.runtime.speculative.batch import BatchGamma, BatchPlan
from localchat.engine.runtime.speculative.drafts import DraftSource
from localchat.engine.runtime.speculative.state import Speculation


def draft_cost_prior(draft: DraftSource | None, target: Executor) -> float:
    """c before any round is timed: a draft model's structural ratio to the target (weight
    bytes, layers), prompt lookup's ~0."""
    executor = getattr(draft, "executor", None)
    if draft is None or executor is None:
        return 0.0 if draft is not None else AdaptiveGamma.c_prior
    d, t = executor.info, target.info
    return structural_c(d.weights_bytes, d.n_layers, t.weights_bytes, t.n_layers)


@dataclass
class Round:
    """One step's speculation: the draft source's chunks with the drafts proposed for each,
    the batch controller's plan where it chose γ, the tokens grammars forced, and the
    lookup's free guess for each chunk that decodes plain despite its evidence."""

    drafted: list[tuple[ScheduledChunk, int]] = field(default_factory=list)
    plan: BatchPlan | None = None
    forced: int = 0
    shadows: list[tuple[ScheduledChunk, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.drafted)


class Speculator:
    def __init__(self, executor: Executor, blocks: BlockManager, scheduler: Scheduler, *,
                 n_ctx: int, draft: DraftSource | None,
                 num_draft_tokens: int | None) -> None:
        self.blocks, self.scheduler, self.n_ctx = blocks, scheduler, n_ctx
        self.draft = draft
        self.adaptive = AdaptiveGamma(fixed=num_draft_tokens,
                                      alpha_priors=draft.alpha_priors if draft else {},
                                      c_prior=draft_cost_prior(draft, executor))
        self.batch = BatchGamma()  # γ for steps of several sequences (adaptive's: one alone)
        # tokens a grammar forces go to the target as drafts (False: one per step like any
        # other token, the baseline `bench --task json` compares with)
        self.forced_drafts = True

    def speculation_for(self, seq: Sequence) -> Speculation | None:
        """A new request's speculation state (none for seeded requests under auto drafting:
        their generator must be drawn the same however many drafts fit)."""
        if self.draft is None or (self.draft.auto and seq.params.seed is not None):
            return None
        return Speculation(self.draft.source, self.adaptive)

    def prefill(self, chunks: list[ScheduledChunk]) -> None:
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

    def propose(self, chunks: list[ScheduledChunk]) -> Round:
        """Draft tokens for every decoding sequence that speculates or whose grammar forces
        what comes next, appended to its chunk (and its blocks) for the target to verify.
        Forced tokens cost no drafting; a draft source's tokens are cut where the grammar
        refuses one."""
        if self.draft is not None:
            self.draft.retain({s.seq_id for s in self.scheduler.running})
        budget = self.scheduler.max_tokens_per_step - sum(c.end - c.start for c in chunks)
        round_ = Round()
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
        round_.plan = self._batch_plan(chunks, candidates)
        batch_gamma = self._batch_choice(round_.plan)
        for chunk, evidence, room in candidates:
            seq = chunk.seq
            if evidence is False:
                gamma = 0
            elif round_.plan is None:
                gamma = seq.speculation.choose(min(room, budget), evidence)
            else:
                seq.speculation.key = evidence
                gamma = seq.speculation.affordable(max(0, min(batch_gamma, room, budget)),
                                                   evidence)
            budget -= gamma
            requests.append((seq, gamma))
            owners.append(chunk)
            guess = self.draft.peek(seq) if gamma == 0 and evidence else None
            if guess is not None:
                round_.shadows.append((chunk, guess))
        proposals = self.draft.propose(requests) if any(g for _, g in requests) else \
            [([], None)] * len(requests)
        for chunk, ff in forced:
            self._append(chunk, ff, None)
            chunk.forced = True
            round_.forced += len(chunk.drafts)
        for chunk, (drafts, q) in zip(owners, proposals):
            if chunk.seq.guide is not None:
                drafts, q = grammatical(chunk.seq.guide, drafts, q)
            self._append(chunk, drafts, q)
            round_.drafted.append((chunk, len(chunk.drafts)))
        return round_

    def cut_rejected(self, chunks: list[ScheduledChunk], new_tokens: dict[int, list]) -> int:
        """Give back the blocks of the drafts the target did not keep; the forced tokens
        kept (every forced token the grammar allowed is kept)."""
        kept_forced = 0
        for chunk in chunks:
            if not chunk.drafts:
                continue
            new = new_tokens[chunk.seq.seq_id]
            kept = len(new) - 1
            rejected = len(chunk.drafts) - kept
            if rejected:
                self.blocks.rollback(chunk.seq, rejected)
                chunk.seq.in_pool -= rejected
            chunk.drafts = chunk.drafts[:kept]
            if chunk.forced:
                kept_forced += len(chunk.drafts)
        return kept_forced

    def record(self, round_: Round, new_tokens: dict[int, list], *, decoding: bool,
               draft_s: float, verify_s: float, step_s: float, tokens_passed: int,
               rows: int, settled: bool = True) -> None:
        """The round's timings to the controllers: each sequence's (alone), the batch's
        (not where the step ran at a thread count the governor was probing: only α then);
        and whether the target chose the lookup's guess where a sequence drafted nothing
        (a one-draft round's acceptance, measured at no cost)."""
        for chunk, guess in round_.shadows:
            chosen = new_tokens.get(chunk.seq.seq_id)
            if chosen:
                chunk.seq.speculation.shadow(chosen[0] == guess)
        catch_up_s = self.draft.catch_up_s if round_ else 0.0
        draft_s = max(0.0, draft_s - catch_up_s)
        for chunk, proposed in round_.drafted:
            chunk.seq.speculation.record(proposed, len(chunk.drafts), draft_s, verify_s,
                                         step_s, catch_up_s,
                                         untimed=round_.plan is not None or not settled)
        if round_.plan is not None and decoding and settled:
            self.batch.observe(round_.plan, tokens_passed,
                               [proposed for _, proposed in round_.drafted], rows, draft_s,
                               verify_s)

    def settle(self, seq: Sequence) -> None:
        """A sequence's tokens are final for this step: the draft's copy follows them."""
        if seq.speculation is not None and self.draft is not None:
            self.draft.settle(seq)

    # ---- the parts ------------------------------------------------------------------

    def _batch_plan(self, chunks: list[ScheduledChunk], candidates: list) -> BatchPlan | None:
        """The step as the batch controller sees it where it decides (several sequences in
        the step, γ not fixed); None where each request's own controller does."""
        if len(chunks) < 2 or self.adaptive.fixed is not None or not candidates:
            return None
        live = [(ev, room) for _, ev, room in candidates if ev is not False]
        return BatchPlan(chains=[self.adaptive.acceptance(ev) for ev, _ in live],
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

    def _append(self, chunk: ScheduledChunk, drafts: list[int], q: np.ndarray | None) -> None:
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


def grammatical(guide: Guide, drafts: list[int], q: np.ndarray | None
                ) -> tuple[list[int], np.ndarray | None]:
    """Drafts cut at the first one the grammar refuses. A sampled draft (q given) keeps that
    one, so that the acceptance rule rejects it and draws from the residual, as exactness
    needs; a deterministic one's rejection draws from p."""
    n = guide.valid_prefix(drafts)
    if n < len(drafts) and q is not None:
        n += 1
    return drafts[:n], None if q is None else q[:n]
