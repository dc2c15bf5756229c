"""The torch engine behind the engine interface, over the paged KV store with prefix
caching. Requests from any number of threads are batched continuously (runner.py); with
a draft model, speculative decoding serves one request at a time instead (decode.py),
since a draft's guesses are per sequence.

A GGUF file is tokenized by llama.cpp's own vocabulary (its vocab-only mode), so both
engines see exactly the same token ids; a Hugging Face directory by its tokenizer.json
(engine/hf_vocab.py, which follows the same rules). Prompts are rendered by the shared
template renderer.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import threading
import time
from typing import Iterator

import llama_cpp
import torch

from localchat.engine.base import Engine, Event, ModelInfo, Request
from localchat.engine.llamacpp import LlamaCppVocabulary
from localchat.engine.streaming import EngineHooks, stream_events
from localchat.engine.torch.blocks import BlockPool
from localchat.engine.compute_thread import COMPUTE
from localchat.engine.torch.model import KVStore, LlamaModel
from localchat.engine.torch.decode import Speculation, decode
from localchat.engine.torch.device import pick_device
from localchat.engine.torch.drafts import ModelDraft, NgramDraft
from localchat.engine.torch.runner import BatchRunner
from localchat.engine.torch.sequence import PagedSequence
from localchat.engine.torch.speculative import AdaptiveGamma
from localchat.engine.torch.weights import load_weights
from localchat.engine.vocab import Vocabulary, VocabMixin
from localchat.errors import UsageError
from localchat.model_files import GGUFFacts
from localchat.units import available_memory, human_bytes

BLOCK_SIZE = 16
KV_DTYPE = torch.float16  # as llama.cpp's default cache: 2 bytes per value


def kv_blocks(config, n_ctx: int, kv_memory: int | None) -> int:
    """Blocks the KV pool gets: the --kv-memory budget, by default 10% of available
    memory; never less than one full context window (that would fail mid-reply)."""
    per_block = BLOCK_SIZE * 2 * config.n_layers * config.n_kv_heads * config.head_dim * \
        torch.tensor([], dtype=KV_DTYPE).element_size()
    needed = math.ceil(n_ctx / BLOCK_SIZE)
    if kv_memory is not None:
        if kv_memory // per_block < needed:
            raise UsageError(
                f"--kv-memory {human_bytes(kv_memory)} holds {kv_memory // per_block * BLOCK_SIZE}"
                f" tokens, less than the {n_ctx}-token context; raise it or lower -c")
        return kv_memory // per_block
    return max(needed, available_memory() // 10 // per_block)


def open_model(facts: GGUFFacts, device: torch.device = torch.device("cpu")):
    """(weights on `device`, vocabulary) for a GGUF file or a Hugging Face directory."""
    if facts.path.is_dir():
        from localchat.engine.hf_vocab import HFVocabulary
        from localchat.engine.torch.hf_weights import load_hf_weights

        return load_hf_weights(facts.path).to(device), HFVocabulary(facts.path)
    return load_weights(facts.path, device), LlamaCppVocabulary(
        llama_cpp.Llama(str(facts.path), vocab_only=True, verbose=False))


def _generator(sp) -> torch.Generator:
    """A request's own random stream: seeded, it samples the same alone or batched."""
    return torch.Generator().manual_seed(
        sp.seed if sp.seed is not None else int.from_bytes(os.urandom(4), "little"))


