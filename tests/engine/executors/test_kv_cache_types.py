"""The llama.cpp executor's KV cache types: llama.cpp's own f16 for K and V by default (its
fastest attention kernels, whose bits depend on the batch), and with --exact-batching the
q8_0 K that keeps a sequence's logits the same bits alone as batched (ggml's CPU kernels)."""

from __future__ import annotations

import dataclasses

import pytest
import numpy as np

from helpers.cli import assert_one_line_error, localchat
from localchat.engine.executors.llamacpp import LlamaCppExecutor
from localchat.engine.runtime.executor_api import Chunk
from localchat.errors import ConfigError
from localchat.models.planner import batches_exactly, chosen_cache_types, default_cache_types
from localchat.models.specs import resolve_model_facts
from localchat.engine.choice import default_threads

FACTS = resolve_model_facts("default")
PROMPT = ("The lighthouse keeper climbed the spiral stairs every evening, counting the "
          "steps as his father had taught him, and at the top he trimmed the wick, wiped "
          "the salt from the great lens, wound the clockwork that turned it, and sat down "
          "with his logbook to write the wind, the sea and the ships he could see.")
OTHER = ("Copper conducts heat and electricity well, which is why it lines the bottoms of "
         "good pans and carries the current through most of the wires in a house.")


def test_defaults_are_llama_cpps_and_exact_batching_takes_the_exact_pair():
    assert default_cache_types(FACTS) == ("f16", "f16") == chosen_cache_types(FACTS, (None, None))
    assert chosen_cache_types(FACTS, (None, None), exact=True) == ("q8_0", "f16")
    odd_heads = dataclasses.replace(FACTS, head_dim=48)  # rows not in 32-value blocks
    assert chosen_cache_types(odd_heads, (None, None), exact=True) == ("f16", "bf16")
    assert default_cache_types(FACTS, on_cpu=False, exact=True) == ("f16", "f16")  # a GPU's
    assert chosen_cache_types(FACTS, (None, "bf16"), exact=True) == ("q8_0", "bf16")
    assert batches_exactly("q8_0", "f16") and batches_exactly("f16", "bf16")
    assert not batches_exactly("f16", "f16") and batches_exactly("q8_0", "q8_0")


@pytest.mark.subprocess
def test_exact_batching_with_f16_for_both_is_refused_naming_the_setting():
    with pytest.raises(ConfigError) as caught:
        chosen_cache_types(FACTS, ("f16", "f16"), exact=True)
    assert caught.value.setting == "exact_batching"
    result = localchat("run", "--exact-batching", "-ctk", "f16", "-ctv", "f16", "-n", "4", "hi")
    assert_one_line_error(result, "--exact-batching")


def _first_rows_logits(executor: LlamaCppExecutor, prompts: list[list[int]]) -> np.ndarray:
    """Every prompt prefilled in one pass, each in its own slot: the first prompt's last-row
    logits."""
    chunks = [Chunk(slot=i, tokens=t, start=0, n_logits=1, block_table=[], write_from=0,
                    n_prompt=len(t)) for i, t in enumerate(prompts)]
    return executor.forward(chunks)[0]


@pytest.mark.model
@pytest.mark.parametrize("exact", [False, True], ids=["default f16", "exact q8_0 K"])
def test_a_prompt_batched_with_another_keeps_its_bits_only_with_exact_batching(exact):
    """Alone, a prompt of 64 or more tokens takes ggml's tiled attention kernel (f16 K and V);
    beside a shorter one llama.cpp splits the pass into equal parts per sequence, each under
    64, another kernel. With exact batching both runs are the same bits."""
    executor = LlamaCppExecutor(FACTS, n_ctx=256, threads=default_threads(), parallel=2,
                                exact_batching=exact)
    try:
        assert executor.cache_types == (("q8_0", "f16") if exact else ("f16", "f16"))
        prompt, other = (executor.vocab.tokenize_text(t) for t in (PROMPT, OTHER))
        assert len(other) < 64 <= len(prompt)
        alone = _first_rows_logits(executor, [prompt])
        together = _first_rows_logits(executor, [prompt, other])
    finally:
        executor.close()
    assert np.allclose(alone, together, atol=1.0)  # the same model either way
    assert np.array_equal(alone, together) == exact
