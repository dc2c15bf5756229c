"""Speculative decoding in the llama.cpp engine, through llama-cpp-python's draft hook.

llama-cpp-python asks a LlamaDraftModel for tokens to append after each sampled token,
evaluates them in the same batch, then samples every position from the target and keeps
drafts while they equal what was sampled ("sample and match"): exact at any temperature
(each kept token was sampled from the target), and at temperature 0 it accepts exactly
what Leviathan's rule would. Drafts come from prompt lookup (llama-cpp-python's own) or
from a second, smaller llama.cpp model run greedily. Counting wraps either source.
"""

from __future__ import annotations

import llama_cpp
import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

RULE = ("llama-cpp-python: sample each position from the target, keep drafts while they "
        "equal the sampled token")


class _GreedyModelProposer:
    """A second llama.cpp model that drafts k tokens greedily, reusing its KV cache for
    the prefix it shares with the previous call."""

    def __init__(self, path: str, n_ctx: int, threads: int, k: int) -> None:
        self.llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.k = k

    def __call__(self, input_ids: np.ndarray) -> np.ndarray:
        llm, ids = self.llm, input_ids.tolist()
        ids = ids[:max(0, llm.n_ctx() - self.k - 1)]
        have = llm.input_ids[:llm.n_tokens].tolist()
        common = 0
        while common < min(len(have), len(ids) - 1) and have[common] == ids[common]:
            common += 1
        llm.n_tokens = common
        llm._ctx.kv_cache_seq_rm(-1, common, -1)
        llm.eval(ids[common:])
        drafts = []
        for _ in range(self.k):
            token = int(np.argmax(self._last_logits()))
            drafts.append(token)
            if llm.n_tokens + 1 >= llm.n_ctx():
                break
            llm.eval([token])
        return np.array(drafts, dtype=np.intc)

    def _last_logits(self) -> np.ndarray:
        """The last evaluated token's logits (without logits_all, llama-cpp-python keeps
        no copy of them)."""
        ptr = llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),))

    def close(self) -> None:
        self.llm.close()


class CountingDraft(LlamaDraftModel):
    """Wraps a proposer and counts proposed and accepted drafts: each call's input shows
    which of the previous call's drafts the target kept (so the last round of a
    generation, never followed by a call, is not counted)."""

    def __init__(self, source: str, propose, k: int) -> None:
        self.source, self.propose, self.k = source, propose, k
        self.proposed = self.accepted = self.rounds = 0
        self._last_input: list[int] = []
        self._last_drafts: list[int] = []

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        ids = input_ids.tolist()
        n0 = len(self._last_input)
        if self._last_drafts and ids[:n0] == self._last_input:
            kept = 0
            for d, t in zip(self._last_drafts, ids[n0:]):
                if d != t:
                    break
                kept += 1
            self.accepted += kept
            self.proposed += len(self._last_drafts)  # counted once verified
            self.rounds += 1
        drafts = self.propose(input_ids)
        self._last_input, self._last_drafts = ids, drafts.tolist()
        return drafts

    def reset(self) -> None:
        """Counts are per generation."""
        self.proposed = self.accepted = self.rounds = 0
        self._last_input, self._last_drafts = [], []

    def stats(self) -> dict:
        return {"source": self.source, "rule": RULE, "proposed": self.proposed,
                "accepted": self.accepted,
                "acceptance_rate": self.accepted / self.proposed if self.proposed else 0.0,
                "gamma": self.k}

    def close(self) -> None:
        close = getattr(self.propose, "close", None)
        if close is not None:
            close()


def llama_cpp_draft(draft, k: int | None, n_ctx: int, threads: int) -> CountingDraft:
    """draft: "ngram" or a draft model's facts (vocabulary already checked)."""
    if draft == "ngram":
        k = k or 10
        return CountingDraft("ngram", LlamaPromptLookupDecoding(max_ngram_size=3, num_pred_tokens=k), k)
    k = k or 4
    return CountingDraft(f"model:{draft.name}",
                         _GreedyModelProposer(str(draft.path), n_ctx, threads, k), k)
