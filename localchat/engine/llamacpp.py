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

import codecs
import ctypes
import os
import threading
import time
from typing import Iterator, Sequence

import llama_cpp

from localchat.chat.template import render_chat
from localchat.engine.base import (
    Delta,
    Engine,
    Event,
    Message,
    ModelInfo,
    Request,
    Result,
    Stats,
)
from localchat.engine.stops import StopMatcher
from localchat.errors import ContextOverflowError, EngineError
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


def llama_log_text() -> str:
    """Everything llama.cpp has logged in this process (the last 2000 pieces)."""
    with _LOG_LOCK:
        return "".join(_LOG_LINES)


class LlamaCppEngine(Engine):
    name = "llama.cpp"

    def __init__(
        self,
        facts: GGUFFacts,
        *,
        n_ctx: int,
        threads: int | None = None,
        gpu_layers: int | None = None,
    ) -> None:
        llama_cpp.llama_log_set(_capture_log, ctypes.c_void_p(0))
        if gpu_layers is None:
            gpu_layers = -1 if llama_cpp.llama_supports_gpu_offload() else 0
        threads = threads or max(1, (os.cpu_count() or 2))
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(facts.path),
                n_ctx=n_ctx,
                n_batch=512,
                n_threads=threads,
                n_threads_batch=threads,
                n_gpu_layers=gpu_layers,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"llama.cpp could not load {facts.path.name}: {exc}") from None
        self.facts = facts
        self._lock = threading.Lock()
        self._bos_id = self._llm.token_bos()
        self._adds_bos = self._llm.tokenize(b"", add_bos=True, special=True) == [self._bos_id]
        n_ctx = self._llm.n_ctx()
        self.info = ModelInfo(
            name=facts.name,
            path=str(facts.path),
            architecture=facts.architecture,
            quant_type=facts.quant_type,
            file_size=facts.file_size,
            n_ctx_train=facts.context_length,
            n_ctx=n_ctx,
            n_layers=facts.n_layers,
            n_kv_heads=facts.n_kv_heads,
            head_dim=facts.head_dim,
            kv_bytes_per_token=facts.kv_bytes_per_token(2),  # llama.cpp's default f16 cache
        )

    # -- prompt -------------------------------------------------------------------

    def _is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._llm._model.vocab, token))

    def _token_text(self, token_id: int | None) -> str:
        if token_id is None or token_id < 0:
            return ""
        return self._llm.detokenize([token_id], special=True).decode("utf-8", errors="replace")

    def tokenize_messages(self, messages: Sequence[Message]) -> list[int]:
        """Render with the model's template, tokenizing typed text as plain text."""
        bos_text = self._token_text(self._bos_id)
        rendered = render_chat(
            self.facts.chat_template,
            messages,
            bos_token=bos_text,
            eos_token=self._token_text(self._llm.token_eos()),
        )
        tokens: list[int] = []
        for segment in rendered.segments:
            if segment.text:
                data = segment.text.encode("utf-8")
                tokens += self._llm.tokenize(data, add_bos=False, special=segment.trusted)
        if self._adds_bos and (not tokens or tokens[0] != self._bos_id):
            tokens.insert(0, self._bos_id)
        return tokens

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        return len(self.tokenize_messages(messages))

    def tokenize_text(self, text: str) -> list[int]:
        """Plain text to tokens (no special-token parsing), for tests and benchmarks."""
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    # -- generation ---------------------------------------------------------------

    def _stats(self, **kw) -> Stats:
        in_cache = self._llm.n_tokens
        return Stats(
            kv_cache_bytes=in_cache * self.info.kv_bytes_per_token,
            kv_cache_capacity_bytes=self.info.n_ctx * self.info.kv_bytes_per_token,
            context_tokens=in_cache,
            context_capacity=self.info.n_ctx,
            **kw,
        )

    def generate(self, request: Request, cancel: threading.Event | None = None) -> Iterator[Event]:
        cancel = cancel or threading.Event()
        t_start = time.perf_counter()
        with self._lock:
            if request.prompt_tokens is not None:
                prompt = list(request.prompt_tokens)
            else:
                prompt = self.tokenize_messages(request.messages)
            n_ctx = self.info.n_ctx
            if len(prompt) >= n_ctx:
                raise ContextOverflowError(
                    f"the prompt is {len(prompt)} tokens but the context window is {n_ctx} "
                    f"tokens (use -c/--ctx-size for a larger one, up to "
                    f"{self.info.n_ctx_train})"
                )
            yield from self._stream(request, prompt, cancel, t_start)

    def _stream(
        self, request: Request, prompt: list[int], cancel: threading.Event, t_start: float
    ) -> Iterator[Event]:
        llm, sp = self._llm, request.sampling
        seed = sp.seed if sp.seed is not None else int.from_bytes(os.urandom(4), "little")
        llm.set_seed(seed)
        budget = self.info.n_ctx - len(prompt)
        if request.max_tokens is not None:
            budget = min(budget, request.max_tokens)
        ctx = llm._ctx.ctx
        llama_cpp.llama_perf_context_reset(ctx)

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stops = StopMatcher(request.stop)
        text_parts: list[str] = []
        completion: list[int] = []
        t_prefill_start = time.perf_counter()
        t_first = t_last = 0.0
        prompt_evaluated = 0
        finish = "length"

        tokens = llm.generate(
            prompt,
            top_k=sp.top_k,
            top_p=sp.top_p,
            min_p=sp.min_p,
            temp=sp.temperature,
            repeat_penalty=sp.repeat_penalty,
        )
        try:
            for token in tokens:
                now = time.perf_counter()
                if not completion:
                    t_first = now
                    perf = llama_cpp.llama_perf_context(ctx)
                    prompt_evaluated = perf.n_p_eval + perf.n_eval
                t_last = now
                if self._is_eog(token):
                    finish = "stop"
                    break
                completion.append(token)
                piece = decoder.decode(llm.detokenize([token]))
                visible = stops.feed(piece)
                if visible:
                    text_parts.append(visible)
                live = self._live_stats(prompt, prompt_evaluated, completion, t_start,
                                        t_prefill_start, t_first, t_last)
                yield Delta(text=visible, token_ids=(token,), stats=live)
                if stops.stopped:
                    finish = "stop"
                    break
                if cancel.is_set():
                    finish = "cancelled"
                    break
                if len(completion) >= budget:
                    finish = "length"
                    break
        finally:
            tokens.close()
        if not stops.stopped:
            tail = stops.feed(decoder.decode(b"", final=True)) + stops.flush()
            if tail:
                text_parts.append(tail)
                yield Delta(text=tail, token_ids=(), stats=self._live_stats(
                    prompt, prompt_evaluated, completion, t_start, t_prefill_start,
                    t_first, t_last))
        if not completion and t_first:  # the first token was end-of-generation
            t_last = t_first
        stats = self._live_stats(prompt, prompt_evaluated, completion, t_start,
                                 t_prefill_start, t_first or time.perf_counter(), t_last)
        yield Result(text="".join(text_parts), finish_reason=finish, stats=stats)

    def _live_stats(
        self,
        prompt: list[int],
        prompt_evaluated: int,
        completion: list[int],
        t_start: float,
        t_prefill_start: float,
        t_first: float,
        t_last: float,
    ) -> Stats:
        prefill_s = t_first - t_prefill_start
        decoded = max(0, len(completion) - 1)  # tokens produced after the first one
        decode_s = t_last - t_first
        return self._stats(
            prompt_tokens=len(prompt),
            cached_tokens=max(0, len(prompt) - prompt_evaluated),
            completion_tokens=len(completion),
            ttft_s=t_first - t_start,
            prefill_tok_s=prompt_evaluated / prefill_s if prefill_s > 0 else 0.0,
            decode_tok_s=decoded / decode_s if decoded and decode_s > 0 else 0.0,
            elapsed_s=time.perf_counter() - t_start,
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
        finally:
            if lock is not None:
                lock.release()
