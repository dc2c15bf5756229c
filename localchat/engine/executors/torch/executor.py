"""The torch executor: our paged Llama-family model (GGUF, NF4, INT8/INT4, GPTQ, Hugging Face
directories) on CPU, CUDA or MPS over one shared pool of 16-token blocks. GGUF files use
llama.cpp's own vocabulary, so both executors see the same token ids."""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from localchat.engine.base import ModelInfo
from localchat.engine.runtime.executor_api import Chunk, Executor
from localchat.engine.executors.llamacpp_vocab import LlamaCppVocabulary
from localchat.engine.executors.torch.device import pick_device
from localchat.engine.executors.torch.kernels import KernelChooser, kernel_isa
from localchat.engine.executors.torch.model import Batch, KVStore, LlamaModel
from localchat.engine.executors.torch.weights import ModelWeights, load_weights
from localchat.engine.runtime.executor_api import BLOCK_SIZE, KVLayout
from localchat.errors import ConfigError
from localchat.models.facts import GGUFFacts
from localchat.paths import cache_dir
from localchat.units import available_memory, human_bytes, refuse_beyond_available

KV_DTYPE = torch.float16  # as llama.cpp's default cache: 2 bytes per value
# torch's own warnings that say nothing to a user (its internals' deprecations and codegen
# notes), by category and the start of the message; any other warning still shows
KNOWN_LIBRARY_WARNINGS = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
    (UserWarning, r"bf16 and fp16 are mixed in the scheduler node"),
)


def quiet_library_warnings() -> None:
    """Hide KNOWN_LIBRARY_WARNINGS for the rest of the process (ours and others' still show)."""
    for category, message in KNOWN_LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def kv_block_bytes(config) -> int:
    """One 16-token block's K and V over every layer."""
    return BLOCK_SIZE * 2 * config.n_layers * config.n_kv_heads * config.head_dim * \
        torch.tensor([], dtype=KV_DTYPE).element_size()


