"""The llama.cpp executor: one llama_decode per step over every sequence, one KV stream per slot.
K and V are f16 by default, llama.cpp's own (the fastest: ggml's tiled and split-KV flash
attention). With exact_batching K is q8_0 on the CPU: that keeps ggml on one attention
kernel, so a sequence computes the same bits alone, batched or verifying drafts."""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
from typing import Sequence

import numpy as np

from localchat.engine.executors.llama_lib import LlamaContext, LlamaModel, llama_cpp

from localchat.engine.base import ModelInfo
from localchat.engine.executors.llamacpp_backends import cpu_backend, load_cpu_backend
from localchat.engine.executors.llamacpp_vocab import LlamaCppVocabulary, llama_log_mark, load_error
from localchat.engine.runtime.executor_api import BLOCK_SIZE, Chunk, Executor, KVLayout
from localchat.errors import EngineError
from localchat.models.facts import GGUFFacts
from localchat.models.planner import chosen_cache_types, engine_kv_bytes_per_token
from localchat.units import refuse_beyond_available

GGML_TYPE_BF16 = 30  # ggml.h (llama-cpp-python names no constant for it)
SLOT_ROUND = 256  # llama.cpp sizes each stream in multiples of 256 cells
MAX_BATCH = 1024  # tokens per llama_decode call; larger forwards are split


class _Batch:
    """A llama_batch over numpy arrays we own (filled with slices, not per-token ctypes)."""

    def __init__(self, capacity: int) -> None:
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.seq_id = np.zeros(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        base = self.seq_id.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *(ctypes.cast(base + 4 * i, ctypes.POINTER(ctypes.c_int32)) for i in range(capacity)))
        self.struct = llama_cpp.llama_batch(
            n_tokens=0, token=_ptr(self.token, ctypes.c_int32), embd=None,
            pos=_ptr(self.pos, ctypes.c_int32), n_seq_id=_ptr(self.n_seq_id, ctypes.c_int32),
            seq_id=self._seq_ptrs, logits=_ptr(self.logits, ctypes.c_int8))


CACHE_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "bf16": GGML_TYPE_BF16,
               "q8_0": llama_cpp.GGML_TYPE_Q8_0}  # their bytes per value: models/planner.py


def _wanted(chunk: Chunk) -> np.ndarray:
    """Per token of the chunk, whether its logits are wanted (llama_batch's logits flags)."""
    first = len(chunk.tokens) - chunk.n_logits
    flags = np.arange(len(chunk.tokens)) >= first
    for i in chunk.no_logits:
        flags[first + i] = False
    return flags


def _ptr(array: np.ndarray, ctype):
    return array.ctypes.data_as(ctypes.POINTER(ctype))


