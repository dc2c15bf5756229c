"""The engine interface over the runtime: a request becomes a Sequence in the runner,
its tokens become events (stream.py), and the stats come from the block manager and
the sequence itself, the same for every executor."""

from __future__ import annotations

import threading
import time
from typing import Iterator

from localchat.engine.base import Engine, Event, Request
from localchat.engine.runtime.executor_api import Executor
from localchat.engine.constraint import Constraint
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.engine.runtime.guide import Guide, grammar_for
from localchat.engine.runtime.kv_disk import DiskCache
from localchat.engine.runtime.runner import Runner
from localchat.engine.runtime.sampler import generator as request_generator
from localchat.engine.runtime.sequence import Sequence
from localchat.engine.runtime.speculative.drafts import DraftSource
from localchat.engine.runtime.stream import EngineHooks, stream_events
from localchat.engine.runtime.vocab import VocabMixin
from localchat.models.facts import GGUFFacts
from localchat.storage.kv_snapshots import KVSnapshotStore

GRAMMARS_KEPT = 32  # compiled constraints kept for requests that repeat them


class RuntimeEngine(VocabMixin, Engine):
    def __init__(self, executor: Executor, facts: GGUFFacts, *, draft: DraftSource | None = None,
                 num_draft_tokens: int | None = None,
                 kv_store: KVSnapshotStore | None = None, adapt_threads: bool = False) -> None:
        """kv_store: where finished replies' KV is saved and prompts' prefixes restored from;
        adapt_threads: step times choose the thread count (the user named none)."""
        self.executor, self.facts = executor, facts
        self.name, self.info, self.vocab = executor.name, executor.info, executor.vocab
        self.draft = draft
        self._vocab_lock = threading.Lock()  # callers on several threads share one vocabulary
        self._pieces: dict[int, bytes] = {}  # detokenized tokens (at most the vocabulary)
        self.runner = Runner(executor, self.is_end_of_generation, n_ctx=self.info.n_ctx,
                             draft=draft, num_draft_tokens=num_draft_tokens,
                             adapt_threads=adapt_threads)
        self.blocks = self.runner.blocks
        self.disk = DiskCache(executor, self.blocks, kv_store) if kv_store is not None else None
        self.notes: list[str] = []  # for the user, once, after loading
        if self.disk is not None and self.disk.enabled:
            self.runner.use_disk(self.disk)
        elif self.disk is not None:
            self.notes.append(f"KV snapshots are off for {executor.info.name}: its cache "
                              "(recurrent or sliding-window state) cannot be restored exactly "
                              "here, so a reopened conversation is prefilled again")
        self._latest: Sequence | None = None
        self._tokenizer = None  # llguidance's, built for the first constrained request
        self._grammars: dict[Constraint, str] = {}  # compiled, most recent last

    def generate(self, request: Request, cancel: threading.Event | None = None) -> Iterator[Event]:
        t_start = time.perf_counter()
        prompt, budget = self.prompt_and_budget(request)
        guide = self.guide(request.constraint) if request.constraint is not None else None
        if guide is not None and request.assistant_prefix:  # the reply so far meets it too
            guide.follow(self.tokenize_text(request.assistant_prefix))
        cancel = cancel or threading.Event()
        if cancel.is_set():  # given up before it was submitted: compute nothing
            yield from stream_events(request, prompt, iter(()), self._hooks(prompt, None),
                                     budget, cancel, t_start)
            return
        seq = self.runner.submit(prompt, request.sampling, budget,
                                 request_generator(request.sampling.seed), guide)
        self._latest = seq
        yield from stream_events(request, prompt, self.runner.tokens(seq, cancel),
                                 self._hooks(prompt, seq), budget, cancel, t_start)

    @property
    def step_stats(self):
        """The step loop's counters (steps, by batch size, masks, forced tokens): bench reads
        them."""
        return self.runner.observer

    @property
    def forced_drafts(self) -> bool:
        """Tokens a grammar forces go to the model as drafts (False: one a step, the
        baseline `bench --task json` compares with)."""
        return self.runner.speculator.forced_drafts

    @forced_drafts.setter
    def forced_drafts(self, on: bool) -> None:
        self.runner.speculator.forced_drafts = on

    def guide(self, constraint: Constraint) -> Guide:
        """A fresh matcher for one sequence; UsageError if the schema or grammar is invalid
        (before anything is decoded)."""
        with self._vocab_lock:
            if self._tokenizer is None:
                self._tokenizer = self.vocab.constraint_tokenizer()
            grammar = self._grammars.pop(constraint, None) or grammar_for(constraint)
            guide = Guide.start(self._tokenizer, grammar, constraint)
            self._grammars[constraint] = grammar
            while len(self._grammars) > GRAMMARS_KEPT:
                del self._grammars[next(iter(self._grammars))]
            return guide

    def _hooks(self, prompt: list[int], seq: Sequence | None) -> EngineHooks:
        return EngineHooks(
            detokenize=self._detokenize,
            is_end_of_generation=self.is_end_of_generation,
            prompt_evaluated=lambda: len(prompt) - ((seq.cached_tokens or 0) if seq else 0),
            memory=lambda: self._memory(seq),
        )

    def _memory(self, seq: Sequence | None) -> dict:
        """Stats' memory fields. With a request: kv_cache_bytes is what its conversation holds
        (its blocks in use, or after the reply the ones still cached for it) and
        kv_cache_cached_bytes the other cached prefixes; without one, the whole pool's use."""
        usage = self.blocks.usage()
        per_block = usage.block_size * self.info.kv_bytes_per_token
        in_use, cached = usage.used, usage.cached
        if seq is not None:
            in_use, idle = self.blocks.held(seq)
            cached -= idle
        memory = dict(kv_cache_bytes=in_use * per_block,
                      kv_cache_capacity_bytes=usage.total * per_block,
                      kv_cache_cached_bytes=cached * per_block, context_capacity=self.info.n_ctx,
                      context_tokens=0, draft=None,
                      kv_disk_bytes=self.disk.store.total_bytes() if self.disk else 0)
        if seq is not None:
            memory.update(context_tokens=seq.computed, preemptions=seq.preemptions,
                          recomputed_tokens=seq.recomputed_tokens,
                          restored_tokens=seq.restored_tokens, restore_s=seq.restore_s,
                          kv_saved=seq.kv_note,
                          draft=seq.speculation.snapshot() if seq.speculation else None)
        return memory

    def memory(self) -> dict:
        if self.disk is not None:  # another process may have cleared the folder
            self.disk.store.sync()
        memory = self._memory(None)
        if self._latest is not None:  # the last request's context and draft, for the gauges
            memory.update(context_tokens=self._latest.computed,
                          draft=self._latest.speculation.snapshot()
                          if self._latest.speculation else None)
        return memory

    def tokenize_messages(self, messages, tools=()) -> list[int]:
        with self._vocab_lock:
            return super().tokenize_messages(messages, tools)

    def tokenize_text(self, text: str) -> list[int]:
        with self._vocab_lock:
            return super().tokenize_text(text)

    def _detokenize(self, token: int) -> bytes:
        """A token's bytes, remembered: a token's piece never changes, and every streamed
        token of every reply asks (under the lock, 16 streams' readers queued on it)."""
        piece = self._pieces.get(token)
        if piece is None:
            with self._vocab_lock:
                piece = self._pieces[token] = self.vocab.detokenize(token)
        return piece

    def close(self) -> None:
        """Requests still in flight end with an error; then the models are released."""
        runner = getattr(self, "runner", None)
        if runner is None:
            return
        self.runner = None
        runner.close()
        if self.disk is not None:  # the last reply's snapshot, so a restart finds it
            self.disk.store.flush()
        COMPUTE.call(self._release)

    def _release(self) -> None:
        if self.draft is not None:
            self.draft.close()
        with self._vocab_lock:
            self.executor.close()