def kv_blocks(config, n_ctx: int, kv_memory: int | None) -> int:
    """Blocks the KV pool gets: the kv_memory budget, by default 10% of available
    memory; never less than one full context window (that would fail mid-reply)."""
    per_block = kv_block_bytes(config)
    needed = math.ceil(n_ctx / BLOCK_SIZE)
    if kv_memory is not None:
        if kv_memory // per_block < needed:
            raise ConfigError(
                "kv_memory", f"{human_bytes(kv_memory)} holds {kv_memory // per_block * BLOCK_SIZE}"
                f" tokens, less than the {n_ctx}-token context; raise it or lower ctx_size")
        return kv_memory // per_block
    return max(needed, available_memory() // 10 // per_block)


def open_weights(path, device: torch.device = torch.device("cpu"),
                 chooser: KernelChooser | None = None) -> ModelWeights:
    """The weights of a GGUF file or a Hugging Face directory, on `device` (a directory is
    built on the CPU and moved)."""
    if Path(path).is_dir():
        from localchat.engine.executors.torch.hf_weights import load_hf_weights

        return load_hf_weights(Path(path), chooser).to(device)
    return load_weights(Path(path), device, chooser)


def open_vocabulary(path):
    """The vocabulary of a GGUF file (llama.cpp's own) or a Hugging Face directory."""
    if Path(path).is_dir():
        from localchat.engine.executors.torch.hf_vocab import HFVocabulary

        return HFVocabulary(Path(path))
    return LlamaCppVocabulary.vocab_only(str(path))


def open_model(facts: GGUFFacts, device: torch.device = torch.device("cpu"),
               chooser: KernelChooser | None = None):
    """(weights on `device`, vocabulary) for a GGUF file or a Hugging Face directory."""
    return open_weights(facts.path, device, chooser), open_vocabulary(facts.path)


class TorchExecutor(Executor):
    name = "torch"

    def __init__(self, facts: GGUFFacts, *, n_ctx: int, threads: int,
                 kv_memory: int | None = None, device: str | None = None,
                 compiled: bool | None = None, ahead_of_time: bool | None = None) -> None:
        """Built from a TorchSpec (engine/choice.py resolves its defaults); call on the
        compute thread (compute_thread.py says why). compiled, ahead_of_time: as LlamaModel's."""
        quiet_library_warnings()
        self.facts = facts
        self.device = pick_device(device)
        torch.set_num_threads(threads)
        # a Hugging Face directory is built on the CPU and moved (its kernels are the CPU's)
        build_on = torch.device("cpu") if facts.path.is_dir() else self.device
        chooser = KernelChooser(build_on, cache_dir=cache_dir())  # per machine, as AOT code
        weights, self.vocab = open_model(facts, self.device, chooser)
        self.config = weights.config
        self.model = LlamaModel(weights, max_positions=n_ctx + 64, compiled=compiled,  # + drafts
                                ahead_of_time=ahead_of_time)
        n_blocks = kv_blocks(self.config, n_ctx, kv_memory)
        if self.device.type == "cpu":
            refuse_beyond_available(n_blocks * kv_block_bytes(self.config),
                                    f"a KV cache of {n_blocks * BLOCK_SIZE} tokens")
        self.kv = KVStore(self.config, n_blocks * BLOCK_SIZE, dtype=KV_DTYPE, device=self.device)
        self.model.warm_up(self.kv)
        key = hashlib.blake2b(f"{facts.path}:{facts.file_size}:{KV_DTYPE}".encode()).digest()
        self.layout = KVLayout(pools=1, blocks_per_pool=n_blocks, exclusive=False, cache_key=key)
        self.info = ModelInfo.from_facts(facts, n_ctx=n_ctx,
                                         kv_bytes_per_token=self.kv.bytes_per_token,
                                         weights_bytes=weights.nbytes(),
                                         kernels={**chooser.chosen, **self.model.describe()},
                                         compute=kernel_isa(self.device))

    def forward(self, chunks: Sequence[Chunk]) -> np.ndarray:
        bs = BLOCK_SIZE
        tokens: list[int] = []
        positions, new_slots, logit_rows = [], [], []
        seqs: list[tuple[int, torch.Tensor]] = []
        for chunk in chunks:
            end = chunk.start + len(chunk.tokens)
            table = torch.tensor(chunk.block_table, dtype=torch.long)
            context = (table[:, None] * bs + torch.arange(bs)).flatten()[:end]
            pos = torch.arange(chunk.start, end)
            slots = context[chunk.start:end].clone()
            slots[pos < chunk.write_from] = -1  # already in a shared block: never written
            offset = len(tokens)
            tokens += chunk.tokens
            positions.append(pos)
            new_slots.append(slots)
            seqs.append((len(chunk.tokens), context, chunk.n_prompt))
            first = offset + len(chunk.tokens) - chunk.n_logits
            logit_rows += [first + i for i in range(chunk.n_logits) if i not in chunk.no_logits]
        batch = Batch(torch.tensor(tokens), torch.cat(positions), torch.cat(new_slots), seqs,
                      torch.tensor(logit_rows, dtype=torch.long))
        return self.model.forward_batch(batch, self.kv).float().cpu().numpy()

    def kv_identity(self) -> str | None:
        stat = os.stat(self.facts.path)
        return f"torch|{stat.st_size}|{stat.st_mtime_ns}|{KV_DTYPE}|{self.device.type}"

    def _slots(self, block_table: list[int], start: int, end: int) -> torch.Tensor:
        """The pool slots of positions start..end-1 of a sequence with these blocks."""
        table = torch.tensor(block_table, dtype=torch.long)
        return (table[:, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE)).flatten()[start:end]

    def save_kv(self, slot: int, block_table: list[int], n_tokens: int) -> memoryview:
        """K then V of the positions, [layers, n_tokens, kv_heads, head_dim] each."""
        k = self.kv.k
        index = self._slots(block_table, 0, n_tokens).to(k.device)
        out = torch.empty((2, k.shape[0], n_tokens, *k.shape[2:]), dtype=k.dtype, device=k.device)
        for i, source in enumerate((self.kv.k, self.kv.v)):
            torch.index_select(source, 1, index, out=out[i])
        return memoryview(out.cpu().view(torch.uint8).numpy()).cast("B")

    def restore_kv(self, slot: int, block_table: list[int], start: int, n_tokens: int,
                   data, data_tokens: int) -> bool:
        k = self.kv.k
        shape = (k.shape[0], data_tokens, *k.shape[2:])
        half = math.prod(shape) * k.element_size()
        if len(data) != 2 * half or n_tokens > data_tokens:
            return False
        index = self._slots(block_table, start, n_tokens).to(k.device)
        saved = torch.frombuffer(data, dtype=torch.uint8).view(k.dtype).view(2, *shape)
        for i, target in enumerate((self.kv.k, self.kv.v)):
            saved_part = saved[i, :, start:n_tokens]
            target[:, index] = saved_part.to(target.device)
        return True

    def close(self) -> None:
        vocab, self.vocab = getattr(self, "vocab", None), None
        if vocab is not None:
            vocab.close()