class LlamaCppExecutor(Executor):
    name = "llama.cpp"

    def __init__(self, facts: GGUFFacts, *, n_ctx: int, threads: int, parallel: int,
                 gpu_layers: int | None = None,
                 cache_types: tuple[str | None, str | None] = (None, None),
                 exact_batching: bool = False, flash_attn: bool = True) -> None:
        """Built from a LlamaCppSpec (engine/choice.py resolves its defaults). parallel: KV
        slots (sequences computed at once), each holding n_ctx tokens;
        cache_types: K and V cache types (None: default_cache_types, exact_batching's pair
        if asked); flash_attn False is llama-cpp-python's default, for comparing models."""
        if gpu_layers is None:
            gpu_layers = -1 if llama_cpp.llama_supports_gpu_offload() else 0
        self.threads = threads
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = gpu_layers
        slot_cells = math.ceil(n_ctx / SLOT_ROUND) * SLOT_ROUND
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = parallel * slot_cells
        params.n_seq_max = parallel
        params.kv_unified = False
        params.n_batch = MAX_BATCH
        params.n_ubatch = 512
        params.n_threads = params.n_threads_batch = threads
        params.swa_full = True  # sliding-window layers keep every cell, so tails can be cut
        params.no_perf = True
        on_cpu = gpu_layers == 0 or not llama_cpp.llama_supports_gpu_offload()
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED if not flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if on_cpu
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO)
        self.cache_types = chosen_cache_types(facts, cache_types, on_cpu, exact_batching)
        params.type_k, params.type_v = (CACHE_TYPES[t] for t in self.cache_types)
        kv_bytes = engine_kv_bytes_per_token(facts, "llama.cpp", self.cache_types)
        if on_cpu:
            refuse_beyond_available(
                facts.file_size + kv_bytes * parallel * slot_cells,
                f"{facts.name} with a KV cache of {parallel} slot(s) x {slot_cells} tokens")
        load_cpu_backend()  # before the first model: a GGML_BACKEND_DL build registers none
        mark = llama_log_mark()
        try:
            self._model = LlamaModel(path_model=str(facts.path), params=model_params,
                                     verbose=False)
            self._ctx = LlamaContext(model=self._model, params=params, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            self.close()
            why = load_error(mark) or exc  # the field llama.cpp refused, where it logged one
            raise EngineError(f"llama.cpp could not load {facts.path.name}: {why}") from None
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self.vocab = LlamaCppVocabulary(self._model)
        self.n_vocab = self._model.n_vocab()
        model = self._model.model
        self.supports_rollback = not (llama_cpp.llama_model_is_recurrent(model) or
                                      llama_cpp.llama_model_is_hybrid(model))
        key = hashlib.blake2b(f"llama.cpp:{facts.path}:{facts.file_size}".encode()).digest()
        self.layout = KVLayout(pools=parallel, blocks_per_pool=slot_cells // BLOCK_SIZE,
                               exclusive=True, cache_key=key,
                               prefix_cache=self.supports_rollback, slot_copy=True)
        self.info = ModelInfo.from_facts(facts, n_ctx=n_ctx,
                                         kv_bytes_per_token=kv_bytes,
                                         weights_bytes=self._model.size(),
                                         compute=cpu_backend() if on_cpu else "llama.cpp GPU offload")
        self.slot_cells = slot_cells
        stat = os.stat(facts.path)
        # sliding-window models keep a second cache whose exact restore we have not verified
        exact = self.supports_rollback and llama_cpp.llama_model_n_swa(model) == 0
        self._identity = (f"llama.cpp|{stat.st_size}|{stat.st_mtime_ns}|{'/'.join(self.cache_types)}"
                          f"|fa={params.flash_attn_type}|gpu_layers={gpu_layers}") if exact else None
        self._filled = [0] * parallel  # positions each slot's stream holds
        self._batch = _Batch(MAX_BATCH)

    def forward(self, chunks: Sequence[Chunk]) -> np.ndarray:
        for chunk in chunks:  # copies first: a later chunk may cut a copy's source
            if chunk.copy_from is not None:  # across streams llama.cpp copies the whole buffer
                llama_cpp.llama_memory_seq_cp(self._memory, chunk.copy_from, chunk.slot, -1, -1)
                self._filled[chunk.slot] = self._filled[chunk.copy_from]
        for chunk in chunks:
            if self._filled[chunk.slot] > chunk.start:  # rollback, or a new sequence
                self._cut(chunk.slot, chunk.start)
            elif self._filled[chunk.slot] < chunk.start:  # the caller's bookkeeping is wrong
                raise EngineError(f"KV cache bookkeeping: slot {chunk.slot} holds "
                                  f"{self._filled[chunk.slot]} positions, a chunk starts at "
                                  f"{chunk.start}")
            self._filled[chunk.slot] = chunk.start + len(chunk.tokens)
        outputs: list[np.ndarray] = []
        b, n, wanted = self._batch, 0, 0
        for chunk in chunks:
            if len(chunk.tokens) == 1:  # a decode step's chunk: scalar stores, no arrays
                want = chunk.n_logits > 0 and not chunk.no_logits
                b.token[n], b.pos[n], b.seq_id[n], b.logits[n] = (
                    chunk.tokens[0], chunk.start, chunk.slot, want)
                n, wanted = n + 1, wanted + want
                if n == MAX_BATCH:
                    outputs.append(self._decode(n, wanted))
                    n = wanted = 0
                continue
            done, wants = 0, _wanted(chunk)
            while done < len(chunk.tokens):
                take = min(len(chunk.tokens) - done, MAX_BATCH - n)
                sl = slice(n, n + take)
                b.token[sl] = chunk.tokens[done:done + take]
                b.pos[sl] = np.arange(chunk.start + done, chunk.start + done + take)
                b.seq_id[sl] = chunk.slot
                flags = wants[done:done + take]
                b.logits[sl] = flags
                wanted += int(flags.sum())
                n, done = n + take, done + take
                if n == MAX_BATCH:
                    outputs.append(self._decode(n, wanted))
                    n = wanted = 0
        if n:
            outputs.append(self._decode(n, wanted))
        return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]

    def _decode(self, n: int, n_out: int) -> np.ndarray:
        """The batch's first n tokens, of which n_out want logits."""
        b = self._batch
        b.struct.n_tokens = n
        rc = llama_cpp.llama_decode(self._ctx.ctx, b.struct)
        if rc != 0:
            raise EngineError(f"llama_decode failed (code {rc})")
        if not n_out:
            return np.zeros((0, self.n_vocab), np.float32)
        rows = np.empty((n_out, self.n_vocab), np.float32)  # ours: valid after the next decode
        ctypes.memmove(rows.ctypes.data, llama_cpp.llama_get_logits(self._ctx.ctx), rows.nbytes)
        return rows

    def decode_raw(self, entries: Sequence[tuple[int, int, int, bool]]) -> np.ndarray:
        """Bare llama_decode over (slot, position, token, wants logits) entries, with no KV
        bookkeeping (the benchmark's kernel limit); the wanted rows' logits."""
        b, out = self._batch, []
        for start in range(0, len(entries), MAX_BATCH):
            part = entries[start:start + MAX_BATCH]
            n = len(part)
            b.seq_id[:n], b.pos[:n], b.token[:n], b.logits[:n] = zip(*part)
            out.append(self._decode(n, int(b.logits[:n].sum())))
        return np.concatenate(out)

    def clear(self) -> None:
        """Empty every slot's KV."""
        llama_cpp.llama_memory_clear(self._memory, True)
        self._filled = [0] * len(self._filled)

    def _cut(self, slot: int, start: int) -> None:
        """Drop the slot's KV from `start` on (all of it where the state cannot be cut)."""
        if not llama_cpp.llama_memory_seq_rm(self._memory, slot, start, -1):
            llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
            if start:
                raise EngineError("this model's cache cannot be cut back (recurrent state)")

    def kv_identity(self) -> str | None:
        return self._identity

    def save_kv(self, slot: int, block_table: list[int], n_tokens: int) -> memoryview:
        """The slot's whole stream (llama_state_seq_get_data); positions from n_tokens on,
        if any, are cut again on restore."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx.ctx, slot)
        buf = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buf, size, slot)
        if got != size:
            raise EngineError(f"llama_state_seq_get_data wrote {got} of {size} bytes")
        return memoryview(buf).cast("B")

    def restore_kv(self, slot: int, block_table: list[int], start: int, n_tokens: int,
                   data, data_tokens: int) -> bool:
        """The slot's stream becomes the saved one cut to n_tokens (all of it is restored:
        a stream is one llama.cpp sequence)."""
        llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
        self._filled[slot] = 0
        array = ctypes.c_uint8 * len(data)
        try:
            src = array.from_buffer(data)  # a writable buffer: no copy
        except TypeError:
            src = array.from_buffer_copy(data)
        read = llama_cpp.llama_state_seq_set_data(self._ctx.ctx, src, len(data), slot)
        held = llama_cpp.llama_memory_seq_pos_max(self._memory, slot) + 1
        if read != len(data) or held < n_tokens:
            llama_cpp.llama_memory_seq_rm(self._memory, slot, -1, -1)
            return False
        self._filled[slot] = held
        self._cut(slot, n_tokens)
        self._filled[slot] = n_tokens
        return True

    def memory(self) -> dict:
        """llama.cpp's own view: cells each slot holds, and the whole cache's size."""
        cells = [llama_cpp.llama_memory_seq_pos_max(self._memory, s) + 1
                 for s in range(len(self._filled))]
        return {"cells": cells, "capacity_cells": self.slot_cells * len(self._filled),
                "kv_bytes": self.slot_cells * len(self._filled) * self.info.kv_bytes_per_token}

    def set_threads(self, n: int) -> bool:
        llama_cpp.llama_set_n_threads(self._ctx.ctx, n, n)
        self.threads = n
        return True

    def close(self) -> None:
        for name in ("_ctx", "_model"):
            part = getattr(self, name, None)
            if part is not None:
                part.close()
                setattr(self, name, None)
