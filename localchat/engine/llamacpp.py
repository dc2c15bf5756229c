"""The llama.cpp engine: llama-cpp-python behind localchat's engine interface.

It runs every GGUF architecture llama.cpp supports and is the speed and correctness
reference for our own torch engine. Prompts are rendered with localchat's sandboxed
template renderer (not llama-cpp-python's), and text that users typed is tokenized with
special-token parsing off, so a typed `<|im_end|>` stays plain text.

One llama.cpp context holds one chat's KV cache; llama-cpp-python's generate() keeps the
longest common token prefix between calls, so the next turn of a chat only prefills
what is new. Stats are measured here: wall-clock TTFT and rates, and the evaluated
prompt token count from llama.cpp's own performance counters.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Iterator, Sequence

import llama_cpp

from localchat.chat.template import render_chat
from localchat.engine.base import Engine, Event, Message, ModelInfo, Request, Result, Stats
from localchat.engine.compute_thread import COMPUTE
from localchat.engine.streaming import EngineHooks, stream_events
from localchat.engine.vocab import VocabMixin
from localchat.errors import EngineError
from localchat.model_files import GGUFFacts

# llama.cpp logs to stderr by default, which would scribble over the TUI. Keep its
# log lines in memory instead (the KV-size line is read back by tests and --verbose).
_LOG_LINES: list[str] = []
_LOG_LOCK = threading.Lock()


@llama_cpp.llama_log_callback
def _capture_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    with _LOG_LOCK:
        _LOG_LINES.append(text.decode("utf-8", errors="replace"))
        del _LOG_LINES[:-2000]


llama_cpp.llama_log_set(_capture_log, ctypes.c_void_p(0))  # before any model or vocab loads


def llama_log_text() -> str:
    """Everything llama.cpp has logged in this process (the last 2000 pieces)."""
    with _LOG_LOCK:
        return "".join(_LOG_LINES)


def render_and_tokenize(llm: llama_cpp.Llama, template: str | None,
                        messages: Sequence[Message]) -> list[int]:
    """Render with the model's template and tokenize with llama.cpp's vocabulary: text
    the template wrote may hold special tokens, text users typed never does. Shared with
    the torch engine (which passes a vocab-only Llama), so both see the same ids."""

    def token_text(token_id: int) -> str:
        if token_id < 0:
            return ""
        return token_piece(llm, token_id, special=True).decode("utf-8", errors="replace")

    bos = llm.token_bos()
    rendered = render_chat(template, messages, bos_token=token_text(bos),
                           eos_token=token_text(llm.token_eos()))
    tokens: list[int] = []
    for segment in rendered.segments:
        tokens += llm.tokenize(segment.text.encode("utf-8"), add_bos=False,
                               special=segment.trusted)
    adds_bos = llm.tokenize(b"", add_bos=True, special=True) == [bos]
    if adds_bos and (not tokens or tokens[0] != bos):
        tokens.insert(0, bos)
    return tokens


def token_piece(llm: llama_cpp.Llama, token: int, special: bool = False) -> bytes:
    """One token's bytes. llama-cpp-python's detokenize() uses a 32-byte buffer, so
    longer pieces (64 dashes, a newline and 32+ spaces: 47 tokens of SmolLM2's vocabulary)
    came back empty; llama.cpp reports the size it needs, so ask again with that."""
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, token, buf, size, 0, special)
        if n >= 0:
            return buf.raw[:n]
        size = -n


class LlamaCppVocabulary:
    """A llama.cpp vocabulary (a vocab-only Llama, or the full model) as a Vocabulary."""

    def __init__(self, llm: llama_cpp.Llama) -> None:
        self.llm = llm

    def tokenize_messages(self, template: str | None, messages: Sequence[Message]) -> list[int]:
        return render_and_tokenize(self.llm, template, messages)

    def tokenize_text(self, text: str) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def detokenize(self, token: int) -> bytes:
        return token_piece(self.llm, token)

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.llm._model.vocab, token))

    def close(self) -> None:
        self.llm.close()


class LlamaCppEngine(VocabMixin, Engine):
    name = "llama.cpp"

    def __init__(
        self,
        facts: GGUFFacts,
        *,
        n_ctx: int,
        threads: int | None = None,
        gpu_layers: int | None = None,
        draft: GGUFFacts | str | None = None,
        num_draft_tokens: int | None = None,
    ) -> None:
        """draft: a draft model's facts (vocabulary already checked) or "ngram"."""
        if gpu_layers is None:
            gpu_layers = -1 if llama_cpp.llama_supports_gpu_offload() else 0
        threads = threads or max(1, (os.cpu_count() or 2))
        self._draft = None
        if draft is not None:
            from localchat.engine.llamacpp_draft import llama_cpp_draft

            self._draft = llama_cpp_draft(draft, num_draft_tokens, n_ctx, threads)
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(facts.path),
                n_ctx=n_ctx,
                n_batch=512,
                n_threads=threads,
                n_threads_batch=threads,
                n_gpu_layers=gpu_layers,
                draft_model=self._draft,  # llama-cpp-python then keeps logits for all positions
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"llama.cpp could not load {facts.path.name}: {exc}") from None
        self.facts = facts
        self.vocab = LlamaCppVocabulary(self._llm)  # the full model doubles as the vocabulary
        self._lock = threading.Lock()
        n_ctx = self._llm.n_ctx()
        self.info = ModelInfo.from_facts(
            facts, n_ctx=n_ctx,
            kv_bytes_per_token=facts.kv_bytes_per_token(2),  # llama.cpp's default f16 cache
            weights_bytes=self._llm._model.size(),
        )

    # -- generation ---------------------------------------------------------------

    def generate(self, request: Request, cancel: threading.Event | None = None) -> Iterator[Event]:
        t_start = time.perf_counter()
        with self._lock:
            prompt, budget = self.prompt_and_budget(request)
            if cancel is not None and cancel.is_set():  # given up while queued for the lock
                yield Result(text="", finish_reason="cancelled",
                             stats=Stats(prompt_tokens=len(prompt), **self.memory()))
                return
            llm, sp = self._llm, request.sampling
            llm.set_seed(sp.seed if sp.seed is not None else int.from_bytes(os.urandom(4), "little"))
            ctx = llm._ctx.ctx
            llama_cpp.llama_perf_context_reset(ctx)
            if self._draft is not None:
                self._draft.reset()

            def prompt_evaluated() -> int:  # llama.cpp's own count, so cache hits are measured
                perf = llama_cpp.llama_perf_context(ctx)
                return perf.n_p_eval + perf.n_eval

            hooks = EngineHooks(
                detokenize=lambda token: token_piece(llm, token),
                is_end_of_generation=self.is_end_of_generation,
                prompt_evaluated=prompt_evaluated,
                memory=self.memory,
            )
            tokens = COMPUTE.iterate(llm.generate(  # compute_thread.py says why
                prompt, top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p, temp=sp.temperature,
                repeat_penalty=sp.repeat_penalty))
            yield from stream_events(request, prompt, tokens, hooks, budget,
                                     cancel or threading.Event(), t_start)

    def memory(self) -> dict:
        in_cache = self._llm.n_tokens
        return dict(
            kv_cache_bytes=in_cache * self.info.kv_bytes_per_token,
            kv_cache_capacity_bytes=self.info.n_ctx * self.info.kv_bytes_per_token,
            context_tokens=in_cache,
            context_capacity=self.info.n_ctx,
            draft=self._draft.stats() if self._draft is not None else None,
        )

    def close(self) -> None:
        """Waits for a generation in another thread to let go of the model first."""
        lock = getattr(self, "_lock", None)
        if lock is not None and not lock.acquire(timeout=30):
            return  # a stuck generation still holds the model: leak it rather than crash
        try:
            llm, self._llm = getattr(self, "_llm", None), None
            if llm is not None:
                llm.close()
            draft, self._draft = getattr(self, "_draft", None), None
            if draft is not None:
                draft.close()
        finally:
            if lock is not None:
                lock.release()