class TorchEngine(VocabMixin, Engine):
    name = "torch"

    def __init__(self, facts: GGUFFacts, *, n_ctx: int, threads: int | None = None,
                 kv_memory: int | None = None, draft: GGUFFacts | str | None = None,
                 num_draft_tokens: int | None = None, device: str | None = None) -> None:
        """draft: a draft model's facts, or "ngram" (prompt lookup); num_draft_tokens
        fixes γ (default: adaptive); device: auto (CUDA, else MPS, else CPU), or one."""
        self.facts = facts
        self.device = pick_device(device)
        weights = COMPUTE.call(self._load_target, threads, n_ctx)
        n_blocks = kv_blocks(self.config, n_ctx, kv_memory)
        self.kv = KVStore(self.config, n_blocks * BLOCK_SIZE, dtype=KV_DTYPE, device=self.device)
        cache_key = hashlib.blake2b(f"{facts.path}:{facts.file_size}:{KV_DTYPE}".encode()).digest()
        self.pool = BlockPool(n_blocks, BLOCK_SIZE, cache_key=cache_key)
        self._seq_ids = itertools.count()
        self._lock = threading.Lock()  # the speculative path: one request at a time
        self._vocab_lock = threading.Lock()
        self.num_draft_tokens = num_draft_tokens
        self.draft = None if draft is None else (
            NgramDraft() if draft == "ngram" else COMPUTE.call(self._load_draft, draft, n_ctx))
        self.runner = None if self.draft is not None else BatchRunner(
            self.model, self.kv, self.pool, self.is_end_of_generation)
        self.info = ModelInfo.from_facts(facts, n_ctx=n_ctx,
                                         kv_bytes_per_token=self.kv.bytes_per_token,
                                         weights_bytes=weights.nbytes())

    def _load_target(self, threads: int | None, n_ctx: int):
        """On the compute thread, like every torch call (compute_thread.py says why)."""
        torch.set_num_threads(threads or max(1, os.cpu_count() or 1))
        weights, self.vocab = open_model(self.facts, self.device)
        self.config = weights.config
        self.model = LlamaModel(weights, max_positions=n_ctx)
        return weights

    def generate(self, request: Request, cancel: threading.Event | None = None) -> Iterator[Event]:
        if self.runner is None:
            yield from self._generate_speculative(request, cancel)
            return
        t_start = time.perf_counter()
        prompt, budget = self.prompt_and_budget(request)
        sp = request.sampling
        seq = self.runner.submit(prompt, sp, budget, _generator(sp))
        hooks = EngineHooks(
            detokenize=self._detokenize,
            is_end_of_generation=self.is_end_of_generation,
            prompt_evaluated=lambda: len(prompt) - (seq.cached_tokens or 0),
            memory=lambda: {**self.memory(), "context_tokens": seq.computed,
                            "preemptions": seq.preemptions,
                            "recomputed_tokens": seq.recomputed_tokens},
        )
        yield from stream_events(request, prompt, self.runner.tokens(seq), hooks, budget,
                                 cancel or threading.Event(), t_start)

    def tokenize_messages(self, messages) -> list[int]:
        with self._vocab_lock:  # callers on several threads share one vocabulary
            return super().tokenize_messages(messages)

    def tokenize_text(self, text: str) -> list[int]:
        with self._vocab_lock:
            return super().tokenize_text(text)

    def _detokenize(self, token: int) -> bytes:
        with self._vocab_lock:
            return self.vocab.detokenize(token)

    def _generate_speculative(self, request: Request,
                              cancel: threading.Event | None) -> Iterator[Event]:
        t_start = time.perf_counter()
        with self._lock:
            prompt, budget = self.prompt_and_budget(request)
            sequence = PagedSequence(self.model, self.kv, self.pool, next(self._seq_ids), prompt)
            self._active = sequence
            speculation = self._speculation()
            try:
                hooks = EngineHooks(
                    detokenize=self.vocab.detokenize,
                    is_end_of_generation=self.is_end_of_generation,
                    prompt_evaluated=lambda: len(prompt) - sequence.cached,
                    memory=lambda: self.memory(speculation),
                )
                sp = request.sampling
                tokens = COMPUTE.iterate(decode(sequence, prompt, sp, _generator(sp),
                                                self.info.n_ctx, speculation))
                yield from stream_events(request, prompt, tokens, hooks, budget,
                                         cancel or threading.Event(), t_start)
            finally:
                sequence.free()
                self._active = None

    def _speculation(self) -> Speculation | None:
        if self.draft is None:
            return None
        rule = ("greedy: keep drafts equal to the target's argmax; sampling: Leviathan "
                "min(1, p/q), residual norm(max(0, p - q))")
        return Speculation(self.draft, AdaptiveGamma(fixed=self.num_draft_tokens), rule)

    def _load_draft(self, facts: GGUFFacts, n_ctx: int) -> ModelDraft:
        """The vocabulary check is load_engine's (shared with the llama.cpp engine)."""
        weights, vocab = open_model(facts, self.device)
        vocab.close()
        return ModelDraft(weights, facts.name, n_ctx, KV_DTYPE)

    def memory(self, speculation: Speculation | None = None) -> dict:
        usage = self.pool.usage()
        in_use = usage.bytes(self.kv.bytes_per_token)
        sequence = getattr(self, "_active", None)
        return dict(
            draft=speculation.snapshot() if speculation is not None else None,
            kv_cache_bytes=in_use["used"],
            kv_cache_capacity_bytes=in_use["total"],
            kv_cache_cached_bytes=in_use["cached"],
            context_tokens=len(sequence) if sequence is not None else 0,
            context_capacity=self.info.n_ctx,
        )

    def close(self) -> None:
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.close()
        lock = getattr(self, "_lock", None)
        if lock is not None and lock.acquire(timeout=30):
            try:
                vocab: Vocabulary | None = getattr(self, "vocab", None)
                self.vocab = None
                if vocab is not None:
                    vocab.close()
            finally:
                lock.release()
